"""Every lie of tests/lies.py, told with Dell's accepted v5.0 GB200 set, fails bertctl's verdict with its
reason in one line; the package checker's view says which of them the official tools would find."""

import re
import shutil

import pytest
from lies import LIES, RUNS, clock_back, ids, in_runs, keyed, lines_of, set_time, squeeze, time_of, write
from mlperf_sets import copy_set, extract, judge

from orchestrator.results import resultlog

BASE = "v5.0/Dell/1xXE9712x4GB200"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return extract(BASE, tmp_path_factory.mktemp("base"))


def told(lie_tell, base, tmp_path):
    bert = copy_set(base, tmp_path)
    lie_tell(bert)
    return judge(bert)


def reasons(report) -> str:
    """Every line a reviewer reads: the problems, each run's failures and the checker's column."""
    return "\n".join(report.problems + [f for r in report.runs for f in r.failures] + [r.message for r in report.runs])


def test_the_set_told_true_passes(base):
    report = judge(base)
    assert report.passed and report.package_view_passed and not report.warnings
    assert round(report.score.minutes, 3) == 6.092


@pytest.mark.parametrize("lie", LIES, ids=ids())
def test_each_lie_fails_with_its_reason(lie, base, tmp_path):
    report = told(lie.tell, base, tmp_path)
    assert report.passed is False, lie.name
    assert lie.reason in reasons(report), reasons(report)
    assert report.package_view_passed is not lie.package_checker_finds_it, report.package_problems
    if not lie.package_checker_finds_it:  # bertctl alone: the report says it is stricter, in a line of its own
        assert report.stricter and set(report.stricter) <= set(report.problems)


def test_a_lie_in_one_run_makes_it_the_dropped_run(base, tmp_path):
    """Olympic scoring drops one failing run: a lie in one run only makes it count as the slowest."""
    report = told(in_runs(squeeze(40), runs=(RUNS[0],)), base, tmp_path)
    lied = next(r for r in report.runs if r.file == RUNS[0])
    assert lied.failures and "samples/s per accelerator" in lied.failures[0] and not lied.passed
    assert report.passed and report.score.dropped == [RUNS[0]]
    assert f"{RUNS[0]} fails or did not converge: accepted under olympic scoring as the dropped run" in report.notes
    assert report.score.minutes > 6.092  # the dropped run counts as the slowest: a lie never lowers the score


def test_the_clock_set_back_names_the_line_and_the_seconds(base, tmp_path):
    report = told(in_runs(clock_back(15_000)), base, tmp_path)
    message = next(r.message for r in report.runs if r.file == RUNS[0])
    assert message.startswith("malformed log (bertctl's checks): line ")
    assert re.search(r"is earlier than the event before \(its eval_start's \d+\) by 1\d\.\d{3} s\Z", message), message


def test_without_a_system_description_the_report_says_which_rate_bound_it_used(base, tmp_path):
    """Times divided by 40 leave 257,000 samples/s for the whole run: only the system's accelerators make it
    impossible, so a bare folder of logs (no submission tree, no systems/*.json) is held to the whole-run
    bound, and the report says so."""
    bert = copy_set(base, tmp_path)
    in_runs(squeeze(40))(bert)
    logs = tmp_path / "logs"
    logs.mkdir()
    for log in bert.glob("result_*.txt"):
        shutil.copy(log, logs)
    report = judge(logs)
    assert report.passed
    assert any(n.startswith("rate bound: no system description (no systems/<system>.json beside the logs), so each "
                            "run's whole rate is held to 10,000,000 samples/s") for n in report.notes)


@pytest.mark.parametrize("damage, why", [(lambda p: p.unlink(), "systems/1xXE9712x4GB200.json is missing"),
                                         (lambda p: p.write_text("{"), "systems/1xXE9712x4GB200.json is unreadable (")],
                         ids=["missing", "not-json"])
def test_a_submission_tree_without_a_readable_system_description_fails_as_the_package_checker_fails_it(
        damage, why, base, tmp_path):
    """The package checker reads systems/SYSTEM.json of a submission tree (its division) and fails the tree
    without it: a problem of its view, not a note and a whole-run rate bound that passes times divided by 40."""
    bert = copy_set(base, tmp_path)
    in_runs(squeeze(40))(bert)
    damage(bert.parents[2] / "systems" / "1xXE9712x4GB200.json")
    report = judge(bert)
    assert not report.passed and not report.package_view_passed
    problem = next(p for p in report.package_problems if why in p)
    assert problem.endswith("the package checker reads the system description of a submission tree and fails without it")
    assert problem not in report.stricter and "\n" not in problem


def test_a_system_description_without_a_count_of_accelerators_falls_back_to_the_whole_run_bound(base, tmp_path):
    """A description that names no count (or -1 nodes) is no ground for a per-accelerator bound: the note says so."""
    bert = copy_set(base, tmp_path)
    described = bert.parents[2] / "systems" / "1xXE9712x4GB200.json"
    described.write_text(described.read_text().replace('"number_of_nodes": "1"', '"number_of_nodes": "-1"'))
    report = judge(bert)
    assert report.passed and ("rate bound: systems/1xXE9712x4GB200.json describes no accelerators, so each run's whole "
                              "rate is held to 10,000,000 samples/s (13 times the fastest published BERT run)") in report.notes


def test_an_asynchronous_evaluation_is_accepted_only_in_the_published_logs_that_have_it(tmp_path):
    """The published Gaudi logs write each eval_accuracy after later training, with the time it was taken: those
    exact files get a warning naming them. The same form in an edited copy, its last evaluation and run_stop
    timed 60 s earlier (a minute off the time to train), fails in one line."""
    log = extract("v2.0/Intel-HabanaLabs/HLS-Gaudi2", tmp_path) / "result_0.txt"
    published = resultlog.parse(log)
    assert published.problem is None and any(
        "(asynchronous evaluation)" in w and w.endswith("accepted as published: v2.0 Intel-HabanaLabs/HLS-Gaudi2 result_0.txt]")
        for _, w in published.warnings), published.warnings
    lines = lines_of(log)
    for i in (keyed(lines, "eval_accuracy")[-1], keyed(lines, "run_stop")[0]):
        lines[i] = set_time(lines[i], time_of(lines[i]) - 60_000)
    write(log, lines)
    edited = resultlog.parse(log)
    assert not any("asynchronous" in w for _, w in edited.warnings)
    line, why = edited.problem
    assert line == keyed(lines, "eval_accuracy")[0] + 1 and "(asynchronous evaluation), which only the published Gaudi logs" in why
