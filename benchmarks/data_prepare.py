"""Data preparation on this machine: text -> HDF5 throughput per worker, 1 -> 2 worker speed-up,
and how long `bertctl data prepare --dataset sample` takes.

    python benchmarks/data_prepare.py [--repeat 2]

1. builds the sample dataset from scratch with `bertctl data prepare --dataset sample` (all stages,
   one worker per core) and times it, then times the second call (which finds it complete);
2. re-runs only the examples stage (text part -> tokenize -> sentence pairs -> masking -> HDF5, for
   the phase-1 and phase-2 outputs and the eval split: 9 tasks) on 1 and on 2 worker processes, as
   bertctl's local runner does it (long-lived workers, one task at a time each), `--repeat` times
   each, best time kept. Tokens/s counts the input tokens tokenized and the tokens of the samples
   written (the dupe factor and the two outputs make the second ~12x larger); the time includes
   starting the workers (~0.4 s: numpy, h5py, tokenizers, pydantic);
3. prints the dataset's sizes (samples per bin, phase-1 samples, eval samples, corpus MB).

Everything runs in a temporary $BERTCTL_HOME. Workers are single-threaded (TOKENIZERS_PARALLELISM=false).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def bertctl(*args: str, home: Path) -> tuple[float, subprocess.CompletedProcess]:
    env = {**os.environ, "BERTCTL_HOME": str(home)}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"bertctl {' '.join(args)} failed:\n{proc.stderr}")
    return time.perf_counter() - t0, proc


class Reports:
    """A silent progress display that keeps the tasks' reports."""

    def __init__(self):
        self.reports: list[dict] = []

    def begin(self, stage, total):
        pass

    def advance(self, stage, reports):
        self.reports += reports

    def end(self, stage):
        pass


def examples_stage(manifest: Path, tasks: int, workers: int) -> tuple[float, list[dict]]:
    """Wall time of the examples stage on `workers` worker processes, exactly as bertctl runs it locally."""
    from orchestrator.data import run_stage_locally

    reports = Reports()
    t0 = time.perf_counter()
    run_stage_locally(manifest, "examples", tasks, workers, reports)
    return time.perf_counter() - t0, reports.reports


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    from orchestrator.data import load_manifest, write_manifest

    with tempfile.TemporaryDirectory(prefix="bertctl-bench-") as tmp:
        home = Path(tmp) / "home"
        build_s, proc = bertctl("data", "prepare", "--dataset", "sample", home=home)
        again_s, _ = bertctl("data", "prepare", "--dataset", "sample", home=home)
        root = Path(proc.stdout.strip())
        record = json.loads((root / "prepared.json").read_text())

        # the examples stage alone, on the corpus and vocabulary the build left
        os.environ["BERTCTL_HOME"] = str(home)
        loaded = load_manifest("sample", ["prepare.keep_work=true"])
        manifest = write_manifest(loaded, Path(tmp))
        subprocess.run([sys.executable, "-m", "trainer.data.prepare", "start", "--manifest", str(manifest), "--force"],
                       cwd=REPO, check=True, capture_output=True)
        subprocess.run([sys.executable, "-m", "trainer.data.prepare", "run", "--manifest", str(manifest),
                        "--stage", "corpus", "--group", "0"], cwd=REPO, check=True, capture_output=True)
        tasks = 9
        results = {}
        for workers in (1, 2):
            best = None
            for _ in range(args.repeat):
                shutil.rmtree(root / ".work" / "examples", ignore_errors=True)
                seconds, reports = examples_stage(manifest, tasks, workers)
                assert len(reports) == tasks and not any(r.get("skipped") for r in reports)
                if best is None or seconds < best[0]:
                    best = (seconds, reports)
            results[workers] = best

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    import h5py
    import numpy
    import tokenizers

    print(f"machine: {os.cpu_count()} cores, {cpu}; Python {platform.python_version()}, numpy {numpy.__version__}, "
          f"h5py {h5py.__version__}, tokenizers {tokenizers.__version__}")
    corpus = record["corpus"]
    print(f"sample corpus: {corpus['corpus_bytes'] / 1e6:.2f} MB of text, {corpus['documents']} documents "
          f"({corpus['eval_documents']} held out for eval), vocab {record['vocab']['tokens']} tokens")
    print(f"bertctl data prepare --dataset sample: {build_s:.1f} s from scratch, {again_s:.2f} s when complete")
    outputs = record["outputs"]
    hist = outputs["train"]["stats"]["length_histogram"]
    per_bin = [sum(hist[lo + 1:hi + 1]) for lo, hi in ((0, 128), (128, 256), (256, 384), (384, 512))]
    print(f"samples: train (512) {outputs['train']['samples']} = bins 128/256/384/512: {'/'.join(map(str, per_bin))}; "
          f"train_128 {outputs['train_128']['samples']}; eval {outputs['eval']['samples']}")
    for workers, (seconds, reports) in results.items():
        tokens_in = sum(r["input_tokens"] for r in reports)
        tokens_out = sum(r["output_tokens"] for r in reports)
        print(f"examples stage, {workers} worker(s): {seconds:.2f} s (best of {args.repeat}); "
              f"{tokens_in / seconds / workers:,.0f} input tokens/s per worker, "
              f"{tokens_out / seconds / workers:,.0f} written tokens/s per worker "
              f"({tokens_in:,} tokens in, {tokens_out:,} out)")
    print(f"speed-up 1 -> 2 workers: {results[1][0] / results[2][0]:.2f}x")


if __name__ == "__main__":
    main()
