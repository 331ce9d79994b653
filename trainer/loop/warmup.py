"""The warm-up before the clock starts: forward/backward passes on a maximum-length batch through
the real collectives (exchange, allreduce), so that communicators get created and kernels and the
allocator warm up at the largest shapes before the first timed step. No optimizer step; the RNG is
restored; the data is untouched. Bucket-wise clipping needs two passes: they tell it how many
buckets DDP settled on (after a requeue too).
"""

from __future__ import annotations

import contextlib
from typing import Callable

import numpy as np
import torch

from trainer.checkpoints.run import rng_state, set_rng_state
from trainer.config import RunConfig
from trainer.data.layout import Sample
from trainer.loop.fast_step import make_batch
from trainer.parallel.exchange import Exchange
from trainer.parallel.gradients import GradientSync


def warm_up(cfg: RunConfig, exchange: Exchange | None, device: torch.device, forward_backward: Callable,
            grads: GradientSync, optimizer: torch.optim.Optimizer) -> int:
    """The passes made (0 when the run needs none), each through `forward_backward` (the run's
    Trainer.forward_backward) and the step's gradient path (`grads`: DDP reduced in the backward, or
    clip local reduces now), the gradients dropped after each."""
    passes = max(cfg.runtime.nccl_warmup_steps, 2 if cfg.optim.clip == "bucket" else 0)
    if not passes:
        return 0
    saved = rng_state()
    samples = longest_samples(cfg)
    for _ in range(passes):
        mine = exchange(samples) if exchange else samples
        batch = make_batch(cfg, mine).to(device)
        forward_backward(batch, 1e-3, 1e-3, contextlib.nullcontext())  # DDP reduces: the real collectives
        grads.finish(1.0)  # clip local reduces here
        optimizer.zero_grad()
    set_rng_state(saved)
    return passes


def longest_samples(cfg: RunConfig) -> list[Sample]:
    """A micro-batch of maximum-length sequences with the most masked positions."""
    length, k = cfg.data.max_seq_length, cfg.data.max_predictions_per_seq
    ids = np.full(length, min(1000, cfg.model.vocab_size - 1), np.int64)
    positions = np.unique(np.linspace(1, length - 1, num=min(k, length - 1), dtype=np.int64))
    sample = Sample(ids, (np.arange(length) >= length // 2).astype(np.int64), positions, ids[positions], 0)
    return [sample] * cfg.train.batch_size
