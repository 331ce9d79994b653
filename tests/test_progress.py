"""What a run reports about itself: the FLOP model, MFU's peaks, the tallies and the progress lines' rates."""

import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from synthetic import make_sample, tiny_run_config

from trainer.config import ModelConfig
from trainer.data.batch import collate
from trainer.data.histogram import wikipedia_histogram
from trainer.loop import progress
from trainer.loop.progress import Stopwatch, model_flops_utilization, peak_tflops
from trainer.loop.state import LoopState
from trainer.loop.tally import Tally
from trainer.model.bert import flops_per_sequence, training_flops


def test_the_flop_model_gives_the_reference_figures_over_the_wikipedia_lengths():
    """../shared/reference/performance-anchors.md §4.1: training a padded 512-token BERT-large
    sequence costs about 1,020 GFLOP, an average unpadded one about 500, attention about 6 % of it.
    Averaged over the phase-2 length histogram (15 % masked, at most 76): from the mean length
    instead, the squared attention term would come out 2 % short."""
    large = ModelConfig()
    assert flops_per_sequence(large, 512, 76) == pytest.approx(1.020e12, rel=0.01)
    lengths, counts = wikipedia_histogram()
    masked = np.minimum(76, np.maximum(1, np.round(0.15 * lengths)))
    weights = counts / counts.sum()
    total = training_flops(large, weights @ lengths, weights @ lengths**2, weights @ masked)
    assert total == pytest.approx(500e9, rel=0.02)
    attention = 6 * large.num_layers * 2 * large.hidden_size * (weights @ lengths**2)
    assert attention / total == pytest.approx(0.06, abs=0.005)
    assert flops_per_sequence(large, weights @ lengths, weights @ masked) / total == pytest.approx(0.98, abs=0.003)


def test_the_flops_of_a_batch_are_the_sum_of_its_sequences():
    large = ModelConfig()
    lengths, masked = [64, 128, 512], [10, 19, 76]
    each = sum(flops_per_sequence(large, n, m) for n, m in zip(lengths, masked))
    assert training_flops(large, sum(lengths), sum(n * n for n in lengths), sum(masked)) == pytest.approx(each, rel=1e-12)


@pytest.mark.parametrize("name, peak", [
    ("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0), ("NVIDIA H100 NVL", 835.0),
    ("NVIDIA H200", 989.0), ("NVIDIA H200 NVL", 835.0), ("NVIDIA H800", 989.0), ("NVIDIA H800 PCIe", 756.0),
    ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA B200", 2250.0), ("NVIDIA GB200", 2500.0),
    ("NVIDIA H100 80GB HBM3 MIG 3g.40gb", None), ("Tesla V100-SXM2-32GB", None),
])
def test_peak_tflops_by_the_name_cuda_reports(name, peak):
    assert peak_tflops(name) == peak


def test_mfu_is_flops_per_second_over_the_gpus_peak_and_none_off_cuda(monkeypatch):
    assert model_flops_utilization(torch.device("cpu"), 1e15) is None
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert model_flops_utilization(torch.device("cuda"), 494.5e12) == pytest.approx(0.5)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA GeForce RTX 4090")
    assert model_flops_utilization(torch.device("cuda"), 494.5e12) is None


def test_a_tally_sums_losses_counts_and_squared_lengths_of_its_batches():
    rng = np.random.default_rng(0)
    batches = [collate([make_sample(rng, 64, 64, 10) for _ in range(5)], unpadded=unpadded) for unpadded in (True, False)]
    tally = Tally("cpu")
    for i, batch in enumerate(batches):
        tally.add(torch.tensor(1.5 + i), torch.tensor(0.25), batch)
    got = tally.read()
    lengths = [n for b in batches for n in b.seqlens]
    assert got == {"mlm_loss": 4.0, "nsp_loss": 0.5, "masked": sum(b.num_masked for b in batches),
                   "sequences": 10, "tokens": sum(lengths), "squared_lengths": sum(n * n for n in lengths)}


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_a_stopwatch_lap_is_wall_time_less_its_pauses_and_restarts(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(progress.time, "perf_counter", clock)
    watch = Stopwatch()
    clock.now += 2.0
    with watch.paused(torch.device("cpu")):
        clock.now += 30.0  # an evaluation
    clock.now += 1.5
    assert watch.lap() == 3.5
    clock.now += 0.25
    assert watch.lap() == 0.25


def test_progress_rates_count_data_loading_and_leave_out_evaluations(tmp_path, monkeypatch):
    """The run loop's own figures, on a clock that jumps: 10 s for every step's data, 1,000 s for
    every evaluation. A 3-step window then took at least 30 s, the evaluation in it excluded."""
    from gloo import free_port

    from trainer.config import load_run_config
    from trainer.loop.entry import RunArgs
    from trainer.loop.train import Trainer

    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    config = tiny_run_config(tmp_path, optim={"max_steps": 6},
                             train={"log_every_steps": 3, "eval_every_samples": 24, "target_accuracy": 0.99})
    trainer = Trainer(load_run_config(str(config)), RunArgs(config=str(config), out=str(tmp_path / "out")))
    next_micro_batches, evaluate, real_clock = trainer.next_micro_batches, trainer.evaluate, time.perf_counter
    skipped, evaluations = [0.0], []

    def slow_data():
        skipped[0] += 10.0
        return next_micro_batches()

    def slow_evaluation():
        skipped[0] += 1000.0
        evaluations.append(trainer.state.updates)
        evaluate()

    monkeypatch.setattr(trainer, "next_micro_batches", slow_data)
    monkeypatch.setattr(trainer, "evaluate", slow_evaluation)
    monkeypatch.setattr(progress.time, "perf_counter", lambda: real_clock() + skipped[0])
    records = run_to_the_end(trainer, tmp_path / "out")
    assert [r["update"] for r in records] == [3, 6] and evaluations == [3, 6]
    for record in records:  # 3 steps of 8 sequences per line
        seconds = 24 / record["seq_per_s"]
        assert 30 <= seconds < 90, record


def run_to_the_end(trainer, out: Path) -> list[dict]:
    """Run the trainer to its end (exit 0) and return its metrics records."""
    from trainer.parallel import distributed

    try:
        assert trainer.run() == 0
    finally:
        trainer.close()
        distributed.close()
    return [json.loads(line) for line in (out / "metrics" / "run_0.jsonl").read_text().splitlines()]


def test_batch_drift_warns_once_past_one_percent_and_only_after_the_first_steps():
    drift = progress.BatchDrift(768)
    assert drift.check(samples=10 * 700, updates=10) is None  # too early to judge
    assert drift.check(samples=40 * 762, updates=40) is None  # -0.8 %: within 1 %
    warning = drift.check(samples=40 * 700, updates=40)
    assert warning.startswith("warning: the run trains 700.0 sequences per step on average, -8.9% from the nominal "
                              "global_batch_size 768")
    assert drift.check(samples=50 * 600, updates=50) is None  # once


def test_a_packed_run_reports_actual_beside_nominal_and_warns_when_its_packs_fall_short(tmp_path, monkeypatch, capsys):
    """Packs of at most 3 that the recipe says average 3: the synthetic lengths let them average less,
    so the run trains fewer sequences than the global batch it logs, and says so (once)."""
    from gloo import free_port

    from trainer.config import load_run_config
    from trainer.loop.entry import RunArgs
    from trainer.loop.train import Trainer

    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    config = tiny_run_config(tmp_path, batch_size=4, balance={"packing": True, "pack_sequences": 3, "pack_average": 3,
                                                              "pack_window": 64},
                             runtime={"unpad": True}, optim={"max_steps": 30},
                             train={"global_batch_size": 12, "log_every_steps": 10, "eval_every_samples": 10**6,
                                    "target_accuracy": 0.99})
    trainer = Trainer(load_run_config(str(config)), RunArgs(config=str(config), out=str(tmp_path / "out")))
    records = run_to_the_end(trainer, tmp_path / "out")
    assert [r["update"] for r in records] == [10, 20, 30]
    for r in records:
        assert r["nominal_batch"] == 12 and 4 <= r["actual_batch"] < 12 and r["run_batch"] == r["samples"] / r["update"]
    assert sum(r["actual_batch"] for r in records) * 10 == pytest.approx(records[-1]["samples"])
    out = capsys.readouterr().out
    assert f"batch {records[0]['actual_batch']:.1f} of nominal 12" in out
    assert out.count("warning: the run trains") == 1 and "from the nominal global_batch_size 12" in out


# ---- the curves: TensorBoard event files (trainer/loop/curves.py)

def progress_report(tmp_path: Path, say, **metrics) -> progress.ProgressReport:
    from trainer.config import RunConfig
    from trainer.loop.stragglers import ComputeClock

    run = yaml.safe_load(tiny_run_config(tmp_path / "recipe").read_text())
    cfg = RunConfig.model_validate({**run, "metrics": metrics} if metrics else run)
    device = torch.device("cpu")
    return progress.ProgressReport(cfg, device, ComputeClock(device, "node", 1), tmp_path / "out" / "metrics" / "run_3.jsonl", say)


def test_the_curves_go_beside_the_metrics_unless_run_metrics_tensorboard_is_false(tmp_path):
    from trainer.loop.curves import BY_SAMPLES

    assert progress_report(tmp_path, print, tensorboard=False).curves is None  # the run key arrives
    report = progress_report(tmp_path, print)
    assert report.curves.folder == tmp_path / "out" / "tensorboard" / "run_3"
    assert progress_report(tmp_path, print, tensorboard=True).curves is not None  # the default is on
    report.start(LoopState())
    assert (report.curves.folder / BY_SAMPLES).is_dir()


def test_without_tensorboard_installed_the_run_says_so_once_and_writes_no_curves(tmp_path, monkeypatch):
    """The `tensorboard` package absent (blocked from import here: the test environment has it)."""
    import sys

    monkeypatch.setitem(sys.modules, "tensorboard", None)
    monkeypatch.delitem(sys.modules, "torch.utils.tensorboard", raising=False)
    said = []
    report = progress_report(tmp_path, said.append)
    report.start(LoopState())
    record = {"update": 1, "samples": 8, "loss": 7.0, "mlm_loss": 6.3, "nsp_loss": 0.7, "lr": 1e-3, "seq_per_s": 9.0,
              "tokens_per_s": 100.0, "memory_gb": 1.0, "time": time.time()}
    report.curves.progress(record)
    report.evaluation(LoopState(updates=1, samples=8, accuracy=0.5))
    assert len(said) == 1 and "no TensorBoard curves: tensorboard is not installed" in said[0]
    assert "run.metrics.tensorboard: false" in said[0]
    assert not (tmp_path / "out" / "tensorboard").exists()
