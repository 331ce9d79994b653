"""One rank of a BERT pretraining run.

    python -m trainer --config run.yaml --out DIR [--run-index N] [--seed S]          # one process
    torchrun --standalone --nproc-per-node 2 -m trainer --config run.yaml --out DIR  # two ranks here
    srun ... python -m trainer --config run.yaml --out DIR                           # under Slurm

`run.yaml` is the RunConfig that bertctl wrote (trainer/config.py). Rank 0 writes the MLPerf log
to DIR/results/result_N.txt, progress lines to stdout and per-step metrics to
DIR/metrics/run_N.jsonl. Exit codes: 0 the run finished (converged or not: see the log's run_stop
status), 1 it failed, 2 bad input (config, data, checkpoint), 75 checkpointed on a signal.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import random
import resource
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import yaml
from pydantic import ValidationError
from torch.nn.parallel import DistributedDataParallel

from trainer import distributed
from trainer.checkpoint import Checkpoints, StopSignal, rng_state, set_rng_state, write_model
from trainer.config import REQUEUE_EXIT_CODE, PathError, RunConfig, expand_path, load_run_config
from trainer.data.batch import Batch, collate
from trainer.data.dataset import DataError, TrainData
from trainer.data.layout import Sample, ShardError
from trainer.evaluate import Evaluator
from trainer.exchange import Exchange
from trainer.gradients import GradientSync
from trainer.mlperf import RunLogger
from trainer.model import BertForPreTraining, flops_per_sequence, pretraining_loss_sums
from trainer.optim import build_optimizer, learning_rate, set_learning_rate, take_step
from trainer.weights import WeightsError, load_pretrained_file, tf_variable_names

USER_ERRORS = (distributed.LaunchError, DataError, ShardError, WeightsError, PathError)


@dataclass
class RunArgs:
    config: str
    out: str
    run_index: int = 0
    seed: int | None = None
    once: bool = False


@dataclass
class LoopState:
    """Where the run is; saved in checkpoints."""

    updates: int = 0  # successful optimizer steps
    skipped: int = 0  # fp16 steps skipped because the gradients overflowed
    samples: int = 0  # samples trained by successful steps (MLPerf's epoch_num)
    next_eval: int = 0
    block_start: int = 0  # samples at the start of the current block
    accuracy: float | None = None
    status: str | None = None  # success | aborted, once decided


@dataclass
class StepStats:
    loss: torch.Tensor  # [mlm sum, nsp sum, masked tokens, sequences, real tokens] of this rank
    lr: float
    skipped: bool
    sequences: int  # trained in this step by all ranks (the global batch; varies when packing)
    seconds: float = 0.0


class Trainer:
    def __init__(self, cfg: RunConfig, args: RunArgs):
        self.cfg, self.args = cfg, args
        self.seed = cfg.train.seed + args.run_index if args.seed is None else args.seed
        self.env, self.device = distributed.init(cfg)
        self.rank0 = self.env.rank == 0
        out = Path(args.out)
        folder = cfg.checkpoint.dir or str(out / "checkpoints" / f"run_{args.run_index}")
        self.checkpoints = Checkpoints(Path(expand_path(folder)), cfg.checkpoint.keep, self.env.rank)
        self.mllog = RunLogger(out / "results" / f"result_{args.run_index}.txt", enabled=self.rank0,
                               resumed=self.checkpoints.latest() is not None)
        self.mllog.init_start()
        self.mllog.submission(cfg.mlperf)
        seed_everything(self.seed, self.env.rank)

        self.model = build_model(cfg, self.device)
        self.mllog.hyperparameters(cfg, self.seed)
        if cfg.mlperf.legacy_keys:
            self.mllog.weights_initialization(tf_variable_names(self.model))
        self.optimizer = build_optimizer(self.model, cfg.optim, cfg.runtime.kernels == "apex", self.device.type)
        self.ddp = DistributedDataParallel(self.model, gradient_as_bucket_view=True) if distributed.initialized() else None
        self.grads = GradientSync(self.model, self.ddp, cfg.optim.clip, cfg.optim.max_grad_norm)
        bal = cfg.balance
        self.exchange = Exchange(bal.exchange_padding, bal.group_size, bal.snake, cfg.data.max_seq_length,
                                 cfg.data.max_predictions_per_seq, self.device) \
            if bal.exchange_padding != "none" and self.env.world_size > 1 else None
        self.scaler = torch.amp.GradScaler(self.device.type, init_scale=cfg.runtime.init_loss_scale) \
            if cfg.runtime.precision == "fp16" else None

        self.data = TrainData(expand_path(cfg.data.train_dir), self.env.rank, self.env.world_size, cfg.train.batch_size,
                              self.seed, cfg.data.streams, cfg.data.num_workers, quotas=bal.bin_quotas,
                              stratified=bal.stratified, packing=bal.packing, pack_window=bal.pack_window,
                              capacity=cfg.data.max_seq_length)
        self.evaluator = Evaluator(expand_path(cfg.data.eval_dir), cfg.data.eval_samples, cfg.train.eval_batch_size,
                                   self.env.rank, self.env.world_size, cfg.runtime.unpad, self.device) \
            if cfg.data.eval_dir else None
        self.state = LoopState(next_eval=cfg.train.eval_start_samples or cfg.train.eval_interval)
        self.stop = StopSignal()
        self.metrics = (out / "metrics" / f"run_{args.run_index}.jsonl") if self.rank0 else None
        self.resumed = self.resume()

    # ---- the run ----------------------------------------------------------------------------

    def run(self) -> int:
        self.warm_up()  # after a requeue too: bucket-wise clipping must know its bucket count again
        if not self.resumed:
            self.mllog.init_stop()
            distributed.all_reduce_sum(torch.zeros(1, device=self.device))  # all ranks start together
            self.mllog.run_start()
            self.mllog.block_start(0, self.state.next_eval)
        self.block_clock = time.perf_counter()  # throughput of each block, for tracked_stats
        if self.evaluator:
            self.say(f"eval set: {self.cfg.data.eval_samples} samples, {self.evaluator.masked} masked tokens; "
                     f"guessing the most frequent one scores {self.evaluator.baseline:.3f} (the unigram baseline)")
        self.say(f"training: {self.cfg.world_size} rank(s) x {self.cfg.train.batch_size} x "
                 f"{self.cfg.train.gradient_accumulation_steps} = {self.cfg.train.global_batch_size} sequences per step, "
                 f"seed {self.seed}, {'resumed at update ' + str(self.state.updates) if self.resumed else 'from the start'}")
        window = []
        while self.state.status is None:
            started = time.perf_counter()
            micro_batches = [self.next_batch() for _ in range(self.cfg.train.gradient_accumulation_steps)]
            step = self.train_step(micro_batches)
            step.seconds = time.perf_counter() - started  # data + compute, evaluation excluded
            window.append(step)
            self.account(step)
            if self.state.status or (not step.skipped and self.state.updates % self.cfg.train.log_every_steps == 0):
                self.report(window)
                window = []
                if self.stop.agreed(self.device):
                    self.save_checkpoint()
                    self.say(f"signal {self.stop.received}: checkpoint saved at update {self.state.updates}, exiting to be requeued")
                    return REQUEUE_EXIT_CODE
            if self.cfg.checkpoint.every_steps and not step.skipped and self.state.updates % self.cfg.checkpoint.every_steps == 0:
                self.save_checkpoint()
        if self.state.block_start < self.state.samples:  # a block the run ended in without an eval
            self.mllog.block_stop(self.state.block_start, self.state.samples)
        self.mllog.run_stop(self.state.status, self.state.samples)
        self.say(f"run_stop: {self.state.status}{self.stop_reason()} after {self.state.samples} samples "
                 f"({self.state.updates} updates, {self.state.skipped} skipped), eval accuracy {self.state.accuracy}")
        if self.cfg.checkpoint.final_model and self.rank0:
            write_model(expand_path(self.cfg.checkpoint.final_model), self.model)
        return 0

    def next_batch(self) -> Batch:
        samples, packs = self.data.next_samples()
        if self.exchange:  # redistribute the step's samples (or packs) so ranks get similar token counts
            samples = self.exchange(samples, packs)
        return collate(samples, unpadded=self.cfg.runtime.unpad).to(self.device)

    def train_step(self, micro_batches: list[Batch]) -> StepStats:
        """One optimizer update over the micro-batches of this step."""
        update = self.state.updates + 1
        lr = learning_rate(update, self.cfg.optim)
        set_learning_rate(self.optimizer, lr)
        # The loss is normalised by the step's global number of masked tokens and sequences, so it
        # is the same whatever the rank count and however exchange padding distributes the samples.
        local = torch.tensor([[b.num_masked, b.num_sequences] for b in micro_batches], dtype=torch.float32).sum(0)
        masked, sequences = distributed.all_reduce_sum(local.to(self.device)).tolist()
        world = self.env.world_size  # DDP averages gradients over ranks: undo that division
        scale = self.scaler.get_scale() if self.scaler else 1.0
        self.grads.set_scale(scale)
        model = self.ddp or self.model
        sums = torch.zeros(5, device=self.device)
        for i, batch in enumerate(micro_batches):
            with self.grads.micro_step_context(last=i == len(micro_batches) - 1):
                with self.autocast():
                    mlm_logits, nsp_logits = model(batch)
                mlm, nsp = pretraining_loss_sums(mlm_logits, nsp_logits, batch)
                loss = (mlm / masked + nsp / sequences) * world
                (self.scaler.scale(loss) if self.scaler else loss).backward()
            sums += torch.stack([mlm.detach(), nsp.detach(), torch.tensor(float(batch.num_masked), device=self.device),
                                 torch.tensor(float(batch.num_sequences), device=self.device),
                                 torch.tensor(float(batch.num_tokens), device=self.device)])
        self.grads.finish(scale)
        skipped = take_step(self.optimizer, self.scaler)
        self.optimizer.zero_grad(set_to_none=True)
        return StepStats(loss=sums, lr=lr, skipped=skipped, sequences=int(sequences))

    def account(self, step: StepStats) -> None:
        """Count the step, evaluate when due, decide whether the run is over."""
        s, t = self.state, self.cfg.train
        if step.skipped:
            s.skipped += 1
            return
        s.updates += 1
        s.samples += step.sequences
        if self.evaluator and s.samples >= s.next_eval:
            seconds = time.perf_counter() - self.block_clock
            self.mllog.block_stop(s.block_start, s.samples)
            s.accuracy, _ = self.evaluator.accuracy(self.model, self.autocast)
            self.mllog.evaluation(s.samples, s.accuracy, {"throughput": (s.samples - s.block_start) / seconds,
                                                          "skipped_steps": s.skipped, "updates": s.updates})
            self.say(f"eval at {s.samples} samples: mlm accuracy {s.accuracy:.4f} (target {t.target_accuracy})")
            s.block_start = s.samples
            s.next_eval += t.eval_interval
            if s.accuracy >= t.target_accuracy:
                s.status = "success"
                return
            self.mllog.block_start(s.samples, s.next_eval - s.samples)
            self.block_clock = time.perf_counter()
        if s.samples >= t.max_samples_termination or s.updates >= self.cfg.optim.max_steps:
            s.status = "aborted"

    def stop_reason(self) -> str:
        """Why an aborted run stopped: MLPerf calls every run that missed its target 'aborted', which
        reads like a crash to a newcomer watching a fixed-length phase 1."""
        if self.state.status != "aborted":
            return ""
        limit = ("max_steps", self.cfg.optim.max_steps) if self.state.updates >= self.cfg.optim.max_steps \
            else ("max_samples_termination", self.cfg.train.max_samples_termination)
        return f" ({limit[0]} {limit[1]} reached before the target accuracy {self.cfg.train.target_accuracy})"

    def report(self, window: list[StepStats]) -> None:
        """Progress line and metrics for the last steps (one allreduce of a few numbers)."""
        seconds = sum(w.seconds for w in window)
        sums = distributed.all_reduce_sum(torch.stack([w.loss for w in window]).sum(0)).tolist()
        last = distributed.all_reduce_sum(window[-1].loss.clone()).tolist()
        mlm_sum, nsp_sum, masked, sequences, tokens = sums
        step_loss = last[0] / max(last[2], 1) + last[1] / max(last[3], 1)
        seq_per_s, tok_per_s = sequences / seconds, tokens / seconds
        record = {
            "update": self.state.updates, "samples": self.state.samples, "loss": step_loss,
            "mlm_loss": mlm_sum / max(masked, 1), "nsp_loss": nsp_sum / max(sequences, 1), "lr": window[-1].lr,
            "seq_per_s": seq_per_s, "tokens_per_s": tok_per_s, "skipped": self.state.skipped,
            "memory_gb": memory_gb(self.device), "time": time.time(),
        }
        mfu = model_flops_utilization(self.cfg, self.device, seq_per_s, tokens / max(sequences, 1), masked / max(sequences, 1))
        if mfu is not None:
            record["mfu"] = mfu
        if self.metrics:
            self.metrics.parent.mkdir(parents=True, exist_ok=True)
            with self.metrics.open("a") as f:
                f.write(json.dumps(record) + "\n")
        self.say(f"update {record['update']} | loss {step_loss:.4f} (mlm {record['mlm_loss']:.4f}, nsp {record['nsp_loss']:.4f}) "
                 f"| lr {record['lr']:.3e} | {seq_per_s:.1f} seq/s {tok_per_s:,.0f} tok/s | mem {record['memory_gb']:.2f} GB"
                 + (f" | mfu {mfu:.1%}" if mfu is not None else ""))

    def warm_up(self) -> None:
        """Forward/backward passes on a maximum-length batch through the real collectives (exchange,
        allreduce), before the clock starts: communicators get created and kernels and allocator
        warm up at the largest shapes. No optimizer step; the RNG is restored; the data is untouched.
        Bucket-wise clipping needs two passes: they tell it how many buckets DDP settled on.
        """
        passes = max(self.cfg.runtime.nccl_warmup_steps, 2 if self.cfg.optim.clip == "bucket" else 0)
        if not passes:
            return
        saved = rng_state()
        model = self.ddp or self.model
        samples = longest_samples(self.cfg)
        for _ in range(passes):
            mine = self.exchange(samples) if self.exchange else samples
            batch = collate(mine, unpadded=self.cfg.runtime.unpad).to(self.device)
            with self.autocast():
                mlm_logits, nsp_logits = model(batch)
            mlm, nsp = pretraining_loss_sums(mlm_logits, nsp_logits, batch)
            ((mlm + nsp) * 1e-3).backward()
            self.optimizer.zero_grad(set_to_none=True)
        set_rng_state(saved)
        self.say(f"warm-up: {passes} forward/backward pass(es) at length {self.cfg.data.max_seq_length}")

    # ---- checkpoints --------------------------------------------------------------------------

    def save_checkpoint(self) -> None:
        shared = {
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler else None, "state": asdict(self.state),
            "seed": self.seed, "run_index": self.args.run_index,
        }
        self.checkpoints.save(self.state.updates, shared, {"data": self.data.state_dict(), "rng": rng_state()})

    def resume(self) -> bool:
        path = self.checkpoints.latest()
        if path is None:
            return False
        shared, mine = self.checkpoints.load(path)
        self.model.load_state_dict(shared["model"])
        self.optimizer.load_state_dict(shared["optimizer"])
        if self.scaler and shared["scaler"]:
            self.scaler.load_state_dict(shared["scaler"])
        self.state = LoopState(**shared["state"])
        self.data.load_state_dict(mine["data"])
        set_rng_state(mine["rng"])
        self.say(f"resumed from {path}")
        return True

    # ---- helpers ------------------------------------------------------------------------------

    def autocast(self):
        precision = self.cfg.runtime.precision
        if precision == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)

    def say(self, text: str) -> None:
        if self.rank0:
            print(text, flush=True)

    def close(self) -> None:
        self.data.close()
        self.mllog.close()


def build_model(cfg: RunConfig, device: torch.device) -> BertForPreTraining:
    model = BertForPreTraining(cfg.model, fused_kernels=cfg.runtime.kernels == "apex")
    if cfg.train.init_checkpoint:
        load_pretrained_file(model, expand_path(cfg.train.init_checkpoint))
    return model.to(device).train()


def longest_samples(cfg: RunConfig) -> list[Sample]:
    """A micro-batch of maximum-length sequences with the most masked positions (for the warm-up)."""
    length, k = cfg.data.max_seq_length, cfg.data.max_predictions_per_seq
    ids = np.full(length, min(1000, cfg.model.vocab_size - 1), np.int64)
    positions = np.linspace(1, length - 1, num=min(k, length - 1), dtype=np.int64)
    sample = Sample(ids, (np.arange(length) >= length // 2).astype(np.int64), np.unique(positions), ids[np.unique(positions)], 0)
    return [sample] * cfg.train.batch_size


def seed_everything(seed: int, rank: int) -> None:
    """Python, numpy and torch seeded per rank from the run's seed (the data order uses the seed alone)."""
    rank_seed = int(np.random.default_rng([seed, rank]).integers(2**31))
    random.seed(rank_seed)
    np.random.seed(rank_seed)
    torch.manual_seed(rank_seed)


def memory_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # kB on Linux


PEAK_TFLOPS = {"A100": 312.0, "H100": 989.0, "H200": 989.0, "B200": 2250.0}  # dense bf16/fp16 tensor cores


def model_flops_utilization(cfg: RunConfig, device: torch.device, seq_per_s: float, mean_len: float, masked: float):
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    peak = next((v for k, v in PEAK_TFLOPS.items() if k in name), None)
    if peak is None:
        return None
    achieved = seq_per_s * flops_per_sequence(cfg.model, mean_len, masked) / cfg.world_size
    return achieved / (peak * 1e12)


def parse_args(argv: list[str] | None) -> RunArgs:
    parser = argparse.ArgumentParser(prog="python -m trainer", description="One rank of a BERT pretraining run.")
    parser.add_argument("--config", required=True, help="run.yaml written by bertctl")
    parser.add_argument("--out", help="output folder (default: the config's folder)")
    parser.add_argument("--run-index", type=int, default=0, help="run N of an experiment: writes result_N.txt")
    parser.add_argument("--seed", type=int, help="default: train.seed + run index")
    parser.add_argument("--once", action="store_true",
                        help="skip the run when checkpoint.final_model already exists (phase 1, built once per machine)")
    ns = parser.parse_args(argv)
    return RunArgs(config=ns.config, out=ns.out or str(Path(ns.config).parent), run_index=ns.run_index, seed=ns.seed,
                   once=ns.once)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cfg = load_run_config(args.config)
    except FileNotFoundError:
        return _fail(f"{args.config}: run configuration not found")
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        return _fail(f"{args.config}: {'.'.join(str(p) for p in first['loc'])}: {first['msg']}")
    except (yaml.YAMLError, TypeError) as e:
        return _fail(f"{args.config}: not a run configuration ({str(e).splitlines()[0]})")
    trainer = None
    try:
        with built_once(cfg, args.once) as needed:
            if not needed:
                return 0
            trainer = Trainer(cfg, args)
            return trainer.run()
    except USER_ERRORS as e:
        return _fail(str(e))
    finally:
        if trainer is not None:
            trainer.close()
        distributed.close()


@contextlib.contextmanager
def built_once(cfg: RunConfig, once: bool):
    """With --once: yields False when the final model exists, else trains under a lock on it, so two
    jobs on one machine never build it twice (the second waits, then finds it)."""
    target = cfg.checkpoint.final_model
    if not once or not target:
        yield True
        return
    path = Path(expand_path(target))
    if path.exists():
        print(f"{path} exists: skipped (delete it to train again)", flush=True)
        yield False
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            print(f"{path} was built meanwhile: skipped", flush=True)
            yield False
        else:
            yield True


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr, flush=True)
    return 2
