"""Rendering: a validated cluster -> the exact script that runs the experiment. A pure function.

`render(cluster, nexp)` returns the text that `bertctl render` and `bertctl submit --dry-run` print
and that `submit` hands to sbatch (or to the local executor), byte for byte. The script is
self-contained: it carries the run configuration (run.yaml) and the per-task launch script in
quoted heredocs, so reading it shows every hyperparameter, and `sbatch` alone can run it.

Safety: Jinja runs with StrictUndefined; every value that reaches a shell line goes through the
`sh` filter (shlex.quote); values in `#SBATCH` lines are validated to be single lines by the schema;
comments go through the `comment` filter; heredoc delimiters are derived from their content's hash
so that no value can end a heredoc early.
"""

from __future__ import annotations

import hashlib
import shlex
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import jinja2

from orchestrator import __version__, resources
from orchestrator.config.clusters import ClusterConfig, LoadedCluster, SlurmConfig, training_time_limit
from trainer.config import REQUEUE_EXIT_CODE

Program = Literal["train", "probe", "preflight"]
# what each rank runs: the trainer, the launch probe, or the preflight measures (`bertctl preflight`)
RANK_MODULES = {"train": "trainer", "probe": "trainer.launch.probe", "preflight": "trainer.launch.preflight"}


@dataclass(frozen=True)
class RenderRequest:
    cluster: LoadedCluster
    nexp: int = 1
    program: Program = "train"

    @property
    def config(self) -> ClusterConfig:
        return self.cluster.config


def render(cluster: LoadedCluster, nexp: int = 1, program: Program = "train") -> str:
    request = RenderRequest(cluster=cluster, nexp=nexp, program=program)
    ctx = context(request)
    env = _environment()
    if request.config.executor == "local":
        return env.get_template("local.sh.j2").render(**ctx)
    ctx["task_script"] = env.get_template("task.sh.j2").render(**ctx)
    return env.get_template("sbatch.sh.j2").render(**ctx)


def script_name(config: ClusterConfig) -> str:
    """The file name the script gets in the experiment directory."""
    return "job.sh" if config.executor == "local" else "job.sbatch"


def context(req: RenderRequest) -> dict:
    c = req.config
    return {
        "version": __version__,
        "source": req.cluster.source,
        "overrides": list(req.cluster.overrides),
        "c": c,
        "nexp": req.nexp,
        "program": req.program,
        "seeds": seeds(c, req.nexp),
        "sbatch_options": sbatch_options(c, req.nexp),
        "submit_command": submit_command(req),
        "env": node_environment(c),
        "mounts": container_mounts(c),
        "run_yaml": c.run.to_yaml(),
        "prerequisites": prerequisites(c, req.program),
        "phase1_yaml": c.phase1_run().to_yaml() if c.prepare.phase1 else None,
        "task_command": task_command(c, req.program),
        "trainer_args": " ".join(TRAINER_ARGS),
        "local_command": local_command(c, req.program),
        "rank_stop_seconds": RANK_STOP_SECONDS,
        "requeue_exit_code": REQUEUE_EXIT_CODE,
    }


def node_environment(c: ClusterConfig) -> list[tuple[str, str]]:
    """The variables every job of a cluster exports on its nodes, training and data-preparation
    arrays alike (templates/_node_env.sh.j2 writes them): a node key that becomes a variable is
    added here once and reaches every job kind."""
    return sorted(c.node.env.items())


def container_mounts(c: ClusterConfig) -> str:
    """`--container-mounts`' value for every job kind: host:container pairs, comma-separated."""
    return ",".join(f"{m.host}:{m.container}" for m in c.container.mounts)


def prerequisites(c: ClusterConfig, program: Program) -> list[str]:
    """The steps a training job runs before its runs (the probe only checks the launch path). The
    preflight reads the shards, so it prepares the dataset; its steps start from random weights (the
    speed is the same), so it needs no phase 1."""
    wanted = {"train": ("prepare", "phase1"), "preflight": ("prepare",)}.get(program, ())
    return [name for name, asked in (("prepare", c.prepare.dataset), ("phase1", c.prepare.phase1)) if asked and name in wanted]


def seeds(c: ClusterConfig, nexp: int) -> list[int]:
    """A distinct seed per run, reproducible from the recipe's base seed (Samsung used 0..9)."""
    return [c.run.train.seed + i for i in range(nexp)]


def sbatch_options(c: ClusterConfig, nexp: int) -> list[str]:
    """The training job's `#SBATCH` options."""
    r, s = c.resources, c.slurm
    array = s.nexp_mode == "array" and nexp > 1
    return sbatch_lines([
        ("job-name", f"bert-{c.name}"),
        ("nodes", r.nodes),
        ("ntasks-per-node", r.tasks_per_node),
        ("gpus-per-node", r.gpus_per_node or None),
        ("cpus-per-task", r.cpus_per_task),
        *where_and_how_long(s, training_time_limit(s, nexp)),
        ("mem", s.mem),
        # named as submitit's JobPaths names a job's output, so that its `Job.stdout()` reads it
        ("output", "%A_%a_0_log.out" if array else "%j_0_log.out"),
        ("array", f"0-{nexp - 1}" if array else None),
        # ranks get SIGUSR2 this long before the time limit, checkpoint, and the job requeues itself
        ("signal", f"USR2@{s.signal_seconds}" if s.signal_seconds else None),
        ("open-mode", "append"),
        ("exclusive", s.exclusive),
        ("requeue", bool(s.max_requeues)),
    ], s.extra_sbatch)


def where_and_how_long(s: SlurmConfig, time: str | None = None) -> list[tuple[str, object]]:
    """The options every job of a cluster shares, training and data-preparation arrays alike: a new
    key of this kind (a reservation, a QOS) added here reaches both. `time`: the training job's own
    limit (`training_time_limit`), else time_limit."""
    return [("partition", s.partition), ("account", s.account), ("time", time or s.time_limit), ("exclude", s.exclude)]


def sbatch_lines(options: list[tuple[str, object]], extra: list[str] = ()) -> list[str]:
    """`#SBATCH` options, in order: `--name=<shell-quoted value>` (sbatch parses quotes), `--name` for
    True, nothing for None or False; then the cluster's `extra_sbatch` flags as given."""
    lines = []
    for name, value in options:
        if value is None or value is False:
            continue
        lines.append(f"--{name}" if value is True else f"--{name}={shlex.quote(str(value))}")
    for flag in extra:
        name, sep, value = flag.partition("=")
        lines.append(f"{name}={shlex.quote(value)}" if sep else name)
    return lines


def task_command(c: ClusterConfig, program: Program) -> str:
    """The per-rank command line: optional binding wrapper, then the trainer (or the probe, or the preflight)."""
    target = ["-m", RANK_MODULES[program], *TRAINER_ARGS]
    b = c.node.binding
    binding = []
    if (b.cpu, b.mem, b.ib) != ("none", "none", "none"):
        binding = ['"$PYTHON"', "-m", "trainer.launch.binding", "--cpu", b.cpu, "--mem", b.mem, "--ib", b.ib]
        if b.ib_devices:
            binding += ["--ib-devices", shlex.quote(",".join(b.ib_devices))]
        binding += ["--tasks-per-node", str(c.resources.tasks_per_node), "--"]
    return " ".join(binding + ['"$PYTHON"', "-u", *target])


def local_command(c: ClusterConfig, program: Program) -> str:
    """On this machine several ranks start through torchrun, which sets RANK/WORLD_SIZE for them; each rank runs
    through the script's `rank_exit` (templates/local.sh.j2), which records its own exit status: torchrun's is not it."""
    if c.resources.tasks_per_node == 1:
        return task_command(c, program)
    target = ['"$PYTHON"', "-u", "-m", RANK_MODULES[program], *TRAINER_ARGS]
    launcher = ['"$PYTHON"', "-m", "torch.distributed.run", "--standalone",
                f"--nproc-per-node={c.resources.tasks_per_node}", "--no-python", "bash", "-c", """'rank_exit "$@"'""", "rank"]
    return " ".join(launcher + target)


# How long torchrun waits for its ranks to stop once it has passed a SIGTERM on to them, before it kills them:
# what a checkpoint may take. torch's default, 30 s, would cut a large one short on a slow disk; a job shell waits
# for a single rank without any bound.
RANK_STOP_SECONDS = 600


TRAINER_ARGS = [
    "--config", '"$EXP_DIR/run.yaml"',
    "--out", '"$EXP_DIR"',
    "--run-index", '"$BERTCTL_RUN_INDEX"',
    "--seed", '"$BERTCTL_SEED"',
]


def submit_command(req: RenderRequest) -> str:
    if req.program == "preflight":
        words = ["bertctl", "preflight", "--cluster", req.config.name]
    else:
        words = ["bertctl", "submit", "--cluster", req.config.name, "--nexp", str(req.nexp)]
    if req.program == "probe":
        words.append("--probe")
    for item in req.cluster.overrides:
        words += ["-o", item]
    return shlex.join(words)


def heredoc(content: str, path: str, label: str) -> str:
    """`cat > path <<'DELIM' ... DELIM` with a delimiter no line of `content` can equal."""
    digest = hashlib.sha256(content.encode()).hexdigest()[:16]
    delimiter = f"BERTCTL_{label}_{digest}"
    assert delimiter not in content.splitlines()
    body = content if content.endswith("\n") else content + "\n"
    return f"cat > {path} <<'{delimiter}'\n{body}{delimiter}"


def comment(text: str) -> str:
    """Text safe inside a `#` comment: control characters (newlines) shown escaped."""
    return "".join(c if 32 <= ord(c) != 127 else repr(c)[1:-1] for c in str(text))


def render_template(name: str, **ctx) -> str:
    """Any shipped template in the same environment (StrictUndefined, `sh`, `comment`, `heredoc`)."""
    return _environment().get_template(name).render(**ctx)


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(resources.shipped_dir("templates"))),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["sh"] = lambda v: shlex.quote(str(v))
    env.filters["comment"] = comment
    env.globals["heredoc"] = heredoc
    return env
