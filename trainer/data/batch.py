"""Batches: samples -> the tensors the model reads, padded or unpadded (packed token stream).

Both forms carry the masked-LM targets the same way: `mlm_positions` are indices into the
flattened token axis (b * L + position when padded, the token's offset in the stream when
unpadded), `mlm_labels` the original ids there. Only real targets are listed, so the MLM head
runs on those rows alone and the loss needs no ignore index. `first_tokens` index each sequence's
[CLS] for the pooler and NSP.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Sequence

import numpy as np
import torch

from trainer.data.layout import Sample


@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, L] padded or [T] unpadded
    segment_ids: torch.Tensor  # same shape
    mlm_positions: torch.Tensor  # [M] indices into the flattened tokens
    mlm_labels: torch.Tensor  # [M]
    nsp_labels: torch.Tensor  # [S]
    first_tokens: torch.Tensor  # [S] index of each sequence's first token in the flattened tokens
    attention_mask: torch.Tensor | None = None  # [B, L] bool, padded form only
    position_ids: torch.Tensor | None = None  # [T] restarting at 0 per sequence, unpadded form only
    cu_seqlens: torch.Tensor | None = None  # [S + 1] int32 sequence offsets, unpadded form only
    # known on the host when the batch is made, so that no step copies them back from the device
    max_seqlen: int = 0
    seqlens: tuple[int, ...] = ()  # every sequence's length
    tokens: int = 0  # real tokens

    @property
    def unpadded(self) -> bool:
        return self.cu_seqlens is not None

    @property
    def num_sequences(self) -> int:
        return int(self.nsp_labels.numel())

    @property
    def num_masked(self) -> int:
        return int(self.mlm_labels.numel())

    @property
    def num_tokens(self) -> int:
        return self.tokens

    @property
    def min_seqlen(self) -> int:
        return min(self.seqlens)

    def to(self, device: torch.device | str) -> "Batch":
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, value in moved.items():
            if isinstance(value, torch.Tensor):
                moved[name] = value.to(device, non_blocking=True)
        return replace(self, **moved)


def collate(samples: Sequence[Sample], unpadded: bool, pad_to: int | None = None) -> Batch:
    """Samples -> Batch. Padded batches are as long as their longest sample unless `pad_to` is given."""
    return _collate_unpadded(samples) if unpadded else _collate_padded(samples, pad_to)


def _collate_padded(samples: Sequence[Sample], pad_to: int | None) -> Batch:
    lengths = np.array([len(s) for s in samples])
    width = int(pad_to or lengths.max())
    n = len(samples)
    ids = np.zeros((n, width), np.int64)
    seg = np.zeros((n, width), np.int64)
    mask = np.zeros((n, width), bool)
    positions, labels = [], []
    for b, s in enumerate(samples):
        ids[b, : len(s)], seg[b, : len(s)], mask[b, : len(s)] = s.input_ids, s.segment_ids, True
        positions.append(b * width + s.masked_lm_positions)
        labels.append(s.masked_lm_ids)
    return Batch(
        input_ids=torch.from_numpy(ids),
        segment_ids=torch.from_numpy(seg),
        attention_mask=torch.from_numpy(mask),
        mlm_positions=torch.from_numpy(np.concatenate(positions).astype(np.int64)),
        mlm_labels=torch.from_numpy(np.concatenate(labels).astype(np.int64)),
        nsp_labels=torch.tensor([s.next_sentence_label for s in samples], dtype=torch.int64),
        first_tokens=torch.arange(n, dtype=torch.int64) * width,
        max_seqlen=width,
        seqlens=tuple(lengths.tolist()),
        tokens=int(lengths.sum()),
    )


def _collate_unpadded(samples: Sequence[Sample]) -> Batch:
    lengths = np.array([len(s) for s in samples], np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return Batch(
        input_ids=torch.from_numpy(np.concatenate([s.input_ids for s in samples]).astype(np.int64)),
        segment_ids=torch.from_numpy(np.concatenate([s.segment_ids for s in samples]).astype(np.int64)),
        position_ids=torch.from_numpy(np.concatenate([np.arange(n) for n in lengths]).astype(np.int64)),
        cu_seqlens=torch.from_numpy(offsets.astype(np.int32)),
        max_seqlen=int(lengths.max()),
        seqlens=tuple(lengths.tolist()),
        tokens=int(lengths.sum()),
        mlm_positions=torch.from_numpy(
            np.concatenate([o + s.masked_lm_positions for o, s in zip(offsets[:-1], samples)]).astype(np.int64)),
        mlm_labels=torch.from_numpy(np.concatenate([s.masked_lm_ids for s in samples]).astype(np.int64)),
        nsp_labels=torch.tensor([s.next_sentence_label for s in samples], dtype=torch.int64),
        first_tokens=torch.from_numpy(offsets[:-1].astype(np.int64)),
    )
