"""`bertctl logs`: print or follow one run's log (all ranks, or one)."""

from __future__ import annotations

import io
import re
import sys
import time
from pathlib import Path
from typing import Callable, TextIO

from orchestrator.errors import UserError
from orchestrator.experiments import Experiment
from orchestrator.jobs import status
from orchestrator.results import resultlog

POLL_S = 0.5


def default_run(exp: Experiment) -> int:
    """The newest run that has started, else run 0."""
    started = [i for i in range(exp.nexp) if (exp.path / "runs" / f"{i}.started").exists() or exp.log_file(i).exists()]
    return max(started, default=0)


def rank_filter(rank: int | None) -> Callable[[str], bool]:
    """`srun -l` prefixes lines with `R: `; torchrun's tee with `[rankR]:`."""
    if rank is None:
        return lambda line: True
    pattern = re.compile(rf"^\s*({rank}: |\[rank{rank}\]:)")
    return lambda line: bool(pattern.match(line))


def line_filter(rank: int | None, grep: str | None) -> Callable[[str], bool]:
    """Lines of one rank (or all) that match `grep` (a regular expression; or all)."""
    of_rank = rank_filter(rank)
    if grep is None:
        return of_rank
    try:
        pattern = re.compile(grep)
    except re.error as e:
        raise UserError(f"not a regular expression: {e}", where="--grep", key=grep) from None
    return lambda line: of_rank(line) and bool(pattern.search(line))


def show(exp: Experiment, run: int | None, rank: int | None, follow: bool, out: TextIO | None = None,
         grep: str | None = None, last: int | None = None) -> int:
    """Print run N's log (its last `last` matching lines), or with `follow` stream it until the run ends."""
    out = out or sys.stdout  # looked up now: a default argument would keep the stdout of the first import
    run = default_run(exp) if run is None else run
    if not 0 <= run < exp.nexp:
        raise UserError(f"experiment has runs 0..{exp.nexp - 1}", where="--run", key=str(run))
    path = exp.log_file(run)
    ranks = status.world_size(exp)
    if rank is not None and ranks is not None and not 0 <= rank < ranks:
        raise UserError(f"the runs have {ranks} rank(s), 0 to {ranks - 1}", where="--rank", key=str(rank))
    keep = line_filter(None if ranks == 1 else rank, grep)  # one process's lines carry no rank prefix
    if not follow:
        if not path.exists():
            raise UserError(f"run {run} has no log yet ({path})", where=exp.id)
        with _open_text(path) as f:
            _copy_last(f.read(), keep, last, out)
        return 0
    follow_file(path, lambda: _run_over(exp, run), keep, out, last=last)
    return 0


def follow_step(exp: Experiment, step: str, out: TextIO) -> None:
    """Stream a preparatory step's log (logs/STEP.log) until runs/STEP.exit appears or the job is over."""

    def done() -> bool:
        return (exp.path / "runs" / f"{step}.exit").exists() or status.collect([exp])[0].state.finished

    follow_file(exp.path / "logs" / f"{step}.log", done, rank_filter(None), out)


def follow_file(path: Path, done, keep, out: TextIO, last: int | None = None) -> None:
    """Stream `path` as it grows until `done()`; with `last`, start from its last N kept lines (tail -n N -f)."""
    offset, pending = 0, ""
    if last is not None and path.exists():
        with _open_text(path) as f:
            text = f.read()
            offset = f.tell()
        complete, _, pending = text.rpartition("\n")
        _copy_last(complete + "\n" if complete else "", keep, last, out)
    while True:
        over = done()  # checked before reading, so nothing written before the end is missed
        if path.exists():
            with _open_text(path) as f:
                f.seek(offset)
                chunk = f.read()
                offset = f.tell()
            complete, _, pending = (pending + chunk).rpartition("\n")
            if complete:
                _copy(complete + "\n", keep, out)
        if over:
            if pending:
                _copy(pending + "\n", keep, out)
            return
        time.sleep(POLL_S)


def _open_text(path: Path):
    """A log opened as text, if it is a regular file (a FIFO would block): else one UserError naming it."""
    return io.TextIOWrapper(resultlog.open_regular(path, "run log"), encoding="utf-8", errors="replace")


def _run_over(exp: Experiment, run: int) -> bool:
    if exp.exit_file(run).exists():
        return True
    rv = status.collect([exp])[0].runs[run]
    return rv.state.finished


def _copy_last(text: str, keep, last: int | None, out: TextIO) -> None:
    lines = [line for line in text.splitlines(keepends=True) if keep(line)]
    out.writelines(lines[-last:] if last else lines)
    out.flush()


def _copy(text: str, keep, out: TextIO) -> None:
    for line in text.splitlines(keepends=True):
        if keep(line):
            out.write(line)
    out.flush()
