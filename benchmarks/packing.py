"""Packing up to 3 sequences per pack: efficiency on the Wikipedia length histogram, its cost, and
the H100 recipe's data path on a CPU.

    python benchmarks/packing.py [--stream-steps 250] [--stream-window 16384] [--steps 8] [--run-window 256] [--skip-run]

1. The histogram (16,279,552 sequences): sequences per pack and real tokens for at most 2, 3 and any
   number per pack, and the time `pack_plan` takes (targets: >= 1.99 and >= 99.5 % at 3; Graphcore's
   LPFHP reaches 99.81 %, NVIDIA's packed data 1.999 per pack).
2. The same 16.28 M sequences as an array of lengths, packed index by index (`pack_sequences`): the
   time an offline packing of the whole set would take (target < 60 s on 2 cores).
3. Windows drawn from the histogram, as the trainer packs them online (`pack_window`): the mean and
   the worst window.
4. The recipe's data path: clusters/nvidia_dgxh100_1x8.yaml's balance settings and batch (8 ranks x
   48 packs, as 8 data streams in one CPU process: the same packs) on a synthetic dataset whose
   lengths are drawn from the histogram.
   a. The packed stream alone, 250 steps (past a window's end): the sequences of each step (target:
      within 1 % of the nominal 768 on average). Window 16,384: a window and the one packed ahead
      hold about 13 KB a sample, so the recipe's 65,536 would take about 7 GB for 8 streams, too
      much for the shared 2-core machine this ran on (a DGX H100 has 2 TB).
   b. The same stream in the trainer's loop with a 1-layer model (no dropout), 8 steps: the share of
      the loop's wall time spent waiting for the packed stream (target <= 1 %) and collating. The
      window here is 256, so that 8 steps cross about 3 window ends per stream (each step takes tens
      of seconds of per-sequence attention on a loaded 2-core CPU).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from trainer.balance.algorithms import pack_histogram, pack_sequences  # noqa: E402
from trainer.data.histogram import wikipedia_histogram  # noqa: E402

CAPACITY = 512


def histogram_figures() -> None:
    lengths, counts = wikipedia_histogram()
    mean = (lengths * counts).sum() / counts.sum()
    print(f"## 1. Wikipedia histogram: {counts.sum():,} sequences, mean length {mean:.1f}")
    for k in (2, 3, None):
        start = time.perf_counter()
        packs, efficiency = pack_histogram(counts, CAPACITY, k)
        seconds = time.perf_counter() - start
        print(f"at most {k or 'any'} per pack: {packs:,} packs, {counts.sum() / packs:.4f} sequences per pack, "
              f"{efficiency:.4%} real tokens ({seconds:.2f} s)")


def whole_set() -> None:
    lengths, counts = wikipedia_histogram()
    every = np.random.default_rng(0).permutation(np.repeat(lengths, counts))
    start = time.perf_counter()
    packs = pack_sequences(every, CAPACITY, 3)
    seconds = time.perf_counter() - start
    assert max(len(p) for p in packs) <= 3
    print(f"## 2. {len(every):,} lengths packed index by index, at most 3: {len(every) / len(packs):.4f} per pack, "
          f"{every.sum() / (len(packs) * CAPACITY):.4%} real tokens, {seconds:.1f} s")


def windows() -> None:
    lengths, counts = wikipedia_histogram()
    rng = np.random.default_rng(1)
    print("## 3. online windows drawn from the histogram, at most 3 per pack")
    for window, reps in ((1024, 64), (16384, 16), (65536, 8)):
        per_pack, real, seconds = [], [], []
        for _ in range(reps):
            x = rng.choice(lengths, size=window, p=counts / counts.sum())
            start = time.perf_counter()
            packs = pack_sequences(x, CAPACITY, 3)
            seconds.append(time.perf_counter() - start)
            per_pack.append(window / len(packs))
            real.append(x.sum() / (len(packs) * CAPACITY))
        print(f"window {window:>6}: {np.mean(per_pack):.4f} sequences per pack (worst {min(per_pack):.4f}), "
              f"{np.mean(real):.4%} real tokens (worst {min(real):.4%}), {np.mean(seconds) * 1000:.0f} ms per window "
              f"({reps} windows)")


def synthetic_dataset(folder: Path, shards: int, per_shard: int, seed: int = 0) -> Path:
    from trainer.data.histogram import sample_lengths
    from trainer.data.layout import Sample, write_shard

    rng = np.random.default_rng(seed)
    for s in range(shards):
        samples = []
        for n in sample_lengths(per_shard, rng):
            n = int(max(n, 8))
            k = min(76, max(1, round(0.15 * n)))
            pos = np.sort(rng.choice(np.arange(1, n - 1), size=k, replace=False))
            samples.append(Sample(rng.integers(5, 1000, n), (np.arange(n) >= n // 2).astype(np.int64), pos,
                                  rng.integers(5, 1000, k), int(rng.integers(0, 2))))
        write_shard(folder / f"part_{s:05d}.hdf5", samples, "varlen", CAPACITY, 76)
    return folder


def recipe_settings():
    from orchestrator.config.clusters import load_cluster

    recipe = load_cluster("nvidia_dgxh100_1x8").config.run
    return recipe, recipe.world_size, recipe.balance


def recipe_stream(steps: int, window: int) -> None:
    """The recipe's packed stream alone (8 streams x 48 packs, as one process reads them): the
    sequences of each step, over enough steps to cross a window's end."""
    from synthetic import train_data

    recipe, ranks, b = recipe_settings()
    with tempfile.TemporaryDirectory() as tmp:
        folder = synthetic_dataset(Path(tmp), shards=ranks, per_shard=4096)
        data = train_data(folder, batch_size=recipe.train.batch_size * ranks, streams=ranks, workers=2,
                          max_seq_length=CAPACITY, max_predictions=76, packing=True, pack_sequences=b.pack_sequences,
                          pack_average=b.pack_average, pack_window=window)
        sequences = [len(data.next_samples()[0]) for _ in range(steps)]
        data.close()
    mean = float(np.mean(sequences))
    print(f"## 4a. the H100 recipe's packed stream: {ranks} streams x {recipe.train.batch_size} packs, at most "
          f"{b.pack_sequences} per pack, nominal {b.pack_average:g} (global batch {recipe.train.global_batch_size}), "
          f"window {window}, {steps} steps")
    print(f"sequences per step: mean {mean:.1f} ({mean / recipe.train.global_batch_size - 1:+.2%} from nominal), "
          f"min {min(sequences)}, max {max(sequences)}")


def recipe_run(steps: int, window: int) -> None:
    """The recipe's data path in the trainer's loop, a 1-layer model: the share of the loop's wall
    time spent waiting for the packed stream and collating, with windows small enough that the run
    crosses several window ends (the next window is packed while the current one trains)."""
    import torch
    import yaml

    from trainer.config import load_run_config
    from trainer.loop.entry import RunArgs
    from trainer.loop.train import Trainer
    from trainer.parallel import distributed

    recipe, ranks, b = recipe_settings()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = synthetic_dataset(tmp / "train", shards=ranks, per_shard=1024)
        cfg = {
            "world_size": 1,
            "model": {"num_layers": 1, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64, "vocab_size": 1024,
                      "hidden_dropout": 0.0, "attention_dropout": 0.0},
            "data": {"train_dir": str(data), "num_workers": 2, "streams": ranks},
            "optim": {"name": "lamb", "lr": 1e-3, "max_steps": steps},
            "train": {"batch_size": recipe.train.batch_size * ranks, "global_batch_size": recipe.train.global_batch_size,
                      "max_samples_termination": 10**9, "log_every_steps": steps, "target_accuracy": 0.99},
            "balance": {**b.model_dump(mode="json"), "pack_window": window},
            "runtime": {"unpad": True},
            "mlperf": {"division": "open"},  # a 1-layer model timing the input pipeline, not a closed run
        }
        (tmp / "run.yaml").write_text(yaml.safe_dump(cfg))
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        trainer = Trainer(load_run_config(str(tmp / "run.yaml")), RunArgs(config=str(tmp / "run.yaml"), out=str(tmp / "out")))
        waits, collates = [], []
        next_samples, next_batch = trainer.data.next_samples, trainer.next_batch

        def timed_samples():
            start = time.perf_counter()
            out = next_samples()
            waits.append(time.perf_counter() - start)
            return out

        def timed_batch():
            start = time.perf_counter()
            batch = next_batch()
            collates.append(time.perf_counter() - start - waits[-1])
            return batch

        trainer.data.next_samples, trainer.next_batch = timed_samples, timed_batch
        try:
            start = time.perf_counter()
            trainer.run()
            wall = time.perf_counter() - start
        finally:
            trainer.close()
            distributed.close()
    first, steady = waits[0], sum(waits[1:])  # the first window is read and packed before step 1: start-up
    print(f"## 4b. the same data path in the training loop: window {window} (the run crosses "
          f"{steps * 96 // window} window ends per stream), {steps} steps of a 1-layer model, torch {torch.__version__}")
    print(f"loop wall time {wall:.1f} s ({wall / steps:.2f} s per step); waiting for the packed stream after step 1: "
          f"{steady:.3f} s = {steady / wall:.3%} of the loop (longest wait {max(waits[1:]) * 1000:.1f} ms; the first "
          f"window, before step 1: {first:.2f} s); collating batches: {sum(collates):.2f} s = {sum(collates) / wall:.2%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stream-steps", type=int, default=250)
    parser.add_argument("--stream-window", type=int, default=16384)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--run-window", type=int, default=256)
    parser.add_argument("--skip-run", action="store_true")
    args = parser.parse_args()
    import numpy

    print(f"# benchmarks/packing.py on {platform.node()}: {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, Python {platform.python_version()}, numpy {numpy.__version__}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    histogram_figures()
    whole_set()
    windows()
    if not args.skip_run:
        recipe_stream(args.stream_steps, args.stream_window)
        recipe_run(args.steps, args.run_window)


if __name__ == "__main__":
    main()
