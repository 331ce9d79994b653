"""Where the run loop is, and how it counts: updates, skipped steps and trained samples.

Without packing a step trains the global batch, known on the host. With packing the number of
sequences per pack varies, so a step's global count is an all-reduced tensor on the device; reading
each one back would stall the GPU's queue once a step. `Counts` keeps those counts unread and reads
them (all at once) only where a decision needs the exact sample count: when an evaluation or the
sample limit could be due by an upper bound, and before a report, a checkpoint or the end.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer.config import RunConfig
from trainer.loop.tally import Tally


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

    def report_due(self, step: "Step", every: int) -> bool:
        """A progress line after every `every`-th applied update, and when the run has ended."""
        return self.status is not None or (not step.skipped and self.updates % every == 0)

    def checkpoint_due(self, step: "Step", every: int) -> bool:
        """A checkpoint after every `every`-th applied update (0: on a signal only), none once the run has ended."""
        return bool(every) and self.status is None and not step.skipped and self.updates % every == 0


def first_state(cfg: RunConfig) -> LoopState:
    """Where a run that starts from the beginning starts: nothing trained, the first evaluation ahead."""
    return LoopState(next_eval=cfg.train.eval_start_samples or cfg.train.eval_interval)


@dataclass
class Step:
    """One optimizer update as the loop sees it."""

    tally: Tally  # this rank's sums (on the device until the progress line is due)
    lr: float
    skipped: bool
    # trained in this step by all ranks: the global batch, or with packing (where it varies) the
    # all-reduced count, left on the device (see UnreadSamples)
    sequences: int | torch.Tensor


class UnreadSamples:
    """Packed steps' global sequence counts, still on the device, with an upper bound on their sum
    (each step trained at most `per_step` sequences) that needs no read."""

    def __init__(self, per_step: int):
        self.per_step = per_step
        self.counts: list[torch.Tensor] = []

    @property
    def bound(self) -> int:
        return len(self.counts) * self.per_step

    def add(self, count: torch.Tensor) -> None:
        self.counts.append(count)

    def read(self) -> int:
        # int64: the counts are float32 (exact per step), their sum would not be past 2**24
        total = int(torch.stack(self.counts).to(torch.int64).sum()) if self.counts else 0
        self.counts = []
        return total


class Counts:
    """The loop's bookkeeping of `state`: each step counted, samples made exact only when needed."""

    def __init__(self, state: LoopState, per_step: int):
        self.state = state
        self.unread = UnreadSamples(per_step)

    def count(self, step: Step) -> None:
        if step.skipped:
            self.state.skipped += 1  # the schedule repeats this update's learning rate
            return
        self.state.updates += 1
        if isinstance(step.sequences, torch.Tensor):
            self.unread.add(step.sequences)
        else:
            self.state.samples += step.sequences

    def samples_reach(self, threshold: int) -> bool:
        """state.samples >= threshold, reading the unread counts only if their bound says it may be."""
        if self.state.samples + self.unread.bound < threshold:
            return False
        self.settle()
        return self.state.samples >= threshold

    def settle(self) -> None:
        """Make state.samples exact (reads the device when packed steps' counts are unread)."""
        self.state.samples += self.unread.read()


def step_sequences(cfg: RunConfig, counted: torch.Tensor) -> int | torch.Tensor:
    """Sequences trained by all ranks in a step (Step.sequences): the global batch, known without asking
    the device, except with packing, where the number of sequences per pack varies: then the device's
    count (`counted`, all-reduced)."""
    if not cfg.balance.packing:
        return cfg.train.global_batch_size
    return counted


def most_sequences_per_step(cfg: RunConfig) -> int:
    """An upper bound on the sequences of one step: the global batch, or with packing the packs of a step
    x pack_sequences. Without a pack_sequences limit a row of max_seq_length tokens holds at most that
    many sequences: a bound so loose that the loop reads the counts nearly every step (set
    balance.pack_sequences, as the packed recipes do)."""
    t, b = cfg.train, cfg.balance
    if not b.packing:
        return t.global_batch_size
    return cfg.world_size * t.batch_size * t.gradient_accumulation_steps * (b.pack_sequences or cfg.data.max_seq_length)


def stop_reason(state: LoopState, cfg: RunConfig) -> str:
    """Why an aborted run stopped, for its run_stop line: MLPerf calls every run that missed its target
    'aborted', which reads like a crash to a newcomer watching a fixed-length phase 1."""
    if state.status != "aborted":
        return ""
    limit = ("max_steps", cfg.optim.max_steps) if state.updates >= cfg.optim.max_steps \
        else ("max_samples_termination", cfg.train.max_samples_termination)
    return f" ({limit[0]} {limit[1]} reached before the target accuracy {cfg.train.target_accuracy})"
