"""A trainer killed by SIGKILL (what the OOM killer sends) takes its helpers with it: nothing it started
keeps its output pipe open, so the job script's `| tee` ends, and the job with it. And a trainer ends with
its job: when the job's shell is killed, the trainer checkpoints and stops."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO
from synthetic import tiny_run_config

pytestmark = pytest.mark.slow


def read_until(proc: subprocess.Popen, text: bytes | None, seconds: float) -> bytes:
    """What the process's output pipe gives within `seconds`: up to `text`, or to its end (None)."""
    seen = b""
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not selector.select(timeout=deadline - time.monotonic()):
            break
        chunk = os.read(proc.stdout.fileno(), 65536)
        if not chunk:
            return seen + b"<EOF>"
        seen += chunk
        if text is not None and text in seen:
            return seen
    return seen


def test_a_sigkilled_trainer_leaves_no_process_holding_its_output_pipe(tmp_path):
    recipe = tiny_run_config(tmp_path, world_size=1, batch_size=8, optim={"max_steps": 100_000},
                             train={"target_accuracy": 0.99, "max_samples_termination": 10**9},
                             data={"num_workers": 1}, runtime={"num_threads": 1})
    # the output goes to a pipe, as into the job script's tee; a new session, to find what the trainer left
    proc = subprocess.Popen([sys.executable, "-m", "trainer", "--config", str(recipe), "--out", str(tmp_path / "out")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        before = read_until(proc, b"update ", 300)
        assert b"update " in before, before.decode(errors="replace")[-2000:]
        os.kill(proc.pid, signal.SIGKILL)
        after = read_until(proc, None, 30)
        assert after.endswith(b"<EOF>"), "the trainer's output pipe is still held open 30 s after its SIGKILL"
        proc.wait(10)  # (the killed trainer itself, a zombie until reaped, is no survivor)
        assert session_ends(proc.pid, 10), f"processes of the killed trainer's session still alive: {session(proc.pid)}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # its own group: what this test started, nothing else
        proc.wait()


def session(sid: int) -> list[str]:
    return subprocess.run(["pgrep", "-s", str(sid)], capture_output=True, text=True).stdout.split()


def session_ends(sid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while session(sid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not session(sid)


def test_a_trainer_whose_job_shell_is_gone_checkpoints_and_stops(tmp_path):
    """A local job's trainer watches the job's shell (BERTCTL_JOB_PID, trainer/loop/lifeline.py): when the shell is
    SIGKILLed the trainer once trained on, unseen, until a resume started a second one beside it. Here a `sleep`
    stands in for the shell (the trainer watches only its pid); the trainer checkpoints and exits 75."""
    recipe = tiny_run_config(tmp_path, world_size=1, batch_size=8, optim={"max_steps": 100_000},
                             train={"target_accuracy": 0.99, "max_samples_termination": 10**9, "log_every_steps": 2},
                             runtime={"num_threads": 1})
    shell = subprocess.Popen(["sleep", "600"])
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "trainer", "--config", str(recipe), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(REPO), "BERTCTL_JOB_PID": str(shell.pid)})
    try:
        before = read_until(proc, b"update ", 300)
        assert b"update " in before, before.decode(errors="replace")[-2000:]
        shell.kill()
        shell.wait()
        after = read_until(proc, None, 60)
        assert after.endswith(b"<EOF>"), "the trainer trained on 60 s after its job's shell was gone"
        assert proc.wait(10) == 75, after.decode(errors="replace")[-2000:]
    finally:
        shell.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert f"the job's shell (pid {shell.pid}) is gone: stopping as on SIGTERM".encode() in after
    assert b"checkpoint saved at update " in after and (out / "checkpoints" / "run_0" / "latest").exists()
