"""A job is the experiment's only on evidence: a local pid only while it is the session leader running
the experiment's script (never a `tail -f` of its log), a Slurm id only while the scheduler's record
has the experiment's job name and folder. A job the scheduler does not know (no accounting, a purged
id, a copied experiment) is over, and the runs' own records decide; scheduler commands have a time
limit and their output is decoded leniently. The scheduler here is stand-in `sacct`/`squeue`/`scancel`
scripts on PATH, so the real subprocess path (timeouts, decoding) runs."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from conftest import run_bertctl, run_cli
from registry_records import record

from orchestrator import experiments
from orchestrator.jobs import lifecycle, scheduler, status
from orchestrator.jobs.executors import LocalScriptExecutor, LocalScriptJob
from orchestrator.jobs.scheduler import State

EXP = "c-20260101-000000-aaaaaaaa"


def experiment(home: Path, **changes) -> experiments.Experiment:
    exp_dir = home / "experiments" / EXP
    (exp_dir / "runs").mkdir(parents=True)
    (exp_dir / "experiment.json").write_text(json.dumps(record(exp_dir, **changes)))
    return experiments.find(EXP)


def stand_in(bin_dir: Path, name: str, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
    (bin_dir / name).chmod(0o755)


@pytest.fixture
def slurm_bin(tmp_path, monkeypatch) -> Path:
    """An empty scheduler: sacct and squeue know no job; scancel records what it was asked."""
    bin_dir = tmp_path / "bin"
    stand_in(bin_dir, "sacct", "echo 'JobID|State|NNodes|Elapsed|ExitCode|NodeList|Reason|JobName|WorkDir'")
    stand_in(bin_dir, "squeue", "exit 0")
    stand_in(bin_dir, "scancel", f'echo "$@" >> {bin_dir}/scancel.calls')
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir


def finished_runs(exp: experiments.Experiment, submitted_s_ago: float) -> None:
    """Every run recorded exit 0; the job was submitted that long ago."""
    for run in range(exp.nexp):
        (exp.path / "runs" / f"{run}.started").touch()
        (exp.path / "runs" / f"{run}.exit").write_text("0\n")
    batch = exp.path / f"{exp.job_ids[0]}_submission.sh"
    batch.write_text("#!/bin/bash\n")
    os.utime(batch, (time.time() - submitted_s_ago,) * 2)


def test_a_job_accounting_does_not_know_is_over_and_the_runs_decide(bertctl_home, slurm_bin):
    exp = experiment(bertctl_home, executor="slurm", job_ids=["77"], program="probe")
    finished_runs(exp, submitted_s_ago=scheduler.ACCOUNTING_GRACE_S + 60)
    view = status.collect([exp])[0]
    assert view.state is State.COMPLETED and view.runs[0].state is State.COMPLETED
    # and a verb that waits for the end returns (before: PENDING forever)
    assert run_bertctl("logs", EXP, "-f", timeout=60).code in (0, 1, 2)


def test_a_job_just_submitted_may_not_be_in_accounting_yet(bertctl_home, slurm_bin):
    exp = experiment(bertctl_home, executor="slurm", job_ids=["77"], program="probe")
    finished_runs(exp, submitted_s_ago=5)
    assert status.collect([exp])[0].state is State.PENDING


def test_a_foreign_job_under_the_experiments_id_is_not_its_job_and_is_never_cancelled(bertctl_home, slurm_bin, tmp_path):
    stand_in(slurm_bin, "sacct", "echo 'JobID|State|NNodes|Elapsed|ExitCode|NodeList|Reason|JobName|WorkDir'\n"
                                 f"echo '77|RUNNING|1|00:10:00|0:0|node1|None|someone-else|{tmp_path}/theirs'")
    exp = experiment(bertctl_home, executor="slurm", job_ids=["77"], program="probe")
    finished_runs(exp, submitted_s_ago=3600)
    view = status.collect([exp])[0]
    assert view.state is State.COMPLETED  # its runs recorded their exits; the other job's state is not its
    result = run_cli("cancel", EXP)
    assert result.code == 0 and "already ended" in result.err and "job 77 is not this experiment's" in result.err
    assert not (slurm_bin / "scancel.calls").exists()


def test_cancel_says_already_ended_for_a_completed_job_and_scancels_a_running_one(bertctl_home, slurm_bin):
    exp = experiment(bertctl_home, executor="slurm", job_ids=["77"], program="probe")
    row = f"77|{{}}|1|00:10:00|0:0|node1|None|bert-c|{exp.path}"
    header = "JobID|State|NNodes|Elapsed|ExitCode|NodeList|Reason|JobName|WorkDir"
    stand_in(slurm_bin, "sacct", f"echo '{header}'; echo '{row.format('COMPLETED')}'")
    assert "already ended" in run_cli("cancel", EXP).err
    assert not (slurm_bin / "scancel.calls").exists()
    stand_in(slurm_bin, "sacct", f"echo '{header}'; echo '{row.format('RUNNING')}'")
    assert run_cli("cancel", EXP).code == 0
    assert (slurm_bin / "scancel.calls").read_text().split() == ["77"]


def test_sacct_output_that_is_not_utf8_is_read(bertctl_home, slurm_bin):
    exp = experiment(bertctl_home, executor="slurm", job_ids=["77"], program="probe")
    stand_in(slurm_bin, "sacct", "echo 'JobID|State|NNodes|Elapsed|ExitCode|NodeList|Reason|JobName|WorkDir'; "
                                 f"printf '77|RUNNING|1|0:05|0:0|node1|caf\\xe9 \\xff|bert-c|{exp.path}\\n'")
    info = scheduler.query_slurm(["77"])["77"]
    assert info.state is State.RUNNING and "\ufffd" in info.reason


def test_a_hung_scheduler_command_is_a_scheduler_error_not_a_hang(bertctl_home, slurm_bin, monkeypatch):
    stand_in(slurm_bin, "sacct", "exec sleep 60")
    stand_in(slurm_bin, "squeue", "exec sleep 60")
    monkeypatch.setattr(scheduler, "TIMEOUT_S", 1)
    started = time.monotonic()
    with pytest.raises(scheduler.SchedulerError, match="timed out"):
        scheduler.query_slurm(["77"])
    assert time.monotonic() - started < 10


def test_a_process_that_names_the_experiment_is_not_its_local_job(bertctl_home):
    exp = experiment(bertctl_home)
    log = exp.path / "logs" / "run_0.log"
    log.parent.mkdir()
    log.write_text("")
    viewer = subprocess.Popen(["tail", "-f", str(log)], start_new_session=True)  # even a session leader
    try:
        assert not LocalScriptJob(exp.path, str(viewer.pid)).alive()
        exp = experiments.find(EXP)
        (exp.path / "experiment.json").write_text(json.dumps(record(exp.path, job_ids=[str(viewer.pid)])))
        assert not lifecycle.cancel(experiments.find(EXP))
        assert viewer.poll() is None  # the user's viewer was not signalled
    finally:
        viewer.kill()
        viewer.wait()


def test_the_local_jobs_own_script_is_its_job(bertctl_home):
    exp = experiment(bertctl_home)
    script = "trap 'exit 143' TERM\nsleep 30 & wait\n"
    (exp.path / "job.sh").write_text(script)
    job = LocalScriptExecutor(exp.path, script).submit_script(exp.path / "job.sh")
    handle = LocalScriptJob(exp.path, job.job_id)
    deadline = time.monotonic() + 10
    while not handle.alive() and time.monotonic() < deadline:
        time.sleep(0.05)  # the launcher's shell returns before bash has exec'd
    assert handle.alive()
    handle.cancel()
    deadline = time.monotonic() + 10
    while handle.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not handle.alive() and handle.state == "CANCELLED"
