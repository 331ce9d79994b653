"""Splitting samples by sequence length into bins, and any sample count into balanced shards.

Bins are given by inclusive upper edges: [128, 256, 384, 512] means 1-128, 129-256, 257-384 and
385-512 tokens (Samsung's 4-bin split, whose edges are also the FMHA kernel lengths); a flat output
is one bin. Each bin's samples keep their input order and are cut into shards whose sizes differ
by at most one: with n samples and S shards, nominal = ceil(n / S), and the first S*nominal - n
shards hold one sample fewer (NVIDIA's and Samsung's sizing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np


def bin_of(lengths: np.ndarray, edges: Sequence[int]) -> np.ndarray:
    """The bin index of each length (a length above the last edge gets len(edges))."""
    return np.searchsorted(np.asarray(edges), np.asarray(lengths), side="left")


def bin_counts(length_histogram: Sequence[int], edges: Sequence[int]) -> list[int]:
    """Samples per bin from a histogram indexed by length."""
    hist = np.asarray(length_histogram)
    bounds = [0, *edges]
    return [int(hist[lo + 1: hi + 1].sum()) for lo, hi in zip(bounds, bounds[1:])]


def bin_names(edges: Sequence[int] | None) -> list[str]:
    """Subfolder names: the upper edges ("128", "256", ...), or "" for a flat output."""
    return [str(e) for e in edges] if edges else [""]


def shard_sizes(n: int, shards: int) -> list[int]:
    nominal = math.ceil(n / shards)
    excess = shards * nominal - n
    return [nominal - 1] * excess + [nominal] * (shards - excess)


def shard_name(index: int, shards: int) -> str:
    return f"part_{index}_of_{shards}.hdf5"


@dataclass(frozen=True)
class Span:
    """Samples [start, stop) of a bin in input order, and where they come from."""

    start: int
    stop: int

    def pieces(self, part_counts: Sequence[int]) -> list[tuple[int, int, int]]:
        """(part, first, last) index ranges within each part's samples of this bin, in order."""
        out, offset = [], 0
        for part, count in enumerate(part_counts):
            lo, hi = max(self.start, offset), min(self.stop, offset + count)
            if lo < hi:
                out.append((part, lo - offset, hi - offset))
            offset += count
        return out


def shard_spans(n: int, shards: int) -> list[Span]:
    spans, start = [], 0
    for size in shard_sizes(n, shards):
        spans.append(Span(start, start + size))
        start += size
    return spans
