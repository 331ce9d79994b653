"""`python -m trainer.balance.simulate` (what `bertctl balance` runs): load balance across ranks,
simulated on the real sequence-length histogram with the trainer's own algorithms.

For every step it draws `ranks x batch` sequence lengths, assigns them to ranks with a strategy,
and measures what each rank would compute:

  random           each rank its own random batch
  stratified       each rank the same quotas from the 4 length bins (Samsung, 6/3/2/5 of 16)
  global-exchange  all ranks' samples sorted and dealt out (NVIDIA's exchange padding)
  group-exchange   stratified batches, sorted and dealt inside groups of `group` ranks (Samsung)
  packed           packs of <= 512 tokens and at most --pack-sequences sequences, packed as the trainer
                   packs them (trainer/balance/algorithms.py::pack_sequences over windows of --pack-window), dealt
                   by tokens inside groups of `group` ranks (group-local presort + packing); with
                   --pack-sequences, --batch counts packs per rank (the recipe's train.batch_size),
                   else as many packs as carry `batch` sequences on average

Deals are in snake order (odd rounds reversed) unless --no-snake, as balance.snake says in a run.
`bertctl balance --cluster C` fills all of these from a cluster file's own settings.

Reported (means over steps): max/mean tokens per rank, max/mean attention work (sum of L^2),
max/mean training FLOPs of BERT-large (linear + attention), padding share (padded kernels pad each
rank's rows to its longest sequence; packed rows to 512), and bytes each rank receives per step
in the exchange (int16 rows, as trainer/parallel/exchange.py sends them).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from trainer.balance.algorithms import bin_of, deal_members, pack_sequences, quotas_from_counts
from trainer.config import BIN_EDGES
from trainer.data.histogram import wikipedia_histogram

STRATEGIES = ("random", "stratified", "global-exchange", "group-exchange", "packed")
CAPACITY, MAX_PREDICTIONS = 512, 76
ROW_BYTES = 2 * (4 + 2 * CAPACITY + 2 * MAX_PREDICTIONS)  # trainer/parallel/exchange.py's int16 row
HIDDEN, FFN, LAYERS = 1024, 4096, 24  # BERT-large, for the FLOP model


@dataclass
class Result:
    strategy: str
    ranks: int
    batch: int
    group: int
    steps: int
    seed: int
    max_over_mean_tokens: float
    max_over_mean_attention: float
    max_over_mean_flops: float
    padding_share: float
    exchange_bytes_per_step: int
    mean_tokens_per_rank: float
    snake: bool = True
    sequences_per_step: float = 0.0  # trained by all ranks, on average
    sequences_per_pack: float | None = None  # packed only
    pack_sequences: int | None = None  # packed only: the most a pack holds
    nominal_sequences_per_step: float | None = None  # packed with a nominal pack average: what the log states


class LengthSource:
    """Sequence lengths from a histogram (counts[l - 1] sequences of length l), overall or by bin."""

    def __init__(self, counts: np.ndarray):
        self.lengths = np.arange(1, len(counts) + 1)
        self.p = counts / counts.sum()
        bins = bin_of(self.lengths)
        self.bin_p = [np.where(bins == b, self.p, 0.0) for b in range(len(BIN_EDGES))]
        self.bin_p = [q / q.sum() if q.sum() else q for q in self.bin_p]
        self.bin_share = np.array([self.p[bins == b].sum() for b in range(len(BIN_EDGES))])

    def draw(self, rng, n: int) -> np.ndarray:
        return rng.choice(self.lengths, size=n, p=self.p)

    def draw_stratified(self, rng, ranks: int, quotas: list[int]) -> np.ndarray:
        """[ranks, sum(quotas)]: every rank's batch has quotas[b] lengths from bin b."""
        parts = [rng.choice(self.lengths, size=(ranks, q), p=self.bin_p[b]) for b, q in enumerate(quotas) if q]
        return np.concatenate(parts, axis=1)


def flops(lengths) -> np.ndarray:
    lengths = np.asarray(lengths, dtype=np.float64)
    return LAYERS * (lengths * (4 * HIDDEN * HIDDEN + 2 * HIDDEN * FFN) + 2 * HIDDEN * lengths * lengths)


@dataclass
class Step:
    """One step's work: every unit (a sequence, or a pack) with its rank and what it costs."""

    rank: np.ndarray  # [units] who trains it
    tokens: np.ndarray  # [units]
    attention: np.ndarray  # [units] sum of L^2 over its sequences
    flops: np.ndarray  # [units]
    row_len: np.ndarray  # [ranks] the row length the rank's kernel runs at
    rows: np.ndarray  # [ranks] rows per rank
    sequences: int = 0  # trained by all ranks


@dataclass(frozen=True)
class Packing:
    """How the trainer packs (balance.pack_sequences, pack_window, pack_average); `sequences=None`:
    no limit per pack, and --batch counts sequences to be carried by packs."""

    sequences: int | None = None
    window: int = 1024
    average: float | None = None


def simulate(strategy: str, ranks: int, batch: int, group: int, steps: int, seed: int, counts: np.ndarray,
             snake: bool = True, packing: Packing = Packing()) -> Result:
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r} (choose from {', '.join(STRATEGIES)})")
    if ranks % group:
        raise ValueError(f"--group {group} must divide --ranks {ranks}")
    rng = np.random.default_rng(seed)
    source = LengthSource(counts)
    quotas = quotas_from_counts(source.bin_share, batch)
    pool = PackPool(source, rng, packing) if strategy == "packed" else None
    ratios = {k: [] for k in ("tokens", "attention", "flops")}
    padding, mean_tokens, sequences = [], [], []
    for _ in range(steps):
        step = assign(strategy, source, rng, ranks, batch, group, quotas, pool, snake)
        sequences.append(step.sequences)
        for key in ratios:
            per_rank = np.bincount(step.rank, weights=getattr(step, key), minlength=ranks)
            ratios[key].append(per_rank.max() / per_rank.mean())
        padding.append(1.0 - step.tokens.sum() / (step.rows * step.row_len).sum())
        mean_tokens.append(step.tokens.sum() / ranks)
    per_rank = batch if pool is None else pool.packs_per_rank(batch) * pool.mean_sequences
    exchanged = {"global-exchange": ranks, "group-exchange": group, "packed": group}.get(strategy, 1)
    nominal = ranks * batch * packing.average if pool is not None and packing.sequences and packing.average else None
    return Result(
        strategy=strategy, ranks=ranks, batch=batch, group=group, steps=steps, seed=seed,
        max_over_mean_tokens=float(np.mean(ratios["tokens"])),
        max_over_mean_attention=float(np.mean(ratios["attention"])),
        max_over_mean_flops=float(np.mean(ratios["flops"])),
        padding_share=float(np.mean(padding)),
        exchange_bytes_per_step=int(round((exchanged - 1) * per_rank * ROW_BYTES)),
        mean_tokens_per_rank=float(np.mean(mean_tokens)),
        snake=snake,
        sequences_per_step=float(np.mean(sequences)),
        sequences_per_pack=None if pool is None else pool.mean_sequences,
        pack_sequences=None if pool is None else packing.sequences,
        nominal_sequences_per_step=nominal,
    )


def assign(strategy, source, rng, ranks, batch, group, quotas, pool, snake: bool = True) -> Step:
    if strategy == "packed":
        return assign_packs(pool, rng, ranks, batch, group, snake)
    if strategy in ("random", "global-exchange"):
        lengths = source.draw(rng, ranks * batch).reshape(ranks, batch)
    else:
        lengths = source.draw_stratified(rng, ranks, quotas)
    if strategy == "global-exchange":
        rank = deal_members(lengths.reshape(1, -1), ranks, snake=snake).reshape(-1)
    elif strategy == "group-exchange":
        pooled = lengths.reshape(ranks // group, group * batch)
        rank = (deal_members(pooled, group, snake=snake) + np.arange(0, ranks, group)[:, None]).reshape(-1)
    else:
        rank = np.repeat(np.arange(ranks), batch)
    flat = lengths.reshape(-1).astype(np.float64)
    longest = np.zeros(ranks)
    np.maximum.at(longest, rank, flat)
    return Step(rank=rank, tokens=flat, attention=flat**2, flops=flops(flat), row_len=longest,
                rows=np.bincount(rank, minlength=ranks), sequences=len(flat))


class PackPool:
    """Packs as the trainer makes them: `pack_sequences` over windows of `packing.window` sequences
    (at least 32,768 sequences in all, so that the pool's mix is the histogram's)."""

    def __init__(self, source: LengthSource, rng, packing: Packing):
        self.packing = packing
        packs = []
        for _ in range(max(1, -(-32768 // packing.window))):
            lengths = source.draw(rng, packing.window)
            packs.extend([lengths[i] for i in pack_sequences(lengths, CAPACITY, packing.sequences)])
        self.tokens = np.array([p.sum() for p in packs], dtype=np.float64)
        self.attention = np.array([(p.astype(np.float64) ** 2).sum() for p in packs])
        self.flops = np.array([flops(p).sum() for p in packs])
        self.sequences = np.array([len(p) for p in packs])
        self.mean_sequences = float(self.sequences.mean())

    def packs_per_rank(self, batch: int) -> int:
        """With a per-pack limit `batch` is packs (the trainer's batch_size); without, the packs that
        carry about as many sequences as `batch` unpacked ones."""
        return batch if self.packing.sequences else max(1, round(batch / self.mean_sequences))


def assign_packs(pool: PackPool, rng, ranks: int, batch: int, group: int, snake: bool = True) -> Step:
    per_rank = pool.packs_per_rank(batch)
    drawn = rng.integers(0, len(pool.tokens), size=ranks * per_rank)
    tokens = pool.tokens[drawn].reshape(ranks // group, group * per_rank)
    rank = (deal_members(tokens, group, snake=snake) + np.arange(0, ranks, group)[:, None]).reshape(-1)
    return Step(rank=rank, tokens=pool.tokens[drawn], attention=pool.attention[drawn], flops=pool.flops[drawn],
                row_len=np.full(ranks, CAPACITY, dtype=np.float64), rows=np.full(ranks, per_rank),
                sequences=int(pool.sequences[drawn].sum()))


def lengths_histogram(dataset: str | None) -> tuple[np.ndarray, str]:
    """The real Wikipedia histogram, or the lengths of a prepared dataset's shards."""
    if not dataset:
        return wikipedia_histogram()[1], "Wikipedia histogram (16.28 M sequences)"
    from trainer.data.dataset import training_files
    from trainer.data.layout import Shard

    counts = np.zeros(CAPACITY, dtype=np.int64)
    for f in training_files(dataset):
        lengths = Shard(f).lengths
        counts += np.bincount(np.clip(lengths, 1, CAPACITY) - 1, minlength=CAPACITY)[:CAPACITY]
    return counts, f"{dataset} ({counts.sum()} sequences)"


def plot(results: list[Result], source: str, seed: int, counts: np.ndarray, path: Path, packing: Packing) -> Path:
    """Per-rank load (tokens / mean) of one step, for each strategy, busiest rank first."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    for r in results:
        rng = np.random.default_rng(seed)
        src = LengthSource(counts)
        quotas = quotas_from_counts(src.bin_share, r.batch)
        pool = PackPool(src, rng, packing) if r.strategy == "packed" else None
        step = assign(r.strategy, src, rng, r.ranks, r.batch, r.group, quotas, pool, r.snake)
        load = np.sort(np.bincount(step.rank, weights=step.tokens, minlength=r.ranks))[::-1]
        ax.plot(np.arange(1, r.ranks + 1), load / load.mean(), label=f"{r.strategy} (max/mean {r.max_over_mean_tokens:.3f})")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("rank, busiest first")
    ax.set_ylabel("tokens / mean tokens (one step)")
    ax.set_title(f"Per-rank load, {results[0].ranks} ranks x {results[0].batch} sequences, group {results[0].group}\n{source}")
    ax.legend()
    fig.tight_layout()
    # written beside it, then renamed: a full disk or a place that takes no file leaves no half-written PNG
    partial = path.with_name(f".{path.name}.partial")
    try:
        fig.savefig(partial, dpi=120, format="png")
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        raise
    finally:
        plt.close(fig)
    return path


# Bounds: the largest MLPerf Training systems have about 10,000 accelerators (65,536 leaves room); a
# per-rank batch beyond 4,096 sequences fits no accelerator at length 512; every step draws
# ranks x batch lengths, and 100 million of them take about 20 s of CPU per strategy (measured),
# where `--ranks 100000000` used to run until memory ran out.
MAX_RANKS, MAX_BATCH, MAX_STEPS, MAX_DRAWS = 65_536, 4_096, 100_000, 100_000_000


EXAMPLES = """examples:
  bertctl balance --ranks 1024 --batch 16 --group 8
  bertctl balance --cluster nvidia_dgxh100_1x8"""


def argument_parser() -> argparse.ArgumentParser:
    """`bertctl balance`'s options (the CLI hands them here untouched; `--cluster C [-o K=V]` it fills in first)."""
    parser = argparse.ArgumentParser(
        prog="bertctl balance", epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Simulate how evenly ranks are loaded, strategy by strategy, on the real Wikipedia length\n"
                    "histogram, with the trainer's own balancing code. Instead of the settings below,\n"
                    "--cluster C [-o KEY=VALUE ...] takes a cluster file's own.")
    parser.add_argument("--ranks", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True, help="sequences (or packs) per rank per step")
    parser.add_argument("--group", type=int, default=8, help="ranks per exchange group (a node)")
    parser.add_argument("--strategy", choices=STRATEGIES + ("all",), default="all")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--snake", action=argparse.BooleanOptionalAction, default=True,
                        help="deal sorted units in snake order (balance.snake; default) or round-robin")
    parser.add_argument("--pack-sequences", type=int, help="packed: at most this many sequences per pack "
                        "(balance.pack_sequences); --batch then counts packs per rank")
    parser.add_argument("--pack-window", type=int, default=1024, help="packed: sequences packed together (balance.pack_window)")
    parser.add_argument("--pack-average", type=float, help="packed: the nominal sequences per pack (balance.pack_average)")
    parser.add_argument("--label", help="what the settings are (bertctl balance --cluster names the cluster)")
    parser.add_argument("--lengths-from", help="a prepared dataset folder instead of the Wikipedia histogram")
    parser.add_argument("--json", action="store_true", help="JSON on stdout instead of the table")
    parser.add_argument("--plot", help="write the per-rank load distribution to this PNG")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = argument_parser().parse_args(argv)
    for name, value, most in (("--ranks", args.ranks, MAX_RANKS), ("--batch", args.batch, MAX_BATCH),
                              ("--group", args.group, MAX_RANKS), ("--steps", args.steps, MAX_STEPS),
                              ("--pack-sequences", 1 if args.pack_sequences is None else args.pack_sequences, MAX_BATCH),
                              ("--pack-window", args.pack_window, MAX_DRAWS)):
        if not 1 <= value <= most:
            return _bad(f"{name} must be 1..{most:,}, got {value}")
    if problem := pack_average_problem(args.pack_average, args.pack_sequences):
        return _bad(problem)
    if problem := plot_path_problem(args.plot):
        return _bad(problem)
    if args.ranks * args.batch * args.steps > MAX_DRAWS:
        return _bad(f"--ranks x --batch x --steps must be at most {MAX_DRAWS:,} sequences (fewer --steps)")
    if not 0 <= args.seed < 2**63:
        return _bad(f"--seed must be 0..2^63-1, got {args.seed}")
    if args.ranks % args.group:
        return _bad(f"--group {args.group} must divide --ranks {args.ranks}")
    try:
        counts, source = lengths_histogram(args.lengths_from)
    except Exception as e:  # a missing folder or unreadable shard is the user's input
        return _bad(str(e))
    if args.pack_sequences is not None and len(counts) > CAPACITY and counts[CAPACITY:].any():
        return _bad(f"{source} has sequences longer than a pack's {CAPACITY} tokens")
    packing = Packing(args.pack_sequences, args.pack_window, args.pack_average)
    strategies = STRATEGIES if args.strategy == "all" else (args.strategy,)
    results = [simulate(s, args.ranks, args.batch, args.group, args.steps, args.seed, counts, args.snake, packing)
               for s in strategies]
    if args.json:
        payload = asdict(results[0]) if len(results) == 1 else {"results": [asdict(r) for r in results]}
        print(json.dumps({**payload, "lengths": source, **({"settings": args.label} if args.label else {})}))
    else:
        print_table(results, source, args.label)
    if args.plot:
        try:
            written = plot(results, source, args.seed, counts, Path(args.plot), packing)
        except OSError as e:
            return _bad(f"--plot {args.plot}: cannot write: {e.strerror or e}")
        print(written, file=sys.stderr if args.json else sys.stdout)
    return 0


def pack_average_problem(average: float | None, most: int | None) -> str | None:
    """--pack-average: a finite number of sequences from 1 (a pack holds one or more) to --pack-sequences."""
    if average is None:
        return None
    if not (math.isfinite(average) and 1 <= average <= (most or MAX_BATCH)):
        return f"--pack-average must be a number of sequences per pack from 1 to {most or MAX_BATCH}, got {average}"
    return None


def plot_path_problem(path: str | None) -> str | None:
    """--plot names the PNG file to write: not a folder (matplotlib would write FOLDER.png beside it)."""
    if path is None:
        return None
    if not path.strip() or Path(path).is_dir() or path.endswith(os.sep):
        return f"--plot {path!r}: expected the path of a PNG file to write, not a folder"
    probe = Path(path).with_name(f".{Path(path).name}.partial")
    try:  # before the simulation: a place that takes no file is refused at once
        probe.open("wb").close()
        probe.unlink()
    except OSError as e:
        return f"--plot {path}: cannot write: {e.strerror or e}"
    return None


def print_table(results: list[Result], source: str, label: str | None = None) -> None:
    r0 = results[0]
    if label:
        print(label)
    deal = "snake" if r0.snake else "round-robin"
    print(f"{r0.ranks} ranks x {r0.batch} per rank, exchange group {r0.group} ({deal}), {r0.steps} steps, seed {r0.seed}; {source}")
    print(f"{'strategy':<16} {'max/mean tok':>12} {'max/mean attn':>13} {'max/mean flops':>14} {'padding':>8} {'exchange/step':>14}")
    for r in results:
        print(f"{r.strategy:<16} {r.max_over_mean_tokens:>12.3f} {r.max_over_mean_attention:>13.3f} "
              f"{r.max_over_mean_flops:>14.3f} {r.padding_share:>8.1%} {_bytes(r.exchange_bytes_per_step):>14}")
    for r in results:
        if r.sequences_per_pack is not None:
            most = f"at most {r.pack_sequences}" if r.pack_sequences else "no limit"
            nominal = f" (nominal {r.nominal_sequences_per_step:g})" if r.nominal_sequences_per_step else ""
            print(f"packed ({most} per pack): {r.sequences_per_pack:.3f} sequences per pack, "
                  f"{r.sequences_per_step:.1f} sequences per step{nominal}")


def _bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def _bad(message: str) -> int:
    print(f"bertctl balance: error: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
