"""`compliance-check --results` on real published MLPerf Training v1.1 BERT results (tests/data/mlperf-results).

Both trees were accepted in 2021 and both fail today's checker; the published olympic means are
19.39 min (Inspur, one run aborted) and 39.21 min (GIGABYTE).
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli

from orchestrator.results import resultset, verdict

DATA = Path(__file__).parent / "data" / "mlperf-results" / "v1.1"
TREES = {"Inspur": DATA / "Inspur", "GIGABYTE": DATA / "GIGABYTE"}
PUBLISHED_MINUTES = {"Inspur": 19.39, "GIGABYTE": 39.21}
# The first message of today's checker (mlperf-logging 4.1.68) for every log of each tree
FIRST_MESSAGE = {
    ("GIGABYTE", "1.1.0"): "Required AT_LEAST_ONE occurrence of 'weights_initialization' but found 0",
    ("GIGABYTE", "5.0.0"): "Required EXACTLY_ONE occurrence of 'opt_lamb_epsilon' but found 0",
    ("Inspur", "1.1.0"): "Required EXACTLY_ONE occurrence of 'submission_org' but found 2",
    ("Inspur", "5.0.0"): "Required EXACTLY_ONE occurrence of 'submission_division' but found 2",
}


@pytest.fixture(scope="module")
def reports():
    """Each tree as `bertctl compliance-check --results TREE --json` sees it (ruleset from the path: 1.1.0)."""
    found = {}
    for name, tree in TREES.items():
        result = run_cli("compliance-check", "--results", str(tree), "--json")
        found[name] = (result.code, json.loads(result.out), result.err)
    return found


@pytest.mark.parametrize("name", sorted(TREES))
def test_score_equals_the_published_olympic_mean(reports, name):
    code, report, _ = reports[name]
    assert report["score_minutes"] == pytest.approx(PUBLISHED_MINUTES[name], abs=0.01)
    assert len(report["runs"]) == 10 and report["ruleset"] == "1.1.0" and report["division"] == "closed"


def test_inspur_aborted_run_counts_as_the_dropped_slowest(reports):
    _, report, err = reports["Inspur"]
    by_file = {r["file"]: r for r in report["runs"]}
    assert [r["file"] for r in report["runs"]][:2] == ["result_1.txt", "result_2.txt"]  # numeric order, 1..10
    aborted = by_file["result_9.txt"]
    assert aborted["converged"] is False and aborted["samples_to_converge"] is None
    assert aborted["minutes"] == pytest.approx(22.4010, abs=1e-4)  # its time is known, it is just not counted
    assert report["dropped"] == ["result_9.txt"]
    # olympic with one dropped run: the 9 converged times, minus the fastest (17.035), averaged over 8
    converged = sorted(r["minutes"] for r in report["runs"] if r["converged"])
    assert report["score_minutes"] == pytest.approx(sum(converged[1:]) / 8, abs=1e-9)
    assert "result_9.txt did not converge and counts as the dropped slowest" in err


def test_both_trees_pass_ruleset_1_1_0_as_it_stood_and_name_the_rule_changed_since(reports):
    """Today's checker fails every log of both trees on weights_initialization, a warning in 1.1.0 until
    mlperf-logging made it a failure in March 2022, after v1.1 was published (December 2021)."""
    changed = "weights_initialization required (2022-03-29, mlperf-logging 2.0.0-rc1, commit 4c041127dbe7)"
    for name, (code, report, err) in reports.items():
        assert code == 0 and report["passed"] is True and report["package_checker_view"]["passed"] is True
        # Inspur's result_9.txt also stopped below the target: that fails by any ruleset (the dropped run)
        below = [r["file"] for r in report["runs"] if not r["compliant"]]
        assert below == (["result_9.txt"] if name == "Inspur" else [])
        assert all(r["as_it_stood"].startswith("compliant by ruleset 1.1.0 as it stood when its round was published "
                                               "(2021-12-01); today's checker fails it on a rule changed since: " + changed)
                   for r in report["runs"] if r["compliant"])
        assert report["ruleset_history"].startswith("ruleset 1.1.0 is judged as it stood when its round was published")
        assert changed in report["ruleset_history"] and "weights_initialization tensor list (2022-02-24" in report["ruleset_history"]
        assert report["official_score_minutes"] is None  # the summarizer judges by today's rules: it drops every run
        assert FIRST_MESSAGE[(name, "1.1.0")] in err and "PASSED" in err.splitlines()[-1]


@pytest.mark.parametrize("name,ruleset", sorted(FIRST_MESSAGE))
def test_every_verdict_is_the_official_tools(name, ruleset, tmp_path):
    """The checker run by hand on each file, exactly as the reference documents it, agrees with ours."""
    rs = resultset.from_directory(TREES[name])
    report = verdict.assess(rs, ruleset=ruleset)
    for run, path in zip(report.runs, rs.files):
        by_hand = subprocess.run(
            [sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "training", "--ruleset", ruleset,
             "--log_output", str(tmp_path / "cc.log"), str(path)], capture_output=True, text=True, cwd=tmp_path)
        assert by_hand.returncode in (0, 1)
        # today's checker fails every log; by 1.1.0 as it stood they pass, and the run says why
        stood = ruleset == "1.1.0" and by_hand.returncode == 1 and "Failed checks for eval_accuracy" not in by_hand.stderr
        assert (run.compliant, bool(run.as_it_stood)) == ((True, True) if stood else (by_hand.returncode == 0, False)), path
        assert run.checker_messages[0] == FIRST_MESSAGE[(name, ruleset)]
        assert run.checker_messages[0] in by_hand.stderr


def test_rcp_reads_train_samples_for_v11_logs(reports):
    """v1.1 logs log eval epoch_num = 1: RCP must use train_samples (rcp_checker --bert_train_samples)."""
    _, report, _ = reports["GIGABYTE"]
    rcp = report["rcp"]
    assert rcp["samples_from"] == "train_samples" and rcp["pass"] is True and rcp["factor"] == 1.0
    assert rcp["message"] == "RCP Interpolation"  # 1.1.0 pruned the BS-448 record
    assert rcp["submission_mean"] == pytest.approx(2_943_976.0)
    assert rcp["min_samples"] == pytest.approx(2_410_606.13, abs=0.01)
    assert {r["samples_source"] for r in report["runs"]} == {"train_samples"}
    assert report["runs"][0]["samples_to_converge"] == 2_700_096


def test_ruleset_comes_from_the_logs_date_when_the_path_names_no_round(tmp_path):
    copy = tmp_path / "someone" / "bert"
    shutil.copytree(TREES["GIGABYTE"] / "results" / "G492-ID0_A100_20211013.pytorch" / "bert", copy)
    result = run_cli("compliance-check", "--results", str(copy), "--json")
    report = json.loads(result.out)
    assert report["ruleset"] == "1.1.0" and report["ruleset_reason"].startswith("the logs' date (2021-10-19)")


@pytest.mark.parametrize("ruleset,why", [
    ("5.1.0", "ruleset 5.1.0 cannot check BERT: it no longer lists bert among its benchmarks"),
    ("6.1.0", "ruleset 6.1.0 cannot check BERT: it has no BERT rule files and the checker crashes"),
    ("7.0.0", "unknown ruleset '7.0.0'"),
])
def test_rulesets_that_cannot_check_bert_are_refused_clearly(ruleset, why):
    result = run_cli("compliance-check", "--results", str(TREES["Inspur"]), "--ruleset", ruleset)
    assert result.code == 2 and result.out == ""
    assert result.err.startswith("bertctl: error: --ruleset: ") and why in result.err and result.err.count("\n") == 1
    if ruleset != "7.0.0":
        assert "(use 5.0.0)" in result.err


def test_a_tree_with_two_systems_asks_which(tmp_path):
    for name, tree in TREES.items():
        shutil.copytree(tree, tmp_path / "round" / name)
    result = run_cli("compliance-check", "--results", str(tmp_path / "round"))
    assert result.code == 2 and "holds 2 sets of result logs" in result.err and "pass one of them" in result.err
