"""What validating a shard costs when it is opened (trainer.data.layout.Shard).

    python benchmarks/shard_validation.py [--samples 10000] [--length 256] [--repeats 5]

Writes one shard per layout of N samples with lengths around L (uniform in [L/2, 3L/2], 15 % of
tokens masked, vocabulary 30,522), then times opening it (h5py read + validation, what the trainer
pays per shard) and the validation alone (every check, on the loaded arrays). Prints the median
of the repeats in milliseconds, with the machine and library versions.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

from trainer.data.layout import Sample, Shard, _first_problem, write_shard

VOCAB = 30522


def make_samples(n: int, length: int, seed: int = 0) -> list[Sample]:
    rng = np.random.default_rng(seed)
    samples = []
    for size in rng.integers(length // 2, 3 * length // 2 + 1, n):
        ids = rng.integers(5, VOCAB, size)
        k = max(1, round(0.15 * size))
        positions = np.sort(rng.choice(np.arange(1, size), k, replace=False))
        seg = (np.arange(size) >= size // 2).astype(np.int64)
        samples.append(Sample(ids, seg, positions, ids[positions].copy(), int(rng.integers(0, 2))))
    return samples


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=10_000)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"{platform.processor() or platform.machine()}, Python {platform.python_version()}, numpy {np.__version__}, "
          f"h5py {h5py.__version__}; {args.samples} samples of length {args.length // 2}-{3 * args.length // 2}, "
          f"median of {args.repeats}")
    samples = make_samples(args.samples, args.length)
    max_len, max_pred = 3 * args.length // 2, max(len(s.masked_lm_positions) for s in samples)
    limits = {"vocab_size": VOCAB, "max_seq_length": max_len, "max_predictions": max_pred}
    with tempfile.TemporaryDirectory() as tmp:
        for layout in ("fixed", "varlen"):
            path = write_shard(Path(tmp) / f"{layout}.hdf5", samples, layout, max_len, max_pred)
            shard = Shard(path, **limits)
            opened = median_ms(lambda path=path: Shard(path, **limits), args.repeats)
            checks = median_ms(lambda shard=shard: _first_problem(shard, VOCAB, max_len, max_pred), args.repeats)
            print(f"{layout:6s}  open + validate {opened:7.1f} ms   validation alone {checks:6.1f} ms "
                  f"({checks / opened:.0%} of opening)   {path.stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
