"""Evaluation: masked-LM accuracy over the eval set, summed over ranks.

The eval set is read once, split into contiguous per-rank slices (NVIDIA's scheme: the first
`rem` ranks get one extra sample), collated into batches and kept on the device. Accuracy is
correct masked tokens / masked tokens over all ranks, the same as the reference's weighted
`tf.metrics.accuracy`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from trainer.config import DataConfig, RunConfig, expand_path
from trainer.data.batch import Batch, collate
from trainer.data.dataset import DataError
from trainer.data.layout import Sample, Shard, shard_files


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
    """The run's evaluator; None when the run has no eval set (data.eval_dir)."""
    if not cfg.data.eval_dir:
        return None
    return Evaluator(cfg.data, cfg.train.eval_batch_size, rank, world, cfg.runtime.unpad, device,
                     vocab_size=cfg.model.vocab_size, max_positions=cfg.model.max_position_embeddings)


class Evaluator:
    def __init__(self, data: DataConfig, batch_size: int, rank: int, world: int, unpadded: bool, device,
                 vocab_size: int | None = None, max_positions: int | None = None):
        """The eval shards are checked against the model's vocabulary and positions (not the data section's
        lengths: phase 1 trains at 128 tokens and evaluates on the 512-token set)."""
        start, end = rank_slice(data.eval_samples, rank, world)
        everything = read_eval_samples(expand_path(data.eval_dir), data.eval_samples, vocab_size, max_positions)
        self.baseline = unigram_baseline(everything)
        self.masked = sum(len(s.masked_lm_ids) for s in everything)
        self.samples = len(everything)
        mine = everything[start:end]
        self.batches: list[Batch] = [
            collate(mine[i:i + batch_size], unpadded=unpadded).to(device) for i in range(0, len(mine), batch_size)
        ]
        self.device = device
        self.world = world

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
                mlm_logits, _ = model(batch)
            mlm_logits = mlm_logits.float()
            totals[0] += (mlm_logits.argmax(-1) == batch.mlm_labels).sum()
            totals[1] += torch.nn.functional.cross_entropy(mlm_logits, batch.mlm_labels, reduction="sum")
            totals[2] += batch.num_masked
        if self.world > 1:
            dist.all_reduce(totals)
        model.train(was_training)
        correct, loss, masked = totals.tolist()
        return correct / max(masked, 1.0), loss / max(masked, 1.0)
