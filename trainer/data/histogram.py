"""The real sequence-length distribution of Wikipedia BERT pretraining data at length 512.

Published by Graphcore (packedBERT, 16,279,552 sequences, mean 255.8 tokens, 50.03 % padding at 512);
a close proxy for the MLPerf training set. Used by the benchmarks and the load-balance simulator.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

CSV = Path(__file__).with_name("wikipedia_seqlen_hist_512.csv")


@lru_cache(maxsize=1)
def wikipedia_histogram() -> tuple[np.ndarray, np.ndarray]:
    """(lengths 1..512, counts)."""
    data = np.loadtxt(CSV, delimiter=",", skiprows=1, dtype=np.int64)
    return data[:, 0], data[:, 1]


def sample_lengths(n: int, rng: np.random.Generator) -> np.ndarray:
    lengths, counts = wikipedia_histogram()
    return rng.choice(lengths, size=n, p=counts / counts.sum())
