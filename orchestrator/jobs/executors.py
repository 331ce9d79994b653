"""Submission and job handles through submitit's executor plugin interface.

A submitit plugin is a `PicklingExecutor` subclass implementing four abstract hooks: the text of the
batch file, the command that submits it, the job id in that command's answer, and the number of
tasks. bertctl's executors return its rendered script as the batch file, byte for byte what
`bertctl render` and `--dry-run` print, so the job stays a readable bertctl script that `sbatch`
(or `bash`) runs alone. What submitit adds: the submission itself (`Executor.submit`, the batch
file kept as `<job>_submission.sh` beside the experiment), and `Job` handles (`SlurmJob`: cancel,
`stdout()`, `paths`; the local job's handle is `LocalScriptJob` below).

`submit` takes a callable, which submitit pickles beside the job (`<job>_submitted.pkl`): bertctl
hands it a `BatchScript`, the record of what the job runs. The batch file never unpickles it (it
does not run submitit's `_submit` command): it is the script itself.

submitit's own pieces that cannot serve, and why (bertctl keeps its own code for them):
- `LocalExecutor` runs a pickled callable under a controller that is a child of the submitting
  process (it holds the caller's stdout, so `EXP=$(bertctl submit ...)` would wait for the job), kills
  it after `timeout_min`, and knows its state only through that process's `Popen` object, so a later
  `bertctl status` or `cancel` could not reach it. `LocalScriptExecutor` starts the script detached
  instead, and `LocalScriptJob` finds it again from its pid and the experiment directory.
- `SlurmExecutor` writes its own sbatch file, parses `sbatch`'s human answer and submits arrays of
  pickles through a plain `SlurmExecutor` (which would lose these hooks): bertctl renders its own
  `--array` script and submits it once.
- the state query: see orchestrator/jobs/scheduler.py::query_slurm.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from submitit.core import core, utils
from submitit.slurm.slurm import SlurmJob

from trainer.config.regular import read_regular_text

SUBMIT_TIMEOUT_S = 60  # sbatch's time to answer (orchestrator/jobs/scheduler.py::TIMEOUT_S for the other commands)


class SubmissionRefused(Exception):
    """The scheduler refused the job (its message)."""


@dataclass(frozen=True)
class BatchScript:
    """What a bertctl job runs: its script. Handed to submitit's `submit`, which records it pickled
    beside the job; calling it runs the script as the batch file does (bash, in its directory)."""

    path: Path

    def __call__(self) -> int:
        return subprocess.run(["bash", str(self.path)], cwd=self.path.parent).returncode


class ScriptExecutor(core.PicklingExecutor):
    """An executor whose batch file is a given script (`update_parameters(script=...)`), submitted
    from `folder` in the environment `environment` (added to this process's)."""

    def __init__(self, folder: Path, script: str, environment: dict[str, str] | None = None) -> None:
        super().__init__(folder)
        self.update_parameters(script=script, environment=dict(environment or {}))

    def submit_script(self, path: Path) -> core.Job:
        """Submit the script (its copy at `path` is the experiment's record); the scheduler's refusal
        is SubmissionRefused with its message (submitit would also print it)."""
        quiet = io.StringIO()
        before = set(self.folder.iterdir()) if self.folder.is_dir() else set()
        try:
            with contextlib.redirect_stderr(quiet):
                return self.submit(BatchScript(path))
        except (utils.FailedJobError, utils.FailedSubmissionError, OSError) as e:
            for leftover in set(self.folder.iterdir()) - before:  # submitit's pickle and batch file
                leftover.unlink()
            message = str(e).strip() or quiet.getvalue().strip()
            if "status 124" in message:  # timeout's own exit status
                message = f"sbatch did not answer within {SUBMIT_TIMEOUT_S} s"
            raise SubmissionRefused(message.splitlines()[-1] if message else type(e).__name__) from None

    # ---- submitit's plugin hooks (abstract in PicklingExecutor; tests/test_submitit_executor.py pins their shape)

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        # `command` runs submitit's pickle; the bertctl script runs the job itself
        return self.parameters["script"]

    def _num_tasks(self) -> int:
        # one batch script per job; its ranks write the run logs, not per-task submitit logs
        return 1

    def in_environment(self, command: list[str]) -> list[str]:
        assignments = [f"{key}={value}" for key, value in sorted(self.parameters["environment"].items())]
        return ["env", *assignments, *command] if assignments else command


class SlurmScriptExecutor(ScriptExecutor):
    """`sbatch --parsable --chdir=<folder> [flags] <batch file>`; handles are submitit's `SlurmJob`."""

    job_class = SlurmJob

    def __init__(self, folder: Path, script: str, environment: dict[str, str] | None = None,
                 sbatch_flags: list[str] = ()) -> None:
        super().__init__(folder, script, environment)
        self.sbatch_flags = list(sbatch_flags)

    def _make_submission_command(self, submission_file_path: Path) -> list[str]:
        # coreutils' timeout: submitit runs the command without a time limit, and a hung slurmctld would hang submit
        return self.in_environment(["timeout", str(SUBMIT_TIMEOUT_S), "sbatch", "--parsable", f"--chdir={self.folder}",
                                    *self.sbatch_flags, str(submission_file_path)])

    @staticmethod
    def _get_job_id_from_submission_command(string: bytes | str) -> str:
        """`--parsable` answers `123` or `123;cluster`."""
        text = string.decode() if isinstance(string, bytes) else string
        lines = text.strip().splitlines()
        job_id = lines[-1].split(";")[0].strip() if lines else ""
        if not job_id.isdigit():
            raise utils.FailedSubmissionError(f"sbatch: unexpected answer {text.strip()!r}")
        return job_id


def slurm_job(folder: Path, job_id: str) -> SlurmJob:
    """submitit's handle on a Slurm job (or array element `123_4`) whose batch file ran in `folder`."""
    return SlurmJob(folder, job_id)


def batch_outputs(executor: str, folder: Path, job_ids: list[str]) -> list[Path]:
    """The batch scripts' own output (what `Job.stdout()` reads), one file per job, in this order."""
    handle = LocalScriptJob if executor == "local" else SlurmJob
    return [handle(folder, job_id).paths.stdout for job_id in job_ids]


# ---- the local executor: the script as a detached process group on this machine

# started in the background by a shell that exits at once (so init reaps it, not us), in its own session
# (so `cancel` can signal the whole group), stdin from /dev/null and output appended to the log submitit's
# JobPaths names after the job id, which is the pid: `exec` keeps the pid of the process setsid became
LOCAL_LAUNCHER = (
    'cd "$2" && { setsid bash -c \'exec bash "$0" </dev/null >>"$1/$$_0_log.out" 2>&1\' "$1" "$2" & echo $!; }'
)


class LocalScriptJob(core.Job):
    """A local job: the script's process (job id = pid) in the experiment directory `folder`, and every process
    of the session it leads. The script writes `job.exit` when it ends; `cancel` leaves `job.cancelled`."""

    def __init__(self, folder: Path, job_id: str, tasks=(0,), script: str = "job.sh") -> None:
        super().__init__(folder, job_id, tasks)
        self.script = self.paths.folder / script  # the experiment's record of what its job runs (Experiment.script)

    @property
    def exit_file(self) -> Path:
        return self.paths.folder / "job.exit"

    @property
    def cancelled_file(self) -> Path:
        return self.paths.folder / "job.cancelled"

    @property
    def state(self) -> str:
        """Slurm's words, so that one table maps both (orchestrator/jobs/scheduler.py::SLURM_STATES). A job asked
        to stop is RUNNING until its last process ends: its ranks are still saving their checkpoints."""
        if self.alive():
            return "RUNNING"
        if self.cancelled_file.exists():
            return "CANCELLED"
        code = self.exit_code()
        if code is None:
            return "UNKNOWN"
        return "COMPLETED" if code == "0" else "FAILED"

    def exit_code(self) -> str | None:
        try:  # a FIFO or device there must not block `status`: one OSError, like a missing file
            return read_regular_text(self.exit_file, limit=64).strip()
        except (OSError, UnicodeDecodeError):
            return None

    def get_info(self, mode: str = "force") -> dict[str, str]:
        return {"JobID": self.job_id, "State": self.state, "ExitCode": self.exit_code() or ""}

    def done(self, force_check: bool = False) -> bool:
        return not self.alive()

    def alive(self) -> bool:
        """The job runs while its script does (`leads_its_session`) or, once that shell is gone (killed), while
        any process of its session still works in the experiment (`session_members`): a trainer its killed shell
        left behind is still the job, and a second one must not start beside it."""
        try:
            pid = int(self.job_id)
        except ValueError:
            return False
        stat = process_stat(pid)
        if pid > 1 and stat is not None and stat.state != "Z":
            return self.leads_its_session(pid)  # a live process under the job's pid is the job's shell, or no job of ours
        return pid > 1 and bool(self.session_members(pid))

    def leads_its_session(self, pid: int) -> bool:
        """`pid` is the job's shell: the leader of the session LOCAL_LAUNCHER made, running bash on exactly the
        script the experiment recorded. A recycled pid, any process that merely names the experiment (a `tail -f`
        of its log, an editor), or another script of its folder is not the job: `cancel` must never signal it."""
        stat = process_stat(pid)
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        if stat is None or stat.state == "Z" or stat.group != pid or stat.session != pid or len(args) < 2:
            return False
        script = Path(os.fsdecode(args[1]))
        if not script.is_absolute():  # as bash opened it: from the process's working directory
            with contextlib.suppress(OSError):
                script = Path(os.readlink(f"/proc/{pid}/cwd")) / script
        return Path(os.fsdecode(args[0])).name == "bash" and os.path.realpath(script) == os.path.realpath(self.script)

    def session_members(self, session: int) -> list[int]:
        """The live processes of session `session` that work in this experiment (their working directory, where
        LOCAL_LAUNCHER put the script, or the EXP_DIR it exports). While any lives the session's id cannot be
        reused (the kernel keeps a pid while a session or group bears it), so they are the job's own."""
        members = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == session:
                continue
            stat = process_stat(int(entry.name))
            if stat is not None and stat.session == session and stat.state != "Z" and self.works_here(entry):
                members.append(int(entry.name))
        return members

    def works_here(self, proc: Path) -> bool:
        folder = os.path.realpath(self.paths.folder)
        with contextlib.suppress(OSError):
            if os.path.realpath(os.readlink(proc / "cwd")) == folder:
                return True
        with contextlib.suppress(OSError):
            variables = (proc / "environ").read_bytes().split(b"\0")
            return any(v.startswith(b"EXP_DIR=") and os.path.realpath(os.fsdecode(v[8:])) == folder for v in variables)
        return False

    def cancel(self, check: bool = True) -> None:
        """SIGTERM to the whole process group (the script and every rank it started), what scancel
        sends first; a job that already ended keeps its outcome."""
        if not self.alive():
            return
        self.cancelled_file.touch()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(self.job_id), signal.SIGTERM)


@dataclass(frozen=True)
class ProcessStat:
    state: str
    group: int
    session: int


def process_stat(pid: int) -> ProcessStat | None:
    """A process's state, process group and session (/proc/PID/stat), None when it does not exist."""
    try:  # the command name, in parentheses, may hold spaces and parentheses: the fields follow its last ")"
        state, _, group, session = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[:4]
        return ProcessStat(state, int(group), int(session))
    except (OSError, ValueError):
        return None


class LocalScriptExecutor(ScriptExecutor):
    """Starts the experiment's script detached on this machine; the job id is its pid."""

    job_class = LocalScriptJob

    def __init__(self, folder: Path, script: str, environment: dict[str, str] | None = None,
                 script_name: str = "job.sh") -> None:
        super().__init__(folder, script, environment)
        self.script_name = script_name

    def submit_script(self, path: Path) -> LocalScriptJob:
        job = super().submit_script(path)
        job.script = self.folder / self.script_name  # what LOCAL_LAUNCHER runs (submitit makes the handle with the default)
        return job

    def _make_submission_command(self, submission_file_path: Path) -> list[str]:
        # the experiment's own copy (the same bytes): the script finds its experiment next to itself,
        # and submitit renames the submission file once this command returns, maybe before bash opens it
        script = self.folder / self.script_name
        return self.in_environment(["bash", "-c", LOCAL_LAUNCHER, "bertctl-local", str(script), str(self.folder)])

    @staticmethod
    def _get_job_id_from_submission_command(string: bytes | str) -> str:
        text = (string.decode() if isinstance(string, bytes) else string).strip()
        if not text.isdigit():
            raise utils.FailedSubmissionError(f"the local job did not start: {text!r}")
        return text
