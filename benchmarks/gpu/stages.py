"""The GPU suite's stages, in the order a first contact with a GPU most needs them: what each proves,
its expected and longest time, and the work it does (run in a child process of its own, so that a
hang, a crash in a CUDA library or a timeout costs that stage only).

Each stage's record is written to OUT/<key>_<name>.json the moment the stage ends, atomically (a
temporary file renamed), so a run killed at any point leaves every finished stage readable."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Stage:
    key: str
    name: str
    proves: str
    # seconds: (expected on one H100 or H200, from their runs of 2026-11-27 and -28 with a margin, b, e and i since estimated
    # for the compiled fast step, not yet measured; expected with --quick on a CPU)
    expected: tuple[int, int]
    # the most a stage may take before it is killed (full, --quick)
    limit: tuple[int, int]

    @property
    def file(self) -> str:
        return f"{self.key}_{self.name}.json"

    def seconds(self, quick: bool) -> tuple[int, int]:
        """(expected, limit) for this mode."""
        return self.expected[quick], self.limit[quick]


STAGES = [
    Stage("a", "environment", "the GPU, driver, torch, CUDA, cuDNN, NCCL, flash_attn and apex the later stages ran on",
          (10, 5), (60, 60)),
    Stage("b", "product", "bertctl submit --cluster local runs the sample dataset's phase 1 and a phase-2 run on the "
          "device to the target, through the rendered script (on a GPU the fast step, compiled and graphed), and the "
          "official checker accepts its log", (180, 90), (420, 360)),
    Stage("c", "parity_attention", "our model on the device matches the CPU and Hugging Face's; every attention "
          "backend that can run matches the fp32 reference in bf16/fp16/fp32; the nested kernel takes a fused path",
          (40, 15), (120, 120)),
    Stage("d", "precision", "bf16 and fp16 steps at BERT-large phase-2 shapes are finite; an overflowing fp16 step is "
          "skipped, counted and halves the loss scale", (20, 10), (90, 90)),
    Stage("e", "throughput", "BERT-large phase 2 in bf16 at 48 packs: Hugging Face as its users train it (batches of 56 "
          "padded to 512), ours reference and the fast step added in turn (direct flash, static compile, CUDA graph, the "
          "recipe's LAMB compiled and eager, then FP8 GEMMs), the recipe's step bf16 and FP8 also at MLPerf's length mix; "
          "sequences/s, MFU, peak memory, CPU and GPU ms per step", (280, 30), (420, 240)),
    Stage("f", "trainer_sync", "python -m trainer under torchrun (NCCL) in every optim.clip mode and fp16 with "
          "compile; the steady-state loop makes no device->host sync in bf16", (150, 120), (270, 240)),
    Stage("g", "apex", "apex's FusedLayerNorm and FusedLAMB update like the PyTorch path (skipped without apex)",
          (10, 5), (60, 60)),
    Stage("h", "profile", "where the fast step's device time goes, eager and compiled (top kernels, casts per step), and what FP8 GEMMs "
          "(torch._scaled_mm) could save at the encoder's shapes", (70, 20), (180, 120)),
    Stage("i", "trainer_throughput", "python -m trainer under torchrun trains BERT-large phase 2 on packed synthetic shards "
          "with the H100 recipe's step (LAMB, bf16, compiled, graphed) in clip local and bucket, and evaluates 10,000 samples: "
          "its own metrics' sequences/s agree with stage e's within 5 %; the evaluation's seconds", (300, 60), (480, 240)),
    Stage("j", "attention_kernels", "the fast step's attention (PyTorch's flash kernel on the packed stream) against cuDNN's "
          "SDPA and PyTorch's other kernels, on NestedTensors and on masked rows of packs, dropout 0.1, forward and backward: "
          "milliseconds, and each equal to the fp32 reference at dropout 0 (measured, not adopted)", (40, 10), (150, 90)),
    Stage("k", "fp8_convergence", "BERT-large phase 2 on the sample dataset's text, one initialisation and one order of "
          "batches, 300 updates of the recipe's step in bf16 and with FP8 GEMMs: both MLM loss curves, their ends within 1 %",
          (200, 60), (420, 240)),
]
BY_NAME = {s.name: s for s in STAGES}


def write_record(out: Path, stage: Stage, record: dict) -> Path:
    """OUT/<key>_<name>.json, whole or not at all (written aside, flushed to disk, then renamed)."""
    path = out / stage.file
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(json.dumps({"stage": f"{stage.key}_{stage.name}", **record}, indent=2) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def overall(records: list[dict]) -> str:
    """A stage's status from its checks': fail if one failed, skip if all skipped, else pass."""
    statuses = [r["status"] for r in records]
    if "fail" in statuses:
        return "fail"
    return "skip" if statuses and all(s == "skip" for s in statuses) else "pass"


# ---- what each stage runs (in its child process) ---------------------------------------------

def run_stage(name: str, device_name: str, quick: bool, deadline: float, log: Path) -> dict:
    """The stage's record (without its timing, which the caller adds)."""
    import torch

    from trainer.config import ModelConfig

    from . import checks

    device = torch.device(device_name)
    precision = "bf16" if device.type == "cuda" else "fp32"
    small = ModelConfig(num_layers=2, hidden_size=128, num_heads=2, intermediate_size=512, vocab_size=4096)
    base = ModelConfig(num_layers=4, hidden_size=768, num_heads=12, intermediate_size=3072, vocab_size=30522)
    large = ModelConfig(hidden_dropout=0.1, attention_dropout=0.1)
    # the CPU rehearsal of the throughput and profile stages: their code paths, at sizes a busy CPU runs in seconds
    tiny = ModelConfig(num_layers=2, hidden_size=64, num_heads=2, intermediate_size=128, vocab_size=512,
                       max_position_embeddings=128)
    if name == "environment":
        return {"status": "pass", **checks.environment(device)}
    if name == "product":
        from .product import product_end_to_end

        return {"status": "pass", **product_end_to_end(device.type, quick, deadline, log)}
    if name == "parity_attention":
        nodrop = small.model_copy(update={"hidden_dropout": 0.0, "attention_dropout": 0.0})
        found = [checks.parity(device, nodrop, 4) if quick else checks.parity(device, base, 16),
                 checks.attention_backends(device, 2, 64, 4) if quick else checks.attention_backends(device, 16, 64, 64)]
    elif name == "precision":
        found = [checks.precision_steps(device, small, 4) if quick else checks.precision_steps(device, large, 32)]
    elif name == "throughput":
        found = [checks.throughput(device, tiny, 2, 1, seq_len=128, warmup=1, probes=1) if quick
                 else checks.throughput(device, large, 48, 10)]
    elif name == "trainer_sync":
        # --quick: one launch under torchrun (its PYTHONPATH, its timeout), no compiling on a CPU
        runs = {"clips": ("bucket",), "compiled": False} if quick else {}
        found = [checks.trainer_runs(device, precision, deadline, log, **runs),
                 checks.steady_state_syncs(device, precision, **({"steps": 2} if quick else {}))]
    elif name == "profile":
        # --quick: eager only (tests/test_gpu_suite.py profiles the compiled step on the CPU)
        profiles = [checks.profile(device, tiny, 2, seq_len=128)] if quick else \
            [checks.profile(device, large, 48), checks.profile(device, large, 48, compiled=True)]
        found = [*profiles, checks.fp8_gemms(device, 2 * 512 if quick else 48 * 512)]
    elif name == "trainer_throughput":
        # --quick: the tiny model, a few steps, one clip mode, fp32 and eager on the CPU (its plumbing, not its speed)
        found = [checks.trainer_throughput(device, tiny, 2, 12, deadline, log, seq_len=128, eval_samples=60, clips=("local",))
                 if quick else checks.trainer_throughput(device, large, 48, 60, deadline, log, stage_e=log.parent / "e_throughput.json")]
    elif name == "attention_kernels":
        found = [checks.attention_kernels(device, 2, 128, 2, 16, repeats=2) if quick else checks.attention_kernels(device)]
    elif name == "fp8_convergence":
        # --quick: the tiny model on the sample dataset's phase-1 sequences (128 tokens), a few updates: the plumbing
        found = [checks.fp8_convergence(device, tiny.model_copy(update={"max_position_embeddings": 128}), 2, 8, deadline, log,
                                        seq_len=128, tolerance=0.05, min_fall=None) if quick
                 else checks.fp8_convergence(device, large, 48, 300, deadline, log)]
    elif name == "apex":
        found = [checks.apex_paths(device, small, 4) if quick else checks.apex_paths(device, large, 16)]
    else:
        raise ValueError(f"unknown stage {name}")
    status = overall(found)
    reasons = [f"{r['check'].split(':')[0]}: {r['reason']}" for r in found if r["status"] == status and r.get("reason")]
    return {"status": status, **({"reason": reasons[0][:300]} if status != "pass" and reasons else {}), "checks": found}
