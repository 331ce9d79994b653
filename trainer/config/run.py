"""The run configuration: everything one rank needs to train, as one frozen, validated object.

The orchestrator writes a `RunConfig` as `run.yaml`; every rank reads it back with
`load_run_config`. Defaults are BERT-large with NVIDIA's MLPerf v1.1 conventions; the cluster
files under `clusters/` set the recipe for each system and scale. Each component of the trainer is
handed its own section (`cfg.data`, `cfg.optim`, ...); rules that tie sections together live in
`RunConfig.cross_checks`, once.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import ClassVar, Literal, Optional

import yaml
from pydantic import Field, model_serializer, model_validator

from trainer.config.base import ConfigProblem, Section
from trainer.config.closed_rules import closed_problems, eval_interval_rule
from trainer.config.paths import expand_path

# Samsung's strata: sequence-length bins by their inclusive upper edges (1-128, 129-256, ...).
BIN_EDGES = (128, 256, 384, 512)



class ModelConfig(Section):
    """BERT shape. Defaults are BERT-large (24 layers, 1024 hidden, 16 heads, 4096 FFN)."""

    num_layers: int = Field(24, ge=1)
    hidden_size: int = Field(1024, ge=8)
    num_heads: int = Field(16, ge=1)
    intermediate_size: int = Field(4096, ge=1)
    # token ids are int16 in the shards and on the exchange-padding wire (NVIDIA's formats)
    vocab_size: int = Field(30522, ge=8, le=32768)
    max_position_embeddings: int = Field(512, ge=8)
    type_vocab_size: int = Field(2, ge=1)
    hidden_dropout: float = Field(0.1, ge=0.0, lt=1.0)
    attention_dropout: float = Field(0.1, ge=0.0, lt=1.0)
    layer_norm_eps: float = Field(1e-12, gt=0.0)
    initializer_range: float = Field(0.02, gt=0.0)

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> "ModelConfig":
        if self.hidden_size % self.num_heads:
            raise ConfigProblem("num_heads", f"{self.num_heads} does not divide hidden_size ({self.hidden_size})")
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
            raise ConfigProblem("betas", f"each must be in [0, 1), got {list(self.betas)}")
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
    # packing: a rank's micro-batch is batch_size packs (rows of at most max_seq_length tokens), packed
    # from windows of pack_window samples (trainer/balance/algorithms.py::pack_sequences; the next window is packed
    # while the current one trains)
    packing: bool = False
    pack_window: int = Field(16384, ge=1)
    # at most this many sequences in a pack (NVIDIA's packed dataset: 3); None: no limit
    pack_sequences: Optional[int] = Field(None, ge=1)
    # the nominal sequences per pack (NVIDIA: 2, the packed data averages 1.999): the logged
    # global_batch_size is ranks x batch_size x accumulation x pack_average; the trainer counts the
    # sequences actually trained and reports them beside it. None: the batch counts packs
    # (at least 1: a pack holds one sequence or more, and a logged batch below the trained one is false)
    pack_average: Optional[float] = Field(None, ge=1, allow_inf_nan=False)

    @model_validator(mode="after")
    def _consistent(self) -> "BalanceConfig":
        if self.bin_quotas is not None:
            if len(self.bin_quotas) != len(BIN_EDGES) or any(q < 0 for q in self.bin_quotas):
                raise ConfigProblem("bin_quotas", f"needs {len(BIN_EDGES)} non-negative counts, got {self.bin_quotas}")
            if not self.stratified:
                raise ConfigProblem("bin_quotas", "is set but stratified is false")
        if self.pack_average is not None and self.pack_sequences is not None and self.pack_average > self.pack_sequences:
            raise ConfigProblem("pack_average", f"{self.pack_average} exceeds pack_sequences ({self.pack_sequences}), "
                                                "the most sequences a pack holds")
        if self.packing and self.stratified:
            raise ConfigProblem("packing", "packing and stratified batches are alternatives, choose one")
        return self


class RuntimeConfig(Section):
    """Where and how the maths runs."""

    device: Literal["cpu", "cuda"] = "cpu"
    backend: Literal["gloo", "nccl"] = "gloo"
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    kernels: Literal["torch", "apex"] = "torch"
    unpad: bool = False
    # variable-length attention (with unpad): auto takes flash_attn, else PyTorch's own flash kernel
    # on jagged NestedTensors (CUDA fp16/bf16), else one SDPA call per sequence (see trainer/model/attention.py)
    attention: Literal["auto", "flash_attn", "nested", "per_sequence"] = "auto"
    # torch.compile the encoder layers' pointwise tails (the fast step: the whole model, static shapes, its
    # evaluation, and LAMB's update)
    compile: bool = False
    # a failure to compile: error ends the run (one line naming the cause: a rank run eager is ~14 % slower and
    # the slowest sets the pace); eager runs that code eager after one warning line (trainer/model/compiled.py)
    compile_fallback: Literal["error", "eager"] = "error"
    # fast: fixed-shape packed micro-batches, attention on the packed stream as one operator (trainer/loop/fast_step.py);
    # reference: the step it is tested against; auto: fast on CUDA in bf16/fp16 with balance.packing and
    # balance.pack_sequences set, else reference
    step: Literal["auto", "fast", "reference"] = "auto"
    # the fast step's forward and backward replayed as CUDA graphs (torch.compile mode reduce-overhead)
    cuda_graph: bool = False
    # FP8 GEMMs for the encoder's Linear layers through torchao.float8 (trainer/model/fp8.py): CUDA and bf16 here; a GPU
    # of compute capability 8.9 or newer and a torchao that runs with the node's torch, checked before training
    fp8: bool = False
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

    def run_folder(self, out: str | Path, run_index: int) -> Path:
        """Run N's checkpoints (and its final weights, FINAL_WEIGHTS): checkpoint.dir, or by default
        OUT/checkpoints/run_N. The trainer writes there and `bertctl export` reads there."""
        return Path(expand_path(self.dir)) if self.dir else Path(out) / "checkpoints" / f"run_{run_index}"


# In a run's checkpoint folder: the weights the run ended with, {"model": state_dict}, written by rank 0
# after run_stop (what `bertctl export` exports)
FINAL_WEIGHTS = "final.pt"


class MetricsConfig(Section):
    """What a run writes about itself beside its MLPerf log: metrics/run_N.jsonl always, and the same figures as
    TensorBoard event files in tensorboard/run_N/ (trainer/loop/curves.py) unless turned off here."""

    tensorboard: bool = True


class MLPerfConfig(Section):
    """What the MLPerf log says about the submission."""

    org: str = "bertctl"
    division: Literal["closed", "open"] = "closed"
    status: Literal["onprem", "cloud", "preview", "research"] = "onprem"
    platform: str = "unknown"
    ruleset: str = "5.0.0"
    # opt_epsilon and the 398 weights_initialization records that rulesets 1.1.0-2.1.0 require
    legacy_keys: bool = True
    # a small model run as closed: logged as closed so that the official checker applies its
    # closed rules, exempt from the BERT rules of the problem's size (closed_rules.py: model, sequence
    # length, evaluation set and cadence, initial checkpoint); never a result. Left out of run.yaml while
    # false, so a run.yaml (and a rendered script) shows it exactly where it weakens a closed run.
    waive_scale_rules: bool = False

    @model_serializer(mode="wrap")
    def _waiver_only_when_set(self, dump):
        fields = dump(self)
        if not self.waive_scale_rules:
            fields.pop("waive_scale_rules", None)
        return fields


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
    metrics: MetricsConfig = MetricsConfig()
    mlperf: MLPerfConfig = MLPerfConfig()

    @model_validator(mode="after")
    def _consistent(self) -> "RunConfig":
        for problem in self.cross_checks():
            raise problem
        return self

    def cross_checks(self) -> list[ConfigProblem]:
        """Rules that tie sections together, each checked here and nowhere else."""
        problems = []
        t, rt, bal = self.train, self.runtime, self.balance
        per_row = bal.pack_average if bal.packing and bal.pack_average else 1
        expected = self.world_size * t.batch_size * t.gradient_accumulation_steps * per_row
        if t.global_batch_size != expected:
            names = "ranks x batch_size x gradient_accumulation_steps"
            values = f"{self.world_size} x {t.batch_size} x {t.gradient_accumulation_steps}"
            if per_row != 1:
                names, values = names + " x balance.pack_average", values + f" x {per_row:g}"
            problems.append(ConfigProblem("train.global_batch_size", f"is {t.global_batch_size} but {names} = {values} = {expected}"))
        if rt.device == "cpu":
            cuda_only = {"backend": rt.backend == "nccl", "precision": rt.precision != "fp32", "kernels": rt.kernels == "apex"}
            problems += [ConfigProblem(f"runtime.{key}", f"{getattr(rt, key)} needs runtime.device=cuda")
                         for key, asked in cuda_only.items() if asked]
        if bal.exchange_padding == "group" and self.world_size % bal.group_size:
            problems.append(ConfigProblem(
                "balance.group_size", f"{bal.group_size} does not divide the number of ranks ({self.world_size})"))
        problems += self.stream_problems()
        if bal.packing and not rt.unpad:
            problems.append(ConfigProblem("balance.packing", "packed rows run on the unpadded path: set runtime.unpad true"))
        if self.data.max_seq_length > self.model.max_position_embeddings:
            problems.append(ConfigProblem(
                "data.max_seq_length",
                f"{self.data.max_seq_length} exceeds model.max_position_embeddings ({self.model.max_position_embeddings})"))
        if self.mlperf.division == "closed":
            problems += self.closed_division_problems()
        return problems + self.step_problems() + self.fp8_problems()

    @property
    def fast_step(self) -> bool:
        """Whether the fast step runs (runtime.step, auto resolved)."""
        rt, bal = self.runtime, self.balance
        if rt.step == "auto":
            return rt.device == "cuda" and rt.precision != "fp32" and bal.packing and bal.pack_sequences is not None
        return rt.step == "fast"

    def step_problems(self) -> list[ConfigProblem]:
        """What the fast step (runtime.step, runtime.cuda_graph) cannot run, each with its fix."""
        rt, bal, fix = self.runtime, self.balance, "or set runtime.step: reference"
        if rt.cuda_graph and rt.device != "cuda":
            return [ConfigProblem("runtime.cuda_graph", "CUDA graphs need runtime.device: cuda; set runtime.cuda_graph: false")]
        if rt.cuda_graph and not self.fast_step:
            return [ConfigProblem("runtime.cuda_graph", "graphs replay the fast step only: set runtime.step: fast "
                                                        "(with balance.packing) or runtime.cuda_graph: false")]
        if rt.cuda_graph and rt.precision == "fp16":
            return [ConfigProblem("runtime.cuda_graph", "fp16's loss scaling decides on the host whether a step is "
                                                        "skipped: use runtime.precision: bf16 or runtime.cuda_graph: false")]
        if rt.step != "fast":
            return []
        if not bal.packing:
            return [ConfigProblem("runtime.step", f"fast runs fixed-shape packed micro-batches: set balance.packing: true, {fix}")]
        if bal.pack_sequences is None:
            return [ConfigProblem("balance.pack_sequences", "the fast step needs a bound on sequences per pack (NVIDIA's "
                                                            f"packed data: 3): set it, {fix}")]
        if rt.device == "cuda" and rt.precision == "fp32":
            return [ConfigProblem("runtime.precision", "fp32 cannot run the flash kernel of runtime.step: fast on CUDA: "
                                                       f"set bf16 (or fp16), {fix}")]
        return []

    def fp8_problems(self) -> list[ConfigProblem]:
        """What runtime.fp8 needs of the configuration; the node's GPU and torchao are checked where it runs
        (trainer/model/fp8.py::fp8_problem)."""
        rt, m, fix = self.runtime, self.model, "or set runtime.fp8: false"
        if not rt.fp8:
            return []
        if rt.device != "cuda":
            return [ConfigProblem("runtime.fp8", f"FP8 GEMMs need runtime.device: cuda (a GPU of compute capability 8.9 or newer), {fix}")]
        if rt.precision != "bf16":
            return [ConfigProblem("runtime.fp8", f"FP8 GEMMs run beside bf16, not {rt.precision}: set runtime.precision: bf16, {fix}")]
        if m.hidden_size % 16 or m.intermediate_size % 16:
            return [ConfigProblem("runtime.fp8", f"FP8 GEMMs need model.hidden_size ({m.hidden_size}) and model.intermediate_size "
                                                 f"({m.intermediate_size}) to be multiples of 16, {fix}")]
        return []

    def closed_division_problems(self) -> list[ConfigProblem]:
        """What MLPerf's closed division fixes for BERT (trainer/config/closed_rules.py::CLOSED_RULES, the rules
        as data); each says to set the division open. mlperf.waive_scale_rules keeps the recipe's rules, not the problem's size."""
        return [ConfigProblem(key, message) for key, message in closed_problems(self, self.mlperf.waive_scale_rules)]

    def stream_problems(self) -> list[ConfigProblem]:
        """Each data stream reads batch_size x ranks / streams samples per micro-step (trainer/data/dataset.py):
        the streams must split evenly over the ranks and their samples, and stratified quotas fill one stream's batch."""
        t, bal = self.train, self.balance
        streams = self.data.streams or self.world_size
        if streams % self.world_size or (t.batch_size * self.world_size) % streams:
            return [ConfigProblem("data.streams", f"{streams} data streams cannot be split evenly over {self.world_size} "
                                                  f"rank(s) x train.batch_size {t.batch_size}")]
        per_stream = t.batch_size * self.world_size // streams
        if bal.bin_quotas is not None and sum(bal.bin_quotas) != per_stream:
            return [ConfigProblem(
                "balance.bin_quotas", f"{bal.bin_quotas} add up to {sum(bal.bin_quotas)}, but each of the {streams} data "
                                      f"stream(s) takes train.batch_size x ranks / streams = {t.batch_size} x {self.world_size} "
                                      f"/ {streams} = {per_stream} samples per micro-step: the quotas must add up to {per_stream}")]
        return []

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False, width=100)


def mlperf_eval_interval(global_batch_size: int) -> int:
    """Samples between evaluations by the MLPerf BERT rule: floor(0.05*(230.23*GBS + 3e6)/25000)*25000."""
    return eval_interval_rule(global_batch_size)


def load_run_config(path: str) -> RunConfig:
    with open(path, encoding="utf-8") as f:
        return RunConfig.model_validate(yaml.safe_load(f))


