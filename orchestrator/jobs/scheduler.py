"""Asking the scheduler about jobs: one batched `sacct` call, with `squeue` when accounting is off.

Slurm has two dozen job states; bertctl shows seven (`State`). The table below is the one place
where Slurm's names are mapped. Local-executor jobs have no scheduler: their state comes from their
handle (orchestrator/jobs/executors.py::LocalScriptJob: the script's process and the exit status it
leaves in `job.exit`).

Why not submitit's `SlurmJob.state`: its watcher batches every registered job into one `sacct` call
too, but asks only for JobID, State and NodeList, while `status` also needs ExitCode (a job that
stopped at an interrupted run), NNodes, Elapsed and Reason; changing its columns means overriding
its `_make_command`, which reads the watcher's private `_registered`/`_finished` sets; and its
`update` turns a failed `sacct` into a logged warning, where bertctl asks `squeue` instead (clusters
without accounting) and shows the error on each job. So the query is bertctl's, one call for all
experiments, and the table is read by the watcher's public `read_info`.
"""

from __future__ import annotations

import enum
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from submitit import SlurmJob

from orchestrator.jobs.executors import LocalScriptJob


class State(str, enum.Enum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    # a run that saved a checkpoint and stopped, not requeued: `bertctl resume` continues it
    INTERRUPTED = "INTERRUPTED"
    UNKNOWN = "UNKNOWN"

    @property
    def finished(self) -> bool:
        return self in (State.COMPLETED, State.FAILED, State.CANCELLED, State.TIMEOUT, State.INTERRUPTED)


SLURM_STATES = {
    "PENDING": State.PENDING,
    "CONFIGURING": State.PENDING,
    "REQUEUED": State.PENDING,  # a requeued job waits to start again
    "REQUEUE_HOLD": State.PENDING,
    "REQUEUE_FED": State.PENDING,
    "RESV_DEL_HOLD": State.PENDING,
    "RUNNING": State.RUNNING,
    "COMPLETING": State.RUNNING,
    "STAGE_OUT": State.RUNNING,
    "SUSPENDED": State.RUNNING,
    "SIGNALING": State.RUNNING,
    "RESIZING": State.RUNNING,
    "COMPLETED": State.COMPLETED,
    "FAILED": State.FAILED,
    "NODE_FAIL": State.FAILED,
    "BOOT_FAIL": State.FAILED,
    "OUT_OF_MEMORY": State.FAILED,
    "PREEMPTED": State.FAILED,
    "SPECIAL_EXIT": State.FAILED,
    "REVOKED": State.CANCELLED,
    "CANCELLED": State.CANCELLED,
    "DEADLINE": State.TIMEOUT,
    "TIMEOUT": State.TIMEOUT,
}


def map_slurm_state(raw: str) -> State:
    """'CANCELLED by 0' -> CANCELLED; unknown names -> UNKNOWN."""
    word = raw.split()[0].rstrip("+") if raw.strip() else ""
    return SLURM_STATES.get(word, State.UNKNOWN)


@dataclass(frozen=True)
class JobInfo:
    job_id: str
    state: State
    raw_state: str = ""
    nodes: int | None = None
    elapsed: str = ""
    exit_code: str = ""
    node_list: str = ""
    reason: str = ""
    name: str = ""  # the job's name and working directory: what tells an experiment's job from another
    work_dir: str = ""  # job that has its id (a copied experiment, a purged and reused id)

    def belongs_to(self, name: str, folder: Path) -> bool:
        """This job is the one submitted as `name` from `folder` (what the scheduler does not say is no evidence against)."""
        if self.name and self.name != name:
            return False
        return not self.work_dir or os.path.realpath(self.work_dir) == os.path.realpath(folder)


SACCT_FIELDS = ["JobID", "State", "NNodes", "Elapsed", "ExitCode", "NodeList", "Reason", "JobName", "WorkDir"]
SQUEUE_FORMAT = "%i|%T|%D|%M|%N|%r|%j|%Z"  # the same fields, in that order (squeue has no exit code)
SQUEUE_FIELDS = ["JobID", "State", "NNodes", "Elapsed", "NodeList", "Reason", "JobName", "WorkDir"]
# how long one scheduler command may take: a hung slurmctld or slurmdbd must not hang a verb
TIMEOUT_S = 60
# a job accounting does not list yet may have just been submitted (slurmdbd records it a moment later)
ACCOUNTING_GRACE_S = 120


class SchedulerError(Exception):
    pass


def query_slurm(job_ids: list[str]) -> dict[str, JobInfo]:
    """States of all these jobs (array tasks as `123_4`) from a single scheduler call."""
    if not job_ids:
        return {}
    base_ids = sorted({j.split("_")[0] for j in job_ids})
    selection = [a for j in base_ids for a in ("-j", j)]
    try:
        table = _run(["sacct", "-X", "--parsable2", "-o", ",".join(SACCT_FIELDS), *selection])
    except SchedulerError:
        # no accounting on this cluster: squeue only knows jobs that have not finished yet
        return query_queue(base_ids)
    known = {job: _info(job, stats) for job, stats in parse_table(table).items()}
    missing = [j for j in base_ids if not any(k.split("_")[0] == j for k in known)]
    if missing:  # not in accounting (yet, or any more): the controller may still hold them
        try:
            known.update(query_queue(missing))
        except SchedulerError:
            pass
    return known


def query_queue(base_ids: list[str]) -> dict[str, JobInfo]:
    """What squeue knows of these jobs: the ones queued or running (a finished job is absent)."""
    rows = _run(["squeue", "-h", "-o", SQUEUE_FORMAT, "--jobs", ",".join(base_ids)], ok_codes=(0, 1))
    table = "|".join(SQUEUE_FIELDS) + "\n" + rows
    return {job: _info(job, stats) for job, stats in parse_table(table).items()}


def parse_table(table: str) -> dict[str, dict[str, str]]:
    """`--parsable2` output (a header line, then `|`-separated rows) by job id, read by submitit's
    watcher: array elements are `123_4`, and a pending array's summary row `123_[4-9%2]` stands for
    each of its elements."""
    return SlurmJob.watcher.read_info(table)


def _info(job: str, stats: dict[str, str]) -> JobInfo:
    nodes = stats.get("NNodes", "")
    return JobInfo(
        job_id=job,
        state=map_slurm_state(stats.get("State", "")),
        raw_state=stats.get("State", ""),
        nodes=int(nodes) if nodes.isdigit() else None,
        elapsed=stats.get("Elapsed", ""),
        exit_code=stats.get("ExitCode", ""),
        node_list=stats.get("NodeList", ""),
        reason=stats.get("Reason", "") if stats.get("Reason") not in ("None", "") else "",
        name=stats.get("JobName", ""),
        work_dir=stats.get("WorkDir", ""),
    )


def _run(command: list[str], ok_codes: tuple[int, ...] = (0,)) -> str:
    try:  # errors="replace": a job name or path in another encoding must not take `status` down
        out = run_command(command)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SchedulerError(f"{command[0]}: {e}") from None
    if out.returncode not in ok_codes:
        raise SchedulerError(f"{command[0]}: {out.stderr.strip() or out.returncode}")
    return out.stdout


def run_command(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    """A scheduler command (sacct, squeue, sbatch, scancel, sinfo) with a time limit (TIMEOUT_S), its
    output decoded leniently. subprocess.TimeoutExpired when it takes longer."""
    return subprocess.run(command, capture_output=True, text=True, errors="replace", timeout=TIMEOUT_S, **kwargs)


def gone(job_id: str, why: str) -> JobInfo:
    """A job the scheduler no longer knows as this experiment's: it is over, and the runs' own records
    (exit files, their logs' run_stop) say how it went."""
    return JobInfo(job_id, State.FAILED, "GONE", reason=why)


def local_job_info(job_id: str, exp_dir: Path) -> JobInfo:
    """A local job is its script's process; the script writes job.exit when it ends."""
    job = LocalScriptJob(exp_dir, job_id)
    state = job.state
    if state == "UNKNOWN":
        return JobInfo(job_id, State.FAILED, "GONE", 1, reason="the job's process ended without an exit status")
    if state in ("COMPLETED", "FAILED"):
        code = job.exit_code() or ""
        return JobInfo(job_id, map_slurm_state(state), f"exit {code}", 1, exit_code=code)
    return JobInfo(job_id, map_slurm_state(state), state, 1)
