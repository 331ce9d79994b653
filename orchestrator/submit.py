"""Submission: render, record the experiment, hand the script to submitit.

submitit does what it does well (calling sbatch and reading the job id, starting a detached local
controller); the script it submits is ours. `ScriptSlurmExecutor` is submitit's Slurm executor with
the submission-file hook changed to return the rendered bertctl script; the local executor runs
the rendered script as its command.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import submitit
import yaml
from submitit.core.utils import FailedJobError

from orchestrator import experiments, render as rendering
from orchestrator.clusters import LoadedCluster
from orchestrator.errors import UserError
from orchestrator.experiments import Experiment
from trainer.config import PathError, expand_path


class ScriptSlurmExecutor(submitit.SlurmExecutor):
    """submitit's Slurm executor submitting a bertctl script, from the experiment directory."""

    def __init__(self, folder: Path, script: str, workdir: Path):
        super().__init__(folder)
        self._script = script
        self._workdir = workdir

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        return self._script

    def _make_submission_command(self, submission_file_path: Path) -> list[str]:
        # --chdir: the script writes everything under its working directory, the experiment's
        return ["sbatch", f"--chdir={self._workdir}", str(submission_file_path)]

    def _num_tasks(self) -> int:
        return 1  # the script starts its own job steps


def submit(cluster: LoadedCluster, nexp: int, program: str = "train") -> Experiment:
    """Validate against the scheduler, write the experiment, submit it. Returns the recorded experiment."""
    config = cluster.config
    script = rendering.render(cluster, nexp=nexp, program=program)
    if config.executor == "slurm":
        check_slurm_request(cluster)
    name = rendering.script_name(config)
    exp = Experiment(
        id=experiments.new_id(config.name),
        cluster=config.name,
        cluster_source=cluster.source,
        executor=config.executor,
        nexp=nexp,
        seeds=rendering.seeds(config, nexp),
        program=program,
        overrides=list(cluster.overrides),
        script=name,
        created=time.time(),
        dir="",
        steps=rendering.prerequisites(config, program),
    )
    home = experiments_home(cluster)
    files = {
        name: script,
        "run.yaml": config.run.to_yaml(),
        "cluster.yaml": yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False),
    }
    exp = experiments.create(exp, files, home=home)
    # Without a container the job runs the Python that submitted it (as submitit does by default);
    # the job inherits this environment from sbatch or the local controller.
    job_env = {"BERTCTL_PYTHON": sys.executable} if config.container.kind == "none" else {}
    try:
        with _environment(job_env):
            job_ids = _submit_slurm(exp, script) if config.executor == "slurm" else _submit_local(exp)
    except BaseException:
        experiments.remove(exp)  # nothing reached the scheduler: leave nothing behind
        raise
    exp = dataclasses.replace(exp, job_ids=job_ids, submitted=True)
    experiments.save(exp)
    return exp


def test_only(cluster: LoadedCluster, nexp: int, program: str = "train") -> str:
    """`sbatch --test-only`: Slurm checks account, partition and limits and says when it would start."""
    if cluster.config.executor != "slurm":
        raise UserError("--test-only needs a Slurm cluster (executor: slurm)", where="--cluster")
    require_slurm()
    script = rendering.render(cluster, nexp=nexp, program=program)
    out = subprocess.run(["sbatch", "--test-only"], input=script, capture_output=True, text=True)
    message = (out.stderr + out.stdout).strip()
    if out.returncode:
        raise UserError(f"Slurm rejects the job: {_last_line(message)}", where="sbatch --test-only")
    return message


def check_slurm_request(cluster: LoadedCluster) -> None:
    """Reject what the cluster cannot run (too many nodes for the partition) before submitting."""
    require_slurm()
    partition = cluster.config.slurm.partition
    command = ["sinfo", "-h", "-o", "%D"] + (["-p", partition] if partition else [])
    out = subprocess.run(command, capture_output=True, text=True)
    counts = [int(x) for x in out.stdout.split() if x.isdigit()]
    if out.returncode == 0 and counts:
        available = max(counts) if not partition else sum(counts)
        wanted = cluster.config.resources.nodes
        if wanted > available:
            where = f"partition {partition}" if partition else "this cluster"
            raise UserError(f"asks for {wanted} nodes but {where} has {available}", where=str(cluster.path), key="resources.nodes")
    elif partition and out.returncode == 0:
        raise UserError(f"Slurm knows no partition '{partition}'", where=str(cluster.path), key="slurm.partition")


def require_slurm() -> None:
    if shutil.which("sbatch") is None:
        raise UserError(
            "sbatch not found: this machine is not a Slurm login node "
            "(use --dry-run to see the script, or the local cluster)", where="submit"
        )


def _submit_slurm(exp: Experiment, script: str) -> list[str]:
    (exp.path / "submitit").mkdir()
    executor = ScriptSlurmExecutor(exp.path / "submitit", script, exp.path)
    try:
        job = executor._submit_command("")  # the command lives in our script
    except FailedJobError as e:
        raise UserError(f"sbatch refused the job: {_last_line(str(e))}", where="sbatch") from None
    if exp.nexp > 1 and "--array" in script:
        return [f"{job.job_id}_{i}" for i in range(exp.nexp)]
    return [job.job_id]


def _submit_local(exp: Experiment) -> list[str]:
    executor = submitit.LocalExecutor(exp.path / "submitit")
    # the local controller kills its task at the timeout: a week is "no limit" here
    executor.update_parameters(timeout_min=7 * 24 * 60, tasks_per_node=1, stderr_to_stdout=True)
    job = executor._submit_command(shlex.join(["bash", str(exp.path / exp.script)]))
    return [job.job_id]


@contextlib.contextmanager
def _environment(extra: dict[str, str]):
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    return (errors or lines or ["(no output)"])[-1]


def experiments_home(cluster: LoadedCluster) -> Path | None:
    """The cluster's experiments_dir, expanded here (it is read from this machine): absolute, or an error."""
    value = cluster.config.experiments_dir
    if not value:
        return None
    try:
        path = Path(expand_path(value))
    except PathError as e:
        raise UserError(str(e), where=str(cluster.source), key="experiments_dir") from None
    if not path.is_absolute():
        raise UserError(f"must be an absolute path (after ~ and $VARS), got {value!r}",
                        where=str(cluster.source), key="experiments_dir")
    return path

