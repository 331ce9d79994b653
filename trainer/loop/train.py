"""One rank of a BERT pretraining run.

    python -m trainer --config run.yaml --out DIR [--run-index N] [--seed S]          # one process
    torchrun --standalone --nproc-per-node 2 -m trainer --config run.yaml --out DIR  # two ranks here
    srun ... python -m trainer --config run.yaml --out DIR                           # under Slurm

`run.yaml` is the RunConfig that bertctl wrote (trainer/config/run.py). Rank 0 writes the MLPerf log
to DIR/results/result_N.txt, progress lines to stdout and the same figures, one
JSON line per progress line, to DIR/metrics/run_N.jsonl. Exit codes: 0 the run finished (converged or not: see the log's run_stop
status), 1 it failed, 2 bad input (config, data, checkpoint), 75 checkpointed on a signal.
"""

from __future__ import annotations

import random
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch

from trainer.checkpoints.run import (
    CheckpointRefused,
    Checkpoints,
    OutputError,
    RunCheckpoint,
    StopSignal,
    rewind_log,
    run_checkpoints,
    write_model,
)
from trainer.config import REQUEUE_EXIT_CODE, CheckpointConfig, PathError, RunConfig, expand_path
from trainer.data.batch import Batch, CapacityError
from trainer.data.dataset import DataError, TrainData
from trainer.data.layout import ShardError
from trainer.loop.evaluate import build_evaluator
from trainer.loop.fast_step import build_forward, make_batch, step_counts
from trainer.loop.precision import autocast, grad_scaler
from trainer.loop.progress import ProgressReport, start_line, synchronize
from trainer.loop.run_args import RunArgs, fail
from trainer.loop.state import Counts, Step, first_state, most_sequences_per_step, step_sequences, stop_reason
from trainer.loop.stragglers import ComputeClock
from trainer.loop.tally import Tally
from trainer.loop.warmup import warm_up
from trainer.mlperf import RunLogger, first_trainer_event, logged_run_stop
from trainer.model.bert import BertForPreTraining
from trainer.model.compiled import CompileFailed
from trainer.model.fp8 import to_fp8_training
from trainer.model.weights import WeightsError, load_pretrained_file, tf_variable_names
from trainer.optim import build_optimizer, learning_rate, loss_scale, mlperf_keys, set_learning_rate, take_step
from trainer.parallel import distributed
from trainer.parallel.exchange import build_exchange
from trainer.parallel.gradients import GradientSync, data_parallel

# CompileFailed: the node cannot compile what the recipe asks to (met in the warm-up, before run_start); the
# line names runtime.compile and runtime.compile_fallback
USER_ERRORS = (distributed.LaunchError, DataError, ShardError, WeightsError, PathError, OutputError, CapacityError,
               CompileFailed, CheckpointRefused)


class Trainer:
    def __init__(self, cfg: RunConfig, args: RunArgs):
        self.cfg, self.args = cfg, args
        self.seed = cfg.train.seed + args.run_index if args.seed is None else args.seed
        self.env, self.device = distributed.init(cfg)
        self.rank0 = self.env.rank == 0
        out = Path(args.out)
        self.checkpoints = run_checkpoints(cfg.checkpoint, out, args.run_index, self.env.rank)
        resume = self.checkpoints.resume_point(args.result_log, {"seed": self.seed, "run_index": args.run_index})
        if self.rank0 and resume is not None:
            rewind_to_checkpoint(args.result_log, resume.log.size)
        elif self.rank0:
            start_over(args.result_log)
        self.mllog = RunLogger(args.result_log, enabled=self.rank0, resumed=resume is not None)
        self.mllog.init_start()
        self.mllog.submission(cfg.mlperf)
        seed_everything(self.seed, self.env.rank)

        self.model = build_model(cfg, self.device)
        self.mllog.hyperparameters(cfg, self.seed, mlperf_keys(cfg.optim))
        if cfg.mlperf.legacy_keys:
            self.mllog.weights_initialization(tf_variable_names(self.model))
        self.optimizer = build_optimizer(self.model, cfg.optim, cfg.runtime.kernels == "apex", self.device.type,
                                         compiled=cfg.runtime.compile, compile_fallback=cfg.runtime.compile_fallback == "eager")
        self.ddp = data_parallel(self.model, cfg.optim)  # None in one process and in clip local
        self.grads = GradientSync(self.model, self.ddp, cfg.optim)
        self.exchange = build_exchange(cfg.balance, cfg.data, self.device, self.env.world_size)
        self.scaler = grad_scaler(cfg.runtime, self.device)
        self.autocast = partial(autocast, cfg.runtime.precision, self.device.type)  # the forward's mixed precision
        self.forward = build_forward(cfg, self.ddp or self.model)  # batch -> the loss sums

        self.data = TrainData(cfg.data, cfg.balance, cfg.train.batch_size, self.env.rank, self.env.world_size, self.seed,
                              vocab_size=cfg.model.vocab_size)
        self.evaluator = build_evaluator(cfg, self.env.rank, self.env.world_size, self.device)
        self.stop = StopSignal()
        self.saved = RunCheckpoint(self.checkpoints, self.model, self.optimizer, self.scaler, self.data,
                                   {"seed": self.seed, "run_index": args.run_index},
                                   result_log=args.result_log if self.rank0 else None)
        self.clock = ComputeClock(self.device, self.env.node, self.env.world_size)  # who holds the others back
        self.progress = ProgressReport(cfg, self.device, self.clock,
                                       out / "metrics" / f"run_{args.run_index}.jsonl" if self.rank0 else None, self.say)
        self.state, resumed_from = self.saved.restore(first_state(cfg), resume)  # the model, optimizer, data and RNG too
        self.resumed = resumed_from is not None
        if self.resumed:
            self.say(f"resumed from {resumed_from}")
        self.counts = Counts(self.state, most_sequences_per_step(cfg))

    # ---- the run ----------------------------------------------------------------------------

    def run(self) -> int:
        """Train until the target accuracy or a limit; 75 when a signal asked for a checkpoint."""
        self.start()
        window: list[Step] = []
        while self.state.status is None:
            step = self.train_step(self.next_micro_batches())
            window.append(step)
            self.counts.count(step)
            if self.eval_due(step):
                with self.progress.paused():
                    self.evaluate()
            self.state.status = self.stop_decision()
            if self.state.report_due(step, self.cfg.train.log_every_steps):
                self.counts.settle()
                self.progress(window, self.state)
                window = []
                if self.state.status is None and self.stop.agreed(self.device):
                    return self.checkpoint_and_exit()
            if self.state.checkpoint_due(step, self.cfg.checkpoint.every_steps):
                with self.progress.paused():
                    self.save_checkpoint()
        return self.finish()

    def start(self) -> None:
        self.warm_up()  # after a requeue too: bucket-wise clipping must know its bucket count again
        if not self.resumed:
            self.mllog.init_stop()
            distributed.all_reduce_sum(torch.zeros(1, device=self.device))  # all ranks start together
            self.mllog.run_start()
            self.mllog.block_start(0, self.state.next_eval)
        synchronize(self.device)  # the warm-up's queued GPU work is not the first block's or window's
        self.progress.start(self.state)  # the progress lines' rates; the curves go on from this state
        self.block_clock = time.perf_counter()  # throughput of each block, for tracked_stats
        if self.evaluator:
            self.say(self.evaluator.describe())
        self.say(start_line(self.cfg, self.seed, self.state.updates if self.resumed else None))

    def next_micro_batches(self) -> list[Batch]:
        return [self.next_batch() for _ in range(self.cfg.train.gradient_accumulation_steps)]

    def next_batch(self) -> Batch:
        samples, packs = self.data.next_samples()
        if self.exchange:  # redistribute the step's samples (or packs) so ranks get similar token counts
            samples = self.exchange(samples, packs)
        return make_batch(self.cfg, samples).to(self.device)

    def train_step(self, micro_batches: list[Batch]) -> Step:
        """One optimizer update over the micro-batches of this step."""
        lr = learning_rate(self.state.updates + 1, self.cfg.optim)
        set_learning_rate(self.optimizer, lr)
        # The loss is normalised by the step's global number of masked tokens and sequences, so it is
        # the same whatever the rank count and however exchange padding distributes the samples. The
        # counts stay on the device: the normalisation needs no host sync.
        local = step_counts(self.cfg, micro_batches)  # the fast step counts on the device: no host value enters it
        masked, sequences = distributed.all_reduce_sum(local.to(self.device, non_blocking=True))
        world = self.env.world_size  # DDP averages gradients over ranks: undo that division
        scale = loss_scale(self.scaler, self.device) if self.scaler else 1.0
        self.grads.set_scale(scale)
        tally = Tally(self.device)
        for i, batch in enumerate(micro_batches):
            context = self.grads.micro_step_context(last=i == len(micro_batches) - 1)
            mlm, nsp = self.forward_backward(batch, world / masked, world / sequences, context)
            tally.add(mlm, nsp, batch)
        self.grads.finish(scale)
        skipped = take_step(self.optimizer, self.scaler)
        self.optimizer.zero_grad()  # set_to_none, torch's default; apex's zero_grad takes no argument
        return Step(tally, lr, skipped, step_sequences(self.cfg, sequences))

    def forward_backward(self, batch: Batch, mlm_weight, nsp_weight, context) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward, the loss sums, and backward of mlm_weight * MLM + nsp_weight * NSP (loss-scaled in fp16),
        inside `context`: whether DDP reduces in this backward (GradientSync.micro_step_context)."""
        with context:
            with self.autocast():
                with self.clock.forward():
                    mlm, nsp = self.forward(batch)
            loss = mlm * mlm_weight + nsp * nsp_weight
            (self.scaler.scale(loss) if self.scaler else loss).backward()
        return mlm, nsp

    def eval_due(self, step: Step) -> bool:
        return self.evaluator is not None and not step.skipped and self.counts.samples_reach(self.state.next_eval)

    def evaluate(self) -> None:
        """Close the block with an evaluation; open the next block unless the target is reached."""
        s, t = self.state, self.cfg.train
        seconds = time.perf_counter() - self.block_clock
        self.mllog.block_stop(s.block_start, s.samples)
        self.mllog.eval_start(s.samples)
        s.accuracy, _ = self.evaluator.accuracy(self.model, self.autocast)
        self.mllog.evaluation(s.samples, s.accuracy, {"throughput": (s.samples - s.block_start) / seconds,
                                                      "skipped_steps": s.skipped, "updates": s.updates})
        self.say(f"eval at {s.samples} samples: mlm accuracy {s.accuracy:.4f} (target {t.target_accuracy})")
        self.progress.evaluation(s)  # on the TensorBoard curves
        s.block_start = s.samples
        s.next_eval += t.eval_interval
        if s.accuracy < t.target_accuracy:
            self.mllog.block_start(s.samples, s.next_eval - s.samples)
            self.block_clock = time.perf_counter()

    def stop_decision(self) -> str | None:
        """success once an evaluation reached the target; aborted at a sample or step limit."""
        s, t = self.state, self.cfg.train
        if s.accuracy is not None and s.accuracy >= t.target_accuracy:
            return "success"
        if self.counts.samples_reach(t.max_samples_termination) or s.updates >= self.cfg.optim.max_steps:
            return "aborted"
        return None

    def finish(self) -> int:
        self.counts.settle()
        s = self.state
        if s.block_start < s.samples:  # a block the run ended in without an eval
            self.mllog.block_stop(s.block_start, s.samples)
        self.mllog.run_stop(s.status, s.samples)
        self.say(f"run_stop: {s.status}{stop_reason(s, self.cfg)} after {s.samples} samples "
                 f"({s.updates} updates, {s.skipped} skipped), eval accuracy {s.accuracy}")
        if self.rank0:
            write_final_weights(self.model, self.checkpoints, self.cfg.checkpoint)
        return 0

    def warm_up(self) -> None:
        """Max-length passes through the real collectives before the clock starts (trainer/loop/warmup.py::warm_up);
        the preflight's train_steps and the GPU checks call it too."""
        if passes := warm_up(self.cfg, self.exchange, self.device, self.forward_backward, self.grads, self.optimizer):
            self.say(f"warm-up: {passes} forward/backward pass(es) at length {self.cfg.data.max_seq_length}")
        if self.evaluator:  # a compiled evaluation compiles now, not inside the first timed evaluation
            self.evaluator.warm_up(self.model, self.autocast)

    # ---- checkpoints --------------------------------------------------------------------------

    def checkpoint_and_exit(self) -> int:
        self.save_checkpoint()
        self.say(f"signal {self.stop.received}: checkpoint saved at update {self.state.updates}, exiting to be requeued")
        return REQUEUE_EXIT_CODE

    def save_checkpoint(self) -> None:
        self.counts.settle()
        self.saved.save(self.state)

    # ---- helpers ------------------------------------------------------------------------------

    def say(self, text: str) -> None:
        if self.rank0:
            print(text, flush=True)

    def close(self) -> None:
        self.data.close()
        self.mllog.close()
        distributed.keep_until_exit(self.ddp)


def write_final_weights(model: BertForPreTraining, checkpoints: Checkpoints, cfg: CheckpointConfig) -> None:
    """The weights a run ended with, as {"model": state_dict}: beside its checkpoints (trainer/config/run.py::FINAL_WEIGHTS,
    what `bertctl export` exports), and for a phase 1 where checkpoint.final_model says (the next phase's init_checkpoint)."""
    write_model(checkpoints.final_weights, model)
    if cfg.final_model:
        write_model(expand_path(cfg.final_model), model)


def rewind_to_checkpoint(log: Path, position: int | None) -> None:
    """A resumed run continues from its checkpoint: what the log gained after it (an evaluation, a
    block) is cut, because the run logs it again when it gets there (never twice)."""
    if cut := rewind_log(log, position):
        print(f"{log.name}: {cut} byte(s) logged after the checkpoint cut (the resumed run logs them again)", flush=True)


def start_over(log: Path) -> None:
    """A run with no checkpoint starts from the beginning: what an earlier attempt logged (a requeue after a
    node failed before the first checkpoint, a stop before the run began) is cut, from its init_start on; the
    launcher's cache_clear lines before it stay."""
    if cut := rewind_log(log, first_trainer_event(log)):
        print(f"{log.name}: no checkpoint, the run starts from the beginning: {cut} byte(s) an earlier attempt "
              "logged cut", flush=True)


def build_model(cfg: RunConfig, device: torch.device) -> BertForPreTraining:
    # the fast step compiles the whole model (Trainer.forward), not the pointwise tails alone
    model = BertForPreTraining(cfg.model, fused_kernels=cfg.runtime.kernels == "apex", attention=cfg.runtime.attention,
                               compile=cfg.runtime.compile and not cfg.fast_step,
                               compile_fallback=cfg.runtime.compile_fallback == "eager")
    if cfg.train.init_checkpoint:
        load_pretrained_file(model, expand_path(cfg.train.init_checkpoint))
    if cfg.runtime.fp8:  # the encoder's GEMMs in FP8; the swapped layers keep their parameters and names
        to_fp8_training(model)
    return model.to(device).train()


def seed_everything(seed: int, rank: int) -> None:
    """Python, numpy and torch seeded per rank from the run's seed (the data order uses the seed alone)."""
    rank_seed = int(np.random.default_rng([seed, rank]).integers(2**31))
    random.seed(rank_seed)
    np.random.seed(rank_seed)
    torch.manual_seed(rank_seed)


def train(cfg: RunConfig, args: RunArgs) -> int:
    """The run of a checked configuration (trainer/loop/entry.py::main checked it, and turns an output path
    that cannot take the run's files into one line): 0 when it ended, 2 for bad input found on the way
    (data, checkpoint, launch, output), 75 checkpointed on a signal."""
    trainer = None
    try:
        if ended := logged_run_stop(args.result_log):
            # its result is in (a crash after run_stop, then a resume): training on would log a second run_stop
            print(f"{args.result_log}: the run already ended (run_stop {ended}): nothing to do", flush=True)
            return 0
        trainer = Trainer(cfg, args)
        return trainer.run()
    except USER_ERRORS as e:
        return fail(str(e))
    finally:
        if trainer is not None:
            trainer.close()
        distributed.close()
