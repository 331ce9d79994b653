"""Building a dataset on Slurm: one job array per stage, rendered from
templates/data_prepare.sbatch.j2, each stage depending on the previous one (afterok).

Every array task runs `run --stage S --group J` and, when it fails, writes its error record to
errors/<stage>_<J>.json in the job folder (see orchestrator/data/workers.py), which is what
`--wait` reports. `--wait` follows the scheduler's evidence only (orchestrator/jobs/scheduler.py): a command that
fails or times out is no answer, waited out for a while, never an end; a job the queue listed and lists no more
(a cluster without accounting) has ended, and its tasks' error records say whether it failed.
"""

from __future__ import annotations

import json
import secrets
import shlex
import shutil
import time
from pathlib import Path

from orchestrator import __version__, resources
from orchestrator.data import workers
from orchestrator.data.local import Prepared
from orchestrator.data.manifest import LoadedManifest, write_manifest
from orchestrator.errors import UserError, WorkFailed
from orchestrator.jobs import scheduler
from orchestrator.jobs.executors import SlurmScriptExecutor, SubmissionRefused


def prepare_on_slurm(loaded: LoadedManifest, cluster, force: bool, wait: bool, say) -> Prepared:
    from orchestrator.jobs.submit import require_slurm

    require_slurm()
    job_dir = new_job_dir(loaded.config.name)
    manifest_file = write_manifest(loaded, job_dir)
    try:
        plan = workers.start(manifest_file, force)
    except BaseException:
        shutil.rmtree(job_dir, ignore_errors=True)
        raise
    if not plan["stages"]:
        shutil.rmtree(job_dir, ignore_errors=True)
        say(f"{loaded.config.name}: complete at {plan['root']}")
        return Prepared(plan["root"], "complete", [])
    (job_dir / "logs").mkdir()
    names = [s["name"] for s in plan["stages"]]
    job_ids: list[str] = []
    for position, stage in enumerate(plan["stages"], start=1):
        script = render_stage(loaded, cluster, stage["name"], stage["tasks"], names, position,
                              after=job_ids[-1] if job_ids else None)
        path = job_dir / f"{position}-{stage['name']}.sbatch"
        path.write_text(script)
        job_ids.append(submit_stage(path, job_dir, cluster.config.container.kind))
    (job_dir / "jobs.json").write_text(json.dumps({"stages": names, "job_ids": job_ids, "root": plan["root"]}, indent=1))
    say(f"{loaded.config.name}: submitted {len(job_ids)} job array(s) ({', '.join(f'{n} {j}' for n, j in zip(names, job_ids))}); "
        f"scripts and logs in {job_dir}")
    if wait:
        if wait_for_jobs(job_dir, names, job_ids, say):
            say(f"{loaded.config.name}: the jobs ended at {plan['root']}; without accounting bertctl cannot tell how: "
                f"bertctl data verify --dataset {loaded.config.name} checks the result")
        else:
            say(f"{loaded.config.name}: prepared at {plan['root']}")
    return Prepared(plan["root"], "submitted", job_ids, job_dir)


def new_job_dir(dataset: str) -> Path:
    folder = resources.bertctl_home() / "data-jobs" / f"{dataset}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(4)}"
    folder.mkdir(parents=True)
    return folder


def array_groups(total: int, max_array_tasks: int) -> tuple[int, int]:
    """(array tasks, tasks per array task) so that there are at most `max_array_tasks` array tasks."""
    size = max(1, -(-total // max_array_tasks))
    return -(-total // size), size


def render_stage(loaded: LoadedManifest, cluster, stage: str, tasks: int, stages: list[str], position: int,
                 after: str | None) -> str:
    """The sbatch script of one stage: a pure function of its arguments."""
    from orchestrator.rendering.render import container_mounts, node_environment, render_template

    c = cluster.config
    array_size, group_size = array_groups(tasks, loaded.config.prepare.array_tasks)
    return render_template(
        "data_prepare.sbatch.j2", version=__version__, source=loaded.source, overrides=[*loaded.overrides, *cluster.overrides],
        dataset=loaded.config.name, stage=stage, stages=stages, position=position, tasks=tasks,
        array_size=array_size, group_size=group_size, after=after, c=c,
        sbatch_options=data_sbatch_options(c, loaded.config.name, stage, array_size, after),
        env=node_environment(c), mounts=container_mounts(c),
        submit_command=shlex.join(["bertctl", "data", "prepare", "--dataset", loaded.config.name, "--cluster", c.name,
                                   *[w for o in (*loaded.overrides, *cluster.overrides) for w in ("-o", o)]]),
    )


def data_sbatch_options(c, dataset: str, stage: str, array_size: int, after: str | None) -> list[str]:
    """One CPU task per array element, the cluster's partition, account, time limit and extra flags
    (no GPUs, not exclusive)."""
    from orchestrator.rendering.render import sbatch_lines, where_and_how_long

    s = c.slurm
    return sbatch_lines([
        ("job-name", f"data-{dataset}-{stage}"),
        ("array", f"0-{array_size - 1}"),
        ("ntasks", 1),
        ("cpus-per-task", c.resources.cpus_per_task or 1),
        *where_and_how_long(s),
        ("mem", s.mem if s.mem not in (None, "0") else None),
        ("output", f"logs/{stage}_%A_%a.out"),
        ("open-mode", "append"),
        ("dependency", f"afterok:{after}" if after else None),
        ("kill-on-invalid-dep", "yes" if after else None),
    ], s.extra_sbatch)


def submit_stage(path: Path, job_dir: Path, container: str) -> str:
    """Submit the stage's script through the same submitit executor as a training job (its batch
    file: the script at `path`). Without a container the job runs the Python that submitted it."""
    from orchestrator.jobs.submit import job_environment

    executor = SlurmScriptExecutor(job_dir, path.read_text(), job_environment(container))
    try:
        return executor.submit_script(path).job_id
    except SubmissionRefused as e:
        raise UserError(f"sbatch refused the job: {e}", where="sbatch") from None


# How long `--wait` waits out a scheduler that does not answer (a controller restarting or failing over answers
# again within minutes) before it gives up with the jobs' ids: they may still run.
SILENCE_LIMIT_S = 600


def wait_for_jobs(job_dir: Path, stages: list[str], job_ids: list[str], say, poll_s: float = 2.0,
                  silence_limit_s: float = SILENCE_LIMIT_S) -> list[str]:
    """Until every stage's array has finished; a failed or cancelled stage is WorkFailed with its error. Returns the
    stages whose end no accounting described (the queue stopped listing them and no task recorded an error)."""
    reported: dict[str, str] = {}
    listed: set[str] = set()
    began, silent_since = time.monotonic(), None
    while True:
        infos, why = scheduler_answer(job_ids)
        if why is not None:
            if silent_since is None:
                silent_since = time.monotonic()
                say(f"  {why}: waiting up to {silence_limit_s:g} s for an answer")
            elif time.monotonic() - silent_since >= silence_limit_s:
                raise no_answer(job_dir, job_ids, why, time.monotonic() - silent_since)
            time.sleep(poll_s)
            continue
        silent_since = None
        for stage, job in zip(stages, job_ids):
            states = [i.state for key, i in infos.items() if key.split("_")[0] == job]
            if states:
                listed.add(job)
                summary = stage_state(states)
            elif job in listed or time.monotonic() - began > scheduler.ACCOUNTING_GRACE_S:
                # no record of it, though the queue listed it (or would have by now): it has ended, as
                # orchestrator/jobs/status.py::job_info reads a job the scheduler no longer knows; its records decide
                summary = "FAILED" if stage_errors(job_dir, stage) else "ENDED"
            else:
                continue  # just submitted: not listed yet
            if reported.get(stage) != summary:
                reported[stage] = summary
                say(f"  {stage} (job {job}): {ENDED if summary == 'ENDED' else summary}")
            if summary in ("FAILED", "CANCELLED", "TIMEOUT"):
                raise WorkFailed(f"stage {stage} (job {job}) {summary.lower()}: {first_error(job_dir, stage)}")
        if all(reported.get(stage) in ("COMPLETED", "ENDED") for stage in stages):
            return [stage for stage in stages if reported[stage] == "ENDED"]
        time.sleep(poll_s)


ENDED = "ended (the queue no longer lists it and no accounting says how; no task recorded an error)"


def no_answer(job_dir: Path, job_ids: list[str], why: str, seconds: float) -> WorkFailed:
    """The one line that ends a wait the scheduler did not answer: the jobs may still run, and how to see them."""
    ids = ",".join(dict.fromkeys(j.split("_")[0] for j in job_ids))
    return WorkFailed(f"{why} for {seconds:.0f} s: jobs {ids} may still run; "
                      f"`squeue -j {ids}` or `sacct -j {ids}` shows them once it answers (logs: {job_dir / 'logs'})")


def scheduler_answer(job_ids: list[str]) -> tuple[dict[str, scheduler.JobInfo], str | None]:
    """The scheduler's states of these jobs, or why it did not answer (a command that failed or timed out, for any
    of them), in orchestrator/jobs/scheduler.py::unanswered's words."""
    try:
        infos = scheduler.query_slurm(job_ids)
    except scheduler.SchedulerError as e:
        return {}, scheduler.unanswered("", str(e)).reason
    silent = [i.reason for i in infos.values() if i.raw_state == scheduler.NO_ANSWER]
    return (infos, silent[0]) if silent else (infos, None)


def stage_state(states: list) -> str:
    values = {s.value for s in states}
    for bad in ("FAILED", "TIMEOUT", "CANCELLED"):
        if bad in values:
            return bad
    if values == {"COMPLETED"}:
        return "COMPLETED"
    return "RUNNING" if "RUNNING" in values or "COMPLETED" in values else "PENDING"


def stage_errors(job_dir: Path, stage: str) -> list[dict]:
    """The error records the stage's failed tasks wrote, in task order."""
    records = (workers.read_error(f) for f in sorted((job_dir / "errors").glob(f"{stage}_*.json")))
    return [r for r in records if r]


def first_error(job_dir: Path, stage: str) -> str:
    """The first failed task's error record, else where to look."""
    for record in stage_errors(job_dir, stage):
        where = f"{record['file']}: " if record.get("file") else ""
        return f"{where}{record['message']} (log: {job_dir / 'logs'})"
    return f"see the logs in {job_dir / 'logs'}"
