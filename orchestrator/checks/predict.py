"""Time to train, predicted: how many minutes a BERT run of this recipe should take on this allocation.

The model, in one line: the run trains until the RCP's mean samples to converge for its global batch,
evaluating every eval interval, so

    minutes = (overhead + evals x (steps per interval x step time + eval time)) / 60
    evals   = RCP mean samples / eval interval                      (a mean, not rounded)

- The samples to converge are the RCP mean that `compliance-check` compares a result with: the same
  `mlperf_logging` RCP checker, the same pruned reference points, the same choice of point (exact batch,
  interpolation between the neighbours, the smallest batch's point below the table); see `rcp_point`.
  The RCP means are olympic means of reference runs that stopped at an eval, so they are not rounded
  up to the next eval again.
- Steps per interval: eval interval / global batch, a fraction: the trainer (and NVIDIA's) evaluates at
  the first step whose samples reach the next multiple of the interval, so the gaps alternate between
  the floor and the ceiling and average to the fraction (NVIDIA at 4,320 GPUs: 21 or 22 steps).
- Step time (`step_time`, from preflight): the slowest rank's compute (forward and backward of its
  micro-batches: preflight's `train_compute`), plus the part of the gradient all-reduce that the
  backward does not hide. Assumed: DDP overlaps every bucket's all-reduce with the rest of the last
  micro-batch's backward (two thirds of its compute), so what shows is the larger of the last bucket's
  all-reduce and the all-reduce time beyond that backward. The all-reduce time is the gradient's fp32
  bytes at preflight's measured all-ranks algorithm bandwidth (at DDP's bucket size). The compute
  figure leaves the optimizer update out, and preflight also times whole synchronous steps on the same
  allocation (`train_step`: optimizer and real all-reduce included): the step is the larger of the two.
- Eval time (`evaluation_time`): preflight times one whole evaluation with the run's own evaluator
  (its share of the eval set on each rank, the accuracy summed over ranks); without that figure, the
  eval set split over all ranks, one forward per sample at a third of a training sample's compute
  (forward = 1/3 of forward + backward FLOPs).
- Overhead (`start_up_time`): time in the timed region outside steady intervals. Preflight times the
  first step after the trainer's warm-up (the data pipeline starting, the kernels' and allocator's
  first calls) and the overhead is what it costs beyond a steady step. Published logs give it
  (`from_published`).

`from_published` applies the same model to a published result set (throughput and overhead from its
logs, samples from the RCP) so the model can be checked against published scores (tests/test_predict.py,
benchmarks/predict_vs_published.py). Torch-free.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field

from orchestrator.results import scoring

RCP_PASS = "pruned_rcps"  # what compliance-check's RCP check uses (scoring.check_rcp)
FORWARD_SHARE = 1 / 3  # forward FLOPs / (forward + backward) FLOPs
BACKWARD_SHARE = 2 / 3
GRADIENT_BYTES = 4  # DDP all-reduces fp32 gradients
DDP_BUCKET_BYTES = 25 * 2**20  # DistributedDataParallel's default bucket_cap_mb


@dataclass
class RcpPoint:
    global_batch: int
    samples: float  # the RCP mean samples to converge
    how: str  # rcp_checker's own words: RCP found, RCP Interpolation, ...
    ruleset: str


@dataclass
class Prediction:
    minutes: float
    rcp: RcpPoint
    interval_samples: int  # samples between evaluations: the eval interval
    interval_steps: float  # on average
    evals: float  # RCP samples / interval samples
    interval_s: float  # one interval: steps and an eval
    step_s: float | None = None  # None when the interval time was measured whole (published logs)
    eval_s: float | None = None
    overhead_s: float = 0.0
    detail: dict = field(default_factory=dict)  # the step time's parts
    assumptions: list[str] = field(default_factory=list)

    def as_json(self) -> dict:
        return asdict(self)


class NoPrediction(Exception):
    """The model cannot predict this recipe (no RCP for its batch, a measure missing): says why."""


# ---- samples to converge -----------------------------------------------------------------------

def rcp_point(global_batch: int, ruleset: str) -> RcpPoint:
    """The RCP mean samples to converge at this global batch, chosen as rcp_checker.check_directory
    chooses the record it compares a submission with (pruned RCPs): the exact batch, else the
    interpolation between its neighbours (the checker's own _create_interp_rcp), else below the
    table the smallest batch's point. Private rcp_checker names: mlperf-logging is pinned <4.2."""
    from mlperf_logging.rcp_checker import rcp_checker

    if scoring.rcp_applies("closed", ruleset) is not None:
        raise NoPrediction(scoring.rcp_applies("closed", ruleset))
    with scoring.captured_logging():
        checker = rcp_checker.RCP_Checker(scoring.USAGE, ruleset, scoring.BENCHMARK, False)
        record = checker._find_rcp(global_batch, RCP_PASS)
        how = "RCP found"
        if record is None:
            low = checker._find_top_min_rcp(global_batch, RCP_PASS)
            high = checker._find_bottom_max_rcp(global_batch, RCP_PASS)
            if low is not None and high is not None:
                record, how = checker._create_interp_rcp(global_batch, low, high)[1], "RCP Interpolation"
            elif high is not None:
                record, how = checker._find_min_rcp(RCP_PASS), "RCP not found: the smallest batch's RCP"
            else:
                raise NoPrediction(f"no RCP at or above global batch {global_batch} in ruleset {ruleset} "
                                   "(the checker would ask for one)")
    return RcpPoint(global_batch, float(record["RCP Mean"]), how, ruleset)


MLPERF_TARGET = 0.720  # the masked-LM accuracy the RCPs converge to


def samples_to_converge(run, earlier: list[float] = ()) -> RcpPoint:
    """The samples the run should train: the RCP mean where the RCPs apply (BERT-large to MLPerf's
    target); otherwise the mean of this recipe's earlier converged runs on this machine, else the
    recipe's sample budget, an upper bound. A small model to its own target is not BERT-large to 0.720:
    its RCP (2.4 million samples at batch 16) predicted 24,000 minutes for a run of ~2."""
    not_large = scoring.rcp_bypass_reason(run.model_dump(mode="json"))
    own_target = run.train.target_accuracy < MLPERF_TARGET
    if not not_large and not own_target:
        return rcp_point(run.train.global_batch_size, run.mlperf.ruleset)
    why = (not_large.removeprefix("RCP bypassed: ") if not_large
           else f"its target {run.train.target_accuracy:g} is not MLPerf's {MLPERF_TARGET:.3f}")
    if earlier:
        return RcpPoint(run.train.global_batch_size, statistics.mean(earlier),
                        f"no RCP applies ({why}): the mean of this recipe's {len(earlier)} earlier converged run(s) "
                        "in this BERTCTL_HOME", run.mlperf.ruleset)
    return RcpPoint(run.train.global_batch_size, float(run.train.max_samples_termination),
                    f"no RCP applies ({why}) and no earlier converged run of this recipe in this BERTCTL_HOME: "
                    "the recipe's sample budget (train.max_samples_termination), an upper bound", run.mlperf.ruleset)


def earlier_converged_samples(run) -> list[float]:
    """Samples to converge of every converged run, in this BERTCTL_HOME's experiments, whose run.yaml
    is this recipe exactly (seeds aside: they are not in run.yaml)."""
    import yaml

    from orchestrator import experiments
    from orchestrator.results import summary as results

    wanted, found = run.model_dump(mode="json"), []
    for exp in experiments.load_all():
        try:
            same = exp.program == "train" and yaml.safe_load((exp.path / "run.yaml").read_text()) == wanted
        except (OSError, yaml.YAMLError):
            continue
        for i in range(exp.nexp) if same else ():
            if exp.result_file(i).is_file():
                summary = results.summarize(exp.result_file(i))
                if summary.converged and summary.samples_to_converge:
                    found.append(float(summary.samples_to_converge))
    return found


# ---- the model ---------------------------------------------------------------------------------

def interval_steps(global_batch: int, eval_interval: int) -> float:
    return eval_interval / global_batch


def time_to_train(rcp: RcpPoint, eval_interval: int, interval_s: float, overhead_s: float = 0.0) -> Prediction:
    evals = rcp.samples / eval_interval
    minutes = (overhead_s + evals * interval_s) / 60.0
    return Prediction(minutes=minutes, rcp=rcp, interval_samples=eval_interval,
                      interval_steps=interval_steps(rcp.global_batch, eval_interval), evals=evals,
                      interval_s=interval_s, overhead_s=overhead_s)


def bert_parameters(model) -> int:
    """Trainable parameters of trainer/model/bert.py's BertForPreTraining for a ModelConfig (tied decoder)."""
    h, i, v = model.hidden_size, model.intermediate_size, model.padded_vocab_size
    embeddings = (v + model.max_position_embeddings + model.type_vocab_size) * h + 2 * h
    layer = 4 * (h * h + h) + 2 * h + (h * i + i) + (i * h + h) + 2 * h
    heads = (h * h + h) + (h * h + h) + 2 * h + v + (2 * h + 2)  # pooler, MLM transform + LN + bias, NSP
    return embeddings + model.num_layers * layer + heads


def step_time(compute_s: float, algbw_gbs: float, gradient_bytes: int, accumulation: int = 1) -> dict:
    """One optimizer step: compute plus the all-reduce the last micro-batch's backward does not hide."""
    allreduce_s = gradient_bytes / (algbw_gbs * 1e9)
    last_bucket_s = min(DDP_BUCKET_BYTES, gradient_bytes) / (algbw_gbs * 1e9)
    hiding_s = BACKWARD_SHARE * compute_s / accumulation
    exposed_s = max(last_bucket_s, allreduce_s - hiding_s)
    return {"compute_s": compute_s, "allreduce_s": allreduce_s, "allreduce_hidden_s": allreduce_s - exposed_s,
            "allreduce_exposed_s": exposed_s, "step_s": compute_s + exposed_s}


def eval_time(compute_s: float, samples_per_step: float, eval_samples: int, world_size: int) -> float:
    """The slowest rank's eval: its share of the eval set, forward only."""
    per_rank = math.ceil(eval_samples / world_size)
    return per_rank * FORWARD_SHARE * compute_s / samples_per_step


# ---- from preflight's figures ------------------------------------------------------------------

def from_preflight(reports: dict[int, dict], run, earlier: list[float] = ()) -> Prediction:
    """The prediction for `run` (a trainer.config.RunConfig) from preflight's rank reports; `earlier`:
    samples to converge of this recipe's earlier runs (used where no RCP applies)."""
    computes = {r: rep["measures"]["train_compute"]["compute_s"] for r, rep in reports.items()
                if "compute_s" in rep.get("measures", {}).get("train_compute", {})}
    if not computes:
        raise NoPrediction("no rank measured its training step compute (train_compute)")
    slowest = max(computes, key=computes.get)
    world = run.world_size
    gradient = GRADIENT_BYTES * bert_parameters(run.model)
    rates = [rep["measures"]["allreduce_world"]["algbw"] for rep in reports.values()
             if "algbw" in rep.get("measures", {}).get("allreduce_world", {})]
    assumptions = [f"compute: the slowest rank's (rank {slowest}), {computes[slowest] * 1e3:.1f} ms per step of "
                   f"{run.train.batch_size} x {run.train.gradient_accumulation_steps} sequences"]
    measured = max((typical_step(rep["measures"]["train_step"]) for rep in reports.values()
                    if "step_s" in rep.get("measures", {}).get("train_step", {})), default=0.0)
    if world > 1 and not rates:
        raise NoPrediction("no all-ranks all-reduce was measured (allreduce_world)")
    if world > 1:
        algbw = min(rates)
        parts = step_time(computes[slowest], algbw, gradient, run.train.gradient_accumulation_steps)
        assumptions.append(
            f"all-reduce: {gradient / 1e6:.4g} MB of fp32 gradients at the measured all-ranks algbw {algbw:.3g} GB/s "
            f"= {parts['allreduce_s'] * 1e3:.1f} ms; DDP hides it behind the last micro-batch's backward (2/3 of its "
            f"compute) except the last bucket: {parts['allreduce_exposed_s'] * 1e3:.1f} ms exposed")
    else:
        parts = {"compute_s": computes[slowest], "allreduce_s": 0.0, "allreduce_hidden_s": 0.0,
                 "allreduce_exposed_s": 0.0, "step_s": computes[slowest]}
        assumptions.append("all-reduce: none (one rank)")
    modeled = parts["step_s"]
    parts = parts | {"modeled_step_s": modeled, "measured_step_s": measured, "step_s": max(modeled, measured)}
    assumptions.append(
        f"step: {parts['step_s'] * 1e3:.1f} ms, the larger of the model ({modeled * 1e3:.1f} ms: compute + exposed "
        f"all-reduce, no optimizer) and preflight's synchronous step on this allocation ({measured * 1e3:.1f} ms, "
        "optimizer and real all-reduce included; its slowest rank's mean step)")
    eval_s, eval_how = evaluation_time(reports, run, computes[slowest])
    rcp = samples_to_converge(run, list(earlier))
    steps = interval_steps(rcp.global_batch, run.train.eval_interval)
    startup_s, startup_how = start_up_time(reports, parts["step_s"])
    prediction = time_to_train(rcp, run.train.eval_interval, steps * parts["step_s"] + eval_s, startup_s)
    prediction.step_s, prediction.eval_s, prediction.detail = parts["step_s"], eval_s, parts
    prediction.assumptions = assumptions + [
        (f"samples to converge: {rcp.samples:,.0f}, the RCP mean for global batch {rcp.global_batch} "
         f"(ruleset {rcp.ruleset}, pruned RCPs, {rcp.how}), as compliance-check compares a result with"
         if rcp.how.startswith("RCP") else f"samples to converge: {rcp.samples:,.0f}, {rcp.how}"),
        f"evaluations: every {run.train.eval_interval:,} samples = {steps:.2f} steps; {prediction.evals:.2f} of them "
        "on average (samples to converge are counted at eval points: not rounded up)",
        f"eval: {run.data.eval_samples:,} samples over {world} rank(s): {eval_s * 1e3:.1f} ms each, {eval_how}",
        f"start-up: {startup_s:.2f} s, {startup_how} (inside the timed region; the warm-up and init come before "
        "run_start, outside it)",
        "no node slower than preflight measured it, no skipped (fp16 overflow) steps",
    ]
    return prediction


def typical_step(train_step: dict) -> float:
    """The mean of preflight's timed steps: a run's time is the sum of its steps, and unpadded batches
    differ in tokens, so the best step (the figure nodes are compared by) is the lightest batch's."""
    return statistics.mean(train_step["steps_s"]) if train_step.get("steps_s") else train_step["step_s"]


def measured(reports: dict[int, dict], key: str) -> list[float]:
    """Every rank's `key` of its train_compute figure, where it has one."""
    return [rep["measures"]["train_compute"][key] for rep in reports.values()
            if key in rep.get("measures", {}).get("train_compute", {})]


def evaluation_time(reports: dict[int, dict], run, compute_s: float) -> tuple[float, str]:
    """The slowest rank's whole evaluation as preflight timed it (the trainer's own evaluator); from the
    step's compute where no rank timed one (forward only: 1/3 of a training sample's compute)."""
    if timed := measured(reports, "eval_s"):
        return max(timed), "preflight's evaluation with the run's evaluator (its slowest rank)"
    per_step = run.train.global_batch_size / run.world_size  # sequences, also when a row is a pack of several
    return (eval_time(compute_s, per_step, run.data.eval_samples, run.world_size),
            "forward only at 1/3 of a training sample's compute (preflight timed no eval)")


def start_up_time(reports: dict[int, dict], step_s: float) -> tuple[float, str]:
    """What the run's first step costs beyond a steady one: preflight's first step after the warm-up (the
    data pipeline starting, the kernels' first calls), on its slowest rank; its first batch alone where
    the reports predate the first step's timing."""
    if firsts := measured(reports, "first_step_s"):
        return max(0.0, max(firsts) - step_s), (f"preflight's first step after the warm-up ({max(firsts):.2f} s, "
                                                "its slowest rank) beyond a steady step")
    return max(measured(reports, "first_batch_s"), default=0.0), "preflight's first batch after the warm-up"


# ---- from a published result set's logs --------------------------------------------------------

@dataclass
class PublishedCheck:
    label: str
    global_batch: int
    prediction: Prediction
    score_minutes: float | None  # the olympic mean, as compliance-check computes it; None: the set has no score
    logged_evals: float  # mean evaluations of the converged runs
    logged_samples: float  # mean samples to converge of the converged runs

    @property
    def error(self) -> float | None:
        """The prediction's error against the score; None for a set without a score (two runs failed)."""
        if not self.score_minutes:
            return None
        return self.prediction.minutes / self.score_minutes - 1.0

    @property
    def convergence_miss(self) -> float:
        """How much more (+) the runs trained than the RCP mean: the model's error from convergence alone."""
        return self.logged_samples / self.prediction.rcp.samples - 1.0


def from_published(rs, ruleset: str) -> PublishedCheck:
    """The model on a published result set (an orchestrator.results.resultset.ResultSet): the interval time is
    the median, over runs, of each run's mean time between its first and last evals (steps and eval
    together); the overhead is the median of each run's first interval beyond that plus its time from
    the last eval to run_stop; the eval cadence is the system's own (samples to converge / evals, the
    median over runs: Azure's 2,048 GPUs evaluated every 225,280 samples where the rule says 200,000);
    the samples to converge come from the RCP, not from the logs."""
    # the logs as compliance-check reads them (orchestrator/results/summary.py): a log with a problem never converged
    converged = [s for s in rs.summaries if s.converged and len(s.eval_times_ms) >= 3 and s.samples_to_converge]
    if not converged:
        raise NoPrediction(f"{rs.label}: no converged run with three evals or more")
    gbs = converged[0].global_batch_size
    intervals, overheads = [], []
    for s in converged:
        times = s.eval_times_ms
        steady = (times[-1] - times[0]) / (len(times) - 1)
        intervals.append(steady)
        overheads.append((times[0] - s.run_start_ms - steady) + (s.run_stop_ms - times[-1]))
    score = scoring.olympic_score([(s.file, s.minutes, s.converged) for s in rs.summaries])
    cadence = round(statistics.median(s.samples_to_converge / len(s.eval_times_ms) for s in converged))
    prediction = time_to_train(rcp_point(gbs, ruleset), cadence,
                               statistics.median(intervals) / 1000.0, statistics.median(overheads) / 1000.0)
    return PublishedCheck(rs.label, gbs, prediction, score.minutes,
                          statistics.mean(len(s.eval_times_ms) for s in converged),
                          statistics.mean(s.samples_to_converge for s in converged))


def print_prediction(prediction: dict, console) -> None:
    """Prediction.as_json() (or {"error": ...}) for people: the minutes, then every assumption."""
    if "error" in prediction:
        console.print(f"time to train: not predicted ({prediction['error']})", highlight=False, soft_wrap=True)
        return
    console.print(f"time to train, predicted: {prediction['minutes']:.2f} min ({prediction['evals']:.2f} evals x "
                  f"{prediction['interval_s']:.3g} s per interval of {prediction['interval_steps']:.1f} steps and "
                  "an eval)", highlight=False, soft_wrap=True)
    for assumption in prediction["assumptions"]:
        console.print(f"  assumed: {assumption}", highlight=False, soft_wrap=True)
