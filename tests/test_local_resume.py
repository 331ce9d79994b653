"""The local executor, interrupted and resumed: `EXP=$(bertctl submit --cluster local)` returns while the
job runs; SIGTERM to the trainer checkpoints the run, which `status` shows INTERRUPTED at its update
(never as finished); `bertctl resume` continues it from the checkpoint to the same losses as an
uninterrupted run, and its log passes the official checker."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, STATUS_EVERY, run_bertctl, status_now, wait
from synthetic import tiny_run_config

sys.path.insert(0, str(REPO / "benchmarks"))
import fault_harness as harness  # noqa: E402

pytestmark = pytest.mark.slow

UPDATES = 60
FIXED = dict(optim={"max_steps": UPDATES}, train={"target_accuracy": 0.99, "eval_every_samples": 240, "eval_start_samples": 240},
             model={"hidden_dropout": 0.0, "attention_dropout": 0.0}, runtime={"num_threads": 1},
             mlperf={"division": "open"}, data={"eval_samples": 100})


@pytest.fixture(scope="module")
def recipe(tmp_path_factory) -> Path:
    return tiny_run_config(tmp_path_factory.mktemp("recipe"), world_size=1, batch_size=8, **FIXED)


def local_cluster(tmp: Path, recipe: Path) -> Path:
    return harness.local_cluster(tmp, recipe, "local_resume")


def losses(folder: Path) -> list[float]:
    lines = (folder / "metrics" / "run_0.jsonl").read_text().splitlines()
    by_update = {json.loads(line)["update"]: json.loads(line)["loss"] for line in lines}
    return [by_update[u] for u in sorted(by_update)]


def view(exp: str) -> dict:
    return status_now(exp)


def trainer_pid(job: str) -> int | None:
    # the trainer itself, not the job's `python -m trainer.mlperf cache-clear` that runs just before it
    out = subprocess.run(["pgrep", "-g", job, "-f", "[-]m trainer --config"], capture_output=True, text=True).stdout.split()
    return int(out[0]) if out else None


def test_sigterm_interrupts_a_local_run_and_resume_finishes_it_to_the_same_losses(recipe, tmp_path, bertctl_home):
    reference = tmp_path / "reference"
    proc = subprocess.run([sys.executable, "-m", "trainer", "--config", str(recipe), "--out", str(reference), "--seed", "0"],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-2000:]

    started = time.time()
    submitted = run_bertctl("submit", "--cluster", str(local_cluster(tmp_path, recipe)))
    assert submitted.code == 0, submitted.err
    returned_after = time.time() - started
    exp = submitted.out.strip()
    exp_dir = bertctl_home / "experiments" / exp
    assert returned_after < 30, submitted.err
    # Once it trains, the run takes 2-3 s (60 updates), after a few seconds of start-up: the signal must land
    # inside that window, so nothing slower than pgrep runs before the trainer is found. The job id comes from
    # the experiment's record, not from `bertctl status` (1-4 s a call on a busy CI machine: two calls before
    # the first pgrep once let the whole run end unseen), and the trainer is stopped (SIGSTOP) while the
    # status is read, then let go, and the metrics file read every 20 ms. Polling slower, with pgrep in the
    # loop, a busy CI machine once signalled the trainer after its run_stop (exit 143, FAILED).
    job = json.loads((exp_dir / "experiment.json").read_text())["job_ids"][0]
    metrics = exp_dir / "metrics" / "run_0.jsonl"
    found: list[int] = []
    wait(lambda: found.append(trainer_pid(job)) or found[-1], 300, "the trainer to start", every=0.1)
    os.kill(found[-1], signal.SIGSTOP)
    try:
        running = view(exp)  # submit returned while the job runs
        assert running["state"] == "RUNNING" and running["job_ids"] == [job], running
    finally:
        os.kill(found[-1], signal.SIGCONT)
    wait(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 5, 300, "5 updates", every=0.02)
    os.kill(found[-1], signal.SIGTERM)
    wait(lambda: view(exp)["state"] not in ("PENDING", "RUNNING"), 300, "the job to end", STATUS_EVERY)

    interrupted = view(exp)
    assert interrupted["state"] == "INTERRUPTED", interrupted
    assert interrupted["runs"][0]["error"].startswith("checkpoint saved at update ") and f"bertctl resume {exp}" in interrupted["runs"][0]["error"]
    assert not (exp_dir / "runs" / "0.exit").exists()  # never recorded as finished

    resumed = run_bertctl("resume", exp)
    assert resumed.code == 0 and resumed.out.strip() == exp, resumed.err[-2000:]
    wait(lambda: view(exp)["state"] not in ("PENDING", "RUNNING", "INTERRUPTED"), 300, "the resumed run to end", STATUS_EVERY)
    final = view(exp)
    assert final["state"] == "COMPLETED", final
    assert "resumed at update" in (exp_dir / "logs" / "run_0.log").read_text()
    assert losses(exp_dir) == pytest.approx(losses(reference), rel=1e-5)
    check = run_bertctl("compliance-check", exp, "--no-score", "--json")
    runs = json.loads(check.out)["runs"]
    assert [(r["compliant"], r["status"]) for r in runs] == [(True, "aborted")], check.err[-2000:]
