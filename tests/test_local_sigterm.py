"""SIGTERM to a local job's process group (what `bertctl cancel` sends, or a user's kill): the rank
checkpoints and stops, its words reach the log, the run is recorded interrupted (for `bertctl resume`),
the loop stops, and the job's exit is the interrupted run's, never 0. The rendered local script runs as
it is, with a stand-in Python (the trainer's part: print, then on SIGTERM say so and exit 75); the real trainer
answers a SIGTERM that comes while it still imports torch with that same exit 75. Two ranks on this machine start
through torchrun, whose own exit is not theirs: the real trainer on gloo shows the run still reads INTERRUPTED."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import REPO, STATUS_EVERY, run_bertctl, run_cli, status_now, wait
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


def two_rank_cluster(tmp: Path) -> Path:
    """clusters/local.yaml with 2 ranks on the CPU (gloo), the tiny BERT for a few dozen updates."""
    recipe = yaml.safe_load(tiny_run_config(tmp, world_size=2, batch_size=4, optim={"max_steps": 30}, runtime={"num_threads": 1},
                                            train={"target_accuracy": 0.99, "eval_every_samples": 160, "eval_start_samples": 160},
                                            data={"eval_samples": 50}).read_text())
    recipe.pop("world_size")
    raw = yaml.safe_load((REPO / "clusters" / "local.yaml").read_text())
    raw.update(name="local_two_ranks", prepare={}, run=recipe)
    raw["resources"].update(tasks_per_node=2, gpus_per_node=0)
    path = tmp / "local_two_ranks.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def rank_processes(exp_dir: Path) -> list[int]:
    """The ranks' processes (each rank's `rank_exit` shell and its trainer): those of the run outside the job's session
    (torchrun starts each rank in a session of its own; torchrun itself is in the job's)."""
    job = int(json.loads((exp_dir / "experiment.json").read_text())["job_ids"][0])
    out = subprocess.run(["pgrep", "-f", f"[-]m trainer --config {exp_dir}/run.yaml"], capture_output=True, text=True).stdout
    return [pid for pid in map(int, out.split()) if os.getsid(pid) != job]


@pytest.mark.slow
def test_sigterm_to_a_two_rank_local_job_is_an_interrupted_run_that_resumes(tmp_path, bertctl_home):
    """torchrun takes the job's SIGTERM itself: it passes it on to the ranks, which checkpoint and exit 75, then dies
    of it (exit 1), which the job recorded: the run was FAILED. Now the ranks' own exit is the run's: INTERRUPTED,
    and `bertctl resume` finishes it. The ranks are held (SIGSTOP) while `bertctl cancel` runs, so the signal lands
    mid-run however busy the machine: a run of 30 updates is over in seconds."""
    submitted = run_bertctl("submit", "--cluster", str(two_rank_cluster(tmp_path)))
    assert submitted.code == 0, submitted.err
    exp = submitted.out.strip()
    exp_dir = bertctl_home / "experiments" / exp
    metrics = exp_dir / "metrics" / "run_0.jsonl"
    wait(lambda: metrics.exists() and metrics.read_text().strip(), 300, "the first update", every=0.02)
    ranks = rank_processes(exp_dir)
    for pid in ranks:
        os.kill(pid, signal.SIGSTOP)
    try:
        assert len(ranks) >= 2, ranks  # each rank (with the shell that records its exit)
        assert run_cli("cancel", exp).code == 0
    finally:
        for pid in ranks:
            os.kill(pid, signal.SIGCONT)
    wait(lambda: status_now(exp)["state"] not in ("PENDING", "RUNNING"), 300, "the job to end", STATUS_EVERY)

    interrupted = status_now(exp)
    assert interrupted["state"] == "INTERRUPTED", interrupted
    assert interrupted["runs"][0]["error"].startswith("checkpoint saved at update "), interrupted
    assert (exp_dir / "runs" / "0.interrupted").read_text().strip() == "75"  # was runs/0.exit: 1, a FAILED run
    assert sorted(p.read_text() for p in (exp_dir / "runs" / "0.ranks").iterdir()) == ["75\n", "75\n"]
    log = (exp_dir / "logs" / "run_0.log").read_text()
    assert "torchrun exited with 1; every rank with 75: the run's exit status" in log

    resumed = run_bertctl("resume", exp)
    assert resumed.code == 0, resumed.err[-2000:]
    wait(lambda: status_now(exp)["state"] not in ("PENDING", "RUNNING", "INTERRUPTED"), 300, "the resumed run", STATUS_EVERY)
    final = status_now(exp)
    assert final["state"] == "COMPLETED", final
    assert "resumed at update" in (exp_dir / "logs" / "run_0.log").read_text()
    updates = [json.loads(line)["update"] for line in metrics.read_text().splitlines()]
    assert updates[-1] == 30, updates
