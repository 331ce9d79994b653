"""A run's curves as TensorBoard event files: each progress record's scalars and each evaluation's accuracy.

Rank 0 writes them beside metrics/, one folder per run: EXP/tensorboard/run_N/ with the update (the
optimizer step) as the x axis, and EXP/tensorboard/run_N/by_samples/ with the samples trained (MLPerf's x
axis) under the same tags in the `by_samples/` family (two folders, because a purge, below, is per folder
and in the units of its x axis). The values are the ones metrics/run_N.jsonl records (`TAGS` maps its keys
to tags), the evaluation's is the one the MLPerf log records, and each event's wall time is the record's.
The writer is TensorBoard's own `SummaryWriter` (torch.utils.tensorboard, which needs the `tensorboard`
package: bertctl's `tensorboard` extra); without the package the run says so once and goes on, and
`run.metrics.tensorboard: false` writes nothing.

Exactly once, as the MLPerf log: a run resumed from its checkpoint at update U (S samples trained) opens
its writers with purge_step U + 1 (S + 1 by samples). That writes TensorBoard's restart marker, on which
its readers drop every point at or past that step from the earlier attempt's files: what an attempt wrote
after its last checkpoint is dropped, and the resumed run writes it again. A fresh start purges from 1, so
an attempt that died before its first checkpoint leaves nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable

from trainer.config.run import MetricsConfig

if TYPE_CHECKING:
    from trainer.loop.state import LoopState

# metrics/run_N.jsonl's keys -> their TensorBoard tags (mfu only on a GPU whose peak is known)
TAGS = {"loss": "train/loss", "mlm_loss": "train/mlm_loss", "nsp_loss": "train/nsp_loss", "lr": "train/learning_rate",
        "seq_per_s": "throughput/sequences_per_s", "tokens_per_s": "throughput/tokens_per_s", "mfu": "throughput/mfu",
        "memory_gb": "memory/gb"}
EVAL_TAG = "eval/mlm_accuracy"
BY_SAMPLES = "by_samples"  # the subfolder and the tag family keyed by samples trained


def curves_folder(metrics: Path) -> Path:
    """OUT/tensorboard/run_N/ for OUT/metrics/run_N.jsonl."""
    return metrics.parent.parent / "tensorboard" / metrics.stem


def open_curves(cfg: MetricsConfig, metrics: Path | None, say: Callable[[str], None]) -> Curves | None:
    """The run's curves, on the rank that writes metrics (None elsewhere, and when run.metrics.tensorboard is off)."""
    if metrics is None or not cfg.tensorboard:
        return None
    return Curves(curves_folder(metrics), say)


class Curves:
    def __init__(self, folder: Path, say: Callable[[str], None]):
        self.folder, self.say = folder, say
        self.by_update = self.by_samples = None  # SummaryWriters, from `start`

    def start(self, state: LoopState) -> None:
        """Open the writers where the run starts: `state` is the checkpoint's (or a fresh run's) loop state."""
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:  # torch's module imports the tensorboard package
            self.say(f"no TensorBoard curves: {e.name or 'tensorboard'} is not installed (pip install 'bertctl[tensorboard]'; "
                     "run.metrics.tensorboard: false turns them off); metrics/ has the same figures")
            return
        self.by_update = SummaryWriter(str(self.folder), purge_step=state.updates + 1)
        self.by_samples = SummaryWriter(str(self.folder / BY_SAMPLES), purge_step=state.samples + 1)

    def progress(self, record: dict) -> None:
        """One progress record (trainer/loop/progress.py::progress_record)."""
        for key, tag in TAGS.items():
            if key in record:
                self.scalar(tag, record[key], record["update"], record["samples"], record["time"])
        self.flush()

    def evaluation(self, state: LoopState, walltime: float) -> None:
        self.scalar(EVAL_TAG, state.accuracy, state.updates, state.samples, walltime)
        self.flush()

    def scalar(self, tag: str, value: float, update: int, samples: int, walltime: float) -> None:
        if self.by_update is None:
            return
        self.by_update.add_scalar(tag, value, update, walltime=walltime)
        self.by_samples.add_scalar(f"{BY_SAMPLES}/{tag}", value, samples, walltime=walltime)

    def close(self) -> None:
        """Close the writers: their threads and files end (later points are not written)."""
        if self.by_update is not None:
            self.by_update.close()
            self.by_samples.close()
            self.by_update = self.by_samples = None

    def flush(self) -> None:
        """On disk now: a run killed at any moment has its curves up to its last report."""
        if self.by_update is not None:
            self.by_update.flush()
            self.by_samples.flush()
