"""The time-to-train model (orchestrator/predict.py) against published MLPerf Training v1.1 BERT scores.

    python benchmarks/predict_vs_published.py

For each system: its logged throughput (the time between successive evals, steps and eval together)
and overhead (the first interval's warm-up, the tail after the last eval), the RCP's mean samples to
converge for its global batch (ruleset 1.1.0, as compliance-check interpolates them), and the
prediction against the published score (the olympic mean of run_stop - run_start over its 10 runs, as
compliance-check computes it). "conv." is how many more samples the runs trained than the RCP mean:
the model's miss from convergence alone. The logs are tests/data (published trees from
github.com/mlcommons/training_results_v1.1; NVIDIA's kept as .tar.gz, each log whole).
"""

from __future__ import annotations

import json
import platform
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator import predict, resultset  # noqa: E402

DATA = ROOT / "tests" / "data"
RULESET = "1.1.0"
TARGET = 0.10
# (system, where its tree is: a folder, or a .tar.gz of ORG/{results,systems})
SYSTEMS = [
    ("Inspur nf5688m6", DATA / "mlperf-results" / "v1.1" / "Inspur"),
    ("GIGABYTE G492-ID0", DATA / "mlperf-results" / "v1.1" / "GIGABYTE"),
    ("NVIDIA dgxa100", DATA / "mlperf-published" / "v1.1" / "NVIDIA" / "dgxa100_ngc21.09_pytorch.tar.gz"),
    ("NVIDIA dgxa100_n8", DATA / "mlperf-published" / "v1.1" / "NVIDIA" / "dgxa100_n8_ngc21.09_pytorch.tar.gz"),
    ("NVIDIA dgxa100_n128", DATA / "mlperf-published" / "v1.1" / "NVIDIA" / "dgxa100_n128_ngc21.09_pytorch.tar.gz"),
    ("NVIDIA dgxa100_n540", DATA / "mlperf-published" / "v1.1" / "NVIDIA" / "dgxa100_n540_ngc21.09_pytorch.tar.gz"),
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


def check(source: Path, scratch: Path) -> tuple[int, predict.PublishedCheck]:
    root = tree(source, scratch)
    return accelerators(root), predict.from_published(resultset.from_directory(root), RULESET)


def main() -> None:
    print(f"machine: {platform.machine()}, python {platform.python_version()}; RCP ruleset {RULESET}; "
          f"target: prediction within {TARGET:.0%} of the published score")
    header = (f"{'system':20s} {'accel.':>6s} {'GBS':>6s} {'RCP samples':>12s} {'evals pred/logged':>17s} "
              f"{'interval s':>10s} {'overhead s':>10s} {'predicted':>9s} {'published':>9s} {'error':>7s} {'conv.':>7s}")
    print(header)
    with tempfile.TemporaryDirectory() as scratch:
        for name, source in SYSTEMS:
            count, c = check(source, Path(scratch))
            p = c.prediction
            flag = "" if abs(c.error) <= TARGET else "  MISS"
            print(f"{name:20s} {count:6d} {c.global_batch:6d} {p.rcp.samples:12,.0f} {p.evals:8.2f}/{c.logged_evals:<8.2f} "
                  f"{p.interval_s:10.2f} {p.overhead_s:10.2f} {p.minutes:9.3f} {c.score_minutes:9.3f} "
                  f"{c.error:+7.1%} {c.convergence_miss:+7.1%}{flag}")


if __name__ == "__main__":
    main()
