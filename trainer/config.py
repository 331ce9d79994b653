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
from typing import ClassVar, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

# Samsung's strata (sequence length bins, inclusive upper edges) and its quotas for a 16-sample batch.
BIN_EDGES = (128, 256, 384, 512)


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


class OptimConfig(Section):
    """Optimizer, LR schedule and gradient clipping."""

    name: Literal["lamb", "adam"] = "lamb"
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
    packing: bool = False

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
    dir: Optional[str] = None
    keep: int = Field(3, ge=1)
    every_steps: int = Field(0, ge=0, description="0: only when signalled and at the end if save_final")
    save_final: bool = False


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


def expand_path(path: str) -> str:
    """`~` and `$VARS` expanded on the node that reads the file."""
    return os.path.expandvars(os.path.expanduser(path))


def load_run_config(path: str) -> RunConfig:
    with open(path, encoding="utf-8") as f:
        return RunConfig.model_validate(yaml.safe_load(f))
