"""Cluster files: one YAML per system and scale, validated into a frozen `ClusterConfig`.

A cluster file says where and how to run (Slurm resources, container, node environment, executor)
and carries the training recipe tuned for that scale (`run:`, a `trainer.config.RunConfig`).
`load_cluster` finds the file, applies `-o key.path=value` overrides and validates everything,
cross-field checks included, before anything is written or submitted.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

from pydantic import AfterValidator, BeforeValidator, Field, StringConstraints, ValidationError, model_validator

from orchestrator import resources
from orchestrator.config import configfile, local_gpus
from orchestrator.errors import UserError
from trainer.config import (
    BalanceConfig,
    ConfigProblem,
    DataConfig,
    OptimConfig,
    RunConfig,
    RuntimeConfig,
    Section,
    TrainConfig,
    first_problem,
)

# Unicode's control (Cc), format (Cf: bidi overrides and isolates, zero-width characters) and line
# and paragraph separators (Zl, Zp: U+2028, U+2029): a terminal or editor shows a line holding them
# as something other than what the shell runs, or as two lines.
HIDDEN_CATEGORIES = {"Cc", "Cf", "Zl", "Zp", "Cs"}


def _single_line(value: str) -> str:
    """Values that land in `#SBATCH` lines or comments cannot be quoted across lines."""
    hidden = next((c for c in value if unicodedata.category(c) in HIDDEN_CATEGORIES), None)
    if hidden is not None:
        raise ValueError(f"must be one line without control characters (nor bidi controls or line separators): has U+{ord(hidden):04X}")
    return value


def _integer_as_text(value: Any) -> Any:
    """`mem: 0` or `time_limit: 30` in a file is the integer YAML reads; `-o slurm.mem=0` is the text
    "0". Both mean the same Slurm option, so both are accepted (bools and floats are not)."""
    return str(value) if type(value) is int else value


def _mount_path(value: str) -> str:
    """pyxis joins mounts as `src:dst,src:dst`: a comma or colon inside a path would split it."""
    _single_line(value)
    if not value.startswith("/"):
        raise ValueError(f"must be an absolute path, got {value!r}")
    if "," in value or ":" in value:
        raise ValueError(f"cannot contain ',' or ':' (pyxis mount syntax), got {value!r}")
    return value


OneLine = Annotated[str, AfterValidator(_single_line)]
SlurmText = Annotated[str, BeforeValidator(_integer_as_text), AfterValidator(_single_line)]
# a field MLPerf's system-description checker requires: an empty one is refused here, not by the checker
Described = Annotated[str, StringConstraints(min_length=1), AfterValidator(_single_line)]
MountPath = Annotated[str, AfterValidator(_mount_path)]
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*\Z")  # \Z: "$" would let a final newline through
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
# [0-9], not \d: \d also matches other scripts' digits ("١٠"), which Slurm does not read
TIME_RE = re.compile(r"^(?:(?P<days>[0-9]{1,3})-)?(?P<parts>[0-9]{1,4}(?::[0-9]{2}){0,2})\Z")
MAX_TIME_S = ((999 * 24 + 23) * 60 + 59) * 60 + 59  # the longest time TIME_RE reads: 999-23:59:59


def time_limit_seconds(text: str) -> int | None:
    """Slurm's --time forms (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S) in seconds; None if malformed or
    out of range (minutes and seconds below 60, hours below 24 after a day count)."""
    m = TIME_RE.match(text)
    if not m:
        return None
    parts = [int(p) for p in m["parts"].split(":")]
    if m["days"] is not None:  # D-H[:M[:S]]
        hours, minutes, seconds = (parts + [0, 0])[:3]
        if hours >= 24:
            return None
        days = int(m["days"])
    else:  # M, M:S or H:M:S
        days = 0
        hours, minutes, seconds = parts if len(parts) == 3 else (0, parts[0], parts[1] if len(parts) == 2 else 0)
    if (len(parts) > 1 or m["days"] is not None) and (minutes >= 60 or seconds >= 60):
        return None
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


class Resources(Section):
    nodes: int = Field(ge=1)
    tasks_per_node: int = Field(ge=1, description="ranks per node: one per GPU on a GPU cluster")
    gpus_per_node: int = Field(0, ge=0)
    cpus_per_task: Optional[int] = Field(None, ge=1)


class SlurmConfig(Section):
    partition: Optional[OneLine] = None
    account: Optional[OneLine] = None
    # the job's limit; with time_per_run, the data-preparation jobs' only, and a training job gets
    # time_per_run x its runs (NEXP in loop mode, 1 per array element) + time_margin, as NVIDIA's
    # scripts ask for NEXP x 8 + 5 minutes on a DGX H100
    time_limit: SlurmText = "01:00:00"
    time_per_run: Optional[OneLine] = None
    time_margin: OneLine = "00:05:00"
    exclusive: bool = True
    mem: Optional[SlurmText] = "0"
    # nodes the job must not get (sbatch --exclude), e.g. the ones `bertctl preflight` flagged
    exclude: Optional[OneLine] = None
    extra_sbatch: list[OneLine] = []
    # seconds before the time limit at which ranks get SIGUSR2 to checkpoint (sbatch --signal=USR2@N)
    signal_seconds: int = Field(90, ge=0)
    max_requeues: int = Field(3, ge=0)
    # loop: all NEXP runs one after another in one allocation (MLPerf style); array: one array task per run
    nexp_mode: Literal["loop", "array"] = "loop"

    @model_validator(mode="after")
    def _well_formed(self) -> "SlurmConfig":
        for key, least in (("time_limit", 1), ("time_per_run", 1), ("time_margin", 0)):
            value = getattr(self, key)
            seconds = None if value is None else time_limit_seconds(value)
            if value is not None and (seconds is None or seconds < least):
                raise ConfigProblem(key, f"must be a {'positive' if least else 'non-negative'} time like [D-]HH:MM:SS "
                                         f"or minutes (minutes and seconds below 60), got {value!r}")
        for flag in self.extra_sbatch:
            if not flag.startswith("--"):
                raise ConfigProblem("extra_sbatch", f"entries are long options like --network=sharp, got {flag!r}")
        return self


def training_time_limit(s: SlurmConfig, nexp: int) -> str:
    """The training job's --time: time_limit, or with time_per_run the job's runs x time_per_run +
    time_margin (a loop-mode job runs all NEXP runs; an array element one)."""
    if s.time_per_run is None:
        return s.time_limit
    runs = 1 if s.nexp_mode == "array" else nexp
    seconds = runs * time_limit_seconds(s.time_per_run) + time_limit_seconds(s.time_margin)
    if seconds > MAX_TIME_S:
        raise UserError(f"{runs} run(s) x {s.time_per_run} + {s.time_margin} is {seconds // 86400:,} days, beyond "
                        "the 999 days a Slurm time limit can say (fewer runs, or a shorter time_per_run)",
                        key="slurm.time_per_run")
    return slurm_time(seconds)


def slurm_time(seconds: int) -> str:
    """Seconds as Slurm's [D-]HH:MM:SS."""
    days, rest = divmod(seconds, 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


class Mount(Section):
    host: MountPath
    container: MountPath


class ContainerConfig(Section):
    # pyxis: srun --container-image/--container-name (enroot); none: a bare venv or system Python
    kind: Literal["pyxis", "none"] = "none"
    image: Optional[str] = None
    name: str = "language_model"
    # pull the image once to a squashfs in this folder before the runs (NVIDIA's CONTAINER_PRELOAD_LUSTRE)
    preload_dir: Optional[str] = None
    mounts: list[Mount] = []
    workdir: Optional[str] = None
    python: str = "python3"
    venv: Optional[str] = None
    # image: bertctl is in the image; wheel: a stock PyTorch image, and the job installs the submitting
    # bertctl (a wheel built at submit time into the experiment) before the runs
    install: Literal["image", "wheel"] = "image"

    @model_validator(mode="after")
    def _complete(self) -> "ContainerConfig":
        if self.kind == "pyxis" and not self.image:
            raise ConfigProblem("image", "kind pyxis needs an image (docker://... or a .sqsh path)")
        if self.kind == "none" and (self.image or self.mounts or self.preload_dir):
            raise ConfigProblem("kind", "image, mounts and preload_dir need kind pyxis")
        if self.install == "wheel" and self.kind != "pyxis":
            raise ConfigProblem("install", "wheel installs bertctl into a container image: needs kind pyxis")
        if self.kind == "pyxis" and self.venv:
            raise ConfigProblem("venv", "is for kind none (the container brings its own Python)")
        if not NAME_RE.match(self.name):
            raise ConfigProblem("name", f"must be letters, digits, '_', '.' or '-', got {self.name!r}")
        return self


class Binding(Section):
    """Per-rank CPU, memory and InfiniBand binding (NVIDIA's bind.sh policies)."""

    cpu: Literal["none", "exclusive", "exclusive_nosmt", "node"] = "none"
    mem: Literal["none", "node"] = "none"
    ib: Literal["none", "single"] = "none"
    ib_devices: list[str] = []

    @model_validator(mode="after")
    def _devices_for_ib(self) -> "Binding":
        if self.ib == "single" and not self.ib_devices:
            raise ConfigProblem("ib_devices", "ib single needs devices (e.g. [mlx5_0, mlx5_1])")
        for dev in self.ib_devices:
            if not NAME_RE.match(dev):
                raise ConfigProblem("ib_devices", f"entries are device names like mlx5_0, got {dev!r}")
        return self


class NodeConfig(Section):
    env: dict[str, str] = {}
    binding: Binding = Binding()
    # drop: sync + drop the page cache on every node, then log cache_clear (MLPerf rules);
    # log_only: only log cache_clear (what Samsung v1.1 did; for machines where you are not root)
    clear_caches: Literal["drop", "log_only"] = "drop"

    @model_validator(mode="after")
    def _env_names(self) -> "NodeConfig":
        for name in self.env:
            if not ENV_NAME_RE.match(name):
                raise ConfigProblem("env", f"names must be shell identifiers, got {name!r}")
        for name, value in self.env.items():
            if "\0" in value:  # a shell script cannot hold a NUL byte
                raise ConfigProblem(f"env.{name}", "must not contain a NUL character")
        taken = sorted(name for name in self.env if is_reserved_env(name))
        if taken:
            raise ConfigProblem("env", f"{', '.join(taken)}: reserved, the job script or bash itself uses "
                                       f"{'it' if len(taken) == 1 else 'them'} (reserved: {', '.join(reserved_env_names())}, BASH_*)")
        return self


# Bash's own variables: read-only ones (exporting them kills the job at `set -e`), ones that change
# how the script is parsed or run, and ones bash sets itself.
BASH_NAMES = frozenset({
    "BASHOPTS", "BASHPID", "CDPATH", "DIRSTACK", "ENV", "EPOCHREALTIME", "EPOCHSECONDS", "EUID", "FUNCNAME",
    "GLOBIGNORE", "GROUPS", "HISTCMD", "IFS", "LINENO", "OLDPWD", "OPTARG", "OPTERR", "OPTIND", "PIPESTATUS",
    "POSIXLY_CORRECT", "PPID", "PS4", "PWD", "RANDOM", "SECONDS", "SHELLOPTS", "SHLVL", "SRANDOM", "UID",
})
# Names the job script reads from the environment, or sets as thread-count defaults for one command:
# node.env may set them.
ENV_INPUTS = frozenset({"HOME", "PYTHONPATH", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TOKENIZERS_PARALLELISM"})


def is_reserved_env(name: str) -> bool:
    return name.startswith("BASH") or name in reserved_env_names()


@lru_cache(maxsize=1)
def reserved_env_names() -> tuple[str, ...]:
    """Every name node.env may not set: those the job scripts use (read from the shipped templates,
    so a new template variable is covered without a list to update) and bash's own."""
    return tuple(sorted((template_variables() - ENV_INPUTS) | BASH_NAMES))


SHELL_ASSIGNED = re.compile(r"(?<![\w.$-])([A-Za-z_]\w*)=")  # NAME= (export, local, plain), not --opt= or a.b=
SHELL_READ = re.compile(r"\$\{?([A-Za-z_]\w*)")  # $NAME, ${NAME...}
ARITHMETIC = re.compile(r"\(\((.*?)\)\)")  # $((...)) and for ((...)): names without a $
JINJA = re.compile(r"\{#.*?#\}|\{%.*?%\}|\{\{.*?\}\}", re.S)


def template_variables() -> set[str]:
    """Every shell variable the shipped job-script templates assign or read (comments left out)."""
    names: set[str] = set()
    for template in sorted(resources.shipped_dir("templates").glob("*.j2")):
        text = JINJA.sub(" ", template.read_text(encoding="utf-8"))
        for line in text.splitlines():
            if line.lstrip().startswith("#"):
                continue
            names.update(SHELL_ASSIGNED.findall(line))
            names.update(SHELL_READ.findall(line))
            for inner in ARITHMETIC.findall(line):
                names.update(re.findall(r"[A-Za-z_]\w*", inner))
    return names


AVAILABILITY = Literal[
    "Available on-premise", "Available cloud", "Research, Development, or Internal (RDI)", "Preview",
]


class SystemDescription(Section):
    """The machine, as MLPerf's `systems/<system>.json` describes it (`bertctl package` writes that file).

    One field per field mlperf_logging's system_desc_checker requires, except `submitter` and
    `division`, which come from `bertctl package --org` and the runs' logs. `accelerator_on_chip_memories`
    is written as `accelerator_on-chip_memories`. Counts per node; core and vCPU counts per processor.
    `number_of_nodes` describes the whole machine; a package states the nodes its runs used
    (resources.nodes, overrides included), so `-o resources.nodes=2` needs no edit here.
    """

    system_name: Described
    status: AVAILABILITY  # the ruleset >= 4.0 availability categories
    number_of_nodes: int = Field(ge=1)
    host_processors_per_node: int = Field(ge=1)
    host_processor_model_name: Described
    host_processor_core_count: int = Field(ge=1)
    host_processor_vcpu_count: int = Field(ge=1)
    host_processor_frequency: Described
    host_processor_caches: Described
    host_processor_interconnect: Described
    host_memory_capacity: Described
    host_storage_type: Described
    host_storage_capacity: Described
    host_networking: Described
    host_networking_topology: Described
    host_memory_configuration: Described
    accelerators_per_node: int = Field(ge=0)
    accelerator_model_name: Described
    accelerator_host_interconnect: Described
    accelerator_frequency: Described
    accelerator_on_chip_memories: Described
    accelerator_memory_configuration: Described
    accelerator_memory_capacity: Described
    accelerator_interconnect: Described
    accelerator_interconnect_topology: Described
    cooling: Described
    hw_notes: OneLine = ""
    framework: Described
    other_software_stack: Described  # e.g. "CUDA 11.4, NCCL 2.11, apex ..."
    operating_system: Described
    sw_notes: OneLine = ""


class PhaseOne(Section):
    """Phase 1 (short sequences), trained once on one rank to make the checkpoint phase 2 starts from.

    Model, runtime and MLPerf settings are the run's; the weights go to run.train.init_checkpoint,
    and every later job skips phase 1 while that file exists.
    """

    data: DataConfig
    optim: OptimConfig
    train: TrainConfig
    runtime: Optional[RuntimeConfig] = None  # default: the run's (at length 128 padding costs little)
    balance: BalanceConfig = BalanceConfig()  # plain batches; packs on GPUs (orchestrator/config/local_gpus.py)


class Prerequisites(Section):
    """What a job builds before its runs when it is missing, once per machine (the embedded default)."""

    # a dataset manifest: `bertctl data prepare --dataset <name>` (returns at once when it is complete)
    dataset: Optional[str] = None
    phase1: Optional[PhaseOne] = None


class PreflightConfig(Section):
    # `bertctl preflight` flags a node this % or more below the median node on any measure; a cluster
    # whose nodes share cores or disks (ci_slurm) measures noise wider than the 10 % a real cluster allows
    threshold: float = Field(10.0, gt=0, lt=100)


class ClusterConfig(Section):
    name: str
    description: OneLine = ""
    executor: Literal["slurm", "local"] = "slurm"
    resources: Resources
    slurm: SlurmConfig = SlurmConfig()
    container: ContainerConfig = ContainerConfig()
    node: NodeConfig = NodeConfig()
    # where experiments live (a shared filesystem on a real cluster); default $BERTCTL_HOME/experiments
    experiments_dir: Optional[OneLine] = None
    # the system description of an MLPerf submission (bertctl package); optional until you package
    system: Optional[SystemDescription] = None
    prepare: Prerequisites = Prerequisites()
    preflight: PreflightConfig = PreflightConfig()
    # with resources.gpus_per_node: auto and GPUs found, these dotted keys and values (as `-o` gives them, typed as
    # in the file) apply on top of CUDA, NCCL and bf16, each unless `-o` names it: the recipe on GPUs
    # (orchestrator/config/local_gpus.py::on_gpus)
    on_gpus: dict[str, Any] = {}
    run: RunConfig

    @model_validator(mode="before")
    @classmethod
    def _derive_world_size(cls, data: Any) -> Any:
        """The trainer's world size is the allocation's rank count, never typed by hand."""
        if isinstance(data, dict) and isinstance(data.get("run"), dict) and isinstance(data.get("resources"), dict):
            if "world_size" in data["run"]:
                raise ConfigProblem("run.world_size", "is derived from resources.nodes x resources.tasks_per_node")
            res = data["resources"]
            if isinstance(res.get("nodes"), int) and isinstance(res.get("tasks_per_node"), int):
                data = {**data, "run": {**data["run"], "world_size": res["nodes"] * res["tasks_per_node"]}}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> "ClusterConfig":
        for problem in cluster_problems(self):
            raise problem
        return self

    @property
    def world_size(self) -> int:
        return self.resources.nodes * self.resources.tasks_per_node

    def phase1_run(self) -> RunConfig | None:
        """The phase-1 run configuration: one rank, the run's model, writing run.train.init_checkpoint."""
        p = self.prepare.phase1
        if p is None:
            return None
        raw = {
            "world_size": 1,
            "model": self.run.model.model_dump(),
            "data": p.data.model_dump(),
            "optim": p.optim.model_dump(),
            "train": {**p.train.model_dump(), "init_checkpoint": None},
            "runtime": (p.runtime or self.run.runtime).model_dump(),
            "balance": p.balance.model_dump(),
            "checkpoint": {"final_model": self.run.train.init_checkpoint},
            "mlperf": {**self.run.mlperf.model_dump(), "division": "open"},
        }
        try:
            return RunConfig.model_validate(raw)
        except ValidationError as e:
            key, message = first_problem(e, RunConfig)
            raise ConfigProblem(f"prepare.phase1.{key}", message) from None


def cluster_problems(c: ClusterConfig) -> list[ConfigProblem]:
    """Combinations that cannot run, found before anything is written or submitted."""
    problems = []
    if not NAME_RE.match(c.name):
        problems.append(ConfigProblem("name", f"must be letters, digits, '_', '.' or '-', got {c.name!r}"))
    if c.executor == "local":
        problems += local_executor_problems(c)
    # a name among the manifests found, not a path to stat: a name too long for the file system
    # raised there, and '../x' reached files outside the manifest folders
    if c.prepare.dataset and c.prepare.dataset not in configfile.named_files("datasets"):
        problems.append(ConfigProblem("prepare.dataset", f"no dataset manifest named {configfile.clip(c.prepare.dataset)!r} "
                                                         "(see bertctl data list)"))
    if c.prepare.phase1 is not None:
        if not c.run.train.init_checkpoint:
            problems.append(ConfigProblem("prepare.phase1", "writes run.train.init_checkpoint, which is not set"))
        else:
            c.phase1_run()  # raises with the phase-1 key that is wrong
    for key in c.on_gpus:  # checked on every machine, not only where GPUs apply them
        try:
            configfile.check_key_path(ClusterConfig, key.split("."), f"on_gpus.{key}")
        except UserError as e:
            problems.append(ConfigProblem(f"on_gpus.{key}", str(e).partition(": ")[2]))  # the message after its place
    rt, bal = c.run.runtime, c.run.balance
    if rt.device == "cuda" and c.resources.gpus_per_node < c.resources.tasks_per_node:
        problems.append(ConfigProblem(
            "resources.gpus_per_node", f"runtime.device cuda needs one GPU per rank, {c.resources.gpus_per_node} "
            f"< tasks_per_node ({c.resources.tasks_per_node})"))
    if bal.exchange_padding == "group" and c.resources.tasks_per_node % bal.group_size:
        problems.append(ConfigProblem(
            "run.balance.group_size", f"{bal.group_size} must divide resources.tasks_per_node "
            f"({c.resources.tasks_per_node}) so that every exchange group stays inside one node"))
    return problems


def local_executor_problems(c: ClusterConfig) -> list[ConfigProblem]:
    """The local executor runs one node's ranks on this machine, without Slurm's machinery."""
    rules = [
        ("resources.nodes", c.resources.nodes != 1, f"executor local runs on this machine: must be 1, got {c.resources.nodes}"),
        ("container.kind", c.container.kind != "none", "executor local runs without a container: must be none"),
        ("node.binding", c.node.binding != Binding(), "executor local does not bind ranks to CPUs or NICs"),
        ("slurm.nexp_mode", c.slurm.nexp_mode != "loop", "executor local runs the experiments one after another: must be loop"),
    ]
    return [ConfigProblem(key, message) for key, broken, message in rules if broken]


# A validated cluster and where it came from (for the script's header and the registry).
LoadedCluster = configfile.LoadedFile


def cluster_files() -> dict[str, Path]:
    """Every known cluster by name; $BERTCTL_CLUSTERS folders shadow shipped files of the same name."""
    return configfile.named_files("clusters")


def load_cluster(name: str, overrides: list[str] | tuple[str, ...] = ()) -> LoadedCluster:
    return configfile.load_named("clusters", name, overrides, ClusterConfig, "cluster", "--cluster",
                                 resolve=local_gpus.resolve_auto_gpus)
