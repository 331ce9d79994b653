"""bertctl's set verdict on whole published sets, as the package checker sees them and by its own checks.

tests/data/mlperf-sets holds the sets (tests/data/mlperf-sets/README.md), sets.json the official package
checker's verdict on each. bertctl computes its verdict without reading that verdict: the package
checker's view (each log by its ruleset as it stood, one failing log, the seed and RCP checks) equals
it, and what bertctl doubts in an accepted set is a warning naming that set.
"""

import json

import pytest
from conftest import run_cli
from mlperf_sets import MANIFEST, extract, judge

from orchestrator.results import package

BY_SET = {m["set"]: m for m in MANIFEST}


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    """{set name: its bert folder, extracted once}"""
    root = tmp_path_factory.mktemp("sets")
    return {name: extract(name, root) for name in BY_SET}


@pytest.fixture(scope="module")
def reports(sets):
    return {name: judge(bert, ruleset=BY_SET[name]["ruleset"]) for name, bert in sets.items()}


@pytest.mark.parametrize("name", sorted(BY_SET))
def test_the_package_checkers_view_equals_its_verdict_by_the_rules_as_they_stood(name, reports):
    report, expected = reports[name], BY_SET[name]
    assert report.package_view_passed is expected["package_checker_as_it_stood"], report.package_problems
    assert report.passed is expected["bertctl"], report.problems
    assert not report.stricter  # on a published set bertctl finds nothing the package checker would not


@pytest.mark.parametrize("name", ["v5.0/Dell/1xXE9712x4GB200", "v1.0/Habana/SYS-420GH-TNGR", "v2.0/Intel-HabanaLabs/HLS-Gaudi2"])
def test_the_package_checker_itself_gives_the_recorded_verdict(name, sets):
    """The official tool, run now, on three of the sets: the record above is still its verdict."""
    bert = sets[name]
    verdict = package.check_package(bert.parents[2], BY_SET[name]["ruleset"])
    assert verdict.passed is BY_SET[name]["package_checker"]["passed"]
    assert [e for e in verdict.errors if e in BY_SET[name]["package_checker"]["errors"]] == BY_SET[name]["package_checker"]["errors"]


@pytest.mark.parametrize("name", ["v1.0/Habana/SYS-420GH-TNGR", "v2.0/Intel-HabanaLabs/HLS-Gaudi2"])
def test_a_closed_set_that_logs_no_seed_fails_as_the_package_checker_fails_it(name, reports):
    report = reports[name]
    assert report.package_problems == report.problems and len(report.problems) == 1
    problem = report.problems[0]
    assert problem.startswith("10 run(s) log no seed (result_0.txt, result_1.txt, result_2.txt, result_3.txt, ...): "
                              "the package checker's seed check fails a closed set from ruleset 1.0.0 on")
    # the check asked for a seed in every run only from 2024: the report says when it changed
    assert "since 2024-09-13, mlperf-logging 4.1.0-rc4, commit ac0096ca830b" in problem
    assert all(r.compliant for r in report.runs) and report.rcp.passed


@pytest.mark.parametrize("name", ["v2.1/NVIDIA/dgxa100_ngc22.09_pytorch", "v2.1/Intel/16-nodes-SPR-pytorch-open"])
def test_a_v2_1_set_is_judged_by_2_1_0_as_it_stood_and_names_the_rename(name, reports):
    report = reports[name]
    rename = "opt_epsilon renamed opt_lamb_epsilon (2022-11-22, mlperf-logging 3.0.0-rc1, commit d82b94d47538)"
    assert report.ruleset == "2.1.0" and rename in report.ruleset_history
    assert "ruleset 2.1.0 is judged as it stood when its round was published (2022-11-09)" in report.ruleset_history
    stood = [r for r in report.runs if r.as_it_stood]
    assert len(stood) == 10 and all(rename in r.as_it_stood for r in stood)
    assert all(r.checker_messages == ["Required EXACTLY_ONE occurrence of 'opt_lamb_epsilon' but found 0"] for r in stood)


def test_a_v2_1_set_fails_when_judged_by_todays_rules(sets):
    """--ruleset 5.0.0 is today's rule for the logs: no change since its round excuses them."""
    report = judge(sets["v2.1/NVIDIA/dgxa100_ngc22.09_pytorch"], ruleset="5.0.0")
    assert report.ruleset_history is None and not any(r.as_it_stood for r in report.runs)
    assert report.package_problems[0] == "every log fails the compliance checker (ruleset 5.0.0)"


def test_what_an_accepted_set_shows_is_a_warning_naming_it(reports):
    xfusion = reports["v3.1/xFusion/G5500V7x8xL40S"]
    warned = {r.file: r.warnings for r in xfusion.runs if r.warnings}
    assert sorted(warned) == ["result_10.txt", "result_2.txt", "result_7.txt", "result_9.txt"]
    for file, warnings in warned.items():
        assert len(warnings) == 4 and all(f"accepted as published: v3.1 xFusion/G5500V7x8xL40S {file}]" in w for w in warnings)
        assert any("the run stopped before the evaluation it ends" in w for w in warnings)
        assert any("not a count of correct tokens over the evaluation set's 428,235 masked tokens" in w for w in warnings)
    tinybox = reports["v4.1/tinycorp/tinybox_green"]
    assert [w for w in tinybox.warnings if "one run counted twice" in w] == [
        "result_8.txt and result_3.txt log the same 16 evaluation accuracies (0.38762320266130373, ..., 0.7200488402375792): "
        "one run counted twice, not two runs [one run counted twice: a failure in any other log; accepted as published: "
        "v4.1 tinycorp/tinybox_green result_3.txt]"]
    assert tinybox.notes[-1] == "result_2.txt fails or did not converge: accepted under olympic scoring as the dropped run"


def test_the_gb200_set_passes_with_its_score_and_the_bound_it_was_held_to(sets):
    result = run_cli("compliance-check", "--results", str(sets["v5.0/Dell/1xXE9712x4GB200"].parents[2]), "--json")
    report = json.loads(result.out)
    assert result.code == 0 and report["passed"] and report["warnings"] == [] and report["stricter"] == []
    assert round(report["score_minutes"], 3) == 6.092 and round(report["scaled_score_minutes"], 3) == 6.307
    assert ("note: rate bound: 3 x the fastest published GB200 result (1,605 samples/s per accelerator, v5.0 "
            "Dell/1xXE9712x4GB200), for 4 x NVIDIA Blackwell GPU (GB200) (systems/1xXE9712x4GB200.json)") in result.err
