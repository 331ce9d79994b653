"""`bertctl preflight` on the shipped clusters, typed as a user types it, on a fresh $BERTCTL_HOME: the
job prepares the sample dataset, expands $BERTCTL_HOME in the paths as the job script does, measures and
predicts, and exits 0 on this machine. The timing windows are shortened through the environment
(BERTCTL_PREFLIGHT_*, as the README documents) to keep the tests short; the command's words are the user's."""

from __future__ import annotations

import json

import pytest
from conftest import run_bertctl

SHORT = {"BERTCTL_PREFLIGHT_WINDOW": "0.3", "BERTCTL_PREFLIGHT_WINDOWS": "2", "BERTCTL_PREFLIGHT_STEPS": "2"}


def figures(bertctl_home) -> dict:
    (exp_dir,) = (bertctl_home / "experiments").iterdir()
    return json.loads((exp_dir / "preflight.json").read_text())


@pytest.mark.slow  # not serial: one node, nothing to compare its speed with, so another test's load changes no verdict
@pytest.mark.xdist_group("preflight-local")  # it needs no cluster: not on the Slurm worker (tests/conftest.py)
def test_preflight_on_the_local_cluster_as_typed(bertctl_home):
    result = run_bertctl("preflight", "--cluster", "local", env=SHORT, timeout=600)
    assert result.code == 0, result.err[-3000:] + result.out[-3000:]
    assert "no node flagged" in result.out and "all-reduce: not measured (one rank: nothing to reduce with)" in result.out
    written = figures(bertctl_home)
    (rank,) = written["ranks"]
    assert rank["errors"] == {} and rank["measures"]["storage"]["files"] >= 1
    assert rank["skipped"] == {"allreduce_world": "one rank: nothing to reduce with"}
    predicted = written["time_to_train"]
    # no RCP for the 2-layer model to 0.13 and no earlier run: the recipe's 8,000 samples, 10 evals of 800
    assert predicted["rcp"]["samples"] == 8000 and predicted["evals"] == 10
    assert predicted["minutes"] == pytest.approx((predicted["overhead_s"] + 10 * predicted["interval_s"]) / 60)


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.serial  # its verdict compares the two nodes' measured speeds, which another test's load would skew
def test_preflight_on_the_ci_slurm_cluster_as_typed(slurm, bertctl_home):
    result = run_bertctl("preflight", "--cluster", "ci_slurm", env=SHORT, timeout=600)
    assert result.code == 0, result.err[-3000:] + result.out[-3000:]
    written = figures(bertctl_home)
    # the cluster file's preflight.threshold (its two nodes share two cores), not the default 10
    assert written["threshold"] == 50 and "no node flagged (threshold 50 % below the median)" in result.out
    assert written["flagged"] == [] and len(written["ranks"]) == 4
    for rank in written["ranks"]:
        assert rank["errors"] == {} and rank["measures"]["allreduce_world"]["ranks"] == 4
    assert written["time_to_train"]["minutes"] > 0 and "an upper bound" in result.out
