"""Stage b: the product end to end, as a user runs it: the GPU guide's `bertctl submit --cluster local` GPU
command on the embedded sample dataset (prepared here, phase 1 included), `--follow` to its end, then
`bertctl compliance-check` (the official MLPerf checker) on its log.

bertctl is run as `python -m orchestrator` with this Python: the GPU machine has no `bertctl` on its
PATH, and the local job's scripts run `$BERTCTL_PYTHON` (this Python, with the carried wheels on the
PYTHONPATH it inherits)."""

from __future__ import annotations

import json
import re
import shlex
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


GPU_GUIDE = Path(__file__).resolve().parents[2] / "docs" / "gpu.md"
REFUSED_WITHOUT_GPU = "run.runtime.device: cuda, but this machine has no GPU"


def readme_gpu_command() -> list[str]:
    """The words of the command the stage table of docs/gpu.md gives for stage b (bertctl submit --cluster local
    -o run.runtime.device=cuda -o run.runtime.precision=bf16 --nexp 1 --follow), read from the guide so the
    stage runs what users read."""
    row = next(line for line in GPU_GUIDE.read_text(encoding="utf-8").splitlines() if line.startswith("| b product |"))
    words = shlex.split(re.search(r"`([^`]+)`", row).group(1))
    assert words[:2] == ["bertctl", "submit"], f"docs/gpu.md's stage b row names no bertctl submit command: {row[:120]}"
    return words[1:]


def auto_command(quick: bool) -> list[str]:
    """The same submit without a device: --cluster local takes the machine's GPUs, else its CPU."""
    return ["submit", "--cluster", "local", "--nexp", "1", "--follow", *(QUICK_OVERRIDES if quick else [])]


def product_end_to_end(device: str, quick: bool, deadline: float, log: Path) -> dict:
    """On a GPU: the GPU guide's command word for word (--quick adds its overrides). On a CPU (the
    rehearsal): the same words must be refused in one line, exit 2, nothing submitted, and the
    device-less submit then runs on the CPU."""
    with tempfile.TemporaryDirectory(prefix="bertctl-gpu-product-") as home:
        env = {"BERTCTL_HOME": home, "BERTCTL_PYTHON": sys.executable}
        bertctl = [sys.executable, "-m", "orchestrator"]
        readme_words = readme_gpu_command() + (QUICK_OVERRIDES if quick else [])
        figures: dict = {"readme_command": " ".join(["bertctl", *readme_gpu_command()])}
        words = readme_words
        if device == "cpu":
            figures["readme_command_refused"] = refused_without_gpu(bertctl + readme_words, deadline, log, env, Path(home))
            words = auto_command(quick)
        started = time.time()
        try:
            submitted = run_child(bertctl + words, deadline, log, "bertctl submit", env)
        except BaseException:
            # the local job runs detached from us: cancel it, or it would hold the device for the next stages
            run_child([*bertctl, "cancel", "last"], time.time() + 60, log, "bertctl cancel", env)
            raise
        exp = next(Path(home, "experiments").glob("*"), None) if Path(home, "experiments").is_dir() else None
        for run_log in sorted(Path(exp, "logs").glob("*.log")) if exp else []:
            with open(log, "a") as f:
                f.write(f"==== {run_log.name} of the experiment\n" + "\n".join(run_log.read_text().splitlines()[-200:]) + "\n")
        figures.update(command=" ".join(["bertctl", *words]), submit_seconds=round(time.time() - started, 1),
                       metrics=last_metrics(exp), run_device=run_device(exp))
        # --quick: the run stops at its sample limit below the target, and --follow says so with exit 1
        # (the checker's verdict below tells a compliant short run from a broken one)
        assert submitted.returncode == 0 or (quick and submitted.returncode == 1), f"bertctl submit: {submitted.reason()}"
        assert figures["run_device"] == device, f"the run trained on {figures['run_device']}, not {device}"
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


def refused_without_gpu(args: list[str], deadline: float, log: Path, env: dict, home: Path) -> str:
    """On a machine without a GPU the GPU guide's command must stop before anything is written: one line
    on stderr naming run.runtime.device, exit 2."""
    refused = run_child(args, deadline, log, "bertctl submit (the GPU guide's words, no GPU here)", env)
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(lines) == 1 and REFUSED_WITHOUT_GPU in lines[0], \
        f"the GPU guide's command on a machine without a GPU: {refused.reason()}"
    assert not any(Path(home, "experiments").glob("*")), "the refused command left an experiment behind"
    return lines[0]


def run_device(exp: Path | None) -> str | None:
    """The device the experiment's run.yaml trained on (what auto resolved to)."""
    import yaml

    text = Path(exp, "run.yaml").read_text() if exp and Path(exp, "run.yaml").is_file() else ""
    return ((yaml.safe_load(text) or {}).get("runtime") or {}).get("device") if text else None


def last_metrics(exp: Path | None) -> dict | None:
    """The run's last progress record (sequences/s, memory, MFU where known)."""
    files = sorted(Path(exp, "metrics").glob("*.jsonl")) if exp else []
    lines = files[0].read_text().splitlines() if files else []
    return json.loads(lines[-1]) if lines else None
