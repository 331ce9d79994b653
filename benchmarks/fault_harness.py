"""Crash a run at every moment its files can record, resume it as `bertctl resume` does, count lost results.

    python benchmarks/fault_harness.py [--cases N] [--seed 0] [--torn 3] [--jobs 1]

One reference run (a tiny BERT on synthetic shards, converging at its third evaluation, a checkpoint
every CHECKPOINT_EVERY updates, every checkpoint kept) gives its MLPerf log and, in each checkpoint
(`log_bytes`), how long that log was when the checkpoint was taken. A SIGKILL at any moment leaves the
log cut at some byte B and, as the latest checkpoint, the newest one taken before the kill: one with
`log_bytes` < B surely, and one with `log_bytes` == B maybe (it was taken when the log had B bytes; the
kill came before or after it). A kill inside a checkpoint write also leaves its `.step_N.partial` folder.

For each line boundary B of the log (each event: step-boundary block events, evaluations, run_stop,
and the init phase), for both candidate checkpoints, and for `--torn` cuts inside lines (a write the
kill tore), the harness rebuilds that state in a fresh folder and does what `bertctl resume` does:
a run whose log holds run_stop is finished (status COMPLETED: not resumed); a run with a checkpoint
continues from it (the trainer, in this process); a run without one starts afresh (the job script
removes its log). It then compares the log with the reference's, event by event (times and measured
throughput aside), and counts:

  same      the events of the uninterrupted run, once each
  lost      the run no longer ends with the reference's run_stop (a converged run became something else)
  doubled   an evaluation or a run_stop logged twice
  different any other difference (a damaged log, another accuracy)

Prints the counts, the first example of each problem, and the machine and versions. Timings are
noisy on a shared machine; the counts are not.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the synthetic recipe (tests/synthetic.py)
sys.path.insert(0, str(REPO))

from synthetic import tiny_run_config  # noqa: E402

CHECKPOINT_EVERY = 4
RECIPE = dict(optim={"max_steps": 120}, model={"hidden_dropout": 0.0, "attention_dropout": 0.0},
              train={"target_accuracy": 0.04, "eval_every_samples": 80, "eval_start_samples": 80, "log_every_steps": 4},
              runtime={"num_threads": 1}, data={"eval_samples": 100},
              checkpoint={"every_steps": CHECKPOINT_EVERY, "keep": 10_000})
SEED = "0"


@dataclass(frozen=True)
class Crash:
    """What a kill leaves: the log's first `cut` bytes and, as latest, checkpoint `step` (None: none yet)."""

    cut: int
    step: int | None
    partial: bool = False  # a checkpoint write was under way: its staging folder is left behind

    def moment(self, reference: bytes) -> str:
        """What the kill came after: the last whole event's key, a torn line, a checkpoint being written."""
        if self.cut and reference[self.cut - 1:self.cut] != b"\n":
            return "inside a line"
        if self.partial:
            return "during a checkpoint write"
        return _key(reference[:self.cut].rstrip(b"\n").rsplit(b"\n", 1)[-1]) or "start"

    def describe(self, reference: bytes) -> str:
        before = reference[:self.cut].rstrip(b"\n").rsplit(b"\n", 1)[-1]
        key = _key(before) or "the init phase"
        torn = "" if self.cut == 0 or reference[self.cut - 1:self.cut] == b"\n" else " (inside a line)"
        where = f"checkpoint step {self.step}" if self.step is not None else "no checkpoint"
        return f"killed after {key} at byte {self.cut}{torn}, {where}{', a checkpoint half-written' if self.partial else ''}"


def _key(line: bytes) -> str | None:
    try:
        return json.loads(line.decode().partition(":::MLLOG")[2]).get("key")
    except ValueError:
        return None


def train(recipe: Path, out: Path) -> int:
    """One trainer run in this process (the torch import is paid once), its chatter swallowed."""
    from trainer.loop.entry import main

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return main(["--config", str(recipe), "--out", str(out), "--seed", SEED])


def reference_run(work: Path) -> tuple[Path, Path]:
    recipe = tiny_run_config(work / "recipe", world_size=1, batch_size=8, **RECIPE)
    out = work / "reference"
    code = train(recipe, out)
    if code != 0:
        raise SystemExit(f"the reference run failed (exit {code})")
    return recipe, out


def checkpoint_positions(out: Path) -> dict[int, int]:
    """{update: log bytes} of every checkpoint the reference run kept."""
    folder = out / "checkpoints" / "run_0"
    return {int(p.name.removeprefix("step_")): int((p / "log_bytes").read_text()) for p in folder.glob("step_*")}


def crashes(log: bytes, positions: dict[int, int], torn: int, rng: random.Random) -> list[Crash]:
    """Every line boundary with both candidate checkpoints, and `torn` cuts inside lines."""
    ends = [i + 1 for i, byte in enumerate(log) if byte == ord("\n")]
    cuts = [*ends, *rng.sample(sorted(set(range(1, len(log))) - set(ends)), torn)]
    found = set()
    for cut in cuts:
        surely = max((s for s, at in positions.items() if at < cut), default=None)
        maybe = max((s for s, at in positions.items() if at <= cut), default=None)
        found.add(Crash(cut, surely))
        found.add(Crash(cut, maybe))
        if maybe is not None and maybe != surely:
            found.add(Crash(cut, surely, partial=True))  # killed while writing `maybe`
    return sorted(found, key=lambda c: (c.cut, c.step or -1, c.partial))


def rebuild(crash: Crash, reference: Path, log: bytes, folder: Path) -> Path:
    """The run's folder as the kill left it."""
    (folder / "results").mkdir(parents=True)
    result = folder / "results" / "result_0.txt"
    result.write_bytes(log[:crash.cut])
    checkpoints = folder / "checkpoints" / "run_0"
    checkpoints.mkdir(parents=True)
    if crash.step is not None:
        name = f"step_{crash.step:08d}"
        shutil.copytree(reference / "checkpoints" / "run_0" / name, checkpoints / name)
        (checkpoints / "latest").write_text(name)
    if crash.partial:
        (checkpoints / f".step_{(crash.step or 0) + CHECKPOINT_EVERY:08d}.partial").mkdir()
    return result


FIXED = True  # False: behave as before issue 37 (undo_fixes)


def undo_fixes() -> None:
    """The trainer and status as they were: the log is never rewound, a logged run_stop stops nothing."""
    import trainer.loop.train

    global FIXED
    FIXED = False
    trainer.loop.train.rewind_log = lambda log, position: 0
    trainer.loop.train.logged_run_stop = lambda path: None


def resume(recipe: Path, folder: Path, result: Path) -> str:
    """What `bertctl resume` and the job script do with the run; returns what happened."""
    from orchestrator.results import summary as results

    summary = results.summarize(result)
    if FIXED and summary.finished and summary.problem is None:
        return "finished: not resumed"  # status shows it COMPLETED (orchestrator/jobs/status.py::ended_by_its_log)
    if not (folder / "checkpoints" / "run_0" / "latest").exists():
        result.unlink()  # no checkpoint: `resume` clears runs/N.started and the script starts the log afresh
    code = train(recipe, folder)
    return f"resumed: exit {code}"


def events(log: Path) -> list[tuple]:
    """The log's events without what differs between two runs of the same recipe (times, code lines,
    measured throughput)."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        event = json.loads(line.partition(":::MLLOG")[2])
        meta = {k: v for k, v in event.get("metadata", {}).items() if k not in ("file", "lineno")}
        value = event.get("value")
        if isinstance(value, dict):
            value = {k: v for k, v in value.items() if k != "throughput"}
        out.append((event["key"], json.dumps(value, sort_keys=True), json.dumps(meta, sort_keys=True)))
    return out


def judge(result: Path, expected: list[tuple]) -> str:
    try:
        got = events(result)
    except (OSError, ValueError) as e:
        return f"different: unreadable log ({e})"
    evals = [meta for key, _, meta in got if key == "eval_accuracy"]
    stops = [e for e in got if e[0] == "run_stop"]
    if len(stops) > 1 or len(evals) != len(set(evals)):
        return f"doubled: {len(evals)} evaluations ({len(set(evals))} distinct), {len(stops)} run_stop"
    if not stops or stops[-1] != [e for e in expected if e[0] == "run_stop"][-1]:
        return f"lost: the log ends {stops[-1][2] if stops else 'without run_stop'}"
    if got != expected:
        first = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
        return f"different: event {first + 1}: {got[first] if first < len(got) else 'none'}"
    return "same"


def run_case(crash: Crash, recipe: Path, reference: Path, log: bytes, expected: list[tuple], work: Path) -> tuple[str, str]:
    folder = Path(tempfile.mkdtemp(dir=work, prefix="case-"))
    try:
        result = rebuild(crash, reference, log, folder)
        action = resume(recipe, folder, result)
        return judge(result, expected), action
    except Exception as e:  # noqa: BLE001 - a case that breaks is a count, not the end of the harness
        return f"different: {type(e).__name__}: {e}", "traceback"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=0, help="at most this many crash states, drawn at random (0: all)")
    parser.add_argument("--torn", type=int, default=3, help="cuts inside a line, drawn at random")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--with-checkpoint", action="store_true",
                        help="only the crash states with a checkpoint (the others start afresh, the same with or without the fixes)")
    parser.add_argument("--without-fixes", action="store_true",
                        help="as before issue 37: no log rewind; a logged run_stop neither stops the trainer nor counts as finished")
    args = parser.parse_args(argv)
    if args.without_fixes:
        undo_fixes()
    rng = random.Random(args.seed)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="fault-harness-") as tmp:
        work = Path(tmp)
        recipe, reference = reference_run(work)
        result = reference / "results" / "result_0.txt"
        log, expected = result.read_bytes(), events(result)
        cases = crashes(log, checkpoint_positions(reference), args.torn, rng)
        if args.with_checkpoint:
            cases = [c for c in cases if c.step is not None]
        if args.cases:
            cases = sorted(rng.sample(cases, min(args.cases, len(cases))), key=lambda c: (c.cut, c.step or -1))
        counts, examples, actions, moments = Counter(), {}, Counter(), Counter()
        for crash in cases:
            verdict, action = run_case(crash, recipe, reference, log, expected, work)
            kind = verdict.split(":")[0]
            counts[kind] += 1
            actions[action] += 1
            moments[(crash.moment(log), kind)] += 1
            examples.setdefault(kind, f"{crash.describe(log)}: {verdict}")
    print(report(counts, examples, actions, len(log), len(expected), time.time() - started))
    print("by the moment of the kill (the last whole event before it): " +
          ", ".join(f"{moment} {kind} {n}" for (moment, kind), n in sorted(moments.items())))
    return 0 if set(counts) <= {"same"} else 1


def report(counts: Counter, examples: dict, actions: Counter, size: int, events_count: int, seconds: float) -> str:
    import torch

    lines = [f"fault harness: {sum(counts.values())} crash states of one converged run "
             f"({events_count} events, {size} bytes of log, a checkpoint every {CHECKPOINT_EVERY} updates)"]
    for kind in ("same", "lost", "doubled", "different"):
        lines.append(f"  {kind:<10}{counts.get(kind, 0):>6}")
    lines.append("what resume did: " + ", ".join(f"{n} {a}" for a, n in sorted(actions.items())))
    for kind, example in examples.items():
        if kind != "same":
            lines.append(f"first {kind}: {example}")
    lines.append(f"took {seconds:.0f} s on {platform.node() and platform.machine()}, {os.cpu_count()} CPU(s) "
                 f"(shared: timings are noisy), Python {platform.python_version()}, torch {torch.__version__}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
