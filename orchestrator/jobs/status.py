"""`bertctl status`: experiments and their runs, from one scheduler query and the runs' own files.

A run's state combines the job's state (sacct, or the local controller) with what the script left
in the experiment directory: `runs/N.started` when run N began, `runs/N.exit` with its exit code.
Progress and the last eval accuracy come from the run's MLPerf log.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from orchestrator.config import strictyaml
from orchestrator.errors import UserError
from orchestrator.experiments import Experiment
from orchestrator.jobs import scheduler
from orchestrator.jobs.executors import batch_outputs
from orchestrator.jobs.scheduler import JobInfo, State
from orchestrator.results import resultlog
from orchestrator.results import summary as results
from trainer.config import REQUEUE_EXIT_CODE, expand_path
from trainer.config.checkpoint_folder import CheckpointRefused, latest_checkpoint, resume_point, step_of
from trainer.config.regular import open_regular, read_regular_text

ERROR_LINE = re.compile(r"(?i)(error|exception|traceback|no such file|not found|killed|denied|unbound variable)")
SRUN_PREFIX = re.compile(r"^\s*\d+: ")
# Slurm's own lines; with several slurmd on a host they read `slurmstepd-node1: error: ...`
SCHEDULER_LINE = re.compile(r"^(srun|slurmstepd(-[\w.-]+)?): ")
TAIL_BYTES = 256 * 1024  # of a run log, for its most telling line


@dataclass
class RunView:
    run: int
    state: State
    seed: int
    job_id: str
    nodes: int | None
    elapsed_s: float | None
    samples: int | None = None
    max_samples: int | None = None
    accuracy: float | None = None
    target: float | None = None
    outcome: str | None = None  # the MLPerf run_stop status: success | aborted
    error: str | None = None
    straggler: dict | None = None  # the last progress line's: the rank whose compute holds the others back


@dataclass
class ExperimentView:
    id: str
    cluster: str
    executor: str
    program: str
    created: float
    state: State
    job_ids: list[str]
    runs: list[RunView] = field(default_factory=list)

    def as_json(self) -> dict:
        data = asdict(self)
        data["state"] = self.state.value
        for run in data["runs"]:
            run["state"] = run["state"].value
        return data


def collect(exps: list[Experiment]) -> list[ExperimentView]:
    """Views of these experiments, asking Slurm once for every job among them."""
    slurm_ids = [j for e in exps if e.executor == "slurm" for j in e.job_ids]
    try:
        slurm = scheduler.query_slurm(slurm_ids)
    except scheduler.SchedulerError as e:
        slurm = {j: scheduler.unanswered(j, str(e)) for j in slurm_ids}
    return [view(e, slurm) for e in exps]


def recent(exps: list[Experiment], states: list[str] | None = None, cluster: str | None = None,
           limit: int = 20) -> list[ExperimentView]:
    """The newest experiments first, at most `limit`, filtered by cluster and by state. Without a
    state filter only the newest `limit` are looked at (one scheduler query for those), so `status`
    stays fast however many experiments the registry holds."""
    from orchestrator.errors import UserError

    unknown = sorted(set(states or ()) - {s.value for s in State})
    if unknown:
        raise UserError(f"unknown state {', '.join(unknown)} (states: {', '.join(s.value for s in State)})", where="--state")
    newest = sorted(exps, key=lambda e: e.created, reverse=True)
    if cluster:
        newest = [e for e in newest if e.cluster == cluster]
    if not states:
        return collect(newest[:limit])
    return [v for v in collect(newest) if v.state.value in states][:limit]


def view(exp: Experiment, slurm: dict[str, JobInfo]) -> ExperimentView:
    jobs = [job_info(exp, i, slurm) for i in range(exp.nexp)]
    runs = [run_view(exp, i, job) for i, job in enumerate(jobs)]
    # an experiment is over when its jobs are, even if every run already recorded its exit
    states = [r.state for r in runs] + [j.state for j in jobs if not j.state.finished]
    return ExperimentView(
        id=exp.id, cluster=exp.cluster, executor=exp.executor, program=exp.program,
        created=exp.created, state=overall_state(states), job_ids=exp.job_ids, runs=runs,
    )


def job_info(exp: Experiment, run: int, slurm: dict[str, JobInfo]) -> JobInfo:
    if not exp.job_ids:
        return JobInfo("", State.UNKNOWN)
    job_id = exp.job_ids[run] if len(exp.job_ids) == exp.nexp else exp.job_ids[0]
    if exp.executor == "local":
        return scheduler.local_job_info(job_id, exp.path, exp.script)
    info, foreign = slurm.get(job_id), None
    if info is not None and info.state is not State.UNKNOWN and not info.belongs_to(job_name(exp), exp.path):
        # accounting's newest record under this id is another job's (a copied experiment, or ids that began
        # again after a controller reset): the controller's queue may still hold this experiment's
        foreign, info = info, queued_own_job(exp, job_id)
    if info is None:
        if seconds_since_submission(exp, job_id) < scheduler.ACCOUNTING_GRACE_S:
            return JobInfo(job_id, State.PENDING, reason="not yet in accounting")  # just submitted
        if foreign is not None:
            return scheduler.gone(job_id, f"job {job_id} is another job ({foreign.name or '?'} in {foreign.work_dir or '?'})")
        return scheduler.gone(job_id, f"the scheduler has no record of job {job_id}")
    return info


def queued_own_job(exp: Experiment, job_id: str) -> JobInfo | None:
    """The experiment's job `job_id` as the controller's queue knows it (squeue), or None; UNKNOWN when the
    controller does not answer."""
    try:
        info = scheduler.query_queue([job_id.split("_")[0]]).get(job_id)
    except scheduler.SchedulerError as e:
        return scheduler.unanswered(job_id, str(e))
    return info if info is not None and info.belongs_to(job_name(exp), exp.path) else None


def job_name(exp: Experiment) -> str:
    """The name bertctl gives the experiment's jobs (orchestrator/rendering/render.py::sbatch_options)."""
    return f"bert-{exp.cluster}"


def seconds_since_submission(exp: Experiment, job_id: str) -> float:
    """Since submitit wrote the job's batch file (`<id>_submission.sh`), or since the experiment was made."""
    from orchestrator.jobs.executors import slurm_job

    try:
        submitted = slurm_job(exp.path, job_id).paths.submission_file.stat().st_mtime
    except OSError:
        submitted = exp.created
    return time.time() - submitted


def run_view(exp: Experiment, run: int, job: JobInfo) -> RunView:
    started = exp.path / "runs" / f"{run}.started"
    exit_file = exp.exit_file(run)
    interrupted = (exp.path / "runs" / f"{run}.interrupted").exists()
    state = run_state(job, started.exists(), _read_exit(exit_file), interrupted)
    end = exit_file.stat().st_mtime if exit_file.exists() else time.time()
    rv = RunView(
        run=run, state=state, seed=exp.seeds[run], job_id=job.job_id, nodes=job.nodes,
        elapsed_s=round(end - started.stat().st_mtime, 1) if started.exists() else None,
    )
    damage = add_progress(rv, exp) if exp.program == "train" else None
    if damage:  # a run whose log breaks MLPerf's rules did not produce a result, whatever its exit code
        rv.state = State.FAILED if state == State.COMPLETED else state
        rv.error = damage
    elif ended_by_its_log(state, rv, exit_file):
        # the log's own run_stop is the run's end: a crash between it and the exit record loses nothing
        rv.state = state = State.COMPLETED
    elif state == State.INTERRUPTED:
        refused = resume_refusal(exp, run)
        update = checkpoint_update(exp, run)
        reached = f" at update {update}" if update is not None else ""
        rv.error = f"cannot resume: {refused}" if refused else f"checkpoint saved{reached}: bertctl resume {exp.id} continues it"
    elif state == State.UNKNOWN and job.reason:
        rv.error = job.reason  # what the scheduler did (not) say: the run's own log cannot tell
    elif state in (State.FAILED, State.TIMEOUT, State.UNKNOWN) or (state == State.CANCELLED and started.exists()):
        rv.error = last_error(exp, run, job)
    return rv


def ended_by_its_log(state: State, rv: RunView, exit_file: Path) -> bool:
    """A run whose (undamaged) MLPerf log holds run_stop, with no exit recorded and no job running it."""
    return rv.outcome is not None and state not in (State.RUNNING, State.COMPLETED) and _read_exit(exit_file) is None


def run_state(job: JobInfo, started: bool, exit_code: int | None, interrupted: bool = False) -> State:
    if exit_code is not None:
        return State.COMPLETED if exit_code == 0 else State.FAILED
    if interrupted:  # `bertctl resume` removes the mark before it starts the run again
        return State.INTERRUPTED
    if job.state.finished and job.exit_code.split(":")[0] == str(REQUEUE_EXIT_CODE):
        return State.INTERRUPTED  # the job stopped at an interrupted run: this one waits for the resume
    if job.state.finished:
        # the job is over and this run never recorded an exit: it shares the job's fate
        return State.FAILED if job.state == State.COMPLETED else job.state
    if job.state == State.RUNNING:
        return State.RUNNING if started else State.PENDING  # waiting its turn in the NEXP loop
    return job.state


def overall_state(states: list[State]) -> State:
    for s in (State.RUNNING, State.PENDING, State.UNKNOWN):
        if s in states:
            return s
    for s in (State.INTERRUPTED, State.FAILED, State.TIMEOUT, State.CANCELLED):
        if s in states:
            return s
    return State.COMPLETED


def add_progress(rv: RunView, exp: Experiment) -> str | None:
    """Progress from the run's MLPerf log; returns what is wrong with the log, if anything."""
    path = exp.result_file(rv.run)
    try:
        summary = results.summarize(path)
    except UserError as e:  # not a regular file, or too large: say so, and list the other runs
        return f"damaged log: {e}"
    rv.samples = summary.samples
    rv.accuracy = summary.last_accuracy
    rv.outcome = summary.status
    run = _run_config(exp)
    train = run.get("train") if isinstance(run.get("train"), dict) else {}
    rv.target = _number(train.get("target_accuracy"), float)
    rv.max_samples = _number(train.get("max_samples_termination"), int)
    rv.straggler = last_straggler(exp.path / "metrics" / f"run_{rv.run}.jsonl")
    return f"damaged log: {path.name} {summary.problem}" if summary.problem else None


def last_straggler(metrics: Path) -> dict | None:
    """The straggler the run's last progress line names (trainer/loop/stragglers.py), if any: only the file's tail is read."""
    try:
        with open_regular(metrics, "rb") as f:
            f.seek(max(f.seek(0, 2) - 2**20, 0))
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line being written, or the cut first one
        return record.get("straggler") if isinstance(record, dict) else None
    return None


def last_error(exp: Experiment, run: int, job: JobInfo) -> str | None:
    """The most telling line of the run's log (or the job's), for the status table."""
    candidates = [exp.log_file(run), *batch_outputs(exp.executor, exp.path, exp.history)]
    for path in candidates:
        line = _telling_line(path)
        if line:
            return line
    return job.reason or None


def _telling_line(path: Path) -> str | None:
    try:  # the tail only: a run log can be gigabytes, or a FIFO that would block
        lines = resultlog.read_tail(path, TAIL_BYTES).splitlines()[-200:]
    except UserError as e:
        return None if not path.exists() else str(e)
    lines = [SRUN_PREFIX.sub("", line).strip() for line in lines]
    lines = [line for line in lines if line and not line.startswith("===")]
    errors = [line for line in lines if ERROR_LINE.search(line)]
    # srun's own summary ("srun: error: node1: tasks 0-1: Exited with exit code 1") says less
    # than the task's message that caused it
    own = [line for line in errors if not SCHEDULER_LINE.match(line)]
    return (own or errors or lines or [None])[-1]


def run_checkpoint_folder(exp: Experiment, run: int) -> Path:
    """Run N's checkpoints: the run's checkpoint.dir, or EXP/checkpoints/run_N (trainer/checkpoints/run.py::run_checkpoints)."""
    configured = (_run_config(exp).get("checkpoint") or {}).get("dir")
    return Path(expand_path(configured)) if isinstance(configured, str) and configured else exp.path / "checkpoints" / f"run_{run}"


def checkpoint_update(exp: Experiment, run: int) -> int | None:
    """The update of run N's latest checkpoint, the one its trainer resumes from (the same function decides:
    trainer/config/checkpoint_folder.py::latest_checkpoint); None without one, or when it is refused."""
    try:
        latest = latest_checkpoint(run_checkpoint_folder(exp, run))
    except CheckpointRefused:
        return None
    return None if latest is None else step_of(latest)


def resume_refusal(exp: Experiment, run: int) -> str | None:
    """Why run N's trainer would refuse to resume (its latest checkpoint, or its log, is not what it should be), or None."""
    try:
        resume_point(run_checkpoint_folder(exp, run), exp.result_file(run), run_identity(exp, run))
    except CheckpointRefused as e:
        return f"{e.path}: {e.reason}"
    return None


def run_identity(exp: Experiment, run: int) -> dict:
    """What run N's checkpoints record of it: the seed its job script passes the trainer (--seed) and its index."""
    return {"seed": exp.seeds[run], "run_index": run}


def world_size(exp: Experiment) -> int | None:
    """The ranks each run starts, as run.yaml says (None when it does not say)."""
    ranks = _number(_run_config(exp).get("world_size"), int)
    return ranks if ranks is not None and ranks >= 1 else None


def _read_exit(path: Path) -> int | None:
    try:
        return int(read_regular_text(path, limit=64).strip())
    except (OSError, ValueError):  # a FIFO or a device where the file belongs is a run without an exit
        return None


def _run_config(exp: Experiment) -> dict:
    try:
        run = strictyaml.load(read_regular_text(exp.path / "run.yaml", limit=1 << 20))
    except (OSError, ValueError):  # strictyaml.YAMLProblem is a ValueError
        return {}
    return run if isinstance(run, dict) else {}


def _number(value, kind):
    """A run.yaml number shown in the table, or None for anything else (a hand-edited string, a bool)."""
    return kind(value) if type(value) in (int, float) and math.isfinite(value) else None


def print_table(views: list[ExperimentView], console, damaged=()) -> None:
    """The table; `damaged` registry entries (experiments.Damaged) are rows of their own with the reason."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(show_lines=False, header_style="bold")
    for col in ("experiment", "run", "state", "job", "nodes", "elapsed", "seed", "samples", "eval acc", "note"):
        table.add_column(col, overflow="fold")
    for v in views:
        for r in v.runs:
            table.add_row(
                v.id if r.run == 0 else "", str(r.run), _styled(r.state), r.job_id, _dash(r.nodes),
                _duration(r.elapsed_s), str(r.seed), _samples(r), _accuracy(r), escape(r.error or r.outcome or _straggler(r)),
            )
    for d in damaged:
        table.add_row(escape(d.id), "-", "[red]DAMAGED[/red]", "-", "-", "-", "-", "-", "-", escape(d.reason))
    console.print(table)


def _straggler(r: RunView) -> str:
    s = r.straggler
    try:  # the metrics file is the run's own, but a damaged one must not take `status` down
        return f"straggler: rank {int(s['rank'])} on {s['node']} (+{100 * float(s['over_median']):.0f} % compute)"
    except (TypeError, KeyError, ValueError):
        return ""


def _styled(state: State) -> str:
    color = {State.COMPLETED: "green", State.RUNNING: "cyan", State.PENDING: "yellow"}.get(state, "red")
    return f"[{color}]{state.value}[/{color}]"


def _dash(value) -> str:
    return "-" if value is None else str(value)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}"


def _samples(r: RunView) -> str:
    if r.samples is None:
        return "-"
    return f"{r.samples:,}" + (f" / {r.max_samples:,}" if r.max_samples else "")


def _accuracy(r: RunView) -> str:
    if r.accuracy is None:
        return "-"
    return f"{r.accuracy:.4f}" + (f" / {r.target:.3f}" if r.target else "")
