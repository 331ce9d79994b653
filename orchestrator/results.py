"""What a run's MLPerf log says: progress, accuracy, outcome and time to train.

The lines are read with the official checker's own parser (`mlperf_logging`'s mlp_parser), so the
reader and the checker agree on what a line means; this module only summarises.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mlperf_logging.compliance_checker.mlp_parser import parse_file


@dataclass
class RunSummary:
    file: str
    events: int = 0
    parse_errors: list[str] = field(default_factory=list)
    samples: int | None = None  # the furthest sample count any event reports
    evals: list[tuple[int, float]] = field(default_factory=list)  # (epoch_num = samples, accuracy)
    run_start_ms: float | None = None
    run_stop_ms: float | None = None
    status: str | None = None  # run_stop's status: success | aborted
    train_samples: int | None = None
    seed: int | None = None
    global_batch_size: int | None = None
    target: float | None = None

    @property
    def last_accuracy(self) -> float | None:
        return self.evals[-1][1] if self.evals else None

    @property
    def finished(self) -> bool:
        return self.run_stop_ms is not None

    @property
    def converged(self) -> bool:
        return self.status == "success"

    @property
    def samples_to_converge(self) -> int | None:
        """The epoch_num of the last eval_accuracy (the RCP checker's convergence point)."""
        return self.evals[-1][0] if self.evals and self.converged else None

    @property
    def minutes(self) -> float | None:
        """Time to train: run_stop - run_start, in minutes."""
        if self.run_start_ms is None or self.run_stop_ms is None:
            return None
        return (self.run_stop_ms - self.run_start_ms) / 60000.0


def summarize(path: str | Path, ruleset: str = "5.0.0") -> RunSummary:
    summary = RunSummary(file=str(path))
    if not Path(path).exists():
        return summary
    lines, errors = parse_file(str(path), ruleset=ruleset)
    summary.events = len(lines)
    summary.parse_errors = [f"{err}: {line[:120]}" for line, err in errors]
    for ll in lines:
        _absorb(summary, ll.key, ll.value.get("value"), ll.value.get("metadata") or {}, ll.timestamp)
    return summary


def _absorb(s: RunSummary, key: str, value, meta: dict, time_ms: float) -> None:
    counts = [meta.get(k) for k in ("samples_count", "epoch_num") if isinstance(meta.get(k), (int, float))]
    if counts:
        s.samples = max([int(c) for c in counts] + ([s.samples] if s.samples is not None else []))
    if key == "eval_accuracy" and isinstance(value, (int, float)):
        s.evals.append((int(meta.get("epoch_num", 0) or 0), float(value)))
    elif key == "run_start":
        s.run_start_ms = time_ms
    elif key == "run_stop":
        s.run_stop_ms = time_ms
        s.status = meta.get("status")
    elif key == "train_samples" and isinstance(value, (int, float)):
        s.train_samples = int(value)
    elif key == "seed" and isinstance(value, int):
        s.seed = value
    elif key == "global_batch_size" and isinstance(value, (int, float)):
        s.global_batch_size = int(value)
