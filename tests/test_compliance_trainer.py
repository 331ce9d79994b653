"""compliance-check, package and plot on logs written by our own trainer (`python -m trainer`).

A tiny BERT on synthetic data that reaches 0.720 in about a thousand samples (tests/synthetic.py),
trained ten times with different seeds, as the launcher runs it (cache_clear first, then the
trainer), plus two runs stopped before the target. Slow: about a minute and a half on two cores.
"""

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import REPO, run_cli

from orchestrator import experiments
from orchestrator.config.clusters import load_cluster
from orchestrator.experiments import Experiment

pytestmark = pytest.mark.slow
RUNS = 10
PARALLEL = 2  # two cores


@pytest.fixture(scope="session")
def trained(tmp_path_factory) -> Path:
    """A folder with run.yaml and results/result_0..9.txt (converged) and aborted/result_0..1.txt (stopped early)."""
    if importlib.util.find_spec("trainer.loop.train") is None:
        pytest.fail("trainer not available yet")
    from synthetic import CLOSED, tiny_run_config

    from trainer.mlperf import log_cache_clear

    tmp = tmp_path_factory.mktemp("trained")
    config = tiny_run_config(tmp, runtime={"num_threads": 1}, **CLOSED,
                             train__max_samples_termination=4800, optim__max_steps=600)
    short = tmp / "short" / "run.yaml"  # three evaluations, far from the target: run_stop aborted
    short.parent.mkdir()
    short.write_text(config.read_text().replace("max_samples_termination: 4800", "max_samples_termination: 384"))
    jobs = [(config, tmp, i, 100 + i) for i in range(RUNS)] + [(short, tmp / "short", i, 200 + i) for i in range(2)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    for batch in range(0, len(jobs), PARALLEL):
        running = []
        for cfg, out, index, seed in jobs[batch:batch + PARALLEL]:
            log_cache_clear(out / "results" / f"result_{index}.txt")  # the launcher's part
            running.append(subprocess.Popen(
                [sys.executable, "-m", "trainer", "--config", str(cfg), "--out", str(out), "--run-index", str(index),
                 "--seed", str(seed)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env))
        for proc in running:
            output, _ = proc.communicate(timeout=600)
            if proc.returncode != 0:
                pytest.fail(f"the trainer failed (exit {proc.returncode}): {output[-1500:]}")
    return tmp


def register(trained: Path, logs: list[Path]) -> Experiment:
    """The trained logs as an experiment of the local cluster (CPU system description), as submit records it."""
    cluster = load_cluster("local").config
    exp = Experiment(id=experiments.new_id("local"), cluster="local", cluster_source="clusters/local.yaml",
                     executor="local", nexp=len(logs), seeds=list(range(len(logs))), program="train", overrides=[],
                     script="job.sh", created=time.time(), dir="")
    exp = experiments.create(exp, {"run.yaml": (trained / "run.yaml").read_text(), "job.sh": "#!/bin/bash\n",
                                   "cluster.yaml": yaml.safe_dump(cluster.model_dump(mode="json"), sort_keys=False)})
    exp.result_file(0).parent.mkdir(parents=True, exist_ok=True)
    for i, log in enumerate(logs):
        exp.result_file(i).write_text(log.read_text())
    return exp


def converged_logs(trained: Path) -> list[Path]:
    return [trained / "results" / f"result_{i}.txt" for i in range(RUNS)]


def test_our_trainers_logs_pass_the_official_checker_and_say_they_are_a_rehearsal(trained):
    exp = register(trained, converged_logs(trained))
    assert all('"key": "bertctl_waive_scale_rules", "value": true' in log.read_text() for log in converged_logs(trained))
    result = run_cli("compliance-check", exp.id, "--json")
    report = json.loads(result.out)
    assert all(r["compliant"] and not r["failures"] for r in report["runs"]), [r["message"] for r in report["runs"]]
    assert all(r["converged"] and r["accuracy"] >= 0.72 for r in report["runs"])
    assert all(r["samples_to_converge"] % 128 == 0 and r["samples_source"] == "epoch_num" for r in report["runs"])
    assert len({r["seed"] for r in report["runs"]}) == RUNS
    assert report["ruleset"] == "5.0.0" and report["division"] == "closed" and report["score_minutes"] > 0
    assert report["official_score_minutes"] == pytest.approx(report["score_minutes"], abs=1e-9)
    assert report["rcp"]["bypassed"].startswith("RCP bypassed: a 2-layer, 64-hidden model is not BERT-large")
    # the package checker's view passes; a run that waived the closed rules of scale is never a result
    assert report["package_checker_view"]["passed"] is True and report["warnings"] == []
    assert result.code == 1 and report["passed"] is False and report["problems"] == report["stricter"]
    assert [p.split(":")[0] for p in report["problems"]] == ["a rehearsal, never a result"]


def test_a_trainer_log_with_a_key_removed_fails_with_the_checkers_message(trained, tmp_path):
    logs = converged_logs(trained)
    broken = tmp_path / "result_0.txt"
    broken.write_text("".join(line for line in logs[0].read_text().splitlines(keepends=True)
                              if '"key": "opt_lamb_epsilon"' not in line))
    exp = register(trained, [broken] + logs[1:])
    report = json.loads(run_cli("compliance-check", exp.id, "--json").out)
    assert report["runs"][0]["compliant"] is False
    assert report["runs"][0]["checker_messages"] == ["Required EXACTLY_ONE occurrence of 'opt_lamb_epsilon' but found 0"]
    assert all(r["compliant"] for r in report["runs"][1:])


def test_two_trainer_runs_that_did_not_converge_leave_no_score(trained):
    short = [trained / "short" / "results" / f"result_{i}.txt" for i in range(2)]
    exp = register(trained, converged_logs(trained)[:8] + short)
    result = run_cli("compliance-check", exp.id, "--json")
    report = json.loads(result.out)
    assert [r["converged"] for r in report["runs"]] == [True] * 8 + [False, False]
    assert {r["status"] for r in report["runs"][8:]} == {"aborted"}
    assert result.code == 1 and report["score_minutes"] is None
    assert "no score: 2 runs did not converge (result_8.txt, result_9.txt); olympic scoring allows 1" in report["problems"]


def test_the_package_checker_accepts_our_trainers_logs_and_package_refuses_the_rehearsal(trained, tmp_path):
    from orchestrator.results import package, resultset, scoring

    exp = register(trained, converged_logs(trained))
    result = run_cli("package", exp.id, "--org", "bertctl", "--out", str(tmp_path / "out"))
    assert result.code == 2 and "never a result: not packaged" in result.err and not (tmp_path / "out").exists()
    # the layout `package` writes, checked by the official package checker: our trainer's logs pass it
    rs = resultset.from_experiment(exp)
    system, _ = package.find_system(rs)
    package._write_layout(tmp_path / "bertctl", rs.files, "local", package.system_description(system, "bertctl", "closed"),
                          scoring.rcp_bypass_reason(rs.run_config))
    verdict = package.check_package(tmp_path / "bertctl", "5.0.0")
    assert verdict.passed and verdict.verdict == "PACKAGE CHECKER FOUND NO ERRORS, SUCCESS !", verdict.errors


def test_plot_of_our_trainers_experiment(trained):
    exp = register(trained, converged_logs(trained))
    result = run_cli("plot", exp.id)
    assert result.code == 0 and Path(result.out.strip()).stat().st_size > 20_000
