"""Stage b: the product end to end, as a user runs it: `bertctl submit --cluster local` on the embedded
sample dataset (prepared here, phase 1 included) with the run on the device, `--follow` to its end,
then `bertctl compliance-check` (the official MLPerf checker) on its log.

bertctl is run as `python -m orchestrator` with this Python: the GPU machine has no `bertctl` on its
PATH, and the local job's scripts run `$BERTCTL_PYTHON` (this Python, with the carried wheels on the
PYTHONPATH it inherits)."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from .children import run as run_child

# --quick (the CPU rehearsal): the same path at a fraction of the samples; the run stops at its
# sample limit below the target, so its log is compliant but it has not converged
QUICK_OVERRIDES = [f"-o{key}={value}" for key, value in {
    "prepare.phase1.train.max_samples_termination": 160, "prepare.phase1.optim.max_steps": 5,
    "prepare.phase1.train.eval_every_samples": 160, "prepare.phase1.data.eval_samples": 50,
    "run.train.max_samples_termination": 64, "run.train.eval_every_samples": 32, "run.train.eval_start_samples": 32,
    "run.data.eval_samples": 50}.items()]


def submit_command(device: str, precision: str, quick: bool) -> list[str]:
    """The README's GPU command (bertctl submit --cluster local -o run.runtime.device=cuda -o run.runtime.precision=bf16
    --nexp 1 --follow), word for word after `python -m orchestrator`."""
    return [sys.executable, "-m", "orchestrator", "submit", "--cluster", "local", "-o", f"run.runtime.device={device}",
            "-o", f"run.runtime.precision={precision}", "--nexp", "1", "--follow", *(QUICK_OVERRIDES if quick else [])]


def product_end_to_end(device: str, precision: str, quick: bool, deadline: float, log: Path) -> dict:
    with tempfile.TemporaryDirectory(prefix="bertctl-gpu-product-") as home:
        env = {"BERTCTL_HOME": home, "BERTCTL_PYTHON": sys.executable}
        bertctl = [sys.executable, "-m", "orchestrator"]
        started = time.time()
        try:
            submitted = run_child(submit_command(device, precision, quick), deadline, log, "bertctl submit", env)
        except BaseException:
            # the local job runs detached from us: cancel it, or it would hold the device for the next stages
            run_child([*bertctl, "cancel", "last"], time.time() + 60, log, "bertctl cancel", env)
            raise
        exp = next(Path(home, "experiments").glob("*"), None) if Path(home, "experiments").is_dir() else None
        for run_log in sorted(Path(exp, "logs").glob("*.log")) if exp else []:
            with open(log, "a") as f:
                f.write(f"==== {run_log.name} of the experiment\n" + "\n".join(run_log.read_text().splitlines()[-200:]) + "\n")
        figures = {"command": " ".join(["bertctl", *submitted_words(device, precision, quick)]),
                   "submit_seconds": round(time.time() - started, 1), "metrics": last_metrics(exp)}
        # --quick: the run stops at its sample limit below the target, and --follow says so with exit 1
        # (the checker's verdict below tells a compliant short run from a broken one)
        assert submitted.returncode == 0 or (quick and submitted.returncode == 1), f"bertctl submit: {submitted.reason()}"
        checked = run_child([*bertctl, "compliance-check", "last", "--no-score", "--json"], deadline, log,
                            "bertctl compliance-check", env)
        report = json.loads(checked.stdout) if checked.stdout.strip() else {}
        runs = [{k: r[k] for k in ("compliant", "converged", "status", "minutes", "samples_to_converge", "accuracy", "message")}
                for r in report.get("runs", [])]
        figures.update(runs=runs, checker=report.get("checker"), problems=report.get("problems"))
        assert runs, f"bertctl compliance-check: {checked.reason()}"
        assert all(r["compliant"] for r in runs), f"not compliant: {[r['message'] for r in runs]}"
        if not quick:
            assert all(r["converged"] for r in runs), f"not converged: {[(r['status'], r['accuracy']) for r in runs]}"
        return figures


def submitted_words(device: str, precision: str, quick: bool) -> list[str]:
    return submit_command(device, precision, quick)[3:]


def last_metrics(exp: Path | None) -> dict | None:
    """The run's last progress record (sequences/s, memory, MFU where known)."""
    files = sorted(Path(exp, "metrics").glob("*.jsonl")) if exp else []
    lines = files[0].read_text().splitlines() if files else []
    return json.loads(lines[-1]) if lines else None
