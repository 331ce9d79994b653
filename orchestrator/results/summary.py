"""What a run's MLPerf log says: progress, accuracy, outcome, time to train and throughput.

The events are read and checked by orchestrator/results/resultlog.py (bertctl's own checks, before the
official checker); this module only summarises the events that passed them. A log with a problem
keeps what it said before the problem (for `status`), but has no time to train and never converged,
so it never enters a score.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.results import resultlog


@dataclass
class Block:
    """One training block between evaluations: block_start .. block_stop, with sample counts."""

    start_ms: float
    samples_start: int | None
    stop_ms: float | None = None
    samples_stop: int | None = None


@dataclass
class RunSummary:
    file: str
    events: int = 0
    damaged: list[tuple[int, str]] = field(default_factory=list)  # (line, why): lines that are no event
    problem: str | None = None  # "line N: the first rule the events break"; damaged lines first
    incomplete: str | None = None  # "line N: no run_start" / "no run_stop": what a finished log lacks
    warnings: list[str] = field(default_factory=list)  # "line N: why": doubts published, accepted logs share
    samples: int | None = None  # the furthest sample count any event reports
    evals: list[tuple[int, float]] = field(default_factory=list)  # (epoch_num = samples, accuracy)
    eval_times_ms: list[float] = field(default_factory=list)  # when each of `evals` was logged
    blocks: list[Block] = field(default_factory=list)
    tracked_throughput: list[tuple[float, float]] = field(default_factory=list)  # (time_ms, samples/s)
    first_time_ms: float | None = None
    run_start_ms: float | None = None
    run_stop_ms: float | None = None
    status: str | None = None  # run_stop's status: success | aborted
    train_samples: int | None = None
    seed: int | None = None
    global_batch_size: int | None = None
    target: float | None = None
    benchmark: str | None = None
    division: str | None = None
    org: str | None = None
    platform: str | None = None
    keys: set[str] = field(default_factory=set)
    # the values each configuration key logged, in order (hyperparameters, submission_*, eval_samples, ...)
    values: dict[str, list] = field(default_factory=dict)
    # (line, step, samples): what tracked_stats says where it gives a step ([epoch, step] or a count) and samples
    steps: list[tuple[int, float, float]] = field(default_factory=list)
    eval_lines: list[int] = field(default_factory=list)  # the line of each of `evals`
    sha256: str | None = None  # of the log's bytes (orchestrator/results/accepted.py names published logs by it)
    official_safe: bool = False  # the official tools can read the whole file in seconds (resultlog.ParsedLog)

    @property
    def last_accuracy(self) -> float | None:
        return self.evals[-1][1] if self.evals else None

    @property
    def finished(self) -> bool:
        return self.run_stop_ms is not None

    @property
    def converged(self) -> bool:
        """run_stop says success (and the log broke no rule): the notion the RCP checker and the score use."""
        return self.status == "success" and self.problem is None

    @property
    def epoch_num_counts_samples(self) -> bool:
        """MLPerf BERT logs epoch_num = samples trained; v1.x NVIDIA-derived logs logged 1 instead.

        A value below one global batch cannot be a sample count.
        """
        if not self.evals:
            return False
        floor = self.global_batch_size or 2
        return self.evals[-1][0] >= floor

    @property
    def samples_source(self) -> str | None:
        """Where samples_to_converge comes from: the last eval_accuracy's epoch_num, or train_samples
        for logs whose epoch_num is not a sample count (what the RCP checker's --bert_train_samples reads)."""
        if not self.converged:
            return None
        if self.epoch_num_counts_samples:
            return "epoch_num"
        return "train_samples" if self.train_samples is not None else None

    @property
    def samples_to_converge(self) -> int | None:
        source = self.samples_source
        if source == "epoch_num":
            return self.evals[-1][0]
        if source == "train_samples":
            return self.train_samples
        return None

    @property
    def minutes(self) -> float | None:
        """Time to train: run_stop - run_start, in minutes (None for a log with a problem)."""
        if self.run_start_ms is None or self.run_stop_ms is None or self.problem is not None:
            return None
        return (self.run_stop_ms - self.run_start_ms) / 60000.0

    def accuracy_curve(self) -> tuple[list[tuple[int, float]], bool]:
        """(samples trained, eval accuracy) per evaluation, and whether the samples are estimated.

        Logs whose epoch_num is not a sample count get evenly spaced evaluations up to train_samples
        (MLPerf BERT evaluates at a fixed sample interval), and say so.
        """
        if self.epoch_num_counts_samples or not self.evals:
            return list(self.evals), False
        total = self.train_samples or self.samples
        if not total:
            return [(i + 1, acc) for i, (_, acc) in enumerate(self.evals)], True
        n = len(self.evals)
        return [(round(total * (i + 1) / n), acc) for i, (_, acc) in enumerate(self.evals)], True

    def throughput(self) -> tuple[list[tuple[float, float]], str]:
        """(minutes since run_start, training samples/s) and where the numbers come from.

        In order of preference: the trainer's own `tracked_stats` throughput; the blocks' sample
        counts (over block_start..block_stop, evaluation excluded, when block_start is logged as
        the block begins; else from one block_stop to the next); consecutive evaluations.
        """
        origin = self.run_start_ms if self.run_start_ms is not None else (self.first_time_ms or 0.0)
        if self.tracked_throughput:
            return [((t - origin) / 60000.0, v) for t, v in self.tracked_throughput], "tracked_stats"
        points, timed = self._block_rates(origin)
        if points:
            return points, "blocks" if timed else "block_stops"
        curve, _ = self.accuracy_curve()
        previous_t, previous_s = origin, 0
        for t, (samples, _) in zip(self.eval_times_ms, curve):
            if t > previous_t:
                points.append(((t - origin) / 60000.0, (samples - previous_s) / ((t - previous_t) / 1000.0)))
            previous_t, previous_s = t, samples
        return points, "evals"

    def _block_rates(self, origin: float) -> tuple[list[tuple[float, float]], bool]:
        """Rates per block, and whether every one was timed from its own block_start."""
        points, timed = [], True
        previous_stop, previous_samples = origin, 0
        for b in self.blocks:
            if None in (b.stop_ms, b.samples_start, b.samples_stop):
                continue
            gap = b.stop_ms - previous_stop
            duration = b.stop_ms - b.start_ms
            # a block_start written right before its block_stop measures nothing: use stop to stop
            if duration > 0 and duration >= 0.5 * gap:
                rate = (b.samples_stop - b.samples_start) / (duration / 1000.0)
            elif gap > 0:
                rate, timed = (b.samples_stop - previous_samples) / (gap / 1000.0), False
            else:
                continue
            points.append(((b.stop_ms - origin) / 60000.0, rate))
            previous_stop, previous_samples = b.stop_ms, b.samples_stop
        return points, timed


def summarize(path: str | Path) -> RunSummary:
    """What the log says; an absent log says nothing. A log that is not a regular file, or is too
    large, raises UserError (one line naming it)."""
    summary = RunSummary(file=str(path))
    if not os.path.lexists(path):
        return summary
    log = resultlog.parse(path)
    summary.damaged = log.damaged
    summary.problem = log.problem_text
    summary.incomplete = log.incomplete()
    summary.warnings = [f"line {line}: {why}" for line, why in log.warnings]
    summary.events = len(log.events) + len(log.damaged) + (1 if log.problem else 0)
    summary.sha256, summary.official_safe = log.sha256, log.official_safe
    for e in log.events:  # each one passed resultlog's rules: numbers are finite and well typed
        summary.keys.add(e.key)
        _absorb(summary, e.key, e.value, e.metadata, float(e.time_ms))
        _keep(summary, e)
    return summary


# Keys whose values are not configuration: the run's progress, and the 398 tensor names
NOT_CONFIGURATION = {"eval_accuracy", "tracked_stats", "weights_initialization", "cache_clear", "init_start", "init_stop",
                     "run_start", "run_stop", "block_start", "block_stop", "epoch_start", "epoch_stop", "eval_start",
                     "eval_stop", "train_samples", "data_file"}
MAX_VALUES_KEPT = 8  # of one key: a log repeats a key a few times at most (one line per rank)


def _keep(s: RunSummary, e) -> None:
    """What the configuration keys logged, and the step tracked_stats gives with a sample count."""
    if e.key == "eval_accuracy":
        s.eval_lines.append(e.line)
    elif e.key == "tracked_stats":
        step = e.metadata.get("step")
        step = step[-1] if isinstance(step, list) and step else step  # NVIDIA's [epoch, step]
        samples = (e.value.get("epoch_num") if isinstance(e.value, dict) else None) or e.metadata.get("epoch_num")
        if _is_number(step) and _is_number(samples):
            s.steps.append((e.line, float(step), float(samples)))
    elif e.key not in NOT_CONFIGURATION:
        kept = s.values.setdefault(e.key, [])
        if len(kept) < MAX_VALUES_KEPT:
            kept.append(e.value)


def _absorb(s: RunSummary, key: str, value, meta: dict, time_ms: float) -> None:
    if s.first_time_ms is None:
        s.first_time_ms = time_ms
    counts = [meta.get(k) for k in ("samples_count", "epoch_num") if _is_number(meta.get(k))]
    if counts:
        s.samples = max([int(c) for c in counts] + ([s.samples] if s.samples is not None else []))
    if key == "eval_accuracy" and _is_number(value):
        s.evals.append((_int_or_none(meta.get("epoch_num")) or 0, float(value)))
        s.eval_times_ms.append(time_ms)
    elif key == "block_start":
        s.blocks.append(Block(start_ms=time_ms, samples_start=_int_or_none(meta.get("samples_count"))))
    elif key == "block_stop" and s.blocks and s.blocks[-1].stop_ms is None:
        s.blocks[-1].stop_ms = time_ms
        s.blocks[-1].samples_stop = _int_or_none(meta.get("samples_count"))
    elif key == "tracked_stats" and isinstance(value, dict) and _is_number(value.get("throughput")):
        s.tracked_throughput.append((time_ms, float(value["throughput"])))
    elif key == "run_start":
        s.run_start_ms = time_ms
    elif key == "run_stop":
        s.run_stop_ms = time_ms
        s.status = meta.get("status") if isinstance(meta.get("status"), str) else None
    elif key == "train_samples" and _is_number(value):
        s.train_samples = int(value)
    elif key == "seed" and _is_number(value):
        s.seed = int(value)
    elif key == "global_batch_size" and _is_number(value):
        s.global_batch_size = int(value)
    elif key == "submission_benchmark" and s.benchmark is None and isinstance(value, str):
        s.benchmark = value
    elif key == "submission_division" and s.division is None and isinstance(value, str):
        s.division = value
    elif key == "submission_org" and s.org is None and isinstance(value, str):
        s.org = value
    elif key == "submission_platform" and s.platform is None and isinstance(value, str):
        s.platform = value


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _int_or_none(value) -> int | None:
    return int(value) if _is_number(value) else None
