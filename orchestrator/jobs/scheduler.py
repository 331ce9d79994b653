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
import warnings
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
    """States of all these jobs (array tasks as `123_4`) from a single scheduler call. A job neither command
    could answer for is UNKNOWN (`unanswered`): silence is no evidence that it ended."""
    if not job_ids:
        return {}
    base_ids = sorted({j.split("_")[0] for j in job_ids})
    selection = [a for j in base_ids for a in ("-j", j)]
    try:
        table = _run(["sacct", "-X", "--parsable2", "-o", ",".join(SACCT_FIELDS), *selection])
        known = {job: _info(job, stats) for job, stats in parse_table(table, "sacct", SACCT_FIELDS).items()}
    except SchedulerError:
        # no accounting on this cluster (or an answer that is no table): squeue only knows jobs that have not finished yet
        return query_queue(base_ids)
    missing = [j for j in base_ids if not any(k.split("_")[0] == j for k in known)]
    if missing:  # not in accounting (yet, or any more): the controller may still hold them
        try:
            known.update(query_queue(missing))
        except SchedulerError as e:
            known.update({j: unanswered(j, str(e)) for j in missing})
    return known


# squeue's answer (exit 1) when asked for a single job id the controller does not know: an answer, not a
# failure (Slurm 22.05; asked for several ids, it lists the known ones and exits 0)
UNKNOWN_JOB_ID = "Invalid job id specified"


def query_queue(base_ids: list[str]) -> dict[str, JobInfo]:
    """What squeue knows of these jobs: the ones queued or running (a finished job is absent). A controller
    that does not answer ("Unable to contact slurm controller", exit 1) is a SchedulerError, never an empty queue."""
    command = ["squeue", "-h", "-o", SQUEUE_FORMAT, "--jobs", ",".join(base_ids)]
    try:
        rows = _run(command)
    except SchedulerError as e:
        if UNKNOWN_JOB_ID not in str(e):
            raise
        rows = ""
    table = "|".join(SQUEUE_FIELDS) + "\n" + rows
    return {job: _info(job, stats) for job, stats in parse_table(table, "squeue", SQUEUE_FIELDS).items()}


def parse_table(table: str, command: str = "sacct", fields: list[str] = SACCT_FIELDS) -> dict[str, dict[str, str]]:
    """`--parsable2` output (a header line, then `|`-separated rows) by job id, read by submitit's
    watcher: array elements are `123_4`, and a pending array's summary row `123_[4-9%2]` stands for
    each of its elements. An answer that is not that table (another header, a banner, a row that is no
    job) is one SchedulerError naming the command, not submitit's KeyError."""
    header = table.splitlines()[0] if table.strip() else ""
    names = header.split("|")
    if header and not ({"JobID", "State"} <= set(names) <= set(fields)):
        raise SchedulerError(f"{command}: answered {header[:80]!r}, not the table asked for ({'|'.join(fields[:3])}|...)")
    try:
        with warnings.catch_warnings():  # submitit warns of (and skips) a job id it cannot read
            warnings.simplefilter("error")
            return SlurmJob.watcher.read_info(table)
    except (KeyError, ValueError, IndexError, Warning) as e:
        raise SchedulerError(f"{command}: answered a table bertctl cannot read ({type(e).__name__}: "
                             f"{str(e).splitlines()[0][:80] if str(e) else ''})") from None


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


def _run(command: list[str]) -> str:
    try:  # errors="replace": a job name or path in another encoding must not take `status` down
        out = run_command(command)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SchedulerError(f"{command[0]}: {e}") from None
    if out.returncode:
        said = " ".join(out.stderr.split())[:300]  # one line, however many the command printed
        raise SchedulerError(f"{command[0]}: {said or f'exit status {out.returncode}'}")
    return out.stdout


def run_command(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    """A scheduler command (sacct, squeue, sbatch, scancel, sinfo) with a time limit (TIMEOUT_S), its
    output decoded leniently. subprocess.TimeoutExpired when it takes longer."""
    return subprocess.run(command, capture_output=True, text=True, errors="replace", timeout=TIMEOUT_S, **kwargs)


NO_ANSWER = "NO ANSWER"  # the raw state of a job the scheduler did not answer for


def unanswered(job_id: str, why: str) -> JobInfo:
    """A job the scheduler did not answer for (a command failed or timed out): its state is unknown, and
    `resume` and `rerun` wait for an answer (or --force)."""
    return JobInfo(job_id, State.UNKNOWN, NO_ANSWER, reason=f"the scheduler did not answer ({why})")


def gone(job_id: str, why: str) -> JobInfo:
    """A job the scheduler no longer knows as this experiment's: it is over, and the runs' own records
    (exit files, their logs' run_stop) say how it went."""
    return JobInfo(job_id, State.FAILED, "GONE", reason=why)


def local_job_info(job_id: str, exp_dir: Path, script: str = "job.sh") -> JobInfo:
    """A local job is its script's process and its session's; the script writes job.exit when it ends."""
    job = LocalScriptJob(exp_dir, job_id, script=script)
    state = job.state
    if state == "UNKNOWN":
        return JobInfo(job_id, State.FAILED, "GONE", 1, reason="the job's process ended without an exit status")
    if state in ("COMPLETED", "FAILED"):
        code = job.exit_code() or ""
        return JobInfo(job_id, map_slurm_state(state), f"exit {code}", 1, exit_code=code)
    return JobInfo(job_id, map_slurm_state(state), state, 1)
