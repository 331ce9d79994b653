"""Ways to damage a valid MLPerf result log (written by tests/mllog_factory.py), by class, for
tests/test_hostile_logs.py and benchmarks/hostile_logs.py.

Each `Case` edits the log's lines (or replaces the file) and names what bertctl must say: a
substring of the reason and whether the log is bad input (`damaged`: a line that is no event, or a
file that is no log: one line, exit 2) or a log whose events break MLPerf's rules (the run FAILS).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

MARK = ":::MLLOG "
RAW = "@@RAW@@"


@dataclass(frozen=True)
class Case:
    name: str  # class/what
    damage: Callable[[list[str]], list[str]] | None  # on the log's lines; None: `replace` makes the file
    reason: str  # a substring of what bertctl says
    damaged: bool = False  # bad input (exit 2) rather than a failed run
    replace: Callable[[Path], None] | None = None

    @property
    def cls(self) -> str:
        return self.name.split("/")[0]

    def apply(self, path: Path) -> None:
        if self.replace is not None:
            path.unlink()
            self.replace(path)
            return
        lines = path.read_text().splitlines()
        path.write_text("\n".join(self.damage(lines)) + "\n")


def event_of(line: str) -> dict:
    return json.loads(line.partition(MARK)[2])


def find(lines: list[str], key: str, last: bool = False) -> int:
    """Index of the (first or last) line whose event has this key."""
    hits = [i for i, line in enumerate(lines) if MARK in line and event_of(line)["key"] == key]
    return hits[-1] if last else hits[0]


def with_field(line: str, name: str, raw: str, within: str | None = None) -> str:
    """The line with one field (of the event, or of its `within` object) set to raw JSON text, e.g. NaN."""
    event = event_of(line)
    target = event if within is None else event[within]
    target[name] = RAW
    return MARK + json.dumps(event).replace(json.dumps(RAW), raw)


def set_field(key: str, name: str, raw: str, within: str | None = None, last: bool = True):
    def damage(lines):
        i = find(lines, key, last)
        lines[i] = with_field(lines[i], name, raw, within)
        return lines
    return damage


def insert_copy(key: str, before_key: str, copies: int = 1, last: bool = True):
    def damage(lines):
        line, at = lines[find(lines, key, last)], find(lines, before_key, last=True)
        return lines[:at] + [line] * copies + lines[at:]
    return damage


def before_last_line(key: str):
    """The issue's example: a second copy of the key's line just before the log's last line."""
    def damage(lines):
        return lines[:-1] + [lines[find(lines, key)]] + lines[-1:]
    return damage


def append_copy(key: str, copies: int = 1):
    def damage(lines):
        return lines + [lines[find(lines, key, last=True)]] * copies
    return damage


def delete(key: str):
    def damage(lines):
        del lines[find(lines, key)]
        return lines
    return damage


def run_stop_first(lines):
    """A copy of run_stop, timed like run_start, just before run_start."""
    at = find(lines, "run_start")
    stop = with_field(lines[find(lines, "run_stop")], "time_ms", str(event_of(lines[at])["time_ms"]))
    return lines[:at] + [stop] + lines[at:]


def run_stop_at(offset_ms: int):
    def damage(lines):
        start = event_of(lines[find(lines, "run_start")])["time_ms"]
        i = find(lines, "run_stop")
        lines[i] = with_field(lines[i], "time_ms", str(start + offset_ms))
        return lines
    return damage


def block_stop_before_start(lines):
    """The last block_stop timed 1 ms before its block_start (each key alone stays in order)."""
    start = event_of(lines[find(lines, "block_start", last=True)])["time_ms"]
    i = find(lines, "block_stop", last=True)
    lines[i] = with_field(lines[i], "time_ms", str(start - 1))
    return lines


def two_on_one_line(lines):
    i = find(lines, "eval_accuracy")
    return lines[:i] + [lines[i] + " " + lines[i + 1]] + lines[i + 2:]


def long_line(chars: int):
    def damage(lines):
        i = find(lines, "submission_platform")
        lines[i] = with_field(lines[i], "value", json.dumps("x" * chars))
        return lines
    return damage


def no_space_after_marker(lines):
    i = find(lines, "seed")
    lines[i] = lines[i].replace(MARK, MARK.strip())
    return lines


def many_events(count: int):
    def damage(lines):
        at = find(lines, "init_stop")
        filler = with_field(lines[find(lines, "submission_platform")], "key", json.dumps("filler_note"))
        return lines[:at] + [filler] * count + lines[at:]
    return damage


def repeat_first_eval(lines):
    """The first evaluation written twice, a millisecond apart: what a crash, then `resume`, writes."""
    at = find(lines, "eval_accuracy")
    again = with_field(lines[at], "time_ms", str(event_of(lines[at])["time_ms"] + 1))
    return lines[: at + 1] + [again] + lines[at + 1:]


def final_eval_at_previous_epoch_num(lines):
    """The final evaluation claims the previous one's sample count: fewer samples to converge."""
    evals = [i for i, line in enumerate(lines) if MARK in line and event_of(line)["key"] == "eval_accuracy"]
    previous = event_of(lines[evals[-2]])["metadata"]["epoch_num"]
    lines[evals[-1]] = with_field(lines[evals[-1]], "epoch_num", str(previous), "metadata")
    return lines


def squeeze_run(ms: int):
    """Every event from run_start to run_stop moved into `ms` milliseconds: the same samples, impossibly fast."""
    def damage(lines):
        start, stop = find(lines, "run_start"), find(lines, "run_stop")
        t0, t1 = event_of(lines[start])["time_ms"], event_of(lines[stop])["time_ms"]
        for i in range(start, stop + 1):
            if MARK in lines[i]:
                t = event_of(lines[i])["time_ms"]
                lines[i] = with_field(lines[i], "time_ms", str(round(t0 + (t - t0) * ms / (t1 - t0))))
        return lines
    return damage


def fifo(path: Path) -> None:
    os.mkfifo(path)


def directory(path: Path) -> None:
    path.mkdir()


def device(path: Path) -> None:
    path.symlink_to("/dev/zero")


def too_big(path: Path) -> None:
    from orchestrator.results.resultlog import MAX_FILE_BYTES

    with open(path, "wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)


def cases() -> list[Case]:
    from orchestrator.results.resultlog import MAX_EVENTS

    time = [Case(f"time/run_stop {raw}", set_field("run_stop", "time_ms", raw), why, damaged)
            for raw, why, damaged in (
                ("NaN", "non-finite number (NaN)", True), ("Infinity", "non-finite number (Infinity)", True),
                ("-Infinity", "non-finite number (-Infinity)", True), ("1e400", "out of range", True),
                ("true", "time_ms is true, not a number", False), ('"1760000000000"', "not a number", False),
                ("[1]", "not a number", False), ("null", "time_ms is null", False),
                ("-1", "not a time this log could have been written at", False),
                ("9000000000000000", "not a time this log could have been written at", False),
                ("1" + "0" * 30, "beyond 64 bits", True))]
    time += [Case("time/first far in the future", set_field("cache_clear", "time_ms", "4102444800000", last=False),
                  "not a time this log could have been written at"),
             Case("time/run_stop before run_start's time", run_stop_at(-60_000), "earlier than the event before"),
             Case("time/negative minutes", run_stop_at(-1), "earlier than the event before"),
             Case("time/a block that stops before it starts", block_stop_before_start, "its block_start's")]
    order = [
        Case("order/second run_start before the last line", before_last_line("run_start"), "a second run_start"),
        Case("order/run_stop before run_start", run_stop_first, "run_stop before any run_start"),
        Case("order/second run_stop", append_copy("run_stop"), "run_stop after run_stop"),
        Case("order/eval after run_stop", append_copy("eval_accuracy"), "eval_accuracy after run_stop"),
        Case("order/no run_stop", delete("run_stop"), "no run_stop"),
        Case("order/no run_start", delete("run_start"), "block_start before run_start"),
        # evaluations after convergence alone are a warning (Google's published v1.1 logs have them); copies
        # of one evaluation repeat its sample count, which no published log does
        Case("order/thousands of evals after convergence", insert_copy("eval_accuracy", "train_samples", 3000),
             "a second evaluation at epoch_num"),
        Case("order/thousands of events after run_stop", append_copy("eval_accuracy", 3000), "after run_stop"),
    ]
    accuracy = [Case(f"accuracy/last {raw}", set_field("eval_accuracy", "value", raw), why, damaged)
                for raw, why, damaged in (
                    ("NaN", "non-finite number (NaN)", True), ("Infinity", "non-finite number (Infinity)", True),
                    ("1.5", "not a number from 0 to 1", False), ("-0.1", "not a number from 0 to 1", False),
                    ('"0.73"', "not a number from 0 to 1", False), ("null", "not a number from 0 to 1", False),
                    ("[0.73]", "not a number from 0 to 1", False), ("true", "not a number from 0 to 1", False))]
    counts = [Case(f"counts/last epoch_num {raw}", set_field("eval_accuracy", "epoch_num", raw, "metadata"), why)
              for raw, why in (("-5", "not a number from 0"), ("1e20", "not a number from 0"),
                               ('"x"', "not a number from 0"), ("true", "not a number from 0"),
                               ("null", "not a number from 0"), ("0", "is below the previous"))]
    counts += [Case("counts/block_stop samples_count NaN", set_field("block_stop", "samples_count", "NaN", "metadata"),
                    "non-finite number (NaN)", damaged=True),
               Case("counts/train_samples -1", set_field("train_samples", "value", "-1"), "train_samples is -1"),
               Case("counts/seed 1e30", set_field("seed", "value", "1e30", last=False), "seed is 1e+30")]
    keys = [Case("key/null", set_field("run_stop", "key", "null"), "key is null", damaged=True),
            Case("key/number", set_field("eval_accuracy", "key", "5"), "key is 5", damaged=True),
            ]
    types = [Case("types/run_stop metadata a list", set_field("run_stop", "metadata", "[1, 2]"), "not an object"),
             Case("types/run_stop metadata null", set_field("run_stop", "metadata", "null"), "not an object"),
             Case("types/run_stop status 7", set_field("run_stop", "status", "7", "metadata"), "status is 7"),
             Case("types/division a number", set_field("submission_division", "value", "5", last=False),
                  "submission_division is 5, not a string"),
             Case("types/benchmark a list", set_field("submission_benchmark", "value", '["bert"]', last=False),
                  "not a string"),
             Case("types/global_batch_size a string", set_field("global_batch_size", "value", '"448"', last=False),
                  "not a number")]
    lines = [Case("lines/two events on one line", two_on_one_line, "2 :::MLLOG events on one line", damaged=True),
             Case("lines/300 KB line", long_line(300_000), "an event of 300,", damaged=True),
             Case("lines/marker without its space", no_space_after_marker, "marker without its event", damaged=True),
             Case("lines/too many events", many_events(MAX_EVENTS + 1), f"more than {MAX_EVENTS:,} events")]
    files = [Case("file/FIFO", None, "not a regular file (a FIFO)", damaged=True, replace=fifo),
             Case("file/directory", None, "not a regular file (a directory)", damaged=True, replace=directory),
             Case("file/device", None, "not a regular file (a device)", damaged=True, replace=device),
             Case("file/too big", None, "larger than 64 MiB", damaged=True, replace=too_big)]
    lies = [Case("lie/an evaluation repeated at one epoch_num", repeat_first_eval, "a second evaluation at epoch_num"),
            Case("lie/the final evaluation reuses the previous epoch_num", final_eval_at_previous_epoch_num,
                 "a second evaluation at epoch_num"),
            Case("lie/2.4 M samples in 60 ms", squeeze_run(60), "samples/s: more than 10,000,000"),
            Case("lie/10^12 samples in 20 minutes", set_field("eval_accuracy", "epoch_num", "1000000000000", "metadata"),
                 "samples/s: more than 10,000,000"),
            Case("lie/global_batch_size 0", set_field("global_batch_size", "value", "0", last=False),
                 "global_batch_size is 0: a BERT run needs it above 0"),
            Case("lie/global_batch_size 10^12", set_field("global_batch_size", "value", "1000000000000", last=False),
                 "global_batch_size is 1,000,000,000,000: more than 1,000,000"),
            Case("lie/negative learning rate", set_field("opt_base_learning_rate", "value", "-0.000425", last=False),
                 "opt_base_learning_rate is -0.000425"),
            Case("lie/max_sequence_length 0", set_field("max_sequence_length", "value", "0", last=False),
                 "max_sequence_length is 0")]
    return time + order + accuracy + counts + keys + types + lines + files + lies
