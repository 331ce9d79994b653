"""Evaluation: masked-LM accuracy over the eval set, summed over ranks.

The eval set is read once, split into contiguous per-rank slices (NVIDIA's scheme: the first
`rem` ranks get one extra sample), collated into batches and kept on the device: for the fast step
(runtime.step) packed into fixed-shape batches and, with runtime.compile, summed by a compiled
function (compiled in the warm-up, before the run's clock starts); else as the run trains. Accuracy is
correct masked tokens / masked tokens over all ranks, the same as the reference's weighted
`tf.metrics.accuracy`; both paths count the same tokens right (tests/test_evaluate.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from trainer.config import RunConfig, expand_path
from trainer.data.batch import IGNORE, Batch, collate, packed_fixed_batches
from trainer.data.dataset import DataError
from trainer.data.layout import Sample, Shard, shard_files
from trainer.model.compiled import Guarded


def rank_slice(total: int, rank: int, world: int) -> tuple[int, int]:
    """[start, end) of this rank's eval samples: chunk = total // world, the first total % world get one more."""
    chunk, rem = divmod(total, world)
    if rank < rem:
        return rank * (chunk + 1), (rank + 1) * (chunk + 1)
    start = rem * (chunk + 1) + (rank - rem) * chunk
    return start, start + chunk


def read_eval_samples(eval_dir: str, count: int, vocab_size: int | None = None, max_seq_length: int | None = None,
                      max_predictions: int | None = None) -> list[Sample]:
    """The first `count` samples of the eval file (or of a folder's shards, in name order), each
    shard validated against the limits given (see trainer.data.layout.Shard)."""
    path = Path(eval_dir)
    if not path.exists():
        raise DataError(f"{path}: eval data not found")
    files = [path] if path.is_file() else shard_files(path)
    samples: list[Sample] = []
    for f in files:
        shard = Shard(f, vocab_size, max_seq_length, max_predictions)
        samples.extend(shard.samples(range(min(len(shard), count - len(samples)))))
        if len(samples) >= count:
            break
    if len(samples) < count:
        raise DataError(f"{path}: {len(samples)} eval samples, the run asks for data.eval_samples={count}")
    return samples


def unigram_baseline(samples: list[Sample]) -> float:
    """The accuracy of always guessing the eval set's most frequent masked token: what "learned
    nothing but token frequencies" scores."""
    ids = np.concatenate([s.masked_lm_ids for s in samples])
    return float(np.bincount(ids).max() / len(ids)) if len(ids) else 0.0


def build_evaluator(cfg: RunConfig, rank: int, world: int, device) -> Evaluator | None:
    """The run's evaluator; None when the run has no eval set (data.eval_dir). The fast step's runs evaluate
    on its path (trainer/data/batch.py::packed_fixed_batches, compiled with runtime.compile); the others as they train. The eval
    shards are checked against the model's vocabulary and positions (not the data section's lengths: phase 1
    trains at 128 tokens and evaluates on the 512-token set)."""
    data, model = cfg.data, cfg.model
    if not data.eval_dir:
        return None
    everything = read_eval_samples(expand_path(data.eval_dir), data.eval_samples, model.vocab_size, model.max_position_embeddings)
    start, end = rank_slice(len(everything), rank, world)
    mine = everything[start:end]
    if cfg.fast_step:
        # twice the training micro-batch's packs: without gradients they fit
        batches = packed_fixed_batches(mine, 2 * cfg.train.batch_size, model.max_position_embeddings, cfg.balance.pack_sequences)
    else:
        size = cfg.train.eval_batch_size
        batches = [collate(mine[i:i + size], unpadded=cfg.runtime.unpad) for i in range(0, len(mine), size)]
    sums = eval_sums
    if cfg.fast_step and cfg.runtime.compile:
        sums = Guarded(torch.compile(eval_sums, dynamic=False), eval_sums, "the evaluation", cfg.runtime.compile_fallback == "eager")
    return Evaluator(everything, [b.to(device) for b in batches], sums, device, world)


def eval_sums(model: nn.Module, batch: Batch) -> torch.Tensor:
    """[correct masked tokens, their summed cross-entropy, masked tokens] of one batch, on the device
    (padding slots, labelled IGNORE, count in none)."""
    mlm_logits, _ = model(batch)
    logits = mlm_logits.float()
    real = batch.mlm_labels != IGNORE
    correct = ((logits.argmax(-1) == batch.mlm_labels) & real).sum()
    loss = F.cross_entropy(logits, batch.mlm_labels, ignore_index=IGNORE, reduction="sum")
    return torch.stack([correct.float(), loss, real.sum().float()])


class Evaluator:
    """Masked-LM accuracy of a model over the eval set: this rank's batches, kept on the device, and the
    function that sums one batch's counts (`eval_sums`, compiled or not)."""

    def __init__(self, everything: list[Sample], batches: list[Batch], sums: Callable[[nn.Module, Batch], torch.Tensor],
                 device, world: int):
        self.baseline = unigram_baseline(everything)
        self.masked = sum(len(s.masked_lm_ids) for s in everything)
        self.samples = len(everything)
        self.batches, self.sums, self.device, self.world = batches, sums, device, world

    def describe(self) -> str:
        """The eval set in one line, with what learning nothing but token frequencies would score on it."""
        return (f"eval set: {self.samples} samples, {self.masked} masked tokens; "
                f"guessing the most frequent one scores {self.baseline:.3f} (the unigram baseline)")

    @torch.no_grad()
    def accuracy(self, model: nn.Module, autocast) -> tuple[float, float]:
        """(MLM accuracy, mean MLM loss) over every rank's eval samples."""
        was_training = model.training
        model.eval()
        totals = torch.zeros(3, dtype=torch.float64, device=self.device)  # correct, loss sum, masked
        for batch in self.batches:
            with autocast():
                totals += self.sums(model, batch)
        if self.world > 1:
            dist.all_reduce(totals)
        model.train(was_training)
        correct, loss, masked = totals.tolist()
        return correct / max(masked, 1.0), loss / max(masked, 1.0)

    @torch.no_grad()
    def warm_up(self, model: nn.Module, autocast) -> None:
        """One batch through the evaluation, nothing counted: a compiled evaluation compiles here, before
        the run's clock starts, not inside its first timed evaluation."""
        if self.batches:
            was_training = model.training
            model.eval()
            with autocast():
                self.sums(model, self.batches[0])
            model.train(was_training)
