"""Averaging gradients over ranks, and clipping them before or after that average.

Modes (`optim.clip`):
- after_allreduce: DDP averages during backward; then the average is clipped to max_grad_norm.
- local (NVIDIA v1.1): each rank clips its own whole gradient to max_grad_norm, then the clipped
  gradients are averaged in one coalesced allreduce. Communication cannot overlap the backward; the
  model is not wrapped in DDP (`data_parallel`).
- bucket (Samsung v1.1): a DDP communication hook clips each gradient bucket by its own norm
  before that bucket's allreduce, so communication still overlaps the backward (see BucketClip).
- none: DDP averages; no clipping.

Gradients may be loss-scaled (fp16): every threshold is multiplied by the current scale S, so the
clip acts on the true gradient, and an inf/NaN norm turns the gradients into NaN for the scaler to
detect on every rank (the step is then skipped everywhere).
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.nn.parallel import DistributedDataParallel

from trainer.config import OptimConfig


def grad_tensors(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad for p in model.parameters() if p.grad is not None]


def global_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    if not grads:
        return torch.zeros(())
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)).float(), 2.0)


def clip_(grads: list[torch.Tensor], max_norm: float, norm: torch.Tensor) -> None:
    """Scale `grads` by min(1, max_norm / norm) in place; an inf/NaN norm makes them NaN (skip)."""
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    coef = torch.where(torch.isfinite(norm), coef, torch.full_like(coef, float("nan")))
    torch._foreach_mul_(grads, coef.to(grads[0].dtype))


def allreduce_mean_(grads: list[torch.Tensor], world: int) -> None:
    """One coalesced allreduce of all gradients, then / world."""
    flat = _flatten_dense_tensors(grads)
    dist.all_reduce(flat)
    flat.div_(world)
    for g, reduced in zip(grads, _unflatten_dense_tensors(flat, grads)):
        g.copy_(reduced)


def data_parallel(model: nn.Module, optim: OptimConfig) -> DistributedDataParallel | None:
    """DDP around the model where it reduces the gradients in the backward (clip bucket, after_allreduce,
    none); None in one process, and in clip local, which reduces by hand after the backward
    (GradientSync.finish): there DDP would only cut a compiled model into a graph per bucket (dynamo's DDP
    optimizer) for nothing. Every rank then starts from rank 0's weights by a broadcast, as DDP's
    construction does."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    if optim.clip == "local":
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor.data, src=0)
        return None
    return DistributedDataParallel(model, gradient_as_bucket_view=True)


class GradientSync:
    """The gradient path of one training step, for the configured clipping mode."""

    def __init__(self, model: nn.Module, ddp: nn.Module | None, optim: OptimConfig):
        self.model, self.ddp, self.mode, self.max_norm = model, ddp, optim.clip, optim.max_grad_norm
        mode, max_norm = self.mode, self.max_norm
        self.world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        self.bucket_clip = None
        if mode == "bucket":
            if ddp is None:
                raise ValueError("bucket-wise clipping runs inside DDP's communication hook: it needs a process group")
            self.bucket_clip = BucketClip(max_norm, self.world)
            ddp.register_comm_hook(None, self.bucket_clip.hook)

    def micro_step_context(self, last: bool):
        """DDP reduces only after the last micro-step; in local mode we reduce by hand, never in backward."""
        if self.ddp is None or (last and self.mode != "local"):
            return contextlib.nullcontext()
        return self.ddp.no_sync()

    def set_scale(self, scale: float) -> None:
        if self.bucket_clip is not None:
            self.bucket_clip.scale = scale

    def finish(self, scale: float) -> torch.Tensor | None:
        """After the last backward: reduce (local mode) and clip. Returns the norm clipped on (scaled
        units, on the gradients' device), or None where no whole-gradient norm is computed."""
        grads = grad_tensors(self.model)
        if self.mode == "local":
            norm = global_norm(grads)
            clip_(grads, self.max_norm * scale, norm)
            if self.world > 1:
                allreduce_mean_(grads, self.world)
            return norm
        if self.mode == "after_allreduce":
            norm = global_norm(grads)
            clip_(grads, self.max_norm * scale, norm)
            return norm
        return None  # bucket (clipped bucket by bucket in the hook) or none


def bucket_bound(max_norm: float, buckets: int) -> float:
    """Per-bucket bound c / sqrt(K): K buckets within it compose to a whole-gradient norm <= c."""
    return max_norm / math.sqrt(buckets)


class BucketClip:
    """Samsung's bucket-wise clipping before the allreduce, as a DDP communication hook.

    As each gradient bucket becomes ready during the backward pass it is clipped to
    max_norm * S / sqrt(K) by its own norm (S: the loss scale, K: the number of buckets), divided
    by the world size and summed over ranks asynchronously, so communication still overlaps the
    rest of the backward. K is counted at run time: the hook sees every bucket of a backward pass
    (`is_last()` closes it), and the training loop runs one warm-up backward before the first
    real step so that K is known (DDP also settles its bucket layout after its first iteration).
    An inf/NaN bucket becomes NaN, the NaN crosses the allreduce, and every rank skips the step.
    """

    def __init__(self, max_norm: float, world: int):
        self.max_norm, self.world = max_norm, world
        self.scale = 1.0  # the current loss scale, set before each backward
        self.buckets = 0  # K, from the last complete backward pass
        self._seen = 0

    # no annotations: DDP compares them with dist.GradBucket, and this module postpones annotations
    def hook(self, state, bucket):
        grads = bucket.buffer()
        self._seen += 1
        if bucket.is_last():
            self.buckets, self._seen = self._seen, 0
        if self.buckets:  # unknown only during the warm-up pass, which never steps
            bound = bucket_bound(self.max_norm * self.scale, self.buckets)
            clip_([grads], bound, torch.linalg.vector_norm(grads.float()))
        grads.div_(self.world)
        work = dist.all_reduce(grads, async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0])
