"""Asking the scheduler about jobs: one batched `sacct` call, with `squeue` when accounting is off.

Slurm has two dozen job states; bertctl shows seven (`State`). The table below is the one place
where Slurm's names are mapped. Local-executor jobs have no scheduler: their state comes from the
controller's process and the exit status the script leaves in `job.exit`.
"""

from __future__ import annotations

import enum
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from trainer.config.regular import read_regular_text


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


SACCT_FIELDS = ["JobID", "State", "NNodes", "Elapsed", "ExitCode", "NodeList", "Reason"]
SQUEUE_FORMAT = "%i|%T|%D|%M|%N|%r"  # the same fields, in that order (squeue has no exit code)
SQUEUE_FIELDS = ["JobID", "State", "NNodes", "Elapsed", "NodeList", "Reason"]


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
        rows = _run(["squeue", "-h", "-o", SQUEUE_FORMAT, "--jobs", ",".join(base_ids)], ok_codes=(0, 1))
        table = "|".join(SQUEUE_FIELDS) + "\n" + rows
    return {job: _info(job, stats) for job, stats in parse_table(table).items()}


def parse_table(table: str) -> dict[str, dict[str, str]]:
    """`--parsable2` output (a header line, then `|`-separated rows) by job id. Array elements are
    `123_4`; a pending array's summary row `123_[4-9%2]` stands for each of its elements."""
    lines = [line for line in table.splitlines() if line.strip()]
    if not lines:
        return {}
    header = lines[0].split("|")
    rows: dict[str, dict[str, str]] = {}
    for line in lines[1:]:
        stats = dict(zip(header, line.split("|")))
        for job in expand_array_id(stats.get("JobID", "")):
            rows[job] = stats
    return rows


def expand_array_id(job: str) -> list[str]:
    """'7_[0-2,5%2]' -> ['7_0', '7_1', '7_2', '7_5']; any other id unchanged."""
    base, sep, rest = job.partition("_[")
    if not sep:
        return [job] if job else []
    ids = []
    for part in rest.rstrip("]").split("%")[0].split(","):
        lo, _, hi = part.partition("-")
        if lo.isdigit():
            ids += [f"{base}_{i}" for i in range(int(lo), int(hi or lo) + 1)]
    return ids


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
    )


def _run(command: list[str], ok_codes: tuple[int, ...] = (0,), env: dict[str, str] | None = None) -> str:
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SchedulerError(f"{command[0]}: {e}") from None
    if out.returncode not in ok_codes:
        raise SchedulerError(f"{command[0]}: {out.stderr.strip() or out.returncode}")
    return out.stdout


def cancel_slurm(job_ids: list[str]) -> None:
    _run(["scancel", *job_ids])


def sbatch(script: Path, workdir: Path, extra: list[str] = (), env: dict[str, str] | None = None) -> str:
    """Submit a script with `sbatch --parsable`, from `workdir`, in `env`; returns the job id."""
    out = _run(["sbatch", "--parsable", f"--chdir={workdir}", *extra, str(script)], env=env)
    job_id = out.strip().splitlines()[-1].split(";")[0] if out.strip() else ""
    if not job_id.isdigit():
        raise SchedulerError(f"sbatch: unexpected answer {out.strip()!r}")
    return job_id


# ---- the local executor: the script as a detached process group on this machine

LOCAL_LAUNCHER = 'setsid bash "$1" </dev/null >>"$2" 2>&1 & echo $!'


def start_local(script: Path, log: Path, workdir: Path, env: dict[str, str] | None = None) -> str:
    """Start `bash script` detached: its own session (so `cancel` can signal the whole group), stdin
    from /dev/null and its output appended to `log` (so `EXP=$(bertctl submit ...)` returns at once),
    started in the background by a shell that exits at once (so init reaps it, not us). The job id is
    its pid."""
    out = subprocess.run(["bash", "-c", LOCAL_LAUNCHER, "bertctl-local", str(script), str(log)],
                         capture_output=True, text=True, cwd=workdir, env=env, timeout=30)
    pid = out.stdout.strip()
    if out.returncode or not pid.isdigit():
        raise SchedulerError(f"could not start {script}: {out.stderr.strip() or out.returncode}")
    return pid


def local_job_info(job_id: str, exp_dir: Path) -> JobInfo:
    """A local job is its script's process; the script writes job.exit when it ends."""
    exit_file = exp_dir / "job.exit"
    if (exp_dir / "job.cancelled").exists():
        return JobInfo(job_id, State.CANCELLED, "CANCELLED")
    if local_job_alive(job_id, exp_dir):
        return JobInfo(job_id, State.RUNNING, "RUNNING", 1)
    if exit_file.exists():
        try:
            code = read_regular_text(exit_file, limit=64).strip()
        except (OSError, UnicodeDecodeError) as e:  # a FIFO there must not block `status`
            return JobInfo(job_id, State.FAILED, "GONE", 1, reason=f"job.exit unreadable: {getattr(e, 'strerror', e)}")
        return JobInfo(job_id, State.COMPLETED if code == "0" else State.FAILED, f"exit {code}", 1, exit_code=code)
    return JobInfo(job_id, State.FAILED, "GONE", 1, reason="the job's process ended without an exit status")


def local_job_alive(job_id: str, exp_dir: Path) -> bool:
    """The pid is alive and still runs this experiment's script (not a recycled pid)."""
    try:
        cmdline = Path(f"/proc/{int(job_id)}/cmdline").read_bytes()
    except (OSError, ValueError):
        return False
    return str(exp_dir).encode() in cmdline and _not_zombie(int(job_id))


def _not_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def signal_local(job_id: str, exp_dir: Path, sig: int) -> None:
    """Signal the job's whole process group (the script and every rank it started)."""
    if local_job_alive(job_id, exp_dir):
        try:
            os.killpg(int(job_id), sig)
        except ProcessLookupError:
            pass
