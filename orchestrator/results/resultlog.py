"""Reading an MLPerf result log, and bertctl's own checks on it, before and beside the official checker.

Every verb that reads a result log (status, compliance-check, plot, package, diff) reads it here, so
one hostile file cannot hang, crash or fool any of them:

- only a regular file is opened, without blocking (a FIFO, a device or a directory where a log
  belongs is one line naming it), and only up to MAX_FILE_BYTES;
- each `:::MLLOG` line is split at its marker once (the official parser's `re.sub(".*:::MLLOG ", ...)`
  is quadratic in the line: a 300 KB line takes minutes), and a line longer than MAX_EVENT_CHARS,
  or with two markers, is not an event;
- the events must make one MLPerf run: `Rules.check` states each rule (one run_start and one
  run_stop, in order, nothing of the run after run_stop, no training before run_start; finite,
  plausible time_ms that never go back once the run started, as `Rules._time` says (published logs are
  the measure: many ranks log the init phase with their own clocks); no accuracy before its
  evaluation ended and run_stop not before the evaluation it ends; numbers where numbers belong;
  eval_accuracy in [0, 1]; sample counts non-negative, bounded and non-decreasing; evaluations stop
  when the run converged). The first broken rule is the log's `problem`, with its line number.

Where a published, accepted log breaks one of these rules in a way that cannot be told from a lie by
its form (orchestrator/results/accepted.yaml names those files by content), that file gets a warning
naming it; any other log with the same break fails.

The official checker passes many of these logs (duplicate run_start, NaN times, evaluations after
convergence): its verdict is only as strong as these checks on top of it. A log with a problem fails
whatever the official tools say of it; they read it only where `ParsedLog.official_safe` (for what the
package checker would say). The key names are mllog's constants, the ones the writer (trainer/mlperf.py) uses.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from mlperf_logging.mllog import constants as K

from orchestrator.errors import UserError
from orchestrator.results import accepted

MARKER = ":::MLLOG"
MAX_FILE_BYTES = 64 * 1024 * 1024  # a BERT-large log is about 200 KB; NVIDIA's with stdout a few MB
MAX_EVENT_CHARS = 1024  # the longest event bertctl or a published log writes is under 300 characters
MAX_EVENTS = 20_000  # about 4,000 evaluations: far beyond any run that stops at its target
# The official parser's time grows with the square of each event's length (3 ms for 1,000
# characters): the sum of the squares is bounded so that it reads any log we hand it in seconds
MAX_PARSER_WORK = 2 * 10**9  # 20,000 events of 300 characters
MAX_SAMPLES = 10**12  # sample counts: 400,000 times the 2.5 M samples BERT-large needs
MAX_INT = 2**63 - 1
EARLIEST_MS = 946_684_800_000  # 2000-01-01: before any MLPerf round
CLOCK_SKEW_MS = 24 * 3600 * 1000  # a log's time may run ahead of now (or its file's mtime) by a skewed clock, no more
# Before run_start every rank (or node) logs init events and cache_clear with its own clock, so those
# lines may be out of order: by up to 23 ms (init_start) and 234 ms (cache_clear) in NVIDIA's
# published 1,024- and 4,320-GPU logs
RANK_CLOCK_SKEW_MS = 60_000
# What a log may not say after run_stop: training or evaluating after the run stopped. Anything else
# may follow it: published logs end with submission_* keys (Habana), run_final (Google), seed (tinycorp),
# train_samples (PCL)
NOT_AFTER_RUN_STOP = (K.RUN_START, K.RUN_STOP, K.EVAL_ACCURACY, K.BLOCK_START, K.BLOCK_STOP, K.EPOCH_START,
                      K.EPOCH_STOP, K.EVAL_START, K.EVAL_STOP, K.INIT_START, K.INIT_STOP)
# The fastest published BERT run trained 768,000 samples/s (NVIDIA's 3,472 H100, v3.1 to v4.1: 6.0 M
# samples in 7.8 s); benchmarks/published_logs_sweep.py measured every published log. A log claiming 13
# times that did not happen.
MAX_SAMPLES_PER_S = 10_000_000
# The largest published global batch is 16,416 sequences (sweep of every published log)
MAX_GLOBAL_BATCH = 1_000_000
# Values a BERT run cannot have: nothing is trained with no batch, no sequence or a learning rate <= 0
POSITIVE_VALUES = (K.GLOBAL_BATCH_SIZE, K.MAX_SEQUENCE_LENGTH, K.GRADIENT_ACCUMULATION_STEPS, K.OPT_BASE_LR,
                   "max_predictions_per_seq")
INTERVAL_STARTS = {K.BLOCK_STOP: K.BLOCK_START, K.EPOCH_STOP: K.EPOCH_START, K.EVAL_STOP: K.EVAL_START}
# Training and evaluating happen inside the timed run: no published log has one of these before run_start
TRAINING_KEYS = (K.BLOCK_START, K.BLOCK_STOP, K.EPOCH_START, K.EPOCH_STOP, K.EVAL_START, K.EVAL_STOP)
# The names of the rules a published, accepted log may be excused from (orchestrator/results/accepted.yaml)
TIME_ORDER = "time order"
TIME_RANGE = "a time the log could have been written at"
STOP_BEFORE_EVAL = "run_stop before the evaluation it ends"
EARLY_ACCURACY = "an accuracy known before its evaluation ended"
ASYNC_EVAL = "asynchronous evaluation"
FIELDS = ("time_ms", "key", "value", "metadata")

COUNT_METADATA = (K.EPOCH_NUM, K.SAMPLES_COUNT, K.FIRST_EPOCH_NUM, K.EPOCH_COUNT, "step")
STRING_VALUES = (K.SUBMISSION_BENCHMARK, K.SUBMISSION_ORG, K.SUBMISSION_DIVISION, K.SUBMISSION_STATUS,
                 K.SUBMISSION_PLATFORM, K.OPT_NAME)
COUNT_VALUES = (K.TRAIN_SAMPLES, K.EVAL_SAMPLES, K.SEED, K.GLOBAL_BATCH_SIZE, "d_batch_size",
                K.GRADIENT_ACCUMULATION_STEPS, K.MAX_SEQUENCE_LENGTH, "max_predictions_per_seq",
                K.OPT_LR_WARMUP_STEPS, K.NUM_WARMUP_STEPS, K.OPT_LR_TRAINING_STEPS)
# start_warmup_step may be negative: NVIDIA's published 64-GPU logs set it to -25
NUMBER_VALUES = (K.START_WARMUP_STEP, K.OPT_BASE_LR, K.OPT_LAMB_WEIGHT_DECAY, K.OPT_LAMB_BETA_1, K.OPT_LAMB_BETA_2,
                 K.OPT_LAMB_LR_DECAY_POLY_POWER, K.OPT_LAMB_EPSILON, "opt_epsilon")


@dataclass
class Event:
    line: int  # 1-based, as an editor counts lines
    time_ms: float
    key: str
    value: object
    metadata: dict


@dataclass
class ParsedLog:
    path: Path
    events: list[Event] = field(default_factory=list)  # the events before the first problem
    damaged: list[tuple[int, str]] = field(default_factory=list)  # (line, why) for lines that are no event
    problem: tuple[int, str] | None = None  # the first line whose event breaks a rule, and the rule
    # (line, why): what bertctl doubts in a log that published, accepted results also do; never a failure
    warnings: list[tuple[int, str]] = field(default_factory=list)
    lines: int = 0
    sha256: str | None = None  # of the file's bytes: names a published log (orchestrator/results/accepted.py)
    # every line an event, and few and short enough that the official tools read the whole file in seconds:
    # a log that breaks a rule may still be judged by them (what the package checker would say of it)
    official_safe: bool = False
    has_run_start: bool = False
    has_run_stop: bool = False

    @property
    def problem_text(self) -> str | None:
        if self.damaged:
            line, why = self.damaged[0]
            return f"line {line}: {why}"
        return f"line {self.problem[0]}: {self.problem[1]}" if self.problem else None

    def incomplete(self) -> str | None:
        """Why this is not a whole run (no run_start, no run_stop), or None: what a finished log needs."""
        if not self.has_run_start:
            return f"line {self.lines}: no run_start"
        if not self.has_run_stop:
            return f"line {self.lines}: no run_stop"
        return None


class _NonFinite(ValueError):
    pass


def open_regular(path: str | Path, what: str = "result log"):
    """The file opened for reading as bytes, if it is a regular file; else one UserError naming it.

    O_NONBLOCK: opening a FIFO without a writer would otherwise wait forever.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise UserError(f"cannot read the {what}: {e.strerror}", where=str(path)) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UserError(f"not a regular file ({_kind(mode)}): expected a {what}", where=str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bounded(path: str | Path, limit: int = MAX_FILE_BYTES, what: str = "result log") -> tuple[bytes, float]:
    """(content, mtime) of a regular file no larger than `limit`; else one UserError naming it."""
    with open_regular(path, what) as f:
        mtime = os.fstat(f.fileno()).st_mtime
        data = f.read(limit + 1)
    if len(data) > limit:
        raise UserError(f"larger than {limit // (1024 * 1024)} MiB: not a {what}", where=str(path))
    return data, mtime


def read_tail(path: str | Path, limit: int, what: str = "run log") -> str:
    """The last `limit` bytes of a regular file as text (a whole log may be gigabytes of output)."""
    with open_regular(path, what) as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(max(0, size - limit))
        return f.read(limit).decode("utf-8", errors="replace")


def parse(path: str | Path) -> ParsedLog:
    """Every event of the log, checked in order; stops at the first damaged line or broken rule."""
    data, mtime = read_bounded(path)
    log = ParsedLog(Path(path), sha256=hashlib.sha256(data).hexdigest())
    # not the mtime alone: a log copied out of an archive may carry any mtime (1970, say)
    rules = Rules(latest_ms=max(mtime, time.time()) * 1000.0 + CLOCK_SKEW_MS, accepted=accepted.accepted_log(log.sha256))
    lines = data.decode("utf-8", errors="replace").split("\n")
    work = events = 0
    log.lines = len(lines) - (1 if lines and lines[-1] == "" else 0)
    for number, line in enumerate(lines, start=1):
        if MARKER not in line:
            continue
        event, why = parse_line(line, number)
        if why and number == len(lines):
            continue  # no newline yet: a line the run is still writing (status reads logs in progress)
        if why:
            log.damaged.append((number, why))
            continue
        work, events = work + len(line) ** 2, events + 1
        if log.damaged or log.problem:
            continue  # keep finding damaged lines; the rules only judge an intact prefix
        if len(log.events) >= MAX_EVENTS or work > MAX_PARSER_WORK:
            log.problem = (number, f"more than {MAX_EVENTS:,} events" if len(log.events) >= MAX_EVENTS else
                           "too many long events: the official parser would take minutes (its time grows with "
                           "the square of each line's length)")
            continue
        broken = rules.check(event)
        if broken:
            log.problem = (number, broken)
            continue
        log.events.append(event)
    if not log.problem and not log.damaged:
        log.problem = rules.finish()
    log.has_run_start, log.has_run_stop = rules.run_start is not None, rules.run_stop is not None
    log.warnings = rules.warnings
    log.official_safe = not log.damaged and events <= MAX_EVENTS and work <= MAX_PARSER_WORK
    return log


def parse_line(line: str, number: int) -> tuple[Event | None, str | None]:
    """(event, None) for one intact `:::MLLOG {json}` line, else (None, what is wrong)."""
    if line.count(MARKER) > 1:
        return None, f"{line.count(MARKER)} :::MLLOG events on one line"
    _, marker, text = line.partition(MARKER + " ")
    if not marker:
        return None, "a :::MLLOG marker without its event"
    if len(text) > MAX_EVENT_CHARS:
        return None, f"an event of {len(text):,} characters (at most {MAX_EVENT_CHARS:,})"
    try:
        raw = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float, parse_int=_bounded_int)
    except _NonFinite as e:
        return None, str(e)
    except (ValueError, RecursionError) as e:
        return None, f"not valid JSON ({e})"
    if not isinstance(raw, dict):
        return None, "not a JSON object"
    missing = [k for k in FIELDS if k not in raw]
    if missing:
        return None, f"an event without {', '.join(missing)}"
    if not isinstance(raw["key"], str):
        return None, f"an event whose key is {json.dumps(raw['key'])}, not a name"
    return Event(number, raw["time_ms"], raw["key"], raw["value"], raw["metadata"]), None


def _reject_constant(name: str):
    raise _NonFinite(f"a non-finite number ({name}): JSON has none")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NonFinite(f"a number out of range ({text[:40]})")
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > 19 or abs(int(text)) > MAX_INT:
        raise _NonFinite(f"an integer beyond 64 bits ({text[:40]}{'...' if len(text) > 40 else ''})")
    return int(text)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_count(value) -> bool:
    """A sample count or epoch number: not necessarily whole (some logs count epochs in fractions)."""
    return _is_number(value) and 0 <= value <= MAX_SAMPLES


def _is_counts(value) -> bool:
    """A count, or a list of them: NVIDIA's tracked_stats give their step as [epoch, step], e.g. [2, 3321]."""
    if isinstance(value, list):
        return 0 < len(value) <= 8 and all(_is_count(v) for v in value)
    return _is_count(value)


class Rules:
    """The rules one MLPerf run's events keep, checked event by event (`check` says the first broken one)."""

    def __init__(self, latest_ms: float, accepted: accepted.AcceptedLog | None = None):
        self.latest_ms = latest_ms
        self.accepted = accepted  # a published log excused from some rules (orchestrator/results/accepted.yaml)
        self.last_ms: float | None = None  # the latest time before run_start
        self.run_start_ms: float | None = None
        self.key_ms: dict[str, float] = {}  # since run_start: each key's last time
        self.clock: tuple[float, int, str] | None = None  # since run_start: the latest time, its line and key
        self.late_evals = False  # evaluations logged after later events, with the time they were taken
        self.evaluation: tuple[float, int, str] | None = None  # since run_start: the latest eval_start or eval_stop
        self.excused: set[str] = set()  # the accepted log's rules already said once
        self.run_start: int | None = None  # its line
        self.run_stop: int | None = None
        self.counts: dict[tuple[str, str], float] = {}  # (key, metadata field) -> the last count
        self.evals: list[tuple[int, float]] = []  # (line, accuracy)
        self.status: str | None = None
        self.global_batch_size: float | None = None
        self.train_samples: float | None = None
        self.run_stop_ms: float | None = None
        self.warnings: list[tuple[int, str]] = []  # (line, why): doubts that published logs share

    def warn(self, e: Event, why: str) -> None:
        self.warnings.append((e.line, why))

    def broken(self, e: Event, rule: str, why: str) -> str | None:
        """The rule's failure; for a published log accepted with this break, a warning (once) instead."""
        if self.accepted is None or not self.accepted.excuses(rule):
            return why
        if rule not in self.excused:
            self.excused.add(rule)
            self.warn(e, self.accepted.warning(rule, why))
        return None

    def check(self, e: Event) -> str | None:
        # the order of events first: a copied line breaks it and, less tellingly, the order of times too
        if not e.key:  # Supermicro's published v1.0 logs name their submission_* values with ""
            self.warn(e, f"an event with an empty key (value {json.dumps(e.value)[:40]}): the official checker "
                         "ignores it")
        if self.run_stop is not None and e.key in NOT_AFTER_RUN_STOP:  # first: a copied line says more here
            return f"{e.key} after run_stop (line {self.run_stop})"
        return self._metadata(e) or self._value(e) or self._order(e) or self._time(e)

    def finish(self) -> tuple[int, str] | None:
        """What the whole run claims, once every event is read: (run_stop's line, why) or None."""
        if self.run_stop is None or self.run_start_ms is None or self.run_stop_ms is None:
            return None
        evaluated = max((count for (key, name), count in self.counts.items()
                         if key == K.EVAL_ACCURACY and name == K.EPOCH_NUM), default=0)
        samples = max(evaluated if self._counts_samples(evaluated) else 0, self.train_samples or 0)
        seconds = (self.run_stop_ms - self.run_start_ms) / 1000.0
        if samples and samples > MAX_SAMPLES_PER_S * max(seconds, 1e-3):
            rate = samples / max(seconds, 1e-3)
            return (self.run_stop, f"{samples:,.0f} samples in {seconds:,.3f} s is {rate:,.0f} samples/s: more "
                                   f"than {MAX_SAMPLES_PER_S:,} (13 times the fastest published BERT run)")
        return None

    def _counts_samples(self, epoch_num: float) -> bool:
        """Does eval_accuracy's epoch_num count samples (>= one global batch), as MLPerf BERT logs it since
        v1.0? Earlier logs count epochs (1, 1, 2, ...), and repeat them."""
        return epoch_num >= (self.global_batch_size or 2)

    def _time(self, e: Event) -> str | None:
        """Before run_start the ranks' clocks may disagree by RANK_CLOCK_SKEW_MS. From run_start on each
        key keeps its own order, nothing is earlier than run_start, an interval ends after it started,
        and time never goes back (`_clock_goes_on`)."""
        t = e.time_ms
        if not _is_number(t):
            return f"time_ms is {json.dumps(t)[:40]}, not a number"
        if not EARLIEST_MS <= t <= self.latest_ms:
            why = f"time_ms {t} is not a time this log could have been written at (2000 to now)"
            if e.key in (K.RUN_START, K.RUN_STOP):
                return why
            if t > self.latest_ms:
                return self.broken(e, TIME_RANGE, why)  # a published log accepted with it: its time is not used
            # Google's published v0.7 logs write the submission_* keys with time_ms 0: no time rather than a
            # false one. The event is kept, its time not used
            self.warn(e, f"{e.key}'s {why}; its time is not used")
            return None
        if self.run_start_ms is None or e.key == K.RUN_START:
            if self.last_ms is not None and t < self.last_ms - RANK_CLOCK_SKEW_MS:
                return f"time_ms {t} is earlier than the event before ({self.last_ms}) by more than clocks differ"
            self.last_ms = t if self.last_ms is None else max(t, self.last_ms)
            if e.key == K.RUN_START:
                self.run_start_ms = t
                self.clock = (t, e.line, e.key)
            return None
        before = [(self.run_start_ms, "run_start's"), (self.key_ms.get(e.key), f"the previous {e.key}'s")]
        if e.key in INTERVAL_STARTS:  # an interval ends after it started
            before.append((self.key_ms.get(INTERVAL_STARTS[e.key]), f"its {INTERVAL_STARTS[e.key]}'s"))
        for earlier, whose in before:
            if earlier is not None and t < earlier:
                return f"time_ms {t} is earlier than the event before ({whose} {earlier}) by {(earlier - t) / 1000:,.3f} s"
        broken = self._evaluation_ended(e, t) or self._clock_goes_on(e, t)
        if broken:
            return broken
        if e.key in (K.EVAL_START, K.EVAL_STOP):
            self.evaluation = (t, e.line, e.key)
        if e.key == K.RUN_STOP:
            self.run_stop_ms = t
        self.key_ms[e.key] = t
        return None

    def _evaluation_ended(self, e: Event, t: float) -> str | None:
        """An accuracy is known, and a run stops, only once the evaluation ended: eval_accuracy and run_stop
        are not timed before the eval_stop (or eval_start) logged above them. No published log breaks it."""
        last_eval = self.key_ms.get(K.EVAL_ACCURACY)
        if e.key == K.RUN_STOP and last_eval is not None and t < last_eval:
            return self.broken(e, STOP_BEFORE_EVAL, f"run_stop's time_ms {t} is earlier than the last eval_accuracy's "
                                                    f"({last_eval}): the run stopped before the evaluation it ends")
        if e.key not in (K.EVAL_ACCURACY, K.RUN_STOP) or self.evaluation is None or t >= self.evaluation[0]:
            return None
        ended, line, key = self.evaluation
        if e.key == K.RUN_STOP:
            return self.broken(e, STOP_BEFORE_EVAL, f"run_stop's time_ms {t} is earlier than line {line}'s {key} ({ended}): "
                                                    "the run stopped before the evaluation it ends")
        return self.broken(e, EARLY_ACCURACY, f"eval_accuracy's time_ms {t} is earlier than line {line}'s {key} ({ended}): "
                                              f"{EARLY_ACCURACY}")

    def _clock_goes_on(self, e: Event, t: float) -> str | None:
        """Once the run started, time never goes back: an event is not earlier than any event before it.

        Only the published Gaudi logs of v1.0 to v3.1 (orchestrator/results/accepted.yaml, by content) keep
        it in their own way: they evaluate asynchronously, each eval_accuracy written after later training
        with the time it was taken, and run_stop carries the converging evaluation's time while training
        went on. The form alone cannot be told from a late evaluation's time taken back (a score one
        evaluation better), so any other log going back fails: a clock set back in the middle of a run,
        an evaluation written late, run_stop moved before training it holds."""
        latest, line, key = self.clock
        if t >= latest:
            self.clock = (t, e.line, e.key)
            return None
        if self.late_evals and e.key in (K.EVAL_ACCURACY, K.RUN_STOP):
            return None  # an accepted log's asynchronous evaluation, said once
        if e.key == K.EVAL_ACCURACY:
            broken = self.broken(e, ASYNC_EVAL, f"eval_accuracy's time_ms {t} is earlier than line {line}'s ({key} at {latest}): "
                                                "written after later events with the time the evaluation was taken "
                                                "(asynchronous evaluation), which only the published Gaudi logs of v1.0 "
                                                "to v3.1 show")
            self.late_evals = broken is None
            return broken
        return self.broken(e, TIME_ORDER, f"time_ms {t} is earlier than line {line}'s ({key} at {latest}): the clock "
                                          f"went back {(latest - t) / 1000:,.3f} s after run_start")

    def _metadata(self, e: Event) -> str | None:
        if not isinstance(e.metadata, dict):
            return f"{e.key}'s metadata is {json.dumps(e.metadata)[:40]}, not an object"
        for name in COUNT_METADATA:
            if name not in e.metadata:
                continue
            value = e.metadata[name]
            if not _is_counts(value):
                return f"{e.key}'s {name} is {json.dumps(value)[:40]}, not a number from 0 to {MAX_SAMPLES:.0e}"
            if isinstance(value, list) or name == K.EPOCH_COUNT:
                continue  # [epoch, step]: no one order to keep; a block's length: packed runs' blocks end at the first step past it
            previous = self.counts.get((e.key, name))
            if previous is not None and value < previous:
                return f"{e.key}'s {name} {value} is below the previous {e.key}'s {previous}"
            if (e.key == K.EVAL_ACCURACY and name == K.EPOCH_NUM and previous == value
                    and self._counts_samples(value)):
                return (f"a second evaluation at epoch_num {value:,} (samples trained): no published log "
                        "evaluates twice at one sample count")
            self.counts[(e.key, name)] = value
        if e.key == K.RUN_STOP and not isinstance(e.metadata.get(K.STATUS), str):
            return f"run_stop's status is {json.dumps(e.metadata.get(K.STATUS))[:40]}, not a word"
        return None

    def _value(self, e: Event) -> str | None:
        v = e.value
        if isinstance(v, list) and len(v) == 1 and e.key in COUNT_VALUES + NUMBER_VALUES:
            v = v[0]  # Graphcore's published logs give train_samples and eval_samples as [n]
        if e.key == K.EVAL_ACCURACY:
            if not _is_number(v) or not 0.0 <= v <= 1.0:
                return f"eval_accuracy is {json.dumps(v)[:40]}, not a number from 0 to 1"
        elif e.key in COUNT_VALUES:
            if not (_is_number(v) and 0 <= v <= MAX_SAMPLES):
                return f"{e.key} is {json.dumps(v)[:40]}, not a number from 0 to {MAX_SAMPLES:.0e}"
        elif e.key in NUMBER_VALUES:
            if not _is_number(v):
                return f"{e.key} is {json.dumps(v)[:40]}, not a number"
        if e.key in POSITIVE_VALUES and _is_number(v) and v <= 0:
            return f"{e.key} is {v}: a BERT run needs it above 0"
        if e.key == K.GLOBAL_BATCH_SIZE and _is_number(v):
            if v > MAX_GLOBAL_BATCH:
                return (f"global_batch_size is {v:,}: more than {MAX_GLOBAL_BATCH:,} sequences (60 times the "
                        "largest published batch)")
            self.global_batch_size = v
        elif e.key == K.TRAIN_SAMPLES and _is_number(v):
            self.train_samples = v
        elif e.key in STRING_VALUES:
            if not isinstance(v, str):
                return f"{e.key} is {json.dumps(v)[:40]}, not a string"
        elif e.key == "tracked_stats" and not isinstance(v, dict):
            return f"tracked_stats is {json.dumps(v)[:40]}, not an object"
        return None

    def _order(self, e: Event) -> str | None:
        if self.run_start is None and e.key in TRAINING_KEYS:
            return f"{e.key} before run_start: training and evaluation happen in the timed run"
        if self.run_start is None and e.key == K.EVAL_ACCURACY:
            if e.metadata.get(K.EPOCH_NUM):
                return (f"eval_accuracy at epoch_num {e.metadata.get(K.EPOCH_NUM)} before run_start: training happens "
                        "in the timed run")
            self.warn(e, "an evaluation of the initial checkpoint (epoch_num 0) before run_start, as PCL's published "
                         "v1.0 logs have it")
        if e.key == K.RUN_START:
            if self.run_start is not None:
                return f"a second run_start (the first is on line {self.run_start})"
            self.run_start = e.line
        elif e.key == K.RUN_STOP:
            if self.run_start is None:
                return "run_stop before any run_start"
            if e.metadata.get(K.STATUS) == "success" and self.evals:
                final = self.evals[-1][1]
                earlier = next(((line, acc) for line, acc in self.evals[:-1] if acc >= final), None)
                if earlier:  # a run stops at the first evaluation that reaches its target; Google's
                    # published v1.1 TPU logs go on evaluating (the time to train only grows)
                    self.warn(e, f"evaluations after convergence: line {earlier[0]} already reached the final "
                                 f"accuracy {final}")
            self.run_stop = e.line
        elif e.key == K.EVAL_ACCURACY:
            self.evals.append((e.line, e.value))
        return None


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a plain file"
