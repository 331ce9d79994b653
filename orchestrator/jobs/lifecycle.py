"""What happens to an experiment after `submit`: cancel it, resume its unfinished runs, re-run its
recipe as a new experiment, compare two experiments."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
import time
from pathlib import Path

from orchestrator import experiments
from orchestrator.config import configfile
from orchestrator.errors import UserError, WorkFailed
from orchestrator.experiments import Experiment
from orchestrator.jobs import scheduler, status
from orchestrator.jobs.executors import LocalScriptJob
from orchestrator.jobs.scheduler import State


def cancel(exp: Experiment) -> bool:
    """Cancel the experiment's jobs through their submitit handles; False when there was nothing left
    to cancel (its outcome stays)."""
    if exp.executor == "local":
        alive = [job for job in (LocalScriptJob(exp.path, j, script=exp.script) for j in exp.job_ids) if job.alive()]
        for job in alive:
            job.cancel()
        return bool(alive)
    # one scancel per submission: cancelling an array's id cancels every element it still has
    cancelled = False
    for job_id, job in own_slurm_jobs(exp).items():
        if job.state.finished:
            continue  # already ended: it keeps its outcome
        try:
            out = scheduler.run_command(["scancel", job_id])
        except (OSError, subprocess.TimeoutExpired) as e:
            raise WorkFailed(f"scancel {job_id} failed: {e}") from None
        if out.returncode:
            raise WorkFailed(f"scancel {job_id} failed: {out.stderr.strip() or out.returncode}")
        cancelled = True
    return cancelled


def own_slurm_jobs(exp: Experiment) -> dict[str, scheduler.JobInfo]:
    """The experiment's Slurm submissions that are still its own, by base job id: a job id the scheduler
    has no record of, or that names another job (a copied experiment, a reused id), is left alone."""
    base_ids = sorted({j.split("_")[0] for j in exp.job_ids})
    try:
        known = scheduler.query_slurm(base_ids)
    except scheduler.SchedulerError as e:
        raise WorkFailed(f"cannot tell what the experiment's jobs are: {e}") from None
    own = {}
    for job_id in base_ids:
        elements = [info for key, info in known.items() if key.split("_")[0] == job_id]
        if elements and all(info.belongs_to(status.job_name(exp), exp.path) for info in elements):
            running = [info for info in elements if not info.state.finished]
            own[job_id] = running[0] if running else elements[0]
        else:
            print(f"{exp.id}: job {job_id} is not this experiment's any more (the scheduler has "
                  f"{'another job under that id' if elements else 'no record of it'}): left alone", file=sys.stderr)
    return own


def resume(exp: Experiment, runs: list[int] | None = None, force: bool = False, restart: bool = False) -> Experiment:
    """Start the experiment's script again for its unfinished runs (all of them, or `runs`).

    A run with a checkpoint continues from it (the trainer finds it) and appends to its MLPerf log; a
    run without one starts afresh. In loop mode the job also runs the runs that never started; runs
    that completed are skipped by the script. Every chosen run's checkpoint and log are checked first, as
    its trainer will check them (status.resume_refusal): one that would be refused stops the resume, nothing
    changed; `restart` sets the run's checkpoints and log aside (`set_aside`) and starts it from its beginning.
    An experiment whose state is unknown (the scheduler did not answer) is resumed only with `force`.
    """
    view = status.collect([exp])[0]
    if view.state in (State.RUNNING, State.PENDING):
        raise UserError(f"is {view.state.value.lower()}: wait for it to end (or cancel it) before resuming", where=exp.id)
    refuse_unknown(exp, view, "resuming", force)
    unfinished = [r.run for r in view.runs if r.state != State.COMPLETED]
    chosen = unfinished if runs is None else runs
    for run in chosen:
        if not 0 <= run < exp.nexp:
            raise UserError(f"experiment has runs 0..{exp.nexp - 1}", where="--run", key=str(run))
        if run not in unfinished:
            raise UserError(f"run {run} completed: nothing to resume", where="--run")
    if not chosen:
        raise UserError("every run completed: nothing to resume", where=exp.id)
    script = exp.path / exp.script
    if not script.is_file():  # checked before anything changes: launch() reads it last
        raise UserError(f"its job script {script.name} is missing from {exp.path}: nothing was changed (`bertctl rerun "
                        f"{exp.id}` renders the experiment again from its cluster file)", where=exp.id)
    for run in [] if restart else chosen:
        if refused := status.resume_refusal(exp, run):
            raise UserError(f"run {run} cannot resume: {refused}; nothing was changed. To start it again from its "
                            f"beginning: bertctl resume {exp.id} --run {run} --restart (docs/recovery.md)", where=exp.id)
    for run in chosen:
        if restart:
            set_aside(exp, run)
        reopen_run(exp, run)
    for marker in ("job.exit", "job.cancelled"):
        (exp.path / marker).unlink(missing_ok=True)
    from orchestrator.jobs.submit import launch

    started = launch(exp, chosen if exp.array else None)
    if exp.array:
        job_ids = list(exp.job_ids)
        for run, job in zip(chosen, started):
            job_ids[run] = job
    else:
        job_ids = started
    exp = dataclasses.replace(exp, job_ids=job_ids, history=[*exp.history, *started])
    experiments.save(exp)
    return exp


def refuse_unknown(exp: Experiment, view: status.ExperimentView, doing: str, force: bool) -> None:
    """An experiment whose state is unknown may still run: `doing` it could start a second job beside it."""
    if view.state is not State.UNKNOWN or force:
        return
    why = next((r.error for r in view.runs if r.state is State.UNKNOWN and r.error), "the scheduler gave no answer")
    raise UserError(f"its state is unknown ({why}): {doing} now could start a second job beside one still running; "
                    "once you know its jobs have ended, add --force", where=exp.id)


def set_aside(exp: Experiment, run: int) -> Path:
    """Run N's checkpoints, MLPerf log, metrics and TensorBoard curves moved to EXP/set_aside/run_N-<time>/ (kept, not
    deleted): the run starts again from its beginning, as if it had never started (its curves too: TensorBoard would
    otherwise show the new run's event files over the old run's, in one folder)."""
    folder = exp.path / "set_aside" / f"run_{run}-{time.strftime('%Y%m%dT%H%M%S')}"
    moved = {status.run_checkpoint_folder(exp, run): None, exp.result_file(run): None,
             exp.path / "metrics" / f"run_{run}.jsonl": None,
             exp.path / "tensorboard" / f"run_{run}": "tensorboard"}  # trainer/loop/curves.py::curves_folder
    for path, name in moved.items():
        if path.exists() or path.is_symlink():
            folder.mkdir(parents=True, exist_ok=True)
            shutil.move(path, folder / (name or path.name))  # the curves' run_N would meet the checkpoints' run_N
    return folder


def reopen_run(exp: Experiment, run: int) -> None:
    """Clear what says run N ended; without a checkpoint it must start afresh (new log, new cache_clear)."""
    runs = exp.path / "runs"
    for marker in (f"{run}.exit", f"{run}.interrupted"):
        (runs / marker).unlink(missing_ok=True)
    if status.checkpoint_update(exp, run) is None:
        (runs / f"{run}.started").unlink(missing_ok=True)


def rerun_cluster(exp: Experiment, overrides: list[str]):
    """The experiment's resolved cluster configuration with `overrides` on top, as a loaded cluster
    whose header and submit command name the original cluster file and every override."""
    from orchestrator.config.clusters import ClusterConfig

    path = exp.path / "cluster.yaml"
    raw = configfile.read_mapping(path)
    if isinstance(raw.get("run"), dict):
        raw["run"].pop("world_size", None)  # derived again from the resources
    where = f"{exp.id} (with -o {' -o '.join(overrides)})" if overrides else exp.id
    config = configfile.validate(ClusterConfig, configfile.apply_overrides(raw, overrides, ClusterConfig), where)
    return configfile.LoadedFile(config=config, path=path, source=exp.cluster_source,
                                 overrides=tuple(exp.overrides) + tuple(overrides))


# ---- bertctl diff

def flatten(value, prefix: str = "") -> dict[str, object]:
    """{'a': {'b': 1}} -> {'a.b': 1}; lists stay values."""
    if isinstance(value, dict):
        out: dict[str, object] = {}
        for key, child in value.items():
            out.update(flatten(child, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): value}


def resolved_config(exp: Experiment) -> dict[str, object]:
    try:
        return flatten(configfile.read_mapping(exp.path / "cluster.yaml"))
    except UserError:
        return {}


class Absent:
    """A key an experiment's cluster.yaml does not have (written before the key existed)."""

    def __repr__(self) -> str:
        return "(absent)"

    __str__ = __repr__


ABSENT = Absent()


def config_differences(a: Experiment, b: Experiment) -> list[tuple[str, object, object]]:
    """(key, value in a, value in b) for every key whose resolved value differs; ABSENT where one
    experiment lacks the key. A key one lacks and the other has as null (a key added since, unset:
    its default is None) is no difference."""
    ca, cb = resolved_config(a), resolved_config(b)
    rows = []
    for key in sorted(set(ca) | set(cb)):
        va, vb = ca.get(key, ABSENT), cb.get(key, ABSENT)
        if va != vb and not _unset_in_both(va, vb):
            rows.append((key, va, vb))
    return rows


def _unset_in_both(va, vb) -> bool:
    return (va is ABSENT and vb is None) or (va is None and vb is ABSENT)


def result_summary(exp: Experiment) -> dict[str, object]:
    """What the runs achieved: state, converged runs, mean time to train, samples, last accuracies."""
    from orchestrator.results import summary as results

    view = status.collect([exp])[0]
    summaries = [results.summarize(exp.result_file(r)) for r in range(exp.nexp)]
    minutes = [s.minutes for s in summaries if s.converged and s.minutes is not None]
    return {
        "state": view.state.value,
        "runs": exp.nexp,
        "converged": sum(1 for s in summaries if s.converged),
        "mean_minutes_to_train": round(sum(minutes) / len(minutes), 3) if minutes else None,
        "samples": [s.samples for s in summaries],
        "last_accuracy": [s.last_accuracy for s in summaries],
    }

