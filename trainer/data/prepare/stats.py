"""What a prepared shard holds: counts, length histogram, masking and NSP statistics, a content digest.

The digest is SHA-256 over the samples' content (lengths, token ids, segments, masked positions and
labels, NSP labels) as little-endian int64, independent of the HDF5 layout and library version: two
shards with the same samples in the same order have the same digest.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from trainer.data.layout import Shard


@dataclass
class ShardStats:
    samples: int = 0
    tokens: int = 0
    masked: int = 0  # masked positions (prediction targets)
    shown_mask: int = 0  # ... where the input shows [MASK]
    shown_original: int = 0  # ... where the input shows the original token
    random_next: int = 0  # next_sentence_labels == 1
    length_histogram: list[int] = field(default_factory=list)  # index = length
    max_predictions_seen: int = 0
    problems: list[str] = field(default_factory=list)  # structural faults, a few examples
    digest: str = ""

    def add(self, other: "ShardStats") -> None:
        for name in ("samples", "tokens", "masked", "shown_mask", "shown_original", "random_next"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.length_histogram = _add_lists(self.length_histogram, other.length_histogram)
        self.max_predictions_seen = max(self.max_predictions_seen, other.max_predictions_seen)
        self.problems = (self.problems + other.problems)[:10]

    def as_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "ShardStats":
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in known})


def shard_stats(path: str | Path, mask_id: int | None, length_range: tuple[int, int] | None = None) -> ShardStats:
    """Statistics of one shard; `length_range` (inclusive) is the bin its lengths must be in."""
    return stats_of(Shard(path), mask_id, length_range)


def stats_of(shard: Shard, mask_id: int | None, length_range: tuple[int, int] | None = None) -> ShardStats:
    return columns_stats(*shard.columns(), mask_id=mask_id, length_range=length_range)


def columns_stats(lengths, ids, segments, k, positions, labels, nsp, mask_id: int | None,
                  length_range: tuple[int, int] | None = None) -> ShardStats:
    st = ShardStats(samples=len(lengths), tokens=int(lengths.sum()), masked=int(k.sum()),
                    random_next=int(nsp.sum()), max_predictions_seen=int(k.max()) if len(k) else 0)
    st.length_histogram = np.bincount(lengths, minlength=1).tolist() if len(lengths) else [0]
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1])) if len(lengths) else lengths
    flat_positions = np.repeat(starts, k) + positions  # masked positions as indices into `ids`
    owner_length = np.repeat(lengths, k)
    if np.any(positions <= 0) or np.any(positions >= owner_length):
        st.problems.append("a masked position is 0 ([CLS]) or past the end of its sequence")
    else:
        shown = ids[flat_positions]
        st.shown_original = int((shown == labels).sum())
        if mask_id is not None:
            st.shown_mask = int((shown == mask_id).sum())
    if len(positions) > 1 and np.any((np.diff(positions) <= 0) & ~_sample_starts(k)[1:]):
        st.problems.append("masked positions are not ascending within a sample")
    if np.any((segments != 0) & (segments != 1)) or np.any(nsp > 1) or np.any(nsp < 0):
        st.problems.append("segment ids or next sentence labels outside {0, 1}")
    if length_range is not None and len(lengths):
        lo, hi = length_range
        outside = int(((lengths < lo) | (lengths > hi)).sum())
        if outside:
            st.problems.append(f"{outside} samples have lengths outside {lo}-{hi}")
    st.digest = content_digest(lengths, ids, segments, k, positions, labels, nsp)
    return st


def _sample_starts(k: np.ndarray) -> np.ndarray:
    """For the flat array of masked positions: True where a new sample's positions begin."""
    first = np.zeros(int(k.sum()), bool)
    offsets = np.concatenate(([0], np.cumsum(k)[:-1]))
    first[offsets[k > 0]] = True
    return first


def content_digest(*columns: np.ndarray) -> str:
    h = hashlib.sha256()
    for column in columns:
        data = np.ascontiguousarray(column, dtype="<i8")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data.tobytes())
    return h.hexdigest()


def _add_lists(a: list[int], b: list[int]) -> list[int]:
    n = max(len(a), len(b))
    return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)]
