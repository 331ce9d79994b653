"""Submission: render, record the experiment, submit the script through submitit.

The rendered script is the batch file of a submitit executor (orchestrator/jobs/executors.py): on Slurm
`sbatch --parsable` submits it (the job id is its answer), on this machine it starts detached.
Either way `submit` returns as soon as the job exists. The experiment is written first and removed again if the
scheduler refuses the job, so a failed submit leaves nothing behind.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from orchestrator import experiments, resources
from orchestrator.config.clusters import LoadedCluster, time_limit_seconds, training_time_limit
from orchestrator.errors import UserError, WorkFailed
from orchestrator.experiments import Experiment
from orchestrator.jobs import scheduler
from orchestrator.jobs.executors import LocalScriptExecutor, SlurmScriptExecutor, SubmissionRefused
from orchestrator.rendering import render as rendering
from trainer.config import PathError, expand_path


def submit(cluster: LoadedCluster, nexp: int, program: str = "train") -> Experiment:
    """Validate against the scheduler, write the experiment, submit it. Returns the recorded experiment."""
    config = cluster.config
    check_program(cluster, program)
    script = rendering.render(cluster, nexp=nexp, program=program)
    if config.executor == "slurm":
        check_slurm_request(cluster)
        check_time_limit(cluster, nexp)
    name = rendering.script_name(config)
    exp = Experiment(
        id="", cluster=config.name, cluster_source=cluster.source, executor=config.executor, nexp=nexp,
        seeds=rendering.seeds(config, nexp), program=program, overrides=list(cluster.overrides), script=name,
        created=time.time(), dir="", steps=rendering.prerequisites(config, program),
        array=config.executor == "slurm" and config.slurm.nexp_mode == "array" and nexp > 1,
        container=config.container.kind,
    )
    files = {
        name: script,
        "run.yaml": config.run.to_yaml(),
        "cluster.yaml": yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False),
    }
    exp = experiments.create(exp, files, home=experiments_home(cluster))
    try:
        if config.container.install == "wheel":
            build_wheel(exp.path / "wheels")
        job_ids = launch(exp)
    except BaseException:
        experiments.remove(exp)  # nothing reached the scheduler: leave nothing behind
        raise
    exp = dataclasses.replace(exp, job_ids=job_ids, history=list(job_ids), submitted=True)
    experiments.save(exp)
    return exp


def launch(exp: Experiment, runs: list[int] | None = None) -> list[str]:
    """Submit the experiment's script through its submitit executor; returns the job id of each run
    (arrays: one element per run). `runs`: in array mode, only these runs' elements (a resume); the
    script skips finished runs."""
    script = exp.path / exp.script
    env = job_environment(exp.container)
    if exp.executor == "local":
        executor = LocalScriptExecutor(exp.path, script.read_text(), env, script_name=exp.script)
        try:
            return [executor.submit_script(script).job_id]
        except SubmissionRefused as e:
            raise WorkFailed(f"could not start {script}: {e}") from None
    flags = [f"--array={','.join(str(r) for r in runs)}"] if exp.array and runs is not None else []
    executor = SlurmScriptExecutor(exp.path, script.read_text(), env, sbatch_flags=flags)
    try:
        job = executor.submit_script(script)
    except SubmissionRefused as e:
        raise UserError(f"sbatch refused the job: {e}", where="sbatch") from None
    if exp.array:
        return [f"{job.job_id}_{i}" for i in (runs if runs is not None else range(exp.nexp))]
    return [job.job_id]


def build_wheel(folder: Path) -> Path:
    """A wheel of this bertctl (its source checkout) for a job on a stock image to install."""
    source = resources.source_root()
    if source is None:
        raise UserError("wheel builds bertctl from its source checkout, and this bertctl was installed from a "
                        "package: use an image with bertctl (see the Dockerfile)", key="container.install")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(folder), str(source)],
                          capture_output=True, text=True)
    wheels = sorted(folder.glob("bertctl-*.whl"))
    if proc.returncode or not wheels:
        raise WorkFailed(f"building bertctl's wheel failed: {_last_line(proc.stderr)}")
    return wheels[-1]


def job_environment(container: str) -> dict[str, str]:
    """What the job's environment adds to this one. Without a container the job runs the Python that
    submitted it (sbatch and the local executor pass the submitting environment on)."""
    return {"BERTCTL_PYTHON": sys.executable} if container == "none" else {}


def test_only(cluster: LoadedCluster, nexp: int, program: str = "train") -> str:
    """`sbatch --test-only`: Slurm checks account, partition and limits and says when it would start.
    A question, not a submission (no job, no handle), so sbatch is asked directly, not through the executor."""
    if cluster.config.executor != "slurm":
        raise UserError("--test-only needs a Slurm cluster (executor: slurm)", where="--cluster")
    require_slurm()
    script = rendering.render(cluster, nexp=nexp, program=program)
    try:
        out = scheduler.run_command(["sbatch", "--test-only"], input=script)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise WorkFailed(f"sbatch --test-only: {e}") from None
    message = (out.stderr + out.stdout).strip()
    if out.returncode:
        raise UserError(f"Slurm rejects the job: {_last_line(message)}", where="sbatch --test-only")
    return message


def check_program(cluster: LoadedCluster, program: str) -> None:
    if program == "probe" and cluster.config.executor != "slurm":
        raise UserError("--probe rehearses a Slurm launch; this cluster runs on this machine (executor local)",
                        where=str(cluster.source), key="executor")


def check_slurm_request(cluster: LoadedCluster) -> None:
    """Reject what the cluster cannot run (too many nodes for the partition, more GPUs per node than
    its nodes have) before submitting."""
    require_slurm()
    check_gpus(cluster)
    partition = cluster.config.slurm.partition
    command = ["sinfo", "-h", "-o", "%D"] + (["-p", partition] if partition else [])
    out = sinfo(command)
    counts = [int(x) for x in out.stdout.split() if x.isdigit()]
    if out.returncode == 0 and counts:
        available = max(counts) if not partition else sum(counts)
        wanted = cluster.config.resources.nodes
        if wanted > available:
            where = f"partition {partition}" if partition else "this cluster"
            raise UserError(f"asks for {wanted} nodes but {where} has {available}", where=str(cluster.path), key="resources.nodes")
    elif partition and out.returncode == 0:
        raise UserError(f"Slurm knows no partition '{partition}'", where=str(cluster.path), key="slurm.partition")


def sinfo(command: list[str]) -> subprocess.CompletedProcess:
    """sinfo's answer; one that does not come in time counts as a failed sinfo (sbatch will say what is wrong)."""
    try:
        return scheduler.run_command(command)
    except (OSError, subprocess.TimeoutExpired) as e:
        return subprocess.CompletedProcess(command, 1, "", str(e))


def check_time_limit(cluster: LoadedCluster, nexp: int) -> None:
    """The job's time limit (all NEXP runs in loop mode) must fit the partition's MaxTime (sinfo's %l;
    the default partition, marked *, when the cluster names none)."""
    s = cluster.config.slurm
    out = sinfo(["sinfo", "-h", "-o", "%P %l"] + (["-p", s.partition] if s.partition else []))
    if out.returncode:
        return  # sbatch will say it
    limits = dict(line.split()[:2] for line in out.stdout.splitlines() if len(line.split()) >= 2)
    name = s.partition or next((p for p in limits if p.endswith("*")), None)
    most = limits.get(name) or limits.get(f"{name}*")
    allowed = time_limit_seconds(most) if most else None  # "infinite", "UNLIMITED": no limit
    asked = training_time_limit(s, nexp)
    if allowed is not None and time_limit_seconds(asked) > allowed:
        how = f"{nexp} run(s) x {s.time_per_run} + {s.time_margin}" if s.time_per_run and s.nexp_mode == "loop" else "its limit"
        key = "slurm.time_per_run" if s.time_per_run else "slurm.time_limit"
        raise UserError(f"the job asks for {asked} ({how}) but partition {name.rstrip('*')} allows at most {most}",
                        where=str(cluster.path), key=key)


def check_gpus(cluster: LoadedCluster) -> None:
    """The partition's nodes must have the GPUs a node of the job asks for (sinfo's gres column)."""
    wanted = cluster.config.resources.gpus_per_node
    if not wanted:
        return
    partition = cluster.config.slurm.partition
    out = sinfo(["sinfo", "-h", "-o", "%G"] + (["-p", partition] if partition else []))
    if out.returncode:
        return  # sbatch will say it
    counts = [gres_gpus(g) for g in out.stdout.split()]
    most = max(counts, default=0)
    if most < wanted:
        where = f"partition {partition}" if partition else "this cluster"
        raise UserError(f"asks for {wanted} GPUs per node but the nodes of {where} have {most}",
                        where=str(cluster.path), key="resources.gpus_per_node")


def gres_gpus(gres: str) -> int:
    """'gpu:8', 'gpu:a100:8(S:0-1)', 'gpu:8,shard:4' -> 8; '(null)' -> 0."""
    total = 0
    for item in gres.split(","):
        parts = item.split("(")[0].split(":")
        if parts[0] == "gpu" and parts[-1].isdigit():
            total += int(parts[-1])
    return total


def require_slurm() -> None:
    if shutil.which("sbatch") is None:
        raise UserError(
            "sbatch not found: this machine is not a Slurm login node "
            "(use --dry-run to see the script, or the local cluster)", where="submit"
        )


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
