"""The time-to-train model (orchestrator/checks/predict.py) against published MLPerf Training v1.1 BERT scores.

    python benchmarks/predict_vs_published.py              # the systems kept in tests/data
    python benchmarks/predict_vs_published.py --tree DIR   # every BERT system of a training_results_v1.1 checkout

For each system: its logged throughput (the time between successive evals, steps and eval together)
and overhead (the first interval's warm-up, the tail after the last eval), the RCP's mean samples to
converge for its global batch (ruleset 1.1.0, as compliance-check interpolates them), and the
prediction against the published score (the olympic mean of run_stop - run_start over its 10 runs, as
compliance-check computes it). "conv." is how many more samples the runs trained than the RCP mean:
the model's miss from convergence alone. Then, where a log times its training blocks (block_start ..
block_stop, the eval in the gap to the next block), preflight's eval-time assumption (the eval set over
all ranks, forward only at 1/3 of a training sample's compute) against the logged gap. The logs are tests/data (published trees from
github.com/mlcommons/training_results_v1.1; those in tests/data/mlperf-published kept as .tar.gz, each
log whole).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.checks import predict  # noqa: E402
from orchestrator.errors import UserError  # noqa: E402
from orchestrator.results import compliance, resultset  # noqa: E402

DATA = ROOT / "tests" / "data"
RULESET = "1.1.0"  # the round of the systems kept in tests/data; --tree takes the round from its path
TARGET = 0.10
# (system, where its tree is: a folder, or a .tar.gz of ORG/{results,systems})
SYSTEMS = [
    ("Inspur nf5688m6", DATA / "mlperf-results" / "v1.1" / "Inspur"),
    ("GIGABYTE G492-ID0", DATA / "mlperf-results" / "v1.1" / "GIGABYTE"),
    ("NVIDIA dgxa100", DATA / "mlperf-published" / "v1.1" / "NVIDIA" / "dgxa100_ngc21.09_pytorch.tar.gz"),
    ("NVIDIA dgxa100_n8", DATA / "mlperf-published" / "v1.1" / "NVIDIA" / "dgxa100_n8_ngc21.09_pytorch.tar.gz"),
    ("NVIDIA dgxa100_n128", DATA / "mlperf-published" / "v1.1" / "NVIDIA" / "dgxa100_n128_ngc21.09_pytorch.tar.gz"),
    ("NVIDIA dgxa100_n540", DATA / "mlperf-published" / "v1.1" / "NVIDIA" / "dgxa100_n540_ngc21.09_pytorch.tar.gz"),
    ("Habana HLS-1H-N16", DATA / "mlperf-published" / "v1.1" / "Intel-HabanaLabs" / "HLS-1H-N16.tar.gz"),
    ("Graphcore pod128", DATA / "mlperf-published" / "v1.1" / "Graphcore" / "ipu-pod128-POPART-closed.tar.gz"),
]


def tree(source: Path, scratch: Path) -> Path:
    """The result tree: the folder itself, or the archive unpacked under `scratch`."""
    if source.is_dir():
        return source
    target = scratch / source.name.removesuffix(".tar.gz")
    with tarfile.open(source) as archive:
        archive.extractall(target, filter="data")
    return target


def accelerators(root: Path) -> int:
    (system,) = sorted(root.glob("systems/*.json"))
    data = json.loads(system.read_text())
    return int(data["number_of_nodes"]) * int(data["accelerators_per_node"])


def every_system(checkout: Path) -> list[tuple[str, Path]]:
    """ORG/results/SYSTEM for every BERT result set of a training_results checkout."""
    return [(f"{b.parent.parent.parent.name} {b.parent.name}", b.parent.parent.parent)
            for b in sorted(checkout.glob("*/results/*/bert")) if any(b.glob("result_*.txt"))]


def accelerators_of(root: Path, system: str) -> int:
    data = json.loads((root / "systems" / f"{system}.json").read_text())
    return int(data["number_of_nodes"]) * int(data["accelerators_per_node"])


def row(name: str, count: int, c: predict.PublishedCheck, division: str | None) -> str:
    p = c.prediction
    if c.error is None:  # a set without a score: nothing to compare the prediction with
        return f"{name[:40]:40s} {count:6d} {c.global_batch:6d} predicted {p.minutes:9.3f}, no published score"
    flag = "" if abs(c.error) <= TARGET else "  MISS"
    note = "" if division in (None, "closed") else f"  ({division} division)"
    return (f"{name[:40]:40s} {count:6d} {c.global_batch:6d} {p.rcp.samples:12,.0f} {p.evals:8.2f}/{c.logged_evals:<8.2f} "
            f"{p.interval_s:10.2f} {p.overhead_s:10.2f} {p.minutes:9.3f} {c.score_minutes:9.3f} "
            f"{c.error:+7.1%} {c.convergence_miss:+7.1%}{flag}{note}")


def eval_check(name: str, count: int, rs) -> str | None:
    """The eval-time assumption against a log's timed gaps between blocks (the median over runs)."""
    logged, estimated, intervals = [], [], []
    for s in rs.summaries:
        blocks = [b for b in s.blocks if b.stop_ms is not None][1:]  # the first block holds the warm-up
        if len(blocks) < 3 or not s.samples_to_converge:
            continue
        cadence = s.samples_to_converge / len(s.eval_times_ms)
        training_s = statistics.median(b.stop_ms - b.start_ms for b in blocks) / 1000
        compute_s = training_s / (cadence / s.global_batch_size)
        estimated.append(predict.eval_time(compute_s, s.global_batch_size / count, 10_000, count))
        logged.append(statistics.median(b.start_ms - a.stop_ms for a, b in zip(blocks, blocks[1:])) / 1000)
        intervals.append(training_s + logged[-1])
    if not logged:
        return None
    gap, guess = statistics.median(logged), statistics.median(estimated)
    return (f"{name[:40]:40s} {count:6d}  eval logged {gap:6.2f} s, estimated {guess:6.2f} s "
            f"({guess / gap:.2f}x): {(guess - gap) / statistics.median(intervals):+.1%} of an interval")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tree", type=Path, help="a checkout of github.com/mlcommons/training_results_vX.Y")
    parser.add_argument("--ruleset", help="the round's ruleset (default: from the --tree path, else 1.1.0)")
    args = parser.parse_args(argv)
    ruleset = args.ruleset or (args.tree and compliance.ruleset_from_path(args.tree)) or RULESET
    print(f"machine: {platform.machine()}, python {platform.python_version()}; RCP ruleset {ruleset}; "
          f"target: prediction within {TARGET:.0%} of the published score")
    print(f"{'system':40s} {'accel.':>6s} {'GBS':>6s} {'RCP samples':>12s} {'evals pred/logged':>17s} "
          f"{'interval s':>10s} {'overhead s':>10s} {'predicted':>9s} {'published':>9s} {'error':>7s} {'conv.':>7s}")
    checks = []
    with tempfile.TemporaryDirectory() as scratch:
        for name, source in (every_system(args.tree) if args.tree else SYSTEMS):
            root = tree(source, Path(scratch))
            system = name.split()[-1] if args.tree else None
            try:
                rs = resultset.from_directory(root / "results" / system if system else root)
                c = predict.from_published(rs, ruleset)
            except (predict.NoPrediction, UserError) as why:
                print(f"{name[:40]:40s} no prediction: {why}")
                continue
            count = accelerators_of(root, system) if system else accelerators(root)
            print(row(name, count, c, rs.division))
            checks.append(eval_check(name, count, rs))
    print("\npreflight's eval time (forward only, 1/3 of a training sample's compute) where the logs time it:")
    for line in filter(None, checks):
        print(line)


if __name__ == "__main__":
    main()
