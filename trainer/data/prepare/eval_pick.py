"""The eval set pick: `count` samples taken evenly through all N candidates, index int(i * N / count).

This is what MLPerf's pick_eval_samples does to turn the eval intermediate (create_pretraining_data
on eval.txt) into the 10,000-sample eval set: a deterministic spread over the whole file, no RNG.
"""

from __future__ import annotations

import numpy as np


def pick_indices(total: int, count: int) -> np.ndarray:
    if total < count:
        raise ValueError(f"only {total} samples to pick {count} from")
    return (np.arange(count, dtype=np.int64) * total) // count


def split_by_part(indices: np.ndarray, part_counts: list[int]) -> list[tuple[int, np.ndarray]]:
    """(part, indices within the part) for each part that holds picked samples, in order."""
    bounds = np.concatenate(([0], np.cumsum(part_counts)))
    out = []
    for part in range(len(part_counts)):
        inside = indices[(indices >= bounds[part]) & (indices < bounds[part + 1])]
        if inside.size:
            out.append((part, inside - bounds[part]))
    return out
