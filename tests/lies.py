"""Lies told with a published, accepted result set, for tests/test_lies.py.

The base is Dell's v5.0 set on one XE9712 with four GB200 (tests/data/mlperf-sets/v5.0/Dell/
1xXE9712x4GB200.tar.gz: 10 runs, score 6.092 min, RCP-scaled 6.307). Each `Lie` edits its logs in a small
transformation, the cheap ways to a better score or a result that is not one, and names the reason
bertctl must give and whether the package checker (official tools) finds it at all. A lie about one
run is told in two runs (RUNS): olympic scoring drops one failing run, two fail the set.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from hostile_logs import MARK, event_of, with_field

from trainer.config.closed_rules import WAIVER_KEY

RUNS = ("result_3.txt", "result_7.txt")


@dataclass(frozen=True)
class Lie:
    name: str
    tell: Callable[[Path], None]  # edits the set's bert/ folder in place
    reason: str  # a substring of bertctl's one-line reason
    package_checker_finds_it: bool = False


# ---- editing logs


def lines_of(path: Path) -> list[str]:
    return path.read_text().splitlines()


def write(path: Path, lines: list[str]) -> None:
    path.write_text("\n".join(lines) + "\n")


def keyed(lines: list[str], key: str) -> list[int]:
    return [i for i, line in enumerate(lines) if MARK in line and event_of(line)["key"] == key]


def in_runs(edit: Callable[[list[str]], list[str]], runs=RUNS):
    def tell(folder: Path) -> None:
        for name in runs:
            write(folder / name, edit(lines_of(folder / name)))
    return tell


def in_every_run(edit):
    def tell(folder: Path) -> None:
        for path in sorted(folder.glob("result_*.txt")):
            write(path, edit(lines_of(path)))
    return tell


def set_time(line: str, t: float) -> str:
    return with_field(line, "time_ms", str(round(t)))


def time_of(line: str) -> float:
    return event_of(line)["time_ms"]


def stop_before_last_eval(lines: list[str]) -> list[str]:
    """run_stop a minute before the last evaluation: a minute off the time to train."""
    stop, last_eval = keyed(lines, "run_stop")[0], keyed(lines, "eval_accuracy")[-1]
    lines[stop] = set_time(lines[stop], time_of(lines[last_eval]) - 60_000)
    return lines


def clock_back(ms: int):
    """From the middle of the run on, every time set back: the run looks `ms` shorter."""
    def edit(lines):
        start, stop = keyed(lines, "run_start")[0], keyed(lines, "run_stop")[0]
        for i in range((start + stop) // 2, len(lines)):
            if MARK in lines[i] and time_of(lines[i]) > 0:
                lines[i] = set_time(lines[i], time_of(lines[i]) - ms)
        return lines
    return edit


def squeeze(factor: float):
    """Every time after run_start brought `factor` times closer to it."""
    def edit(lines):
        start = keyed(lines, "run_start")[0]
        t0 = time_of(lines[start])
        for i in range(start + 1, len(lines)):
            if MARK in lines[i]:
                lines[i] = set_time(lines[i], t0 + (time_of(lines[i]) - t0) / factor)
        return lines
    return edit


def last_eval_written_late(lines: list[str]) -> list[str]:
    """The last evaluation's accuracy and run_stop timed 2 and 3 ms after the evaluation before, their lines
    kept: the form of an evaluation written late with the time it was taken (asynchronous evaluation), one
    evaluation interval off the time to train."""
    evals, stop = keyed(lines, "eval_accuracy"), keyed(lines, "run_stop")[0]
    before = time_of(lines[evals[-2]])
    lines[evals[-1]] = set_time(lines[evals[-1]], before + 2)
    lines[stop] = set_time(lines[stop], before + 3)
    return lines


def run_start_timed_after_first_block(lines: list[str]) -> list[str]:
    """run_start timed at the first evaluation, its line kept: the first block trains untimed."""
    start, first_eval = keyed(lines, "run_start")[0], keyed(lines, "eval_accuracy")[0]
    lines[start] = set_time(lines[start], time_of(lines[first_eval]))
    return lines


def run_start_moved_after_first_block(lines: list[str]) -> list[str]:
    """run_start moved, line and time, to the first evaluation."""
    start, first_eval = keyed(lines, "run_start")[0], keyed(lines, "eval_accuracy")[0]
    moved = set_time(lines[start], time_of(lines[first_eval]))
    return lines[:start] + lines[start + 1:first_eval + 1] + [moved] + lines[first_eval + 1:]


def set_value(key: str, value, first_only: bool = True):
    def edit(lines):
        for i in keyed(lines, key)[:1 if first_only else None]:
            lines[i] = with_field(lines[i], "value", json.dumps(value))
        return lines
    return edit


def insert_key(key: str, value):
    """A key the log did not have, logged before init_stop with the time of the line before."""
    def edit(lines):
        at = keyed(lines, "init_stop")[0]
        template = lines[keyed(lines, "global_batch_size")[0]]
        line = with_field(with_field(template, "key", json.dumps(key)), "value", json.dumps(value))
        return lines[:at] + [line] + lines[at:]
    return edit


def scale_samples(factor: float):
    """Every sample count of the run (epoch_num, the eval values, train_samples) multiplied."""
    def edit(lines):
        for i, line in enumerate(lines):
            if MARK not in line:
                continue
            event = event_of(line)
            if event["key"] in ("eval_start", "eval_stop", "train_samples") and isinstance(event["value"], (int, float)):
                line = with_field(line, "value", str(round(event["value"] * factor)))
            if isinstance(event["metadata"].get("epoch_num"), (int, float)) and event["metadata"]["epoch_num"] > 1:
                line = with_field(line, "epoch_num", str(round(event["metadata"]["epoch_num"] * factor)), "metadata")
            if event["key"] == "tracked_stats" and isinstance(event["value"].get("epoch_num"), (int, float)):
                value = dict(event["value"], epoch_num=round(event["value"]["epoch_num"] * factor))
                line = with_field(line, "value", json.dumps(value))
            lines[i] = line
        return lines
    return edit


def raise_an_accuracy(lines: list[str]) -> list[str]:
    """The evaluation before the last typed in higher, 0.7209: what a reader of the log would not notice."""
    i = keyed(lines, "eval_accuracy")[-2]
    lines[i] = with_field(lines[i], "value", "0.7209")
    return lines


def drop(key: str):
    def edit(lines):
        gone = set(keyed(lines, key))
        return [line for i, line in enumerate(lines) if i not in gone]
    return edit


def round_accuracies(digits: int):
    """Every eval_accuracy rounded to `digits` decimal places, as a copier hiding a copy would write them."""
    def edit(lines):
        for i in keyed(lines, "eval_accuracy"):
            lines[i] = with_field(lines[i], "value", repr(round(event_of(lines[i])["value"], digits)))
        return lines
    return edit


def copy_of(source: str, target: str, seed: int, shift_ms: int, evaluations: int | None = None, digits: int | None = None,
            first_left_out: bool = False):
    """`target` replaced by `source` with another seed, every time shifted; cut after `evaluations`
    evaluations and stopped there (aborted) when given: a truncated copy; its accuracies rounded to
    `digits` decimal places when given; its first eval_accuracy left out when asked."""
    def tell(folder: Path) -> None:
        lines = set_value("seed", seed)(lines_of(folder / source))
        if digits is not None:
            lines = round_accuracies(digits)(lines)
        if first_left_out:
            first = keyed(lines, "eval_accuracy")[0]
            lines = lines[:first] + lines[first + 1:]
        if evaluations is not None:
            cut = keyed(lines, "eval_accuracy")[evaluations - 1]
            stop = with_field(lines[keyed(lines, "run_stop")[0]], "status", '"aborted"', "metadata")
            lines = lines[:cut + 1] + [set_time(stop, time_of(lines[cut]) + 1)]
        lines = [set_time(line, time_of(line) + shift_ms) if MARK in line and time_of(line) > 0 else line for line in lines]
        write(folder / target, lines)
    return tell


LIES = [
    Lie("run_stop moved before the last evaluation", in_runs(stop_before_last_eval),
        "the run stopped before the evaluation it ends"),
    Lie("the last evaluation and run_stop timed just after the evaluation before", in_runs(last_eval_written_late),
        "an accuracy known before its evaluation ended"),
    Lie("the clock set back 15 s in the middle of the run", in_runs(clock_back(15_000)), "is earlier than the event before"),
    Lie("every time after run_start divided by 40", in_runs(squeeze(40)),
        "samples/s per accelerator: more than 3 x the fastest published GB200 result"),
    Lie("run_start timed after the first training block", in_runs(run_start_timed_after_first_block),
        "is earlier than the event before (run_start's "),
    Lie("run_start moved after the first training block", in_runs(run_start_moved_after_first_block),
        "before run_start: training and evaluation happen in the timed run", package_checker_finds_it=True),
    Lie("a run copied with a new seed and shifted times", copy_of("result_3.txt", "result_9.txt", 4242, 86_400_000),
        "result_9.txt and result_3.txt log the same 15 evaluation accuracies"),
    Lie("a truncated copy", copy_of("result_3.txt", "result_9.txt", 4242, 86_400_000, evaluations=9),
        "result_9.txt and result_3.txt log the same 9 evaluation accuracies"),
    Lie("a copy with its accuracies rounded to 6 digits", copy_of("result_3.txt", "result_9.txt", 4242, 86_400_000, digits=6),
        "result_9.txt and result_3.txt log the same 15 evaluation accuracies to 6 decimal places"),
    Lie("a copy with its first evaluation left out",
        copy_of("result_3.txt", "result_9.txt", 4242, 86_400_000, first_left_out=True),
        "result_9.txt and result_3.txt log the same 14 evaluation accuracies"),
    Lie("runs whose accuracies are not counted tokens in a set whose runs count them",
        in_runs(round_accuracies(4)), "one implementation logs one accuracy format"),
    Lie("one run with another hyperparameter", in_runs(set_value("opt_lamb_beta_1", 0.7), runs=("result_5.txt",)),
        "values of opt_lamb_beta_1"),
    Lie("one run logged by another system with the same batch",
        in_runs(set_value("submission_platform", "2xXE9712x4GB200"), runs=("result_5.txt",)), "the runs name 2 platforms"),
    Lie("eval_samples halved", in_runs(set_value("eval_samples", 5000)),
        "eval_samples 5000 in a closed log: MLPerf BERT rule '10,000-sample evaluation set'"),
    Lie("epoch_num inflated 30 %", in_runs(scale_samples(1.3)), "MLPerf BERT rule 'evaluation cadence'"),
    Lie("one evaluation's accuracy edited upward", in_runs(raise_an_accuracy),
        "eval_accuracy 0.7209 (line"),
    Lie("every seed removed", in_every_run(drop("seed")), "10 run(s) log no seed", package_checker_finds_it=True),
    Lie("max_sequence_length 128", in_runs(insert_key("max_sequence_length", 128)),
        "max_sequence_length 128 in a closed log: MLPerf BERT rule 'sequence length 512'"),
    Lie("max_predictions_per_seq 20", in_runs(set_value("max_predictions_per_seq", 20)),
        "max_predictions_per_seq 20 in a closed log: MLPerf BERT rule '76 masked positions'"),
    Lie("an ADAM run logged as closed", in_runs(insert_key("opt_name", "adam")),
        "opt_name 'adam' in a closed log: MLPerf BERT rule 'LAMB optimizer'"),
    Lie("LR decay power 2", in_runs(set_value("opt_lamb_learning_rate_decay_poly_power", 2.0)),
        "opt_lamb_learning_rate_decay_poly_power 2.0 in a closed log: MLPerf BERT rule 'reference LR schedule'"),
    Lie("a rehearsal run with the rules of scale waived", in_every_run(insert_key(WAIVER_KEY, True)),
        "a rehearsal, never a result"),
]


def ids() -> list[str]:
    return [re.sub(r"\W+", "-", lie.name).strip("-") for lie in LIES]
