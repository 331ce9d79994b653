"""The embedded default end to end, as the README tells a newcomer to run it:

- on this machine: `bertctl submit --cluster local --nexp 2 --follow` finds the sample dataset and the
  phase-1 checkpoint complete (each built once per test run by the step the job runs for it:
  tests/data_helpers.py::sample_home, ::phase1_home), runs two phase-2 runs through the local executor,
  checks them with the official MLPerf checker and draws the convergence plot;
- on the CI's real Slurm: the same recipe as a 2-node job with 2 gloo ranks per node, exchange
  padding and bucket-wise clipping, its prepare and phase-1 steps run on the cluster (finding their
  results, as on a machine that ran the job before), followed through sacct, its log streamed, its run
  checked. One run, not two: the local job already shows an experiment of several runs, and a second
  4-rank run cost ~2 minutes of CI (issue 38).

Each has its own $BERTCTL_HOME (a copy of the session's phase-1 home), so under `make test`'s xdist
workers the local job runs on one while the Slurm experiment, with every other Slurm test, runs on
another (tests/conftest.py). Phase 1 is trained once for both, not by each job: ~120 CPU-seconds each
time on CI's two cores (issue 38); what a fresh machine's `make demo` prints for it is the phase-1
home's log (test_the_phase1_step_trains_a_fixed_length_phase).
"""

import json
import re
import time
from pathlib import Path

import pytest
from conftest import run_bertctl, status_now

MAIN_JOB = ["submit", "--cluster", "local", "--nexp", "2", "--follow"]  # the README's main job, word for word


@pytest.fixture(scope="session")
def demo_home(tmp_path_factory) -> Path:
    """It holds the session's sample build and phase-1 checkpoint (tests/data_helpers.py::phase1_home: the
    same `bertctl data prepare --dataset sample` and phase-1 trainer command the job's steps run), so the
    job's steps find them complete; the runs are trained here."""
    from data_helpers import home_with_sample

    return home_with_sample(tmp_path_factory, "demo-home", phase1=True)


@pytest.fixture(scope="session")
def local_demo(demo_home):
    started = time.time()
    result = run_bertctl(*MAIN_JOB, env={"BERTCTL_HOME": str(demo_home)}, timeout=1500)
    return result, time.time() - started


@pytest.fixture(scope="session")
def slurm_demo_home(tmp_path_factory) -> Path:
    from data_helpers import home_with_sample

    return home_with_sample(tmp_path_factory, "slurm-demo-home", phase1=True)


@pytest.mark.slow
@pytest.mark.xdist_group("demo-local")  # not the Slurm worker's (tests/conftest.py): it needs no cluster
def test_the_main_job_trains_bert_in_two_phases_and_checks_it(local_demo, demo_home):
    result, seconds = local_demo
    assert result.code == 0, result.err[-3000:]
    exp_id = result.out.strip()
    err = result.err
    for section in ("--- prepare ---", "--- phase1 ---", "--- run 0 ---", "--- run 1 ---"):
        assert section in err
    assert "sample: complete at" in err.split("--- prepare ---")[1].split("--- phase1 ---")[0]  # the session's build
    phase1_step = err.split("--- phase1 ---")[1].split("--- run 0 ---")[0]
    assert "sample/phase1_checkpoint/model.pt exists: skipped" in phase1_step  # the session's phase 1
    baseline = float(re.search(r"scores (0\.\d+) \(the unigram baseline\)", err).group(1))
    assert 0.05 < baseline < 0.08
    for run in ("0", "1"):  # each phase-2 run climbs from its first eval to the target
        run_log = err.split(f"--- run {run} ---")[1].split("--- ")[0]
        evals = [float(a) for a in re.findall(r"eval at \d+ samples: mlm accuracy (0\.\d+)", run_log)]
        assert len(evals) >= 3 and evals[-1] >= 0.13 and evals[-1] - evals[0] >= 0.02, (run, evals)
    assert err.count("run_stop: success") == 2
    assert "division: open, because the target accuracy" in err and "below MLPerf's 0.72" in err
    assert "score: no olympic score with 2 run(s) (MLPerf needs 10); mean time to train:" in err
    png = Path(re.search(r"plot: (\S+\.png)", err).group(1))
    assert png.stat().st_size > 10_000
    view = json.loads(run_bertctl("status", exp_id, "--json", env={"BERTCTL_HOME": str(demo_home)}).out)["experiments"][0]
    assert view["state"] == "COMPLETED" and [r["outcome"] for r in view["runs"]] == ["success", "success"]
    assert all(r["accuracy"] >= max(0.13, 2 * baseline) for r in view["runs"])  # twice what frequencies score
    check = run_bertctl("compliance-check", exp_id, "--no-score", "--json", env={"BERTCTL_HOME": str(demo_home)})
    assert check.code == 0 and json.loads(check.out)["passed"] is True
    print(f"main job: {seconds:.0f} s, baseline {baseline}, "
          f"phase 2 {[round(r['accuracy'], 4) for r in view['runs']]}")


def test_the_phase1_step_trains_a_fixed_length_phase(tmp_path_factory):
    """What a fresh machine's `make demo` prints for its phase-1 step (the session's phase-1 home ran it):
    a fixed budget at length 128, short enough that phase 2 shows the learning."""
    from data_helpers import phase1_home

    log = (phase1_home(tmp_path_factory) / "phase1.log").read_text()
    baseline = float(re.search(r"scores (0\.\d+) \(the unigram baseline\)", log).group(1))
    phase1 = float(re.findall(r"eval at \d+ samples: mlm accuracy (0\.\d+)", log)[-1])
    assert 0.05 < baseline < 0.08 and baseline < phase1 < 0.1, (baseline, phase1)
    assert "run_stop: aborted (max_steps 200 reached before the target accuracy 0.99) after 6400 samples" in log
    assert (phase1_home(tmp_path_factory) / "datasets" / "sample" / "phase1_checkpoint" / "model.pt").is_file()


@pytest.mark.slow
@pytest.mark.slurm
def test_the_same_experiment_on_the_ci_slurm_cluster(slurm, slurm_demo_home):
    demo_home = slurm_demo_home
    env = {"BERTCTL_HOME": str(demo_home)}
    submitted = run_bertctl("submit", "--cluster", "ci_slurm", "--nexp", "1", env=env)
    assert submitted.code == 0, submitted.err
    exp_id = submitted.out.strip()
    streamed = run_bertctl("logs", exp_id, "--run", "0", "-f", env=env, timeout=1500)  # waits for the run to end
    assert streamed.code == 0 and "run_stop: success" in streamed.out
    assert "0: training: 4 rank(s) x 4 x 1 = 16 sequences per step" in streamed.out
    states, deadline = [], time.time() + 300
    while time.time() < deadline:
        view = status_now(exp_id, demo_home)
        states.append(view["state"])
        if view["state"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            break
        time.sleep(1)
    assert states[-1] == "COMPLETED", (states, view)
    assert [r["nodes"] for r in view["runs"]] == [2]
    # the job's prepare and phase-1 steps ran on the cluster and found the dataset and checkpoint complete
    logs = demo_home / "experiments" / exp_id / "logs"
    assert "sample: complete at" in (logs / "prepare.log").read_text()
    assert "sample/phase1_checkpoint/model.pt exists: skipped" in (logs / "phase1.log").read_text()
    assert (demo_home / "experiments" / exp_id / "runs" / "phase1.exit").read_text().strip() == "0"
    run_yaml = (demo_home / "experiments" / exp_id / "run.yaml").read_text()
    assert "exchange_padding: group" in run_yaml and "clip: bucket" in run_yaml
    check = run_bertctl("compliance-check", exp_id, "--no-score", env=env)
    assert check.code == 0, check.err[-2000:]
    # the README's tour, word for word, on this experiment (the newest: `last`)
    tour = {"status last": "COMPLETED", "logs last --run 0 --rank 0": "0: run_stop: success",
            "compliance-check last --no-score": "PASSED", "plot last": "convergence.png"}
    for command, expected in tour.items():
        result = run_bertctl(*command.split(), env=env)
        assert result.code == 0 and expected in result.out + result.err, command
    assert "COMPLETED" in run_bertctl("status", "last", env=env).out  # the table is the verb's output: pipeable
