"""The fast training step (runtime.step: fast): fixed shapes, the packed attention operator, the whole
model compiled once, and on CUDA optionally replayed as CUDA graphs.

What makes it fast on a GPU is what the reference step (runtime.step: reference) does not do:
- every micro-batch has one shape (trainer/data/batch.py::fixed_shape: packs x max_seq_length tokens,
  a fixed bound on sequences and masked positions, padding slots labelled IGNORE), so
  `torch.compile(dynamic=False)` compiles the model once and a CUDA graph can replay it;
- attention calls the flash kernel on the packed stream directly (trainer/model/flash_varlen.py), not
  through NestedTensor, whose per-op Python dispatch made the reference step CPU-bound;
- Q, K and V come from one GEMM (BertSelfAttention.fused_qkv_attention), the parameters keeping
  Hugging Face's names;
- the loss divisors (the step's masked positions and sequences) are counted on the device from the
  labels: nothing the step computes depends on a host value that changes from step to step.

The same code runs on the CPU, where the attention operator runs its reference kernel and graphs
are not available; tests hold its loss and gradients to the reference step's.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import nn

from trainer.config import RunConfig
from trainer.data.batch import IGNORE, Batch, Capacity, collate, fixed_shape
from trainer.data.layout import Sample
from trainer.model.compiled import Guarded


def capacity(cfg: RunConfig) -> Capacity:
    """The fixed shape of one micro-batch of this run (train.batch_size packs)."""
    return Capacity.of_packs(cfg.train.batch_size, cfg.data.max_seq_length, cfg.balance.pack_sequences or 1,
                             cfg.data.max_predictions_per_seq)


def make_batch(cfg: RunConfig, samples: Sequence[Sample]) -> Batch:
    """The host batch the run's step takes: fixed-shape for the fast step, else as collated."""
    batch = collate(samples, unpadded=cfg.runtime.unpad)
    return fixed_shape(batch, capacity(cfg)) if cfg.fast_step else batch


def step_counts(cfg: RunConfig, micro_batches: Sequence[Batch]) -> torch.Tensor:
    """[masked positions, sequences] of a step's micro-batches, float32: counted on the device for the fast
    step, from the host's counts (copied to the device by the caller) for the reference step."""
    if cfg.fast_step:
        return device_counts(micro_batches)
    return torch.tensor([[b.num_masked, b.num_sequences] for b in micro_batches], dtype=torch.float32).sum(0)


def build_forward(cfg: RunConfig, module: nn.Module) -> Callable[[Batch], tuple[torch.Tensor, torch.Tensor]]:
    """batch -> module(batch, loss_sums=True): compiled whole (CompiledForward) for the fast step with runtime.compile."""
    if cfg.fast_step and cfg.runtime.compile:
        return CompiledForward(module, cuda_graph=cfg.runtime.cuda_graph, fallback=cfg.runtime.compile_fallback == "eager")
    return lambda batch: module(batch, loss_sums=True)


def device_counts(micro_batches: Sequence[Batch]) -> torch.Tensor:
    """[masked positions, sequences] of the micro-batches as a float32 device tensor, counted from their
    labels on the device (no host value enters the step)."""
    masked = sum((b.mlm_labels != IGNORE).sum() for b in micro_batches)
    sequences = sum((b.nsp_labels != IGNORE).sum() for b in micro_batches)
    return torch.stack([masked, sequences]).float()


class CompiledForward:
    """model(batch, loss_sums=True), torch.compile'd with static shapes (dynamic=False) and, with
    cuda_graph, mode="reduce-overhead": the forward's and the backward's kernels are then replayed as
    CUDA graphs, dropout's RNG offset advancing with each replay. A failure to compile follows the run's
    rule (trainer/model/compiled.py): an error, or with `fallback` eager from then on: the maths is the same.

    The Batch is passed whole: dynamo guards only on the fields the forward reads (tensors of fixed
    shapes and the constant max_seqlen), not on the host counts that change every step, so one
    compilation serves the whole run (a test counts them)."""

    def __init__(self, model: nn.Module, cuda_graph: bool = False, backend: str | Callable = "inductor",
                 fallback: bool = False):
        self.model, self.cuda_graph = model, cuda_graph
        options = {"mode": "reduce-overhead"} if cuda_graph else {}
        self.compiled = torch.compile(model, dynamic=False, backend=backend, **options)
        self.guard = Guarded(self._compiled_call, self._eager_call, "the fast step's model", fallback)

    @property
    def failed(self) -> str | None:
        """Why compiling failed (the model then runs eager); None while it has not."""
        return self.guard.failed

    def __call__(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        return self.guard(batch)

    def _compiled_call(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        if self.cuda_graph:  # a new step: the previous replay's outputs may be overwritten from here on
            torch.compiler.cudagraph_mark_step_begin()
        return self.compiled(batch, loss_sums=True)

    def _eager_call(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model(batch, loss_sums=True)
