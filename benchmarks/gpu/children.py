"""The GPU suite's child processes: each gets the repository on its PYTHONPATH (appended, so that a
folder of carried wheels named there first stays first), a timeout that ends before its stage's
deadline, its own process group (a timeout ends torchrun's workers too), and the tail of its stderr
in the suite's log, under a header naming the command."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LOG_TAIL_LINES = 400
MARGIN_S = 5  # left to the stage itself, to write its record after a child timed out


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment with the repository appended to PYTHONPATH (never replacing it:
    the wheels installed with `pip --target` are found through it)."""
    env = {**os.environ, **(extra or {})}
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(REPO) not in paths:
        paths.append(str(REPO))
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    def reason(self) -> str:
        return f"exit {self.returncode}: {last_error_line(self.stderr)}"


def last_error_line(text: str) -> str:
    """The line of stderr that says what went wrong: the last `...Error: ...` line if there is one,
    else the last line with words in it (not a `====` rule, nor one of the suite's own headers)."""
    lines = [line.strip() for line in text.splitlines() if re.search(r"[A-Za-z0-9]", line) and not line.startswith("==== ")]
    errors = [line for line in lines if re.match(r"^[\w.]*(Error|Exception|error)\b", line)]
    return ((errors or lines or ["(no stderr)"])[-1])[:300]


def append_log(log: Path, header: str, text: str) -> None:
    tail = text.splitlines()[-LOG_TAIL_LINES:]
    with open(log, "a") as f:
        f.write(f"==== {header}\n" + "\n".join(tail) + ("\n" if tail else ""))


def run(args: list[str], deadline: float, log: Path, label: str, env: dict[str, str] | None = None,
        cwd: Path = REPO) -> Finished:
    """Run a child to its end or the deadline (TimeoutError, the child's group killed)."""
    timeout = deadline - time.time() - MARGIN_S
    if timeout <= 0:
        raise TimeoutError(f"{label}: no time left before the stage's deadline")
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, text=True,
                                cwd=cwd, env=child_env(env), start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            timed_out = True
        except BaseException:  # a signal to the stage: its children go with it
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        err.seek(0)
        stderr = err.read()
    seconds = round(time.perf_counter() - started, 1)
    status = f"killed after {seconds} s (timeout)" if timed_out else f"exit {proc.returncode}, {seconds} s"
    append_log(log, f"{label}: {' '.join(args)} ({status})", stderr)
    if timed_out:
        raise TimeoutError(f"{label}: killed after {timeout:.0f} s, the time its stage had left; stderr in {log.name}")
    return Finished(proc.returncode, out, stderr, seconds)
