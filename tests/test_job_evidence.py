"""A job is the experiment's only on evidence: a local pid only while it is the session leader running
the experiment's script (never a `tail -f` of its log), a Slurm id only while the scheduler's record
has the experiment's job name and folder. A job the scheduler does not know (no accounting, a purged
id, a copied experiment) is over, and the runs' own records decide; scheduler commands have a time
limit and their output is decoded leniently. The scheduler here is stand-in `sacct`/`squeue`/`scancel`
scripts on PATH, so the real subprocess path (timeouts, decoding) runs."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import run_bertctl, run_cli
from registry_records import record

from orchestrator import experiments
from orchestrator.errors import UserError
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


def started_local_job(exp: experiments.Experiment, script: str) -> LocalScriptJob:
    """`script` started as the experiment's local job (job.sh, LocalScriptExecutor), recorded as its job."""
    (exp.path / "job.sh").write_text(script)
    job = LocalScriptExecutor(exp.path, script).submit_script(exp.path / "job.sh")
    (exp.path / "experiment.json").write_text(json.dumps(record(exp.path, job_ids=[job.job_id])))
    handle = LocalScriptJob(exp.path, job.job_id)
    assert wait_until(handle.alive, 10)  # the launcher's shell returns before bash has exec'd
    return handle


def wait_until(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


def session_of(pid: int) -> list[int]:
    return [int(p) for p in subprocess.run(["pgrep", "-s", str(pid)], capture_output=True, text=True).stdout.split()]


def test_a_local_job_whose_shell_was_killed_runs_while_its_session_works(bertctl_home):
    """The job's shell SIGKILLed (its EXIT trap never runs) while its child works on (where the trainer would
    be): the job is alive, RUNNING, and `resume` refuses (it once said FAILED and started a second trainer)."""
    exp = experiment(bertctl_home)
    handle = started_local_job(exp, "sleep 60 & wait\n")
    shell = int(handle.job_id)
    assert wait_until(lambda: len(session_of(shell)) == 2, 10)  # the shell and its sleep
    child = next(p for p in session_of(shell) if p != shell)
    os.kill(shell, signal.SIGKILL)  # the shell alone, not its group
    assert wait_until(lambda: session_of(shell) == [child], 10)
    exp = experiments.find(EXP)
    assert handle.alive() and handle.state == "RUNNING"
    assert status.collect([exp])[0].state is State.RUNNING
    with pytest.raises(UserError, match="is running: wait for it to end"):
        lifecycle.resume(exp)
    assert lifecycle.cancel(exp)  # SIGTERM to the job's process group reaches the child
    assert wait_until(lambda: not handle.alive(), 10) and handle.state == "CANCELLED"
    assert not (exp.path / "job.exit").exists()  # nothing pretended the shell ended by itself


def test_a_job_asked_to_stop_is_running_until_its_last_process_ends(bertctl_home):
    """`cancel` used to make the job CANCELLED at once, while its ranks still wrote their checkpoints: a resume
    then could start beside them."""
    exp = experiment(bertctl_home)
    # The ranks' last writes take 5 s: long enough that both looks below fall inside them on a loaded CI machine
    # (with 1 s, a busy machine once let the job end between the two).
    handle = started_local_job(exp, "trap 'sleep 5; exit 143' TERM\nsleep 60 & wait\n")
    assert wait_until(lambda: len(session_of(int(handle.job_id))) == 2, 10)  # the trap is set: bash started the sleep
    assert lifecycle.cancel(experiments.find(EXP))
    assert handle.state == "RUNNING" and status.collect([experiments.find(EXP)])[0].state is State.RUNNING
    assert wait_until(lambda: not handle.alive(), 30) and handle.state == "CANCELLED"


def test_another_script_of_the_experiment_folder_is_not_its_job(bertctl_home):
    exp = experiment(bertctl_home)
    (exp.path / "job.sh").write_text("exit 0\n")
    (exp.path / "other.sh").write_text("sleep 60 & wait\n")
    other = subprocess.Popen(["bash", str(exp.path / "other.sh")], cwd=exp.path, start_new_session=True)
    try:
        assert wait_until(lambda: len(session_of(other.pid)) == 2, 10)
        assert not LocalScriptJob(exp.path, str(other.pid)).alive()  # a session leader in the folder, but not job.sh
        (exp.path / "experiment.json").write_text(json.dumps(record(exp.path, job_ids=[str(other.pid)])))
        assert not lifecycle.cancel(experiments.find(EXP)) and other.poll() is None
    finally:
        os.killpg(other.pid, signal.SIGKILL)
        other.wait()


# Slurm 22.05's own words (exit status 1), as its squeue says them on the CI's cluster: with slurmctld down, and
# asked for one job id it does not know. The scheduler here is the stand-ins above, saying exactly that.
CONTROLLER_DOWN = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"
NO_SUCH_JOB = "slurm_load_jobs error: Invalid job id specified"


def a_started_slurm_run(home: Path) -> experiments.Experiment:
    """A Slurm experiment whose run started an hour ago, its job not in accounting (yet: slurmdbd lags)."""
    exp = experiment(home, executor="slurm", job_ids=["77"], program="probe")
    (exp.path / "runs" / "0.started").touch()
    batch = exp.path / "77_submission.sh"
    batch.write_text("#!/bin/bash\n")
    os.utime(batch, (time.time() - 3600,) * 2)
    (exp.path / exp.script).write_text("#!/bin/bash\n")  # what a resume submits again
    return exp


def test_a_controller_that_does_not_answer_is_unknown_and_blocks_resume_and_rerun(bertctl_home, slurm_bin, monkeypatch):
    stand_in(slurm_bin, "squeue", f"echo '{CONTROLLER_DOWN}' >&2; exit 1")
    exp = a_started_slurm_run(bertctl_home)
    view = status.collect([exp])[0]
    assert view.state is State.UNKNOWN and view.runs[0].state is State.UNKNOWN  # was FAILED: "the scheduler has no record"
    assert CONTROLLER_DOWN in view.runs[0].error
    for verb in ("resume", "rerun"):
        refused = run_cli(verb, EXP)
        assert refused.code == 2 and refused.err.count("\n") == 1, refused.err
        assert "its state is unknown" in refused.err and CONTROLLER_DOWN in refused.err and "add --force" in refused.err
    launched = []
    from orchestrator.jobs import submit

    monkeypatch.setattr(submit, "launch", lambda exp, runs: launched.append(runs) or ["78"])
    assert lifecycle.resume(exp, force=True).job_ids == ["78"] and launched == [None]


def test_a_scheduler_that_answers_nothing_at_all_is_unknown(bertctl_home, slurm_bin):
    stand_in(slurm_bin, "sacct", "echo 'sacct: error: Problem talking to the database: Connection refused' >&2; exit 1")
    stand_in(slurm_bin, "squeue", f"echo '{CONTROLLER_DOWN}' >&2; exit 1")
    view = status.collect([a_started_slurm_run(bertctl_home)])[0]
    assert view.state is State.UNKNOWN and CONTROLLER_DOWN in view.runs[0].error


def test_a_job_the_controller_says_it_does_not_know_is_over(bertctl_home, slurm_bin):
    stand_in(slurm_bin, "squeue", f"echo '{NO_SUCH_JOB}' >&2; exit 1")
    exp = a_started_slurm_run(bertctl_home)
    (exp.path / "runs" / "0.exit").write_text("0\n")
    assert status.collect([exp])[0].state is State.COMPLETED  # an answer: the runs' records decide


@pytest.mark.parametrize("answer", [
    "sacct: this cluster's accounting is read-only today",  # a banner where the table belongs
    "JobID|State|NNodes\n77_[x-y]|RUNNING|1",  # a row whose job id is none
    "Job|Status\n77|RUNNING",  # another table
])
def test_sacct_output_that_is_no_table_is_one_line_never_a_traceback(bertctl_home, slurm_bin, answer):
    stand_in(slurm_bin, "sacct", f"printf '%s\\n' {shlex.quote(answer)}")
    with pytest.raises(scheduler.SchedulerError) as failed:
        scheduler.parse_table(answer, "sacct")
    assert str(failed.value).startswith("sacct: ") and "\n" not in str(failed.value)
    stand_in(slurm_bin, "squeue", f"echo '{CONTROLLER_DOWN}' >&2; exit 1")
    a_started_slurm_run(bertctl_home)
    shown = run_cli("status", EXP, "--json")
    assert shown.code == 0 and "Traceback" not in shown.err
    assert json.loads(shown.out)["experiments"][0]["state"] == "UNKNOWN"


def test_resume_without_the_job_script_is_one_line_and_changes_nothing(bertctl_home):
    """The script was checked last, by launch(), after the run's interrupted marker was gone: a traceback."""
    exp = experiment(bertctl_home, job_ids=["999999999"])  # its job ended: no such process, its exit recorded
    (exp.path / "job.exit").write_text("75\n")
    (exp.path / "runs" / "0.started").touch()
    (exp.path / "runs" / "0.interrupted").write_text("75\n")
    refused = run_cli("resume", EXP)
    assert refused.code == 2 and refused.err.count("\n") == 1 and "Traceback" not in refused.err, refused.err
    assert "its job script job.sh is missing" in refused.err and "nothing was changed" in refused.err
    assert sorted(p.name for p in (exp.path / "runs").iterdir()) == ["0.interrupted", "0.started"]


@pytest.mark.parametrize("world", [1, 2])
def test_logs_rank_picks_one_ranks_lines_and_a_rank_the_run_lacks_is_one_line(bertctl_home, world):
    """A one-process run's lines carry no rank prefix: `--rank 0` printed nothing, silently (the README's
    `bertctl logs last --run 0 --rank 0` on a local experiment)."""
    exp = experiment(bertctl_home)
    (exp.path / "run.yaml").write_text(f"world_size: {world}\n")
    lines = ["training: 1 rank(s)\n", "step 10\n"] if world == 1 else ["[rank0]: step 10\n", "[rank1]: step 10\n"]
    exp.log_file(0).parent.mkdir(parents=True, exist_ok=True)
    exp.log_file(0).write_text("".join(lines))
    shown = run_cli("logs", EXP, "--run", "0", "--rank", "0")
    assert shown.code == 0 and shown.out == "".join(lines[:1] if world == 2 else lines), shown
    refused = run_cli("logs", EXP, "--run", "0", "--rank", str(world))
    assert refused.code == 2 and refused.err.count("\n") == 1
    assert f"--rank: {world}: the runs have {world} rank(s), 0 to {world - 1}" in refused.err, refused.err
