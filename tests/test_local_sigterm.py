"""SIGTERM to a local job's process group (what `bertctl cancel` sends, or a user's kill): the rank
checkpoints and stops, its words reach the log, the run is recorded interrupted (for `bertctl resume`),
the loop stops, and the job's exit is the interrupted run's, never 0. The rendered local script runs as
it is, with a stand-in Python (the trainer's part: print, then on SIGTERM say so and exit 75)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from conftest import run_cli

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
