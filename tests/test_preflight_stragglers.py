"""Straggler naming during a run (trainer/loop/stragglers.py): the rule, and a real 2-node training run on the
CI's Slurm with one node throttled by a cgroup CPU quota (tests/throttle.py),
whose rank `bertctl status` and `bertctl logs` name."""

from __future__ import annotations

import json
import time

import pytest
from conftest import run_bertctl, status_now
from test_preflight_slurm import overrides, shards, throttled  # noqa: F401 (shards: a fixture)

from orchestrator.jobs.status import last_straggler
from trainer.loop.stragglers import straggler


def test_the_rank_with_the_most_compute_is_named_only_past_the_threshold():
    nodes = ["node1", "node1", "node2", "node2"]
    assert straggler([1.0, 1.0, 1.05, 1.0], nodes) is None  # 5 % over the median: within 10 %
    named = straggler([1.0, 1.1, 2.0, 1.0], nodes)
    assert named == {"rank": 2, "node": "node2", "compute_s": 2.0, "median_s": 1.05, "over_median": pytest.approx(2.0 / 1.05 - 1)}
    assert straggler([3.0], ["a"]) is None


def test_status_reads_the_straggler_of_the_last_progress_line(tmp_path):
    metrics = tmp_path / "run_0.jsonl"
    named = {"rank": 3, "node": "node2", "compute_s": 0.5, "median_s": 0.2, "over_median": 1.5}
    metrics.write_text(json.dumps({"update": 10, "straggler": named}) + "\n" + json.dumps({"update": 20}) + "\n")
    assert last_straggler(metrics) is None  # the newest line names no one
    metrics.write_text(metrics.read_text() + json.dumps({"update": 30, "straggler": named}) + "\n" + '{"upda')
    assert last_straggler(metrics) == named  # a line being written is skipped
    assert last_straggler(tmp_path / "missing.jsonl") is None


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.usefixtures("slurm")
def test_a_throttled_node_of_a_training_run_is_named_by_status_and_logs(shards, bertctl_home):  # noqa: F811
    """Not in the serial pass: a node held to a tenth of a CPU is the slowest whatever else runs, and the
    rule names only the slowest rank."""
    recipe = ["-o", "run.optim.max_steps=60", "-o", "run.train.log_every_steps=5", "-o", "run.train.target_accuracy=0.99",
              "-o", "run.train.max_samples_termination=960", "-o", "run.train.eval_every_samples=100000",
              "-o", "node.clear_caches=log_only"]
    with throttled("node2", cpu_share=0.1, from_shards=True) as throttle:
        submitted = run_bertctl("submit", "--cluster", "ci_slurm", *overrides(shards), *recipe,
                                env={"BERTCTL_TEST_TAG": throttle.tag})
        assert submitted.code == 0, submitted.err
        exp = submitted.out.strip()
        named, end = None, time.time() + 600
        while time.time() < end:
            view = status_now(exp)
            named = view["runs"][0]["straggler"]
            if named or view["state"] not in ("PENDING", "RUNNING"):
                break
            time.sleep(2)
        table = run_bertctl("status", exp).out
        run_bertctl("cancel", exp)
    assert throttle.moved["cpu"]
    assert named is not None and named["node"] == "node2" and named["rank"] in (2, 3), view
    assert f"straggler: rank {named['rank']} on node2" in table
    log = run_bertctl("logs", exp, "--grep", "straggler")
    assert "on node2: compute" in log.out and "on node1" not in log.out
    metrics = [json.loads(line) for line in (bertctl_home / "experiments" / exp / "metrics" / "run_0.jsonl").read_text().splitlines()]
    assert all(len(m["rank_compute_s"]) == len(m["rank_wait_s"]) == 4 for m in metrics)
