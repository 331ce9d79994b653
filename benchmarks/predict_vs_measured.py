"""Preflight's time-to-train prediction against runs it did not read, on this machine.

    python benchmarks/predict_vs_measured.py --cluster local --nexp 3
    python benchmarks/predict_vs_measured.py --cluster ci_slurm --nexp 3      # the CI's real Slurm
    python benchmarks/predict_vs_measured.py --cluster local --nexp 3 -o prepare.phase1=null \
        -o run.train.init_checkpoint=null -o run.train.target_accuracy=0.99 -o run.train.max_samples_termination=480 \
        -o run.train.eval_every_samples=160 -o run.train.eval_start_samples=160 -o run.data.eval_samples=100
        # short runs that train their whole budget (the target is out of reach): the samples term is
        # then known beforehand, and the check is of the speed terms (what a loaded machine affords)

In the $BERTCTL_HOME it is given (default: the user's), it runs `bertctl preflight --cluster C --json`,
then `bertctl submit --cluster C --nexp N --follow` (the same recipe), and sets the prediction beside
what the runs' own logs measured, term by term:
- step: the prediction's step (compute, exposed all-reduce; or the mean of preflight's synchronous
  steps when longer) against the steady step of the logs (blocks after the first: block_start..block_stop over
  their steps), and the trainer's own compute estimate (metrics: rank_compute_s, 3x the forward);
- eval: the prediction's eval (preflight's whole evaluation with the run's evaluator) against
  block_stop..eval_stop of each evaluation;
- start-up: preflight's first step beyond a steady step against the first block's time beyond its steady steps plus the
  tail after the last eval;
- evaluations: the prediction's samples to converge / eval interval against the runs' evals;
- minutes: the prediction against each run's run_start..run_stop and their mean.
Where no RCP applies (the small local models), the samples to converge come from this recipe's earlier
converged runs in the same $BERTCTL_HOME (the first invocation has none: the budget, an upper bound,
and it says so), so run it twice: the second prediction is checked against runs it had not seen.
The machine may be shared: the load average is printed before and after; timings are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.results import resultlog  # noqa: E402


def bertctl(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout, env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})


def measured_run(result: Path, metrics: Path, global_batch: int) -> dict:
    """One run's terms from its MLPerf log (and the trainer's metrics for its compute estimate)."""
    events = resultlog.parse(result).events
    first = {e.key: e.time_ms for e in reversed(events)}
    last = {e.key: e.time_ms for e in events}
    blocks = []
    open_block = None
    for e in events:
        if e.key == "block_start":
            open_block = e
        elif e.key == "block_stop" and open_block is not None:
            steps = (e.metadata["samples_count"] - e.metadata["first_epoch_num"]) / global_batch
            blocks.append({"start": open_block.time_ms, "stop": e.time_ms, "steps": steps})
            open_block = None
    stops = [e.time_ms for e in events if e.key == "block_stop"]
    evals = [e.time_ms for e in events if e.key == "eval_stop"]
    eval_s = [(ev - st) / 1000 for st, ev in zip(stops, evals)]
    steady = [(b["stop"] - b["start"]) / 1000 / b["steps"] for b in blocks[1:] if b["steps"]] or \
             [(b["stop"] - b["start"]) / 1000 / b["steps"] for b in blocks if b["steps"]]
    step_s = statistics.median(steady)
    startup_s = ((blocks[0]["stop"] - first["run_start"]) / 1000 - blocks[0]["steps"] * step_s
                 + (last["run_stop"] - evals[-1]) / 1000)
    records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    compute = sum(max(r["rank_compute_s"]) for r in records if r.get("rank_compute_s"))
    trained_steps = records[-1]["samples"] / global_batch if records else 0
    return {"minutes": (last["run_stop"] - first["run_start"]) / 60000, "evals": len(evals), "step_s": step_s,
            "compute_s": compute / trained_steps if trained_steps else None, "eval_s": statistics.mean(eval_s),
            "startup_s": startup_s, "samples": max((e.metadata.get("epoch_num", 0) for e in events if e.key == "eval_accuracy"),
                                                   default=0)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", default="local")
    parser.add_argument("--nexp", type=int, default=3)
    parser.add_argument("-o", dest="override", action="append", default=[], metavar="KEY=VALUE",
                        help="the same override for the preflight and the runs")
    parser.add_argument("--again", nargs=2, metavar=("PREFLIGHT_EXP", "RUNS_EXP"),
                        help="no new jobs: the report again from a finished preflight and training experiment")
    args = parser.parse_args(argv)
    if args.again:
        preflight_dir, runs_dir = (Path(d) for d in args.again)
        predicted = json.loads((preflight_dir / "preflight.json").read_text())["time_to_train"]
        report_experiment(predicted, runs_dir)
        return 0
    import torch

    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}, torch {torch.__version__}; "
          f"load average before: {os.getloadavg()[0]:.1f} (shared machine: timings are noisy)")
    started = time.time()
    overrides = [w for o in args.override for w in ("-o", o)]
    print(f"cluster {args.cluster}, overrides: {' '.join(overrides) or 'none'}")
    pre = bertctl("preflight", "--cluster", args.cluster, *overrides, "--json", timeout=1800)
    if pre.returncode != 0:
        print(f"preflight failed ({pre.returncode}): {pre.stderr[-2000:]}")
        return 1
    predicted = json.loads(pre.stdout)["time_to_train"]
    print(f"preflight: {time.time() - started:.0f} s; load average after it: {os.getloadavg()[0]:.1f}")
    run = bertctl("submit", "--cluster", args.cluster, *overrides, "--nexp", str(args.nexp), "--follow", timeout=7200)
    print(f"submit --nexp {args.nexp}: exit {run.returncode}; load average after: {os.getloadavg()[0]:.1f}")
    home = Path(os.environ.get("BERTCTL_HOME", "~/.bertctl")).expanduser()
    exp = max((home / "experiments").iterdir(), key=lambda p: p.stat().st_mtime)
    report_experiment(predicted, exp)
    return 0


def finished(result: Path) -> bool:
    return result.is_file() and resultlog.parse(result).has_run_stop


def report_experiment(predicted: dict, exp: Path) -> None:
    import yaml

    gbs = yaml.safe_load((exp / "run.yaml").read_text())["train"]["global_batch_size"]
    nexp = json.loads((exp / "experiment.json").read_text())["nexp"]
    runs = [measured_run(exp / "results" / f"result_{i}.txt", exp / "metrics" / f"run_{i}.jsonl", gbs)
            for i in range(nexp) if finished(exp / "results" / f"result_{i}.txt")]
    report(predicted, runs, exp.name)


def report(p: dict, runs: list[dict], exp: str) -> None:
    d = p["detail"]
    mean = {k: statistics.mean(r[k] for r in runs if r[k] is not None) for k in runs[0] if any(r[k] is not None for r in runs)}
    print(f"experiment {exp}: {len(runs)} runs")
    print(f"samples to converge, predicted: {p['rcp']['samples']:,.0f} ({p['rcp']['how']}); "
          f"the runs: {', '.join(str(r['samples']) for r in runs)}")
    rows = [
        ("compute per step (s)", d["compute_s"], mean.get("compute_s"), "trainer's estimate: 3x forward"),
        ("exposed all-reduce (s)", d["allreduce_exposed_s"], None, "not separable in the log (part of the step)"),
        ("step (s)", p["step_s"], mean["step_s"], "steady blocks, data and optimizer included"),
        ("eval (s)", p["eval_s"], mean["eval_s"], "block_stop..eval_stop"),
        ("start-up (s)", p["overhead_s"], mean["startup_s"], "first block beyond its steady steps + tail"),
        ("evaluations", p["evals"], mean["evals"], ""),
        ("minutes", p["minutes"], mean["minutes"], "run_start..run_stop, mean of the runs"),
    ]
    print(f"{'term':<24} {'predicted':>10} {'measured':>10} {'error':>8}  how measured")
    for name, predicted, measured, how in rows:
        error = f"{predicted / measured - 1:+.1%}" if measured else "-"
        shown = f"{measured:10.3f}" if measured is not None else f"{'-':>10}"
        print(f"{name:<24} {predicted:10.3f} {shown} {error:>8}  {how}")
    print("per run minutes: " + ", ".join(f"{r['minutes']:.2f}" for r in runs))
    # the speed model alone: the same prediction with the samples these runs needed (not held out: the
    # convergence term is read from them, so this row checks step, eval and start-up only)
    given = (p["overhead_s"] + mean["samples"] / p["interval_samples"] * p["interval_s"]) / 60
    print(f"minutes, with the runs' own mean samples ({mean['samples']:,.0f}): {given:.3f} predicted, "
          f"{given / mean['minutes'] - 1:+.1%} (speed terms only, not a held-out check)")
    within = abs(p["minutes"] / mean["minutes"] - 1) <= 0.15
    print(f"prediction {'within' if within else 'NOT within'} 15 % of the mean measured time")


if __name__ == "__main__":
    raise SystemExit(main())
