"""MLPerf logging: every `:::MLLOG` event bertctl writes comes from this module.

Torch-free: the launcher calls `python -m trainer.mlperf cache-clear --file result_N.txt` on every
node before a run (the MLPerf rules want one `cache_clear` per node), then rank 0 of the trainer
appends the rest of the run's events to the same file through `RunLogger`.

The official `mlperf_logging.mllog` writes the lines. Its default logger also prints to stdout and
its file handler appends, so each logger here gets its own `logging.Logger` with exactly one handler.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from pathlib import Path

from mlperf_logging.mllog import constants as K
from mlperf_logging.mllog import mllog

from trainer.config.closed_rules import WAIVER_KEY
from trainer.config.regular import open_regular

# The numerics a run trains in, by the keys and vocabulary MLPerf's rules gave them in ruleset 6.0.0 (optional there,
# unknown keys to the BERT rulesets' checkers, which pass them): NVIDIA's BERT logs of v3.0 and v4.0, FP8 GEMMs
# through Transformer Engine, state no precision at all. Spelled out: mlperf-logging's constants for them are recent.
PRECISION_KEYS = ("lowest_numerical_precision_in_linear", "lowest_numerical_precision_in_attn", "lowest_numerical_precision_in_comm")
MLPERF_DTYPE = {"fp32": "fp32", "bf16": "bfloat16", "fp16": "fp16"}

# Two call frames sit between the caller and mllog: the public method and `_emit`.
_STACK_OFFSET = 3
# metadata.file is shown relative to the folder holding the `trainer` package (no machine paths)
_ROOT = re.escape(str(Path(__file__).resolve().parent.parent))


class _StrictFileHandler(logging.FileHandler):
    """A line that cannot be written (a full disk) stops the run: logging's default prints a traceback
    and carries on, which would leave a result log silently missing events."""

    def handleError(self, record: logging.LogRecord) -> None:
        raise  # noqa: PLE0704 - called inside logging's `except`: re-raise the write error itself


class EventLog:
    """Appends MLLOG lines to one file (and nowhere else)."""

    def __init__(self, path: str | Path, echo: bool = False):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        logger = logging.getLogger(f"bertctl.mllog.{self.path.resolve()}")
        logger.handlers.clear()
        logger.propagate = False
        logger.setLevel(logging.INFO)
        logger.addHandler(_StrictFileHandler(self.path, mode="a", encoding="utf-8"))
        if echo:
            logger.addHandler(logging.StreamHandler(sys.stdout))
        self._mllogger = mllog.MLLogger(logger=logger, default_stack_offset=_STACK_OFFSET, root_dir=_ROOT)

    # time_ms: None for now; tests and log generators pass a virtual clock
    def event(self, key: str, value=None, metadata: dict | None = None, time_ms: int | None = None) -> None:
        self._emit(self._mllogger.event, key, value, metadata, time_ms)

    def start(self, key: str, value=None, metadata: dict | None = None, time_ms: int | None = None) -> None:
        self._emit(self._mllogger.start, key, value, metadata, time_ms)

    def end(self, key: str, value=None, metadata: dict | None = None, time_ms: int | None = None) -> None:
        self._emit(self._mllogger.end, key, value, metadata, time_ms)

    def _emit(self, method, key, value, metadata, time_ms) -> None:
        method(key=key, value=value, metadata=metadata, time_ms=time_ms)
        for handler in self._mllogger.logger.handlers:
            handler.flush()

    def close(self) -> None:
        for handler in list(self._mllogger.logger.handlers):
            handler.close()
            self._mllogger.logger.removeHandler(handler)


class RunLogger:
    """The events of one training run, in the order the official checker expects.

    Only rank 0 writes (others get `enabled=False`). Keys and their order follow NVIDIA's and
    Samsung's submitted logs and the rules of ruleset 5.0.0; with `legacy_keys` the log also
    carries `opt_epsilon` and the `weights_initialization` records that rulesets 1.1.0-2.1.0
    require, so one log passes every ruleset from 1.0.0 to 5.0.0 (for BERT-large).
    """

    def __init__(self, path: str | Path | None, enabled: bool, echo: bool = False, resumed: bool = False):
        self._log = EventLog(path, echo=echo) if enabled and path is not None else None
        # a resumed (requeued) run appends to the log it began, whose init phase, from init_start to
        # run_start, is already there: the checker accepts each of those events once
        self._init_log = None if resumed else self._log

    def _event(self, key, value=None, metadata=None):
        if self._log:
            self._log.event(key, value, metadata)

    def _init_event(self, key, value=None, metadata=None):
        if self._init_log:
            self._init_log.event(key, value, metadata)

    def init_start(self) -> None:
        if self._init_log:
            self._init_log.start(K.INIT_START)

    def submission(self, mlperf) -> None:
        """`mlperf`: trainer.config.MLPerfConfig. The division must come before init_stop."""
        self._init_event(K.SUBMISSION_BENCHMARK, K.BERT)
        self._init_event(K.SUBMISSION_ORG, mlperf.org)
        self._init_event(K.SUBMISSION_DIVISION, mlperf.division)
        self._init_event(K.SUBMISSION_STATUS, mlperf.status)
        self._init_event(K.SUBMISSION_PLATFORM, mlperf.platform)
        if mlperf.waive_scale_rules:  # a rehearsal, never a result: compliance-check and package refuse it
            self._init_event(WAIVER_KEY, True)

    def hyperparameters(self, cfg, seed: int, optimizer_keys: list[tuple[str, object]]) -> None:
        """`cfg`: trainer.config.RunConfig; `optimizer_keys`: the optimizer's own events, as its entry in
        trainer/optim.py::OPTIMIZERS declares them (trainer/optim.py::mlperf_keys)."""
        t, o = cfg.train, cfg.optim
        self._init_event(K.SEED, seed)
        self._init_event(K.GLOBAL_BATCH_SIZE, t.global_batch_size)
        self._init_event("d_batch_size", t.batch_size)
        self._init_event(K.GRADIENT_ACCUMULATION_STEPS, t.gradient_accumulation_steps)
        self._init_event(K.MAX_SEQUENCE_LENGTH, cfg.data.max_seq_length)
        self._init_event("max_predictions_per_seq", cfg.data.max_predictions_per_seq)
        self._init_event(K.OPT_NAME, o.name)
        self._init_event(K.OPT_BASE_LR, o.lr)
        for key, value in optimizer_keys:
            self._init_event(key, value)
        if cfg.mlperf.legacy_keys and o.name == "lamb":
            self._init_event("opt_epsilon", o.epsilon)  # LAMB's epsilon in rulesets 1.x and 2.0 (no constant in mllog)
        self._init_event(K.OPT_LR_WARMUP_STEPS, o.warmup_steps)
        self._init_event(K.NUM_WARMUP_STEPS, o.warmup_steps)
        self._init_event(K.START_WARMUP_STEP, o.start_warmup_step)
        self._init_event(K.OPT_LR_TRAINING_STEPS, o.max_steps)
        self._init_event(K.EVAL_SAMPLES, cfg.data.eval_samples)
        for key, value in zip(PRECISION_KEYS, precisions(cfg.runtime)):
            self._init_event(key, value)

    def weights_initialization(self, tensor_names: list[str]) -> None:
        for name in tensor_names:
            self._init_event(K.WEIGHTS_INITIALIZATION, metadata={"tensor": name})

    def init_stop(self) -> None:
        if self._init_log:
            self._init_log.end(K.INIT_STOP)

    def run_start(self) -> None:
        if self._init_log:
            self._init_log.start(K.RUN_START)

    def block_start(self, first_sample: int, count: int) -> None:
        """A training block begins; epoch numbers are sample counts (what the RCP checker reads)."""
        if self._log:
            self._log.start(K.BLOCK_START, metadata={K.FIRST_EPOCH_NUM: first_sample, K.EPOCH_COUNT: max(count, 1),
                                                      K.SAMPLES_COUNT: first_sample})

    def block_stop(self, first_sample: int, last_sample: int) -> None:
        if self._log:
            self._log.end(K.BLOCK_STOP, metadata={K.FIRST_EPOCH_NUM: first_sample, K.SAMPLES_COUNT: last_sample})

    def eval_start(self, samples: int) -> None:
        """Before the eval that ends a block: eval_start and eval_stop bracket the evaluation's own time."""
        if self._log:
            self._log.start(K.EVAL_START, metadata={K.EPOCH_NUM: samples})

    def evaluation(self, samples: int, accuracy: float, stats: dict | None = None) -> None:
        """After the eval that ends a block: its accuracy at `samples` trained, and the block's statistics."""
        if not self._log:
            return
        self._log.end(K.EVAL_STOP, metadata={K.EPOCH_NUM: samples})
        self._log.event(K.EVAL_ACCURACY, accuracy, metadata={K.EPOCH_NUM: samples})
        if stats:
            self._log.event("tracked_stats", stats, metadata={K.EPOCH_NUM: samples})

    def run_stop(self, status: str, train_samples: int) -> None:
        if not self._log:
            return
        self._log.event(K.TRAIN_SAMPLES, train_samples)
        self._log.end(K.RUN_STOP, metadata={K.STATUS: status})

    def close(self) -> None:
        if self._log:
            self._log.close()


def precisions(runtime) -> tuple[str, str, str]:
    """`runtime`: trainer.config.RuntimeConfig. The lowest precision of the linear layers (fp8 with runtime.fp8), of
    attention (the autocast's) and of the gradients' all-reduce (fp32: the parameters and their gradients are fp32)."""
    dtype = MLPERF_DTYPE[runtime.precision]
    return "fp8" if runtime.fp8 else dtype, dtype, "fp32"


def logged_run_stop(path: str | Path) -> str | None:
    """The status of the run_stop a result log holds (its last whole line that is one), or None: a log
    holding run_stop is a run that ended, whose result must never be appended to or rewound."""
    status = None
    try:
        with open_regular(path, "rb") as f:
            for raw in f:
                if b'"run_stop"' in raw and raw.endswith(b"\n"):  # a line cut by a crash is no event
                    status = _run_stop_status(raw) or status
    except OSError:  # no log yet (or none readable): no run_stop
        return None
    return status


def first_trainer_event(path: str | Path) -> int | None:
    """The byte offset of the log's first line the trainer wrote (its init_start; the launcher's cache_clear
    lines come before it), or None when the trainer wrote none (or there is no log)."""
    offset = 0
    try:
        with open_regular(path, "rb") as f:
            for raw in f:
                if b'"init_start"' in raw:
                    return offset
                offset += len(raw)
    except OSError:
        return None
    return None


def _run_stop_status(raw: bytes) -> str | None:
    try:
        event = json.loads(raw.decode("utf-8", errors="replace").partition(":::MLLOG")[2])
    except ValueError:
        return None
    if not isinstance(event, dict) or event.get("key") != K.RUN_STOP or not isinstance(event.get("metadata"), dict):
        return None
    status = event["metadata"].get(K.STATUS)
    return status if isinstance(status, str) else None


def log_cache_clear(path: str | Path) -> None:
    """The launcher's event after the page cache was dropped (or, with log_only, instead of it)."""
    log = EventLog(path)
    log.event(K.CACHE_CLEAR, True)
    log.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.mlperf")
    sub = parser.add_subparsers(dest="command", required=True)
    clear = sub.add_parser("cache-clear", help="append a cache_clear event to a result file")
    clear.add_argument("--file", required=True)
    args = parser.parse_args(argv)
    if args.command == "cache-clear":
        log_cache_clear(args.file)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
