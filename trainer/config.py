"""The run configuration: everything one rank needs to train, as one frozen, validated object.

This module is the only part of the trainer the orchestrator imports, so it must never import
torch. The orchestrator writes a `RunConfig` as `run.yaml`; every rank reads it back with
`load_run_config`. Defaults are BERT-large with NVIDIA's MLPerf v1.1 conventions; the cluster
files under `clusters/` set the recipe for each system and scale.

Paths may contain `~` and `$VARS`; they are expanded on the node that uses them (`expand_path`),
never by the orchestrator, because the login node's environment is not the job's.
"""

from __future__ import annotations

import math
import os
import re
from typing import ClassVar, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

# Samsung's strata: sequence-length bins by their inclusive upper edges (1-128, 129-256, ...).
BIN_EDGES = (128, 256, 384, 512)

# A rank exits with this (EX_TEMPFAIL) after saving a checkpoint on SIGUSR2/SIGTERM; the job
# script then requeues the job and the run resumes from the checkpoint.
REQUEUE_EXIT_CODE = 75


class Section(BaseModel):
    """A config section: unknown keys are errors, values are immutable once validated."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelConfig(Section):
    """BERT shape. Defaults are BERT-large (24 layers, 1024 hidden, 16 heads, 4096 FFN)."""

    num_layers: int = Field(24, ge=1)
    hidden_size: int = Field(1024, ge=8)
    num_heads: int = Field(16, ge=1)
    intermediate_size: int = Field(4096, ge=1)
    vocab_size: int = Field(30522, ge=8)
    max_position_embeddings: int = Field(512, ge=8)
    type_vocab_size: int = Field(2, ge=1)
    hidden_dropout: float = Field(0.1, ge=0.0, lt=1.0)
    attention_dropout: float = Field(0.1, ge=0.0, lt=1.0)
    layer_norm_eps: float = Field(1e-12, gt=0.0)
    initializer_range: float = Field(0.02, gt=0.0)

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> "ModelConfig":
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"num_heads: {self.num_heads} does not divide hidden_size ({self.hidden_size})"
            )
        return self

    @property
    def padded_vocab_size(self) -> int:
        """The vocabulary rounded up to a multiple of 8 (30522 -> 30528) for tensor-core GEMMs."""
        return 8 * math.ceil(self.vocab_size / 8)


class DataConfig(Section):
    """Where the HDF5 shards are and what one sample looks like."""

    train_dir: str
    eval_dir: Optional[str] = None
    max_seq_length: int = Field(512, ge=8)
    max_predictions_per_seq: int = Field(76, ge=1)
    num_workers: int = Field(2, ge=0)
    eval_samples: int = Field(10000, ge=1)
    # independent shard readers; None: one per rank. Fix it to keep the sample order when the
    # rank count changes (a 1-rank run with streams: 2 sees what a 2-rank run sees).
    streams: Optional[int] = Field(None, ge=1)


class OptimConfig(Section):
    """Optimizer, LR schedule and gradient clipping."""

    # madgrad, acclip: Samsung's v1.1 trial optimizers (see trainer/optim.py for how the keys below map)
    name: Literal["lamb", "adam", "madgrad", "acclip"] = "lamb"
    lr: float = Field(gt=0.0)
    betas: tuple[float, float] = (0.9, 0.999)
    epsilon: float = Field(1e-6, gt=0.0)
    weight_decay: float = Field(0.01, ge=0.0)
    # nvidia: warmup then poly decay measured from step 0 (the MLPerf reference);
    # samsung: decay measured from the end of warmup over lr_max_steps, clamped to end_lr.
    schedule: Literal["nvidia", "samsung"] = "nvidia"
    warmup_steps: int = Field(0, ge=0)
    warmup_proportion: float = Field(0.0, ge=0.0, le=1.0)
    start_warmup_step: int = 0
    max_steps: int = Field(ge=1)
    lr_max_steps: Optional[int] = Field(None, ge=1)
    end_lr: float = Field(0.0, ge=0.0)
    # local: clip this rank's whole gradient before the allreduce (NVIDIA v1.1);
    # bucket: clip each DDP bucket before its allreduce (Samsung v1.1);
    # after_allreduce: clip the averaged gradient; none: no clipping.
    clip: Literal["local", "bucket", "after_allreduce", "none"] = "local"
    max_grad_norm: float = Field(1.0, gt=0.0)

    @model_validator(mode="after")
    def _betas_in_range(self) -> "OptimConfig":
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"betas: each must be in [0, 1), got {list(self.betas)}")
        return self

    @property
    def schedule_horizon(self) -> int:
        """Steps over which the LR decays (Samsung used 179 while logging 299)."""
        return self.lr_max_steps or self.max_steps


class TrainConfig(Section):
    """Batching, stopping and evaluation."""

    batch_size: int = Field(ge=1, description="sequences per rank per micro-step")
    gradient_accumulation_steps: int = Field(1, ge=1)
    global_batch_size: int = Field(ge=1)
    eval_batch_size: int = Field(16, ge=1)
    max_samples_termination: int = Field(ge=1)
    target_accuracy: float = Field(0.720, gt=0.0, lt=1.0)
    # None: the MLPerf formula floor(0.05*(230.23*GBS + 3e6)/25000)*25000
    eval_every_samples: Optional[int] = Field(None, ge=1)
    eval_start_samples: Optional[int] = Field(None, ge=0)
    init_checkpoint: Optional[str] = None
    seed: int = Field(0, ge=0, description="run i of an experiment uses seed + i")
    log_every_steps: int = Field(10, ge=1)

    @property
    def eval_interval(self) -> int:
        if self.eval_every_samples is not None:
            return self.eval_every_samples
        return mlperf_eval_interval(self.global_batch_size)


class BalanceConfig(Section):
    """Load balancing across ranks (Samsung's and NVIDIA's MLPerf techniques)."""

    stratified: bool = False
    bin_quotas: Optional[list[int]] = None
    exchange_padding: Literal["none", "global", "group"] = "none"
    group_size: int = Field(8, ge=1)
    snake: bool = True
    # packing: a rank's micro-batch is batch_size packs (rows of at most max_seq_length tokens,
    # about two sequences each), packed best-fit from windows of pack_window samples
    packing: bool = False
    pack_window: int = Field(1024, ge=1)

    @model_validator(mode="after")
    def _quotas_shape(self) -> "BalanceConfig":
        if self.bin_quotas is not None:
            if len(self.bin_quotas) != len(BIN_EDGES) or any(q < 0 for q in self.bin_quotas):
                raise ValueError(f"bin_quotas: needs {len(BIN_EDGES)} non-negative counts, got {self.bin_quotas}")
        return self


class RuntimeConfig(Section):
    """Where and how the maths runs."""

    device: Literal["cpu", "cuda"] = "cpu"
    backend: Literal["gloo", "nccl"] = "gloo"
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    kernels: Literal["torch", "apex"] = "torch"
    unpad: bool = False
    dense_seq_output: bool = True
    nccl_warmup_steps: int = Field(0, ge=0)
    init_loss_scale: float = Field(2.0**20, gt=0.0)
    num_threads: Optional[int] = Field(None, ge=1)


class CheckpointConfig(Section):
    # where a run keeps its checkpoints; None: <out>/checkpoints/run_<index>
    dir: Optional[str] = None
    keep: int = Field(3, ge=1)
    every_steps: int = Field(0, ge=0, description="0: only when signalled (SIGUSR2/SIGTERM)")
    # write the final weights here as {"model": state_dict}: a phase-1 checkpoint for the next phase
    final_model: Optional[str] = None


class MLPerfConfig(Section):
    """What the MLPerf log says about the submission."""

    org: str = "bertctl"
    division: Literal["closed", "open"] = "closed"
    status: Literal["onprem", "cloud", "preview", "research"] = "onprem"
    platform: str = "unknown"
    ruleset: str = "5.0.0"
    # opt_epsilon and the 398 weights_initialization records that rulesets 1.1.0-2.1.0 require
    legacy_keys: bool = True


class RunConfig(Section):
    """One resolved run configuration: what `python -m trainer --config run.yaml` reads."""

    derived_fields: ClassVar[dict[str, str]] = {
        "world_size": "it is nodes x tasks_per_node of the cluster that runs it",
    }

    world_size: int = Field(1, ge=1, description="ranks the job starts; checked against the launcher")
    model: ModelConfig = ModelConfig()
    data: DataConfig
    optim: OptimConfig
    train: TrainConfig
    balance: BalanceConfig = BalanceConfig()
    runtime: RuntimeConfig = RuntimeConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    mlperf: MLPerfConfig = MLPerfConfig()

    @model_validator(mode="after")
    def _consistent(self) -> "RunConfig":
        for problem in run_config_problems(self):
            raise ValueError(problem)
        return self

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False, width=100)


def run_config_problems(cfg: RunConfig) -> list[str]:
    """Cross-field checks that need the whole run configuration."""
    problems = []
    t, rt, bal = cfg.train, cfg.runtime, cfg.balance
    expected = cfg.world_size * t.batch_size * t.gradient_accumulation_steps
    if t.global_batch_size != expected:
        problems.append(
            f"train.global_batch_size: is {t.global_batch_size} but ranks x batch_size x "
            f"gradient_accumulation_steps = {cfg.world_size} x {t.batch_size} x "
            f"{t.gradient_accumulation_steps} = {expected}"
        )
    if rt.device == "cpu":
        cuda_only = {"backend": rt.backend == "nccl", "precision": rt.precision != "fp32", "kernels": rt.kernels == "apex"}
        for key, asked in cuda_only.items():
            if asked:
                problems.append(f"runtime.{key}: {getattr(rt, key)} needs runtime.device=cuda")
    if bal.exchange_padding == "group" and cfg.world_size % bal.group_size:
        problems.append(
            f"balance.group_size: {bal.group_size} does not divide the number of ranks ({cfg.world_size})"
        )
    if bal.bin_quotas is not None and sum(bal.bin_quotas) != t.batch_size:
        problems.append(f"balance.bin_quotas: {bal.bin_quotas} must add up to train.batch_size ({t.batch_size})")
    if bal.bin_quotas is not None and not bal.stratified:
        problems.append("balance.bin_quotas: is set but balance.stratified is false")
    if bal.packing and bal.stratified:
        problems.append("balance.packing: packing and stratified batches are alternatives, choose one")
    if bal.packing and not rt.unpad:
        problems.append("balance.packing: packed rows run on the unpadded path: set runtime.unpad true")
    if cfg.data.max_seq_length > cfg.model.max_position_embeddings:
        problems.append(
            f"data.max_seq_length: {cfg.data.max_seq_length} exceeds "
            f"model.max_position_embeddings ({cfg.model.max_position_embeddings})"
        )
    if cfg.mlperf.division == "closed" and t.target_accuracy < 0.720:
        problems.append(
            f"train.target_accuracy: {t.target_accuracy} is below MLPerf's 0.720: "
            "set mlperf.division=open for a lower target"
        )
    return problems


def mlperf_eval_interval(global_batch_size: int) -> int:
    """Samples between evaluations by the MLPerf BERT rule: floor(0.05*(230.23*GBS + 3e6)/25000)*25000."""
    return int(math.floor(0.05 * (230.23 * global_batch_size + 3_000_000) / 25_000) * 25_000)


DEFAULT_BERTCTL_HOME = "~/.bertctl"


class PathError(ValueError):
    """A configured path that cannot be resolved on this node."""


_VARIABLE = re.compile(r"\$(\w+)|\$\{(\w+)\}")


def expand_path(path: str) -> str:
    """`~` and `$VARS` expanded on the node that reads the file.

    $BERTCTL_HOME defaults to ~/.bertctl, as on the login node; any other variable must be set,
    so that an unset one is an error rather than a directory literally named `$FOO`.
    """

    def value(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        if name in os.environ:
            return os.environ[name]
        if name == "BERTCTL_HOME":
            return os.path.expanduser(DEFAULT_BERTCTL_HOME)
        raise PathError(f"path {path!r} uses ${name}, which is not set in this environment")

    return os.path.expanduser(_VARIABLE.sub(value, path))


def load_run_config(path: str) -> RunConfig:
    with open(path, encoding="utf-8") as f:
        return RunConfig.model_validate(yaml.safe_load(f))


# ---- Dataset manifests
# One YAML per dataset under datasets/: what the data is, where its inputs live, how it is prepared
# and what the result must look like. `bertctl data prepare|verify` validate it here (torch-free, like
# the run configuration) and hand the resolved manifest to the trainer-side workers
# (`python -m trainer.data.prepare`). Paths may use `~` and `$VARS`, expanded on the node.

import hashlib  # noqa: E402  (kept with the block that uses them)
import json  # noqa: E402
import re  # noqa: E402

DATASET_NAME_RE = r"[A-Za-z0-9][A-Za-z0-9_.-]*"


class DataSource(Section):
    """Where the raw material comes from.

    python_stdlib: the docstrings of the Python standard library and the text of its language
                   reference (pydoc_data), split into documents and sentences on this machine.
    text:          text files, one sentence per line and a blank line between documents (the MLPerf
                   Wikipedia parts `part-00xxx-of-00500` and `eval.txt`), or free text with
                   `split_sentences`.
    tfrecord:      TFRecords in the MLPerf feature layout (already tokenized and masked).
    """

    kind: Literal["python_stdlib", "text", "tfrecord"]
    train: Optional[str] = Field(None, description="text/tfrecord: a folder (every file, sorted) or a glob of the training parts")
    eval: Optional[str] = Field(None, description="text/tfrecord: the file the eval set is made from")
    split_sentences: bool = Field(False, description="text: segment each line into sentences (free text)")
    parts: int = Field(8, ge=1, description="python_stdlib: number of text parts the training documents are written into")
    eval_percent: int = Field(10, ge=1, le=50, description="python_stdlib: share of the documents held out for the eval set")
    max_documents: Optional[int] = Field(None, ge=2, description="python_stdlib: only the first N documents (quick builds)")

    @model_validator(mode="after")
    def _fields_fit_the_kind(self) -> "DataSource":
        if self.kind == "python_stdlib" and (self.train or self.eval):
            raise ValueError("train: python_stdlib builds its own corpus: train and eval must be unset")
        if self.kind != "python_stdlib" and self.max_documents is not None:
            raise ValueError("max_documents: only for kind python_stdlib")
        if self.kind == "tfrecord" and self.split_sentences:
            raise ValueError("split_sentences: TFRecords are already tokenized")
        return self


class VocabSection(Section):
    """The WordPiece vocabulary: a given file (MLPerf's uncased 30,522 tokens) or one trained on the corpus."""

    file: Optional[str] = Field(None, description="vocab.txt, one token per line; null: learn one into <root>/vocab.txt")
    learn: bool = Field(True, description="without a file: learn a vocabulary from the training text (false: a file is required)")
    size: int = Field(30522, ge=16, description="size of a learned vocabulary, special tokens included")
    min_frequency: int = Field(2, ge=1)
    lower_case: bool = True


class PrepareSection(Section):
    """The create_pretraining_data parameters and how the work is split."""

    masked_lm_prob: float = Field(0.15, gt=0.0, lt=1.0)
    dupe_factor: int = Field(10, ge=1, description="passes over the documents, each with fresh pairs and masks")
    random_seed: int = Field(12345, ge=0)
    short_seq_prob: float = Field(0.1, ge=0.0, le=1.0, description="share of sequences with a random shorter target length")
    combine_group: int = Field(8, ge=1, description="output shards written by one task of the combine stage")
    array_tasks: int = Field(64, ge=1, description="Slurm: at most this many array tasks per stage (tasks are grouped)")
    keep_work: bool = Field(False, description="keep the per-part intermediate files under <root>/.work")


class DatasetOutput(Section):
    """One prepared folder under the dataset root, e.g. `train/` (4 bins) or `eval/` (one picked file)."""

    split: Literal["train", "eval"] = Field(description="which documents (or input files) it is made from")
    max_seq_length: int = Field(512, ge=8)
    max_predictions: int = Field(76, ge=1)
    layout: Literal["fixed", "varlen"] = "varlen"
    bins: Optional[list[int]] = Field(None, description="inclusive upper length edges, e.g. [128, 256, 384, 512]: one subfolder per bin")
    shards: int = Field(1, ge=1, description="shards per bin (or in the folder), balanced to within one sample")
    pick: Optional[int] = Field(None, ge=1, description="take this many samples evenly, idx = int(i*N/pick), into one file")
    file: Optional[str] = Field(None, description="with pick: the file name (default part_eval_<pick>.hdf5)")

    @model_validator(mode="after")
    def _consistent(self) -> "DatasetOutput":
        if self.bins is not None:
            if not self.bins or self.bins != sorted(set(self.bins)) or self.bins[0] < 1:
                raise ValueError(f"bins: must be ascending positive lengths, got {self.bins}")
            if self.bins[-1] != self.max_seq_length:
                raise ValueError(f"bins: the last edge must be max_seq_length ({self.max_seq_length}), got {self.bins[-1]}")
        if self.pick is not None and (self.bins is not None or self.shards != 1):
            raise ValueError("pick: a picked set is one file: bins must be unset and shards 1")
        if self.file is not None and (self.pick is None or "/" in self.file or not self.file.endswith((".hdf5", ".h5"))):
            raise ValueError(f"file: needs pick, and a plain *.hdf5 name, got {self.file!r}")
        if self.max_predictions > self.max_seq_length:
            raise ValueError(f"max_predictions: {self.max_predictions} exceeds max_seq_length ({self.max_seq_length})")
        return self

    @property
    def pick_file(self) -> str:
        return self.file or f"part_eval_{self.pick}.hdf5"


class FileCheck(Section):
    """What a known input file must be: size in bytes and md5 (a published prefix of the hex digest is enough)."""

    bytes: Optional[int] = Field(None, ge=0)
    md5: Optional[str] = Field(None, pattern=r"^[0-9a-f]{4,32}$")


class CheckpointSection(Section):
    """The phase-1 TensorFlow checkpoint that phase 2 starts from, converted to PyTorch."""

    tf_checkpoint: Optional[str] = Field(None, description="the checkpoint prefix, e.g. /data/phase1/model.ckpt-28252")
    bert_config: Optional[str] = Field(None, description="bert_config.json")
    output: str = Field("phase1/model.ckpt-28252.pt", description="the converted file, relative to the dataset root")
    files: dict[str, FileCheck] = Field({}, description="checks of <tf_checkpoint><suffix>, e.g. '.index'")
    bert_config_file: Optional[FileCheck] = None


class OutputCheck(Section):
    samples: Optional[int] = Field(None, ge=0, description="exact number of samples")
    min_samples: Optional[int] = Field(None, ge=0)
    max_samples: Optional[int] = Field(None, ge=0)


class ExpectSection(Section):
    """What `bertctl data verify` holds the prepared data to (besides the checksums recorded at build time)."""

    outputs: dict[str, OutputCheck] = {}
    masking_tolerance: float = Field(0.005, ge=0.0, description="|masked share of tokens - masked_lm_prob|")
    replacement_tolerance: float = Field(0.01, ge=0.0, description="each of the 80/10/10 [MASK]/random/kept shares")
    nsp_tolerance: float = Field(0.02, ge=0.0, description="|share of random next sentences - 0.5|")
    checksums: Literal["recorded", "none"] = Field(
        "recorded", description="recorded: compare each file's content digest with the one written when it was built")


class DatasetManifest(Section):
    name: str = Field(pattern=f"^{DATASET_NAME_RE}$")  # pydantic's regex: $ is the end of the text
    description: str = ""
    root: str = Field(description="where the prepared dataset goes")
    source: DataSource
    vocab: VocabSection = VocabSection()
    prepare: PrepareSection = PrepareSection()
    outputs: dict[str, DatasetOutput]
    checkpoint: Optional[CheckpointSection] = None
    expect: ExpectSection = ExpectSection()

    @model_validator(mode="after")
    def _consistent(self) -> "DatasetManifest":
        if not self.outputs:
            raise ValueError("outputs: at least one output is needed")
        for name in self.outputs:
            if not re.fullmatch(DATASET_NAME_RE, name) or name.startswith("."):
                raise ValueError(f"outputs: names are folder names (letters, digits, '_', '.', '-'), got {name!r}")
        unknown = sorted(set(self.expect.outputs) - set(self.outputs))
        if unknown:
            raise ValueError(f"expect.outputs: {', '.join(unknown)} is not an output (outputs: {', '.join(self.outputs)})")
        return self

    def params_digest(self) -> str:
        """A digest of everything that shapes the prepared files (not the expectations or task sizes)."""
        prepare = self.prepare.model_dump(mode="json", exclude={"combine_group", "array_tasks", "keep_work"})
        keys = {"source": self.source.model_dump(mode="json"), "vocab": self.vocab.model_dump(mode="json"),
                "prepare": prepare, "outputs": {k: v.model_dump(mode="json") for k, v in self.outputs.items()}}
        return hashlib.sha256(json.dumps(keys, sort_keys=True).encode()).hexdigest()

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False, width=100)


def load_dataset_manifest(path: str) -> DatasetManifest:
    with open(path, encoding="utf-8") as f:
        return DatasetManifest.model_validate(yaml.safe_load(f))
