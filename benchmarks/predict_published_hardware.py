"""Preflight's time-to-train model on published MLPerf BERT systems, from the hardware and the recipe only.

    python benchmarks/predict_published_hardware.py --repo v2.0=PATH --repo v2.1=PATH ... [--anchor]

Each PATH is a checkout or a bare clone of github.com/mlcommons/training_results_vX.Y (the `fetch` of
mlcommons/training_results_vX.Y gives one). For every closed-division BERT system on NVIDIA A100 or
H100, the prediction uses (orchestrator/checks/predict.py's model: step = compute + exposed all-reduce, an
eval every interval, the RCP's samples):
- compute: bertctl's own efficiency on an H100, the only GPU bertctl has run on (packed, compiled,
  bf16, BERT-large phase 2: 233.2 sequences/s on one H100 80GB HBM3, the GPU suite's stage e,
  2026-11-27) as a fraction of peak, applied to the system's GPU peak (dense bf16: H100 SXM 989,
  H100 PCIe 756, A100 312 TFLOP/s; vendor figures) at 0.479 TFLOP per sequence (bertctl's FLOP count on
  the Wikipedia length mix);
- all-reduce: the interconnect's bus bandwidth (nccl-tests figures: one node of 8 A100 over NVLink
  230 GB/s, of 8 H100 370 GB/s; across DGX A100 nodes 192, DGX H100 nodes 384; PCIe cards without
  NVLink 20 (A100, Gen4) and 40 (H100, Gen5) GB/s), fp32 gradients as bertctl's DDP reduces them;
- the recipe: the global batch the logs declare (a hyperparameter, `global_batch_size`), the eval
  interval by MLPerf's formula for that batch, 10,000 eval samples, the RCP mean samples to converge;
- start-up: none (not measured on these machines).
Nothing measured in the logs enters the prediction: not their throughput, eval times, or samples.
The published score (olympic mean of run_start..run_stop of the converged runs) is what is predicted.
`--anchor` adds the prediction at NVIDIA's own ~49 % MFU (performance-anchors: read from NVIDIA's
v3.0 H100 logs, so not independent of those rows): it shows how much of the miss is software speed.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.checks import predict  # noqa: E402
from trainer.config.run import mlperf_eval_interval  # noqa: E402

H100_MEASURED_SEQ_S = 233.2  # bertctl on one H100 SXM (stage e, packed compiled bf16, batch 32 packs)
H100_PEAK = 989.0
TFLOP_PER_SEQUENCE = 0.479
BERTCTL_MFU = H100_MEASURED_SEQ_S * TFLOP_PER_SEQUENCE / H100_PEAK
ANCHOR_MFU = 0.49
EVAL_SAMPLES = 10_000
RESULT = re.compile(r"^([^/]+)/results/([^/]+)/bert/result_\d+\.txt$")


def gpu(model: str) -> tuple[str, float] | None:
    """(kind, dense bf16 peak TFLOP/s) of an A100 or H100 by the system description's name."""
    name = model.upper()
    if "H100" in name and "GH200" not in name:
        return ("H100 PCIe", 756.0) if "PCI" in name else ("H100 SXM", 989.0)
    if "A100" in name:
        return ("A100 PCIe", 312.0) if "PCI" in name else ("A100 SXM", 312.0)
    return None


def busbw_gbs(kind: str, nodes: int) -> float:
    if "PCIe" in kind:
        return 40.0 if kind.startswith("H100") else 20.0
    if nodes > 1:
        return 384.0 if kind.startswith("H100") else 192.0
    return 370.0 if kind.startswith("H100") else 230.0


class Repo:
    """A training_results checkout or bare clone, read through git (no work tree needed)."""

    def __init__(self, path: Path):
        self.git = ["git", "--git-dir", str(path / ".git" if (path / ".git").exists() else path)]

    def files(self) -> list[str]:
        return subprocess.run([*self.git, "ls-tree", "-r", "--name-only", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.splitlines()

    def read(self, name: str) -> str:
        return subprocess.run([*self.git, "show", f"HEAD:{name}"], capture_output=True, text=True, errors="replace").stdout


def log_facts(text: str) -> dict:
    """run_start, run_stop (time and status) and the declared global batch of one result log."""
    facts: dict = {}
    for line in text.splitlines():
        if ":::MLLOG" not in line:
            continue
        try:
            event = json.loads(line.split(":::MLLOG", 1)[1])
        except ValueError:
            continue
        key = event.get("key")
        if key == "run_start":
            facts.setdefault("start", event["time_ms"])
        elif key == "run_stop":
            facts["stop"], facts["status"] = event["time_ms"], (event.get("metadata") or {}).get("status")
        elif key == "global_batch_size":
            facts["gbs"] = int(event["value"])
    return facts


def olympic_minutes(runs: list[dict]) -> float | None:
    """The olympic mean of the converged runs' minutes (BERT: drop the fastest and the slowest)."""
    minutes = sorted((r["stop"] - r["start"]) / 60000 for r in runs if r.get("status") == "success" and "stop" in r)
    if len(minutes) < 3:
        return None
    return statistics.mean(minutes[1:-1])


def predicted_minutes(kind: str, peak: float, gpus: int, nodes: int, gbs: int, ruleset: str, mfu: float) -> dict:
    per_gpu = mfu * peak / TFLOP_PER_SEQUENCE  # sequences/s
    compute_s = gbs / gpus / per_gpu
    algbw = busbw_gbs(kind, nodes) * gpus / (2 * (gpus - 1)) if gpus > 1 else math.inf
    parts = predict.step_time(compute_s, algbw, predict.GRADIENT_BYTES * predict.bert_parameters(large_model()))
    if gpus == 1:
        parts["step_s"] = compute_s
    eval_s = predict.eval_time(compute_s, gbs / gpus, EVAL_SAMPLES, gpus)
    interval = mlperf_eval_interval(gbs)
    rcp = predict.rcp_point(gbs, ruleset)
    p = predict.time_to_train(rcp, interval, predict.interval_steps(gbs, interval) * parts["step_s"] + eval_s)
    return {"minutes": p.minutes, "compute_s": compute_s, "exposed_s": parts["step_s"] - compute_s, "eval_s": eval_s,
            "evals": p.evals, "rcp": rcp.samples}


def large_model():
    from trainer.config import ModelConfig

    return ModelConfig()


def systems(round_name: str, repo: Repo) -> list[dict]:
    names = repo.files()
    found: dict[tuple[str, str], list[str]] = {}
    for name in names:
        m = RESULT.match(name)
        if m:
            found.setdefault(m.groups(), []).append(name)
    rows = []
    for (org, system), logs in sorted(found.items()):
        try:
            desc = json.loads(repo.read(f"{org}/systems/{system}.json"))
        except ValueError:
            continue
        card = gpu(str(desc.get("accelerator_model_name", "")))
        if desc.get("division") != "closed" or card is None:
            continue
        nodes, per_node = int(desc.get("number_of_nodes") or 1), int(desc.get("accelerators_per_node") or 0)
        runs = [log_facts(repo.read(log)) for log in logs]
        gbs = next((r["gbs"] for r in runs if "gbs" in r), None)
        score = olympic_minutes(runs)
        if not per_node or gbs is None or score is None:
            continue
        rows.append({"round": round_name, "system": f"{org}/{system}", "kind": card[0], "peak": card[1], "nodes": nodes,
                     "gpus": nodes * per_node, "gbs": gbs, "score": score})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", action="append", default=[], help="vX.Y=PATH of a training_results_vX.Y clone")
    parser.add_argument("--anchor", action="store_true", help="also predict at NVIDIA's ~49 %% MFU (not independent)")
    args = parser.parse_args(argv)
    print(f"bertctl's measured efficiency: {H100_MEASURED_SEQ_S} seq/s x {TFLOP_PER_SEQUENCE} TFLOP / {H100_PEAK} TFLOP/s "
          f"= {BERTCTL_MFU:.1%} of peak (one H100, GPU suite stage e, 2026-11-27)")
    header = f"{'round':<5} {'system':<58} {'GPU':<9} {'GPUs':>5} {'GBS':>5} {'score':>7} {'pred.':>7} {'error':>7}"
    print(header + ("  at 49 % MFU" if args.anchor else "") + "   compute/exposed/eval per interval (s)")
    errors: dict[str, list[float]] = {}  # by GPU kind and scale; "(anchor)" for the 49 % MFU column
    for spec in args.repo:
        version, _, path = spec.partition("=")
        ruleset = version.lstrip("v") + ".0"
        for row in systems(version, Repo(Path(path))):
            try:
                p = predicted_minutes(row["kind"], row["peak"], row["gpus"], row["nodes"], row["gbs"], ruleset, BERTCTL_MFU)
            except predict.NoPrediction as why:
                print(f"{version:<5} {row['system'][:58]:<58} no prediction: {why}")
                continue
            error = p["minutes"] / row["score"] - 1
            scale = "1 node" if row["nodes"] == 1 else ("2-8 nodes" if row["nodes"] <= 8 else "> 8 nodes")
            errors.setdefault(f"{row['kind']}, {scale}", []).append(error)
            steps = mlperf_eval_interval(row["gbs"]) / row["gbs"]
            line = (f"{version:<5} {row['system'][:58]:<58} {row['kind']:<9} {row['gpus']:>5} {row['gbs']:>5} "
                    f"{row['score']:7.2f} {p['minutes']:7.2f} {error:+7.0%}")
            if args.anchor:
                a = predicted_minutes(row["kind"], row["peak"], row["gpus"], row["nodes"], row["gbs"], ruleset, ANCHOR_MFU)
                line += f"  {a['minutes']:7.2f} {a['minutes'] / row['score'] - 1:+5.0%}"
                errors.setdefault(f"{row['kind']}, {scale} (at 49 % MFU)", []).append(a["minutes"] / row["score"] - 1)
            print(line + f"   {steps * p['compute_s']:.1f}/{steps * p['exposed_s']:.1f}/{p['eval_s']:.1f}")
    for kind, errs in sorted(errors.items()):
        print(f"{kind}: {len(errs)} systems, median error {statistics.median(errs):+.0%}, "
              f"range {min(errs):+.0%} .. {max(errs):+.0%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
