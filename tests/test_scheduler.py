"""Slurm state mapping and parsing of real sacct/squeue output (recorded from Slurm 22.05)."""

import pytest

from orchestrator.jobs import scheduler
from orchestrator.jobs.scheduler import JobInfo, State
from orchestrator.jobs.status import overall_state, run_state


@pytest.mark.parametrize("raw,state", [
    ("PENDING", State.PENDING), ("REQUEUED", State.PENDING), ("RUNNING", State.RUNNING),
    ("COMPLETING", State.RUNNING), ("COMPLETED", State.COMPLETED), ("FAILED", State.FAILED),
    ("NODE_FAIL", State.FAILED), ("OUT_OF_MEMORY", State.FAILED), ("CANCELLED by 0", State.CANCELLED),
    ("TIMEOUT", State.TIMEOUT), ("PREEMPTED", State.FAILED), ("WEIRD_NEW_STATE", State.UNKNOWN), ("", State.UNKNOWN),
])
def test_slurm_states_map_to_seven(raw, state):
    assert scheduler.map_slurm_state(raw) is state


# recorded from `sacct -X --parsable2 -o ...` on the CI's Slurm 22.05: two plain jobs, a pending array
# (5, four tasks, --begin in an hour) and a running array (6) with task 1 cancelled
SACCT = """JobID|State|NNodes|Elapsed|ExitCode|NodeList|Reason
3|COMPLETED|2|00:00:00|0:0|node[1-2]|None
4|FAILED|2|00:00:00|1:0|node[1-2]|None
5_[0-3]|PENDING|1|00:00:00|0:0|None assigned|BeginTime
6_0|RUNNING|1|00:00:03|0:0|node1|None
6_1|CANCELLED by 0|1|00:00:01|0:0|node1|None
6_2|RUNNING|1|00:00:03|0:0|node1|None
"""


def test_sacct_output_with_arrays(monkeypatch):
    monkeypatch.setattr(scheduler, "_run", lambda cmd, ok_codes=(0,): SACCT)
    info = scheduler.query_slurm(["3", "4", "5_0", "5_3", "6_0", "6_1", "6_2"])
    assert info["3"].state is State.COMPLETED and info["3"].nodes == 2 and info["3"].node_list == "node[1-2]"
    assert info["4"].state is State.FAILED and info["4"].exit_code == "1:0"
    assert info["5_0"].state is State.PENDING and info["5_3"].reason == "BeginTime"
    assert info["6_0"].state is State.RUNNING and info["6_0"].elapsed == "00:00:03"
    assert info["6_1"].state is State.CANCELLED and info["6_2"].state is State.RUNNING


def test_squeue_is_asked_when_accounting_is_off(monkeypatch):
    calls = []

    def fake(cmd, ok_codes=(0,)):
        calls.append(cmd[0])
        if cmd[0] == "sacct":
            raise scheduler.SchedulerError("sacct: error: Slurm accounting storage is disabled")
        return "21|RUNNING|2|0:05|node[1-2]|None\n"

    monkeypatch.setattr(scheduler, "_run", fake)
    assert scheduler.query_slurm(["21"])["21"].state is State.RUNNING
    assert calls == ["sacct", "squeue"]


def test_run_state_combines_job_and_run_files():
    running, done = JobInfo("1", State.RUNNING), JobInfo("1", State.COMPLETED)
    assert run_state(running, started=False, exit_code=None) is State.PENDING  # waiting its turn
    assert run_state(running, started=True, exit_code=None) is State.RUNNING
    assert run_state(running, started=True, exit_code=0) is State.COMPLETED
    assert run_state(done, started=True, exit_code=3) is State.FAILED
    assert run_state(done, started=False, exit_code=None) is State.FAILED  # the job ended without it
    assert run_state(JobInfo("1", State.CANCELLED), started=False, exit_code=None) is State.CANCELLED
    assert overall_state([State.COMPLETED, State.RUNNING]) is State.RUNNING
    assert overall_state([State.COMPLETED, State.FAILED]) is State.FAILED
    assert overall_state([State.COMPLETED, State.COMPLETED]) is State.COMPLETED


def test_local_job_state_from_its_exit_file(tmp_path):
    assert scheduler.local_job_info("999999999", tmp_path).state is State.FAILED  # no process, no exit status
    (tmp_path / "job.exit").write_text("0\n")
    assert scheduler.local_job_info("999999999", tmp_path).state is State.COMPLETED
    (tmp_path / "job.exit").write_text("1\n")
    assert scheduler.local_job_info("999999999", tmp_path).state is State.FAILED
    (tmp_path / "job.cancelled").touch()
    assert scheduler.local_job_info("999999999", tmp_path).state is State.CANCELLED
