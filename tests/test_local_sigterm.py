"""SIGTERM to a local job's process group (what `bertctl cancel` sends, or a user's kill): the rank
checkpoints and stops, its words reach the log, the run is recorded interrupted (for `bertctl resume`),
the loop stops, and the job's exit is the interrupted run's, never 0. The rendered local script runs as
it is, with a stand-in Python (the trainer's part: print, then on SIGTERM say so and exit 75); the real trainer
answers a SIGTERM that comes while it still imports torch with that same exit 75."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import REPO, run_cli
from synthetic import tiny_run_config

STAND_IN = """#!/bin/bash
case " $* " in
  *" --once "*|*" -m trainer.mlperf "*|*" -m orchestrator "*) exit 0 ;;
  *" -m trainer "*)
    trap 'echo "stand-in trainer: SIGTERM, checkpoint saved"; exit 75' TERM
    echo "stand-in trainer: update 1"
    while :; do sleep 0.1; done ;;
esac
exit 0
"""


def wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.1)
    return condition()


def test_sigterm_to_a_local_job_interrupts_its_run_and_records_that(tmp_path):
    exp = tmp_path / "exp"
    exp.mkdir()
    rendered = run_cli("render", "--cluster", "local", "--nexp", "2")
    assert rendered.code == 0, rendered.err
    (exp / "job.sh").write_text(rendered.out)
    python = tmp_path / "python"
    python.write_text(STAND_IN)
    python.chmod(0o755)
    job = subprocess.Popen(["bash", str(exp / "job.sh")], cwd=exp, start_new_session=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, env={**os.environ, "BERTCTL_PYTHON": str(python)})
    try:
        log = exp / "logs" / "run_0.log"
        assert wait_for(lambda: log.exists() and "update 1" in log.read_text(), 60), "the run never started"
        os.killpg(job.pid, signal.SIGTERM)
        job.wait(30)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    assert (exp / "job.exit").read_text().strip() == "75"  # was 0: the shell died, its EXIT trap said 0
    assert (exp / "runs" / "0.interrupted").exists() and not (exp / "runs" / "0.exit").exists()
    assert "checkpoint saved" in log.read_text()  # the log's tee outlived the TERM
    assert not (exp / "runs" / "1.started").exists()  # the loop stopped


def catches(pid: int, signum: int) -> bool:
    """The process has a handler for `signum` (its SigCgt mask in /proc/PID/status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(mask, 16) >> (signum - 1) & 1)


def test_sigterm_while_the_trainer_still_imports_torch_is_an_interrupted_run(tmp_path):
    """Before the run's own handler (StopSignal) exists, a SIGTERM (a `bertctl cancel` right after submit) killed the
    trainer: exit 143, which the job script records as a failed run. Now it is exit 75, an interrupted run."""
    recipe = tiny_run_config(tmp_path)
    trainer = subprocess.Popen([sys.executable, "-m", "trainer", "--config", str(recipe), "--out", str(tmp_path / "out")],
                               cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert wait_for(lambda: catches(trainer.pid, signal.SIGTERM) or trainer.poll() is not None, 60)
        os.kill(trainer.pid, signal.SIGTERM)  # at once: the handler that answers is the one installed first
        out, err = trainer.communicate(timeout=60)
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()
    assert trainer.returncode == 75, err[-2000:]
    assert out.strip().splitlines() == ["signal 15 before the run began: stopped, nothing to save yet (exit 75)"]
    assert not (tmp_path / "out" / "checkpoints").exists()
