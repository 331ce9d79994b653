"""The GPU suite's own code runs here on the CPU, at tiny shapes, so it cannot rot between GPU
sessions: its parity, attention and precision checks pass, and a broken model fails them."""

import importlib.util

import pytest
import torch
from conftest import REPO

from trainer.config import ModelConfig

SMALL = ModelConfig(num_layers=2, hidden_size=64, num_heads=2, intermediate_size=128, vocab_size=512,
                    hidden_dropout=0.0, attention_dropout=0.0)


@pytest.fixture(scope="module")
def suite():
    spec = importlib.util.spec_from_file_location("gpu_suite", REPO / "benchmarks" / "gpu_suite.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cpu_runnable_checks_pass(suite):
    cpu = torch.device("cpu")
    records = [suite.parity(cpu, SMALL, 3), suite.attention_backends(cpu, 2, 16, 3), suite.precision_steps(cpu, SMALL, 3)]
    assert [r["status"] for r in records] == ["pass", "pass", "pass"], records
    assert max(records[0]["max_abs_logit_diff"].values()) < 1e-5
    assert set(records[1]["max_abs_diff"]) == {f"{backend}_{dtype}" for backend in ("nested", "per_sequence")
                                               for dtype in ("bfloat16", "float16", "float32")}
    assert records[2]["overflow_skipped"] and records[2]["scale_after_overflow"] == 2.0**15


def test_the_steady_state_check_drives_the_real_loop(suite):
    """On the CPU nothing can be counted (sync debug mode is CUDA's), but the check's use of the
    trainer (in-process Trainer, warm-up, train_step with and without packing) must still run."""
    record = suite.steady_state_syncs(torch.device("cpu"), "fp32", steps=2)
    assert record["status"] == "pass", record
    assert set(record["runs"]) == {"bucket_fp32", "local_fp32_packed"} and "not counted" in record["note"]


def test_a_check_that_finds_a_difference_fails_with_its_reason(suite, monkeypatch):
    real = suite.load_pretrained

    def load_then_break(model, state, source):  # a model that drifts from Hugging Face's weights
        real(model, state, source)
        with torch.no_grad():
            model.cls.seq_relationship.bias.add_(0.1)

    monkeypatch.setattr(suite, "load_pretrained", load_then_break)
    record = suite.parity(torch.device("cpu"), SMALL, 3)
    assert record["status"] == "fail" and "largest logit difference" in record["reason"]
