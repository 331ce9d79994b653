"""Batches: samples -> the tensors the model reads, padded or unpadded (packed token stream).

Both forms carry the masked-LM targets the same way: `mlm_positions` are indices into the
flattened token axis (b * L + position when padded, the token's offset in the stream when
unpadded), `mlm_labels` the original ids there. Only real targets are listed, so the MLM head
runs on those rows alone and the loss needs no ignore index. `first_tokens` index each sequence's
[CLS] for the pooler and NSP.

`fixed_shape` turns an unpadded batch into the fast step's form (trainer/loop/fast_step.py): every
tensor of a fixed size whatever the step's samples, so a compiled step never recompiles and a CUDA
graph can replay it. Padding slots carry IGNORE labels, and the padding tokens form segments of
their own, so the attention covers every row of the stream.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Sequence

import numpy as np
import torch

from trainer.balance.algorithms import pack_sequences
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
    # fixed_shape: the tensors are padded to fixed capacities (labels IGNORE in the padding slots);
    # the real counts stay here, on the host, for the progress figures only
    static: bool = False
    masked: int = 0

    @property
    def unpadded(self) -> bool:
        return self.cu_seqlens is not None

    @property
    def num_sequences(self) -> int:
        return len(self.seqlens) if self.static else int(self.nsp_labels.numel())

    @property
    def num_masked(self) -> int:
        return self.masked if self.static else int(self.mlm_labels.numel())

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


IGNORE = -100  # the label of a padding slot (F.cross_entropy's default ignore_index)


class CapacityError(ValueError):
    """A batch needs more room than the fast step's fixed shape gives it."""


@dataclass(frozen=True)
class Capacity:
    """The fast step's fixed shape: tokens, sequences and masked positions of one micro-batch."""

    tokens: int  # packs x max_seq_length
    sequences: int  # packs x balance.pack_sequences
    masked: int  # packs x (data.max_predictions_per_seq + balance.pack_sequences)
    max_seqlen: int  # data.max_seq_length: the longest segment, real or padding

    @classmethod
    def of_packs(cls, packs: int, max_seq_length: int, per_pack: int, max_predictions: int) -> "Capacity":
        # a pack's sequences share its max_seq_length tokens, so their masked counts (each about 15 % of
        # a sequence's length, rounded) add up to about one full-length sequence's plus a rounding each
        return cls(packs * max_seq_length, packs * per_pack, packs * (max_predictions + per_pack), max_seq_length)

    @property
    def padding_segments(self) -> int:
        """The most segments the padding tokens may need: each at most max_seqlen long."""
        return math.ceil(self.tokens / self.max_seqlen)

    @property
    def offsets(self) -> int:
        """The fixed length of cu_seqlens."""
        return self.sequences + self.padding_segments + 1


def fixed_shape(batch: Batch, cap: Capacity) -> Batch:
    """An unpadded host batch padded to `cap`: the token stream to cap.tokens (padding tokens are
    id 0 in segments of at most cap.max_seqlen, so the varlen kernel writes every row, and zero-length
    segments after them fill cu_seqlens to its fixed length), the masked positions to cap.masked
    and the [CLS] indices to cap.sequences (labels IGNORE, index 0). Raises CapacityError, naming the
    key to raise, when the batch does not fit."""
    if not batch.unpadded:
        raise ValueError("fixed_shape takes an unpadded batch")
    _check_fits(batch, cap)
    pad = cap.tokens - batch.tokens
    pad_lengths = [min(cap.max_seqlen, pad - start) for start in range(0, pad, cap.max_seqlen)]
    real_offsets = batch.cu_seqlens.to(torch.int64)
    pad_offsets = batch.tokens + torch.tensor(np.cumsum(pad_lengths, dtype=np.int64))
    tail = torch.full((cap.offsets - len(real_offsets) - len(pad_offsets),), cap.tokens, dtype=torch.int64)
    pad_positions = torch.cat([torch.arange(n) for n in pad_lengths]) if pad_lengths else torch.zeros(0, dtype=torch.int64)
    return replace(
        batch,
        input_ids=_pad(batch.input_ids, cap.tokens, 0),
        segment_ids=_pad(batch.segment_ids, cap.tokens, 0),
        position_ids=torch.cat([batch.position_ids, pad_positions]),
        cu_seqlens=torch.cat([real_offsets, pad_offsets, tail]).to(torch.int32),
        mlm_positions=_pad(batch.mlm_positions, cap.masked, 0),
        mlm_labels=_pad(batch.mlm_labels, cap.masked, IGNORE),
        first_tokens=_pad(batch.first_tokens, cap.sequences, 0),
        nsp_labels=_pad(batch.nsp_labels, cap.sequences, IGNORE),
        max_seqlen=cap.max_seqlen,
        static=True,
        masked=batch.num_masked,
    )


def _check_fits(batch: Batch, cap: Capacity) -> None:
    needs = {"tokens": (batch.tokens, "train.batch_size (packs) or data.max_seq_length"),
             "sequences": (batch.num_sequences, "balance.pack_sequences"),
             "masked": (batch.num_masked, "balance.pack_sequences or data.max_predictions_per_seq")}
    for what, (count, key) in needs.items():
        if count > getattr(cap, what):
            raise CapacityError(f"{key}: a batch has {count} {what}, more than the fast step's fixed bound "
                                f"({getattr(cap, what)}); raise {key} or set runtime.step: reference")
    if batch.max_seqlen > cap.max_seqlen:
        raise CapacityError(f"data.max_seq_length: a sequence of {batch.max_seqlen} tokens is longer than {cap.max_seqlen}")


def _pad(values: torch.Tensor, size: int, fill: int) -> torch.Tensor:
    return torch.cat([values, torch.full((size - len(values),), fill, dtype=values.dtype)])


def packed_fixed_batches(samples: Sequence[Sample], packs: int, pack_length: int, per_pack: int) -> list[Batch]:
    """`samples` packed (at most `per_pack` sequences and `pack_length` tokens a pack) into batches of `packs`
    packs, all of one fixed shape: the one the fullest of them needs, known before the first is used, so
    a compiled function of them never recompiles and none exceeds it (the evaluation's batches on the fast
    step: trainer/loop/evaluate.py)."""
    rows = pack_sequences(np.array([len(s) for s in samples]), pack_length, per_pack)
    plain = [collate([samples[i] for row in rows[k:k + packs] for i in row], unpadded=True) for k in range(0, len(rows), packs)]
    if not plain:
        return []
    cap = Capacity(tokens=packs * pack_length, sequences=max(b.num_sequences for b in plain),
                   masked=max(b.num_masked for b in plain), max_seqlen=pack_length)
    return [fixed_shape(b, cap) for b in plain]
