"""What a run says about itself while it trains: step tallies, the progress line, metrics, MFU.

A step's sums are a `Tally` (trainer/loop/tally.py). A `Stopwatch`
times the window: the steps queue their GPU work without waiting for it, so only the wall clock
from one progress line to the next (each taken after the loop waited for the device) holds all
of a window's work, its data loading included. A `ProgressReport` is what the run loop calls once
per window: it puts these together into the progress line, its metrics record and the warnings.
"""

from __future__ import annotations

import contextlib
import json
import resource
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import torch

from trainer.config import ModelConfig, RunConfig
from trainer.loop.curves import open_curves
from trainer.loop.stragglers import ComputeClock, describe
from trainer.loop.tally import Tally, global_sums, mean_losses
from trainer.model.bert import training_flops

if TYPE_CHECKING:
    from trainer.loop.state import LoopState, Step


class Stopwatch:
    """Seconds of training since the last lap: wall clock, less the time spent in `paused()` blocks
    (evaluations, checkpoints). Taken right after the device was waited for, a lap holds all the
    device work queued since the previous lap."""

    def __init__(self):
        self.restart()

    def restart(self) -> None:
        self.started, self.excluded = time.perf_counter(), 0.0

    def lap(self) -> float:
        seconds = time.perf_counter() - self.started - self.excluded
        self.restart()
        return seconds

    @contextlib.contextmanager
    def paused(self, device: torch.device):
        """Time in this block is not training. The device finishes the training work queued before
        it first, so that work is not counted as the block's."""
        synchronize(device)
        began = time.perf_counter()
        try:
            yield
        finally:
            self.excluded += time.perf_counter() - began


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def progress_record(update: int, samples: int, skipped: int, lr: float, seconds: float, window: dict, last: dict,
                    device: torch.device, model: ModelConfig, world_size: int, steps: int = 1,
                    nominal_batch: int | None = None) -> dict:
    """One line of metrics/run_N.jsonl: the last step's loss, the window's means and rates over
    `seconds`, the window's wall-clock training time; with `nominal_batch` (the logged global batch)
    the sequences actually trained per step, in the window's `steps` and over the run, beside it."""
    mlm, nsp = mean_losses(window)
    last_mlm, last_nsp = mean_losses(last)
    seq_per_s, tok_per_s = window["sequences"] / seconds, window["tokens"] / seconds
    record = {
        "update": update, "samples": samples, "loss": last_mlm + last_nsp, "mlm_loss": mlm, "nsp_loss": nsp, "lr": lr,
        "seq_per_s": seq_per_s, "tokens_per_s": tok_per_s, "skipped": skipped, "memory_gb": memory_gb(device),
        "time": time.time(),
    }
    if nominal_batch is not None:
        record.update(nominal_batch=nominal_batch, actual_batch=window["sequences"] / steps,
                      run_batch=samples / update if update else 0.0)
    flops = training_flops(model, window["tokens"], window["squared_lengths"], window["masked"])
    mfu = model_flops_utilization(device, flops / seconds / world_size)
    if mfu is not None:
        record["mfu"] = mfu
    return record


def progress_line(record: dict) -> str:
    mfu = f" | mfu {record['mfu']:.1%}" if "mfu" in record else ""
    batch = f" | batch {record['actual_batch']:.1f} of nominal {record['nominal_batch']}" if "nominal_batch" in record else ""
    return (f"update {record['update']} | loss {record['loss']:.4f} (mlm {record['mlm_loss']:.4f}, nsp {record['nsp_loss']:.4f}) "
            f"| lr {record['lr']:.3e} | {record['seq_per_s']:.1f} seq/s {record['tokens_per_s']:,.0f} tok/s{batch} "
            f"| mem {record['memory_gb']:.2f} GB{mfu}")


class BatchDrift:
    """Warns once when the sequences a run trains per step drift from the nominal global batch (the
    one its MLPerf log states) by more than `tolerance`: with packing the packs' sequence count
    varies, and a recipe whose packs average less than it says would train a smaller batch than it
    logs. Judged on the run's average once it has `settle_steps` updates, past the first steps' noise."""

    def __init__(self, nominal: int, tolerance: float = 0.01, settle_steps: int = 20):
        self.nominal, self.tolerance, self.settle_steps = nominal, tolerance, settle_steps
        self.warned = False

    def check(self, samples: int, updates: int) -> str | None:
        if self.warned or updates < self.settle_steps:
            return None
        actual = samples / updates
        if abs(actual - self.nominal) <= self.tolerance * self.nominal:
            return None
        self.warned = True
        return (f"warning: the run trains {actual:.1f} sequences per step on average, {actual / self.nominal - 1:+.1%} "
                f"from the nominal global_batch_size {self.nominal} its log states (balance.pack_average)")


class ProgressReport:
    """The progress of each window of steps: its line on stdout, its record in metrics/run_N.jsonl
    (`metrics`, None on the ranks that write none) and the same scalars as TensorBoard curves
    (trainer/loop/curves.py, with each evaluation's accuracy), the straggler line and the batch-drift
    warning. Its stopwatch times the windows; the loop runs evaluations and checkpoints inside `paused()`."""

    def __init__(self, cfg: RunConfig, device: torch.device, clock: ComputeClock, metrics: Path | None,
                 say: Callable[[str], None]):
        self.cfg, self.device, self.clock, self.metrics, self.say = cfg, device, clock, metrics, say
        self.drift = BatchDrift(cfg.train.global_batch_size)
        self.stopwatch = Stopwatch()
        self.curves = open_curves(cfg.metrics, metrics, say)

    def start(self, state: LoopState) -> None:
        """The first window starts now (after the warm-up, whose device work is done), from `state`: a fresh
        run's or the checkpoint's it resumed from (the curves drop what an earlier attempt wrote past it)."""
        self.clock.take()
        self.stopwatch.restart()
        if self.curves:
            self.curves.start(state)

    def evaluation(self, state: LoopState) -> None:
        """The evaluation that just set `state.accuracy`, on the curves."""
        if self.curves:
            self.curves.evaluation(state, time.time())

    def paused(self):
        """A block whose time is not training (see Stopwatch.paused)."""
        return self.stopwatch.paused(self.device)

    def __call__(self, window: list[Step], state: LoopState) -> None:
        """Progress line and metrics for the window's steps, `state.samples` made exact beforehand: the
        one place the loop waits for the device. Every rank calls it (the sums are all-reduced)."""
        total = Tally(self.device)
        for step in window:
            total += step.tally
        sums, last = global_sums(total, window[-1].tally)  # waits for the device: the window's work is done
        seconds = self.stopwatch.lap()
        record = progress_record(state.updates, state.samples, state.skipped, window[-1].lr, seconds, sums, last,
                                 self.device, self.cfg.model, self.cfg.world_size, steps=len(window),
                                 nominal_batch=self.cfg.train.global_batch_size)
        record.update(self.clock.report(seconds))  # every rank's compute and wait (one all-gather)
        if self.metrics:
            append_json_line(self.metrics, record)
        if self.curves:
            self.curves.progress(record)
            if state.status is not None:  # the run's last record: nothing follows it (a process may train again)
                self.curves.close()
        self.say(progress_line(record))
        if "straggler" in record:
            self.say(describe(record["straggler"]))
        if warning := self.drift.check(state.samples, state.updates):
            self.say(warning)


def start_line(cfg: RunConfig, seed: int, resumed_at: int | None) -> str:
    """The run's first line: the batch it trains, its seed, and the update it resumed at (None: a fresh start)."""
    t, b = cfg.train, cfg.balance
    rows = f"{cfg.world_size} rank(s) x {t.batch_size} x {t.gradient_accumulation_steps}"
    batch = f"{rows} = {t.global_batch_size} sequences per step"
    if b.packing:  # rows are packs: the logged batch is nominal, the progress lines give the actual one
        batch = (f"{rows} packs of up to {b.pack_sequences or 'any number of'} sequences, {t.global_batch_size} "
                 f"sequences per step nominally ({b.pack_average or 1:g} per pack)")
    start = "from the start" if resumed_at is None else f"resumed at update {resumed_at}"
    return f"training: {batch}, seed {seed}, {start}"


def append_json_line(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")


def memory_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # kB on Linux


# Dense bf16 tensor-core peaks in TFLOP/s, from the vendor datasheets (half their "with sparsity"
# figures). The first key the GPU's name contains wins, so a key comes before those it contains
# (the PCIe and NVL cards before the SXM part, GB200 before B200).
PEAK_TFLOPS = {"A100": 312.0, "H100 PCIe": 756.0, "H100 NVL": 835.0, "H100": 989.0, "H800 PCIe": 756.0, "H800": 989.0,
               "H200 NVL": 835.0, "H200": 989.0, "GB200": 2500.0, "B200": 2250.0}


def peak_tflops(device_name: str) -> float | None:
    """None for a GPU not listed, and for a MIG slice (its share of the GPU is not in its name)."""
    if "MIG" in device_name:
        return None
    return next((v for k, v in PEAK_TFLOPS.items() if k in device_name), None)


def model_flops_utilization(device: torch.device, flops_per_s_per_gpu: float) -> float | None:
    """Real-token training FLOPs per second of one GPU over its dense bf16 peak; None off CUDA."""
    if device.type != "cuda":
        return None
    peak = peak_tflops(torch.cuda.get_device_name(device))
    return None if peak is None else flops_per_s_per_gpu / (peak * 1e12)
