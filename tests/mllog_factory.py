"""Complete, realistic MLPerf BERT result logs without training, and experiments made of them.

Every line goes through the trainer's own `trainer.mlperf.EventLog` on a virtual clock (explicit
time_ms), in the event order of NVIDIA's submitted logs (../shared/reference/mlperf-logging-rules.md
sections 2.4 and 3.1): a 20-minute run is written in milliseconds. Hyperparameters default to the RCP
record for global batch 448. Options break a log the ways real logs break.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from orchestrator import experiments
from orchestrator.config.clusters import load_cluster
from orchestrator.experiments import Experiment
from trainer.config import mlperf_eval_interval
from trainer.mlperf import EventLog

T0_MS = 1_760_000_000_000  # 2025-10-09: after the last BERT round, so the date hint says 5.0.0
TARGET = 0.720
# The RCP record for global batch 448 (rcp_checker/training_5.0.0/rcps_bert.json)
GBS448 = {"lr": 0.000425, "steps": 6700, "warmup": 0, "start_warmup": 0, "betas": (0.9, 0.999), "wd": 0.01}


def bert_large_tensors() -> list[str]:
    """The 398 TF variable names of BERT-large that rulesets 1.1.0-2.1.0 want in weights_initialization."""
    names = [f"bert/embeddings/{n}" for n in ("word_embeddings", "position_embeddings", "token_type_embeddings",
                                               "LayerNorm/gamma", "LayerNorm/beta")]
    per_layer = ["attention/self/query/kernel", "attention/self/query/bias", "attention/self/key/kernel",
                 "attention/self/key/bias", "attention/self/value/kernel", "attention/self/value/bias",
                 "attention/output/dense/kernel", "attention/output/dense/bias", "attention/output/LayerNorm/gamma",
                 "attention/output/LayerNorm/beta", "intermediate/dense/kernel", "intermediate/dense/bias",
                 "output/dense/kernel", "output/dense/bias", "output/LayerNorm/gamma", "output/LayerNorm/beta"]
    names += [f"bert/encoder/layer_{i}/{n}" for i in range(24) for n in per_layer]
    names += ["bert/pooler/dense/kernel", "bert/pooler/dense/bias", "cls/predictions/output_bias",
              "cls/predictions/transform/dense/kernel", "cls/predictions/transform/dense/bias",
              "cls/predictions/transform/LayerNorm/gamma", "cls/predictions/transform/LayerNorm/beta",
              "cls/seq_relationship/output_weights", "cls/seq_relationship/output_bias"]
    return names


@dataclass(frozen=True)
class RunSpec:
    seed: int = 12345
    minutes: float = 20.0  # run_start -> run_stop
    converge_samples: int = 2_400_000  # samples at the evaluation that first reaches the target
    converged: bool = True  # False: the best accuracy stays at 0.716 and run_stop says aborted
    global_batch_size: int = 448
    eval_interval: int | None = None  # None: the MLPerf formula for the batch size
    init_minutes: float = 3.0
    start_ms: int = T0_MS
    division: str = "closed"
    org: str = "bertctl"
    platform: str = "1xNVIDIA DGX A100"
    legacy_keys: bool = True  # opt_epsilon and the 398 weights_initialization records (ruleset 1.1.0)
    drop_key: str | None = None  # leave this key out
    tracked_stats: bool = False  # log tracked_stats {throughput} after each eval, as NVIDIA does
    block_start_at_begin: bool = True  # False: block_start right before block_stop (no block timing)


def write_log(path: str | Path, spec: RunSpec = RunSpec()) -> Path:
    """One run's result log, from cache_clear to run_stop."""
    path = Path(path)
    path.unlink(missing_ok=True)  # EventLog appends
    log = EventLog(path)
    clock = _Clock(spec.start_ms)

    def event(key, value=None, metadata=None):
        if key != spec.drop_key:
            log.event(key, value, metadata, time_ms=clock.now)

    def start(key, metadata=None):
        if key != spec.drop_key:
            log.start(key, None, metadata, time_ms=clock.now)

    def end(key, metadata=None):
        if key != spec.drop_key:
            log.end(key, None, metadata, time_ms=clock.now)

    event("cache_clear", True)
    clock.advance(1_000)
    start("init_start")
    for key, value in (("submission_benchmark", "bert"), ("submission_org", spec.org),
                       ("submission_division", spec.division), ("submission_status", "onprem"),
                       ("submission_platform", spec.platform)):
        event(key, value)
    gbs = spec.global_batch_size
    hp = GBS448
    for key, value in (("seed", spec.seed), ("global_batch_size", gbs), ("d_batch_size", max(gbs // 8, 1)),
                       ("gradient_accumulation_steps", 1), ("max_sequence_length", 512),
                       ("max_predictions_per_seq", 76), ("opt_name", "lamb"), ("opt_base_learning_rate", hp["lr"]),
                       ("opt_lamb_weight_decay_rate", hp["wd"]), ("opt_lamb_beta_1", hp["betas"][0]),
                       ("opt_lamb_beta_2", hp["betas"][1]), ("opt_lamb_learning_rate_decay_poly_power", 1.0),
                       ("opt_lamb_epsilon", 1e-6)):
        event(key, value)
    if spec.legacy_keys:
        event("opt_epsilon", 1e-6)
    for key, value in (("opt_learning_rate_warmup_steps", hp["warmup"]), ("num_warmup_steps", hp["warmup"]),
                       ("start_warmup_step", hp["start_warmup"]), ("opt_learning_rate_training_steps", hp["steps"]),
                       ("eval_samples", 10000)):
        event(key, value)
    if spec.legacy_keys:
        for tensor in bert_large_tensors():
            event("weights_initialization", metadata={"tensor": tensor})
    clock.advance(spec.init_minutes * 60_000)
    end("init_stop")
    clock.advance(50)
    start("run_start")
    run_start = clock.now
    _train(spec, clock, start, end, event)
    clock.now = run_start + round(spec.minutes * 60_000)
    end("run_stop", {"status": "success" if spec.converged else "aborted"})
    log.close()
    return path


def _train(spec: RunSpec, clock: "_Clock", start, end, event) -> None:
    interval = spec.eval_interval or mlperf_eval_interval(spec.global_batch_size)
    if spec.converge_samples % interval:
        raise ValueError(f"converge_samples {spec.converge_samples} is not a multiple of the eval interval {interval}")
    evals = spec.converge_samples // interval + (0 if spec.converged else 4)
    slot = spec.minutes * 60_000 / evals - 1  # leave a millisecond for train_samples before run_stop
    for k in range(1, evals + 1):
        first, last = (k - 1) * interval, k * interval
        slot_start = clock.now
        if spec.block_start_at_begin:
            start("block_start", {"first_epoch_num": first, "epoch_count": interval, "samples_count": first})
        clock.advance(0.9 * slot * _jitter(spec.seed, k))  # training, a little faster or slower each block
        if not spec.block_start_at_begin:
            start("block_start", {"first_epoch_num": first, "epoch_count": interval, "samples_count": first})
        end("block_stop", {"first_epoch_num": first, "samples_count": last})
        start("eval_start", {"epoch_num": last})
        clock.advance(0.05 * slot)  # evaluation
        end("eval_stop", {"epoch_num": last})
        event("eval_accuracy", _accuracy(k, evals, spec.converged, spec.seed), {"epoch_num": last})
        if spec.tracked_stats:
            event("tracked_stats", {"throughput": interval / (0.9 * slot * _jitter(spec.seed, k) / 1000.0)},
                  {"step": last // spec.global_batch_size})
        clock.now = slot_start + round(slot)
    event("train_samples", evals * interval)


def _jitter(seed: int, k: int) -> float:
    """A deterministic factor in [0.95, 1.05) per run and block: throughput is never perfectly flat."""
    return 0.95 + ((seed * 7919 + k * 104729) % 1000) / 10000


def _accuracy(k: int, n: int, converged: bool, seed: int = 0) -> float:
    """Rises from about 0.36; reaches 0.7215 at the last eval of a converging run, 0.716 otherwise. Each
    seed's curve differs in its last digits: two runs with one curve are one run counted twice."""
    top = 0.7215 if converged else 0.716
    noise = ((seed * 7919 + k * 104729) % 89) * 1e-6
    return 0.36 + (top - 0.36) * (1 - math.exp(-5 * k / n)) / (1 - math.exp(-5)) + noise


class _Clock:
    def __init__(self, now_ms: int):
        self.now = now_ms

    def advance(self, ms: float) -> None:
        self.now += round(ms)


def break_json(path: Path, line_number: int = 30) -> None:
    """Truncate one MLLOG line in the middle, as a killed writer or a full disk leaves it."""
    lines = path.read_text().splitlines(keepends=True)
    lines[line_number - 1] = lines[line_number - 1][:60] + "\n"
    path.write_text("".join(lines))


# ---- whole experiments, registered like `bertctl submit` registers them

# Ten runs like the reference's worked example: minutes and samples to converge per run
EXAMPLE_MINUTES = (20.4, 19.1, 21.7, 20.2, 20.6, 21.9, 18.8, 20.3, 23.0, 20.5)
EXAMPLE_SAMPLES = (2_400_000, 2_250_000, 2_550_000, 2_400_000, 2_400_000, 2_550_000, 2_250_000, 2_400_000,
                   2_700_000, 2_400_000)


def example_specs(**changes) -> list[RunSpec]:
    """The ten example runs, one after the other, each with its own seed."""
    specs, start = [], T0_MS
    for i, (minutes, samples) in enumerate(zip(EXAMPLE_MINUTES, EXAMPLE_SAMPLES)):
        fields = {"seed": 1000 + i, "minutes": minutes, "converge_samples": samples, "start_ms": start, **changes}
        specs.append(RunSpec(**fields))
        start += round((minutes + 5) * 60_000)
    return specs


def olympic(minutes: list[float]) -> float:
    """The olympic mean computed by hand for the tests: drop one fastest and one slowest."""
    kept = sorted(minutes)[1:-1]
    return sum(kept) / len(kept)


def make_experiment(specs: list[RunSpec], cluster: str = "nvidia_dgxa100_1x8", overrides: tuple[str, ...] = (),
                    without_system: bool = False) -> Experiment:
    """An experiment in the registry whose results/ hold these runs' logs (no job ever ran)."""
    loaded = load_cluster(cluster, list(overrides))
    config = loaded.config
    dumped = config.model_dump(mode="json")
    if without_system:
        dumped.pop("system", None)
    exp = Experiment(
        id=experiments.new_id(config.name), cluster=config.name, cluster_source=loaded.source,
        executor=config.executor, nexp=len(specs), seeds=[s.seed for s in specs], program="train",
        overrides=list(overrides), script="job.sbatch", created=time.time(), dir="",
    )
    exp = experiments.create(exp, {"run.yaml": config.run.to_yaml(), "cluster.yaml": yaml.safe_dump(dumped, sort_keys=False),
                                    "job.sbatch": "#!/bin/bash\n"})
    for i, spec in enumerate(specs):
        write_log(exp.result_file(i), spec)
    return exp


def tiny_closed_specs(n: int = 10, **changes) -> list[RunSpec]:
    """Runs of a tiny model that reaches 0.720 after a few thousand samples (global batch 16)."""
    return [RunSpec(seed=7 + i, minutes=2.0 + 0.1 * i, converge_samples=4_000 + 400 * (i % 3), global_batch_size=16,
                    eval_interval=400, legacy_keys=False, platform="1xCPU", start_ms=T0_MS + i * 600_000, **changes)
            for i in range(n)]


# the local cluster's 2-layer model is far below the closed division's problem: it waives the rules of scale
TINY_CLOSED = ("run.mlperf.division=closed", "run.mlperf.waive_scale_rules=true", "run.train.target_accuracy=0.72")


def with_changes(specs: list[RunSpec], index: int, **changes) -> list[RunSpec]:
    specs = list(specs)
    specs[index] = replace(specs[index], **changes)
    return specs
