"""The score of a set of BERT runs: the olympic mean, the RCP verdict, and the official summarizer's view.

All rules come from `mlperf_logging`: the averaging is the result summarizer's
`_compute_olympic_average`, the convergence verdict is `rcp_checker.check_directory`, and the
summarizer's own score is `_compute_strong_score_standalone(..., return_full_scores=True)`. The
summarizer's command-line entry point `python -m mlperf_logging.result_summarizer.compute_score`
crashes in mlperf-logging 4.1.68 (it unpacks five return values into four); tests/test_compliance_scoring.py
tells us when it is fixed.
"""

from __future__ import annotations

import contextlib
import io
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

USAGE = "training"
BENCHMARK = "bert"
# The result summarizer drops at most one run (four for unet3d); a dropped run counts as the slowest.
MAX_DROPPED_RUNS = 1
BYPASS_SUFFIX = " passed using rcp_bypass"  # what rcp_checker appends to its message when bypassed


def required_runs() -> int:
    """Runs one BERT result needs (benchmark_meta: 10)."""
    from mlperf_logging.benchmark_meta import get_result_file_counts

    return get_result_file_counts(USAGE)[BENCHMARK]


# ---- the olympic mean


@dataclass
class Score:
    minutes: float | None  # olympic mean of time to train, before any RCP factor; None: no score
    counted: int  # runs averaged
    dropped: list[str]  # runs that did not converge, counted as the dropped slowest
    note: str


def olympic_score(runs: list[tuple[str, float | None, bool]]) -> Score:
    """Olympic mean over (name, minutes, converged) runs: drop the fastest and the slowest, average the rest.

    A run that did not converge (or has no run_stop) counts as the dropped slowest; one such run
    is allowed, more leave the result without a score.
    """
    from mlperf_logging.result_summarizer.result_summarizer import _compute_olympic_average

    times = sorted(m for _, m, converged in runs if converged and m is not None)
    dropped = [name for name, m, converged in runs if not (converged and m is not None)]
    if len(dropped) > MAX_DROPPED_RUNS:
        return Score(None, 0, dropped, f"no score: {len(dropped)} runs did not converge ({', '.join(dropped)}); "
                                       f"olympic scoring allows {MAX_DROPPED_RUNS}")
    minutes = _compute_olympic_average(list(times), len(dropped), MAX_DROPPED_RUNS)
    if minutes is None:
        return Score(None, 0, dropped, f"no score: {len(times)} converged run(s) leave nothing after dropping "
                                       "the fastest and the slowest")
    counted = len(times) - MAX_DROPPED_RUNS - (MAX_DROPPED_RUNS - len(dropped))
    note = f"olympic mean of {counted} of {len(runs)} runs"
    if dropped:
        note += f"; {dropped[0]} did not converge and counts as the dropped slowest"
    return Score(minutes, counted, dropped, note)


# ---- reference convergence points


@dataclass
class RcpVerdict:
    passed: bool
    factor: float  # the score is multiplied by this (>= 1) when convergence was faster than the RCP mean
    message: str  # rcp_checker's own: RCP found, RCP Interpolation, Insufficient convergence, ...
    ruleset: str
    samples_from: str  # epoch_num (the last eval_accuracy's) or train_samples
    submission_mean: float | None = None  # olympic mean of samples to converge
    rcp_mean: float | None = None
    min_samples: float | None = None  # the smallest acceptable submission mean
    bypassed: str | None = None  # why a failed check was let through (rcp_bypass), or None

    def as_json(self) -> dict:
        data = asdict(self)
        data["pass"] = data.pop("passed")
        return data


def rcp_applies(division: str | None, ruleset: str) -> str | None:
    """None when the RCP check applies, else why not."""
    if division != "closed":
        return f"{division or 'unknown'} division: RCP applies to the closed division only"
    if not rcp_file(ruleset).is_file():
        return f"mlperf-logging has no BERT RCPs for ruleset {ruleset}"
    return None


def rcp_file(ruleset: str) -> Path:
    import mlperf_logging.rcp_checker as rc

    return Path(rc.__file__).parent / f"{USAGE}_{ruleset}" / f"rcps_{BENCHMARK}.json"


def check_rcp(directory: Path, ruleset: str, use_train_samples: bool = False,
              bypass_reason: str | None = None) -> RcpVerdict:
    """rcp_checker.check_directory over the folder's result_*.txt, with the package checker's settings
    (pruned RCPs); it writes no scaling.json. With bypass_reason, a failed check is let through the
    way the package checker's --rcp-bypass does, and the verdict says why."""
    from mlperf_logging.rcp_checker import rcp_checker

    with captured_logging() as records:
        try:
            passed, message, factor = rcp_checker.check_directory(
                str(directory), USAGE, ruleset, False, use_train_samples,
                rcp_pass="pruned_rcps", rcp_bypass=bypass_reason is not None, set_scaling=False,
            )
        except Exception as e:  # noqa: BLE001 - the official checker's own crash (a log naming two benchmarks) is a failed check
            first = str(e).splitlines()[0][:200] if str(e) else ""
            return RcpVerdict(passed=False, factor=1.0, ruleset=ruleset,
                              message=f"the official RCP checker could not read these logs ({type(e).__name__}: {first})",
                              samples_from="train_samples" if use_train_samples else "epoch_num")
    verdict = RcpVerdict(passed=bool(passed), factor=float(factor), message=message, ruleset=ruleset,
                         samples_from="train_samples" if use_train_samples else "epoch_num")
    for record in records:  # the checker logs its numbers; take them from the records' arguments
        if record.msg == " RCP Record: %s" and record.args:
            rcp = record.args[0] if isinstance(record.args, tuple) else record.args
            verdict.rcp_mean = float(rcp["RCP Mean"])
            verdict.min_samples = float(rcp["Min Epochs"])
        elif record.msg == " Submission mean epochs: %.4f" and record.args:
            verdict.submission_mean = float(record.args[0])
    if message.endswith(BYPASS_SUFFIX):
        verdict.message = message[: -len(BYPASS_SUFFIX)]
        verdict.bypassed = bypass_reason
    return verdict


def rcp_bypass_reason(run_config: dict | None) -> str | None:
    """Only a model smaller than BERT-large may skip the RCP check: its convergence cannot be compared
    with BERT-large's reference runs. Returns why, or None for BERT-large (and for foreign logs)."""
    if not run_config:
        return None
    from trainer.config import ModelConfig

    large = ModelConfig()
    model = run_config.get("model") or {}
    shape = {k: model.get(k, getattr(large, k)) for k in ("num_layers", "hidden_size", "num_heads", "intermediate_size")}
    if all(shape[k] == getattr(large, k) for k in shape):
        return None
    return (f"RCP bypassed: a {shape['num_layers']}-layer, {shape['hidden_size']}-hidden model is not BERT-large, "
            "so its convergence cannot be compared with the reference points")


# ---- the official summarizer's score


@dataclass
class SummarizerScore:
    minutes: float | None  # the summarizer's olympic mean (non-compliant runs dropped), scaling.json applied
    scaling_factor: float
    per_run: dict[str, float] = field(default_factory=dict)  # file name -> minutes, compliant runs only
    notes: list[str] = field(default_factory=list)  # what it printed (NOTICE / CRITICAL ERROR lines)


def summarizer_score(directory: Path, ruleset: str, system: str = "") -> SummarizerScore:
    """The result summarizer's own score for the folder: the workaround for its broken compute_score.

    It re-runs the compliance checker in this process (quietly) and drops every run that fails it,
    so a tree that today's checker rejects has no score here even when its times are known.
    """
    from mlperf_logging.result_summarizer import result_summarizer

    printed = io.StringIO()
    with captured_logging(), contextlib.redirect_stdout(printed):
        per_run, _, minutes, _, scale = result_summarizer._compute_strong_score_standalone(
            BENCHMARK, system, False, str(directory), USAGE, ruleset, return_full_scores=True,
        )
    notes = [line.strip() for line in printed.getvalue().splitlines() if line.strip()]
    return SummarizerScore(minutes=minutes, scaling_factor=float(scale),
                           per_run={Path(f).name: m for f, m in per_run.items()}, notes=notes)


# ---- helpers


class _Collector(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def captured_logging():
    """The mlperf_logging modules log through the root logger: keep their lines off our stderr."""
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    collector = _Collector()
    root.handlers = [collector]
    root.setLevel(logging.INFO)
    try:
        yield collector.records
    finally:
        root.handlers = saved_handlers
        root.setLevel(saved_level)
