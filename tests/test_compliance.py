"""`bertctl compliance-check EXP`: experiments of complete BERT logs (tests/mllog_factory.py) in the registry.

The numbers follow the reference's worked example: ten runs of 18.8-23.0 min converging at
2.25-2.7 M samples, olympic mean 20.5875 min, RCP mean of submission 2,418,750 samples.
"""

import json
import os
import subprocess
import sys

import mllog_factory as f
import pytest
from conftest import REPO, run_cli

CONTRACT = {"runs", "division", "ruleset", "score_minutes", "rcp", "passed"}
RUN_CONTRACT = {"file", "compliant", "converged", "minutes", "samples_to_converge"}


def check(*args):
    result = run_cli("compliance-check", *args, "--json")
    return result, (json.loads(result.out) if result.out else None)


def test_ten_good_runs_pass_with_score_and_rcp():
    exp = f.make_experiment(f.example_specs())
    result, report = check(exp.id)
    assert result.code == 0 and report["passed"] is True and report["problems"] == []
    assert CONTRACT <= set(report) and all(RUN_CONTRACT <= set(r) for r in report["runs"])
    assert [r["file"] for r in report["runs"]] == [f"result_{i}.txt" for i in range(10)]
    assert all(r["compliant"] and r["converged"] for r in report["runs"])
    assert [r["minutes"] for r in report["runs"]] == pytest.approx(list(f.EXAMPLE_MINUTES), abs=1e-4)
    assert [r["samples_to_converge"] for r in report["runs"]] == list(f.EXAMPLE_SAMPLES)
    assert report["ruleset"] == "5.0.0" and report["division"] == "closed"
    assert report["score_minutes"] == pytest.approx(f.olympic(list(f.EXAMPLE_MINUTES)), abs=1e-4)
    assert report["score_minutes"] == pytest.approx(20.5875, abs=1e-4)
    assert report["official_score_minutes"] == pytest.approx(report["score_minutes"], abs=1e-9)
    assert report["rcp"]["pass"] is True and report["rcp"]["factor"] == 1.0
    assert report["rcp"]["submission_mean"] == 2_418_750.0 and report["rcp"]["message"] == "RCP found"
    assert "PASSED" in result.err and "score: 20.587 min" in result.err


def test_faster_than_the_rcp_mean_gets_the_normalisation_factor():
    # 2.4 M samples at the rules' cadence (every 150,000 at batch 448): below the RCP mean of 2,414,421
    specs = [f.RunSpec(seed=i, converge_samples=2_400_000, minutes=m, start_ms=f.T0_MS + i * 3_600_000)
             for i, m in enumerate(f.EXAMPLE_MINUTES)]
    result, report = check(f.make_experiment(specs).id)
    assert result.code == 0
    assert report["rcp"]["factor"] == pytest.approx(2414421.3333333335 / 2_400_000, rel=1e-12)  # 1.00601...
    assert report["score_minutes"] == pytest.approx(20.5875, abs=1e-4)  # raw: the factor is reported, not applied


def test_too_fast_convergence_fails_the_rcp_check():
    specs = [f.RunSpec(seed=i, converge_samples=1_950_000, minutes=m, start_ms=f.T0_MS + i * 3_600_000)
             for i, m in enumerate(f.EXAMPLE_MINUTES)]
    result, report = check(f.make_experiment(specs).id)
    assert result.code == 1 and report["passed"] is False and report["rcp"]["pass"] is False
    assert report["score_minutes"] == pytest.approx(20.5875, abs=1e-4)
    assert report["problems"] == ["RCP check failed (RCP found): submission mean 1,950,000 samples, "
                                  "acceptable minimum 2,274,732, RCP mean 2,414,421"]


def test_one_run_that_did_not_converge_is_the_dropped_slowest():
    specs = f.with_changes(f.example_specs(), 3, converged=False, minutes=24.0)
    result, report = check(f.make_experiment(specs).id)
    assert result.code == 0 and report["passed"] is True
    assert report["runs"][3]["converged"] is False and report["runs"][3]["compliant"] is False
    assert "eval_accuracy" in report["runs"][3]["message"]  # below 0.720: the checker's own words
    others = sorted(m for i, m in enumerate(f.EXAMPLE_MINUTES) if i != 3)
    assert report["score_minutes"] == pytest.approx(sum(others[1:]) / 8, abs=1e-4)
    assert report["score_minutes"] == pytest.approx(20.9375, abs=1e-4)  # the reference: 20.938
    assert report["dropped"] == ["result_3.txt"]
    assert report["official_score_minutes"] == pytest.approx(report["score_minutes"], abs=1e-9)


def test_two_runs_that_did_not_converge_leave_no_score_and_say_why():
    specs = f.with_changes(f.with_changes(f.example_specs(), 3, converged=False), 7, converged=False)
    result, report = check(f.make_experiment(specs).id)
    assert result.code == 1 and report["passed"] is False and report["score_minutes"] is None
    why = "no score: 2 runs did not converge (result_3.txt, result_7.txt); olympic scoring allows 1"
    assert why in report["problems"] and why in result.err
    assert report["official_score_minutes"] is None


def test_a_log_without_a_required_key_fails_with_the_checkers_message():
    specs = f.with_changes(f.example_specs(), 0, drop_key="opt_lamb_epsilon")
    result, report = check(f.make_experiment(specs).id)
    run = report["runs"][0]
    assert run["compliant"] is False and run["converged"] is True
    assert run["checker_messages"] == ["Required EXACTLY_ONE occurrence of 'opt_lamb_epsilon' but found 0"]
    assert "Required EXACTLY_ONE occurrence of 'opt_lamb_epsilon' but found 0" in result.err
    # one failing log is accepted under olympic scoring; the summarizer drops it, our time score does not
    assert result.code == 0 and report["passed"] is True
    kept = sorted(m for i, m in enumerate(f.EXAMPLE_MINUTES) if i != 0)
    assert report["official_score_minutes"] == pytest.approx(sum(kept[1:]) / 8, abs=1e-4)


def test_two_failing_logs_fail_the_set():
    specs = f.with_changes(f.with_changes(f.example_specs(), 0, drop_key="run_start"), 5, drop_key="eval_samples")
    result, report = check(f.make_experiment(specs).id)
    assert result.code == 1
    assert report["problems"][0] == ("2 log(s) fail the compliance checker (result_0.txt, result_5.txt); "
                                     "the package checker accepts at most 1")
    assert report["package_checker_view"]["passed"] is False


@pytest.mark.slow
def test_one_log_passes_every_ruleset_from_1_1_to_5_0_with_the_legacy_keys():
    exp = f.make_experiment(f.example_specs())
    for ruleset in ("1.1.0", "2.0.0", "3.0.0", "4.1.0", "5.0.0"):
        result, report = check(exp.id, "--ruleset", ruleset, "--werror")
        assert result.code == 0 and report["ruleset"] == ruleset and report["ruleset_reason"] == "--ruleset"
    bare = f.make_experiment(f.example_specs(legacy_keys=False))
    result, report = check(bare.id, "--ruleset", "1.1.0")
    assert result.code == 1
    assert "Required AT_LEAST_ONE occurrence of 'weights_initialization' but found 0" in report["runs"][0]["checker_messages"]


def test_open_division_has_no_rcp_verdict():
    exp = f.make_experiment(f.example_specs(division="open"))
    result, report = check(exp.id)
    assert result.code == 0 and report["division"] == "open" and report["rcp"] is None
    assert report["rcp_note"] == "open division: RCP applies to the closed division only"


def test_no_score_checks_any_number_of_logs():
    exp = f.make_experiment(f.example_specs()[:3])
    result, report = check(exp.id, "--no-score")
    assert result.code == 0 and len(report["runs"]) == 3 and report["score_minutes"] is None and report["rcp"] is None


def test_results_dir_of_our_logs_uses_the_logs_date_hint(tmp_path):
    exp = f.make_experiment(f.example_specs())
    result, report = check("--results", str(exp.path / "results"))
    assert result.code == 0 and report["ruleset"] == "5.0.0" and report["source"] == "directory"


# ---- bad input: one line, exit code 2, nothing on stdout, never a traceback


def bad(*args):
    result = run_cli("compliance-check", *args)
    assert result.code == 2, result.err
    assert result.out == "" and result.err.startswith("bertctl: error: ") and result.err.count("\n") == 1, result.err
    assert "Traceback" not in result.err
    return result.err


def test_bad_input_directories(tmp_path):
    assert "no result_*.txt logs here or below" in bad("--results", str(tmp_path))
    assert "not a directory" in bad("--results", str(tmp_path / "missing"))
    (tmp_path / "result_0.txt").write_text("just some text\n")
    assert "not an MLPerf log: no :::MLLOG lines" in bad("--results", str(tmp_path))


def test_bad_input_damaged_json(tmp_path):
    for i, spec in enumerate(f.example_specs()):
        f.write_log(tmp_path / f"result_{i}.txt", spec)
    f.break_json(tmp_path / "result_4.txt", line_number=30)
    err = bad("--results", str(tmp_path))
    assert "result_4.txt: damaged MLPerf log: line 30 is not valid JSON" in err


def test_bad_input_event_without_its_fields(tmp_path):
    for i, spec in enumerate(f.example_specs()):
        f.write_log(tmp_path / f"result_{i}.txt", spec)
    with open(tmp_path / "result_2.txt", "a") as log:
        log.write(':::MLLOG {"key": "eval_accuracy", "value": 0.7}\n')
    last = len((tmp_path / "result_2.txt").read_text().splitlines())
    assert f"result_2.txt: damaged MLPerf log: line {last} is an event without time_ms, metadata (1 bad line(s))" in bad(
        "--results", str(tmp_path))


def test_bad_input_wrong_number_of_runs(tmp_path):
    for i, spec in enumerate(f.example_specs()[:9]):
        f.write_log(tmp_path / f"result_{i}.txt", spec)
    assert "an MLPerf BERT result is 10 runs, found 9 result log(s)" in bad("--results", str(tmp_path))
    exp = f.make_experiment(f.example_specs()[:9])
    assert f"experiment {exp.id}: an MLPerf BERT result is 10 runs, found 9" in bad(exp.id)


def test_bad_input_experiments():
    exp = f.make_experiment(f.example_specs())
    exp.result_file(6).unlink()
    assert "no result log for 1 of 10 runs (result_6.txt" in bad(exp.id)
    assert "no such experiment" in bad("nothing-like-this")
    assert "exactly one of them" in bad()
    assert "exactly one of them" in bad(exp.id, "--results", str(exp.path))


def test_bad_input_not_bert(tmp_path):
    for i, spec in enumerate(f.example_specs()):
        f.write_log(tmp_path / f"result_{i}.txt", spec)
    text = (tmp_path / "result_0.txt").read_text().replace('"value": "bert"', '"value": "resnet"')
    (tmp_path / "result_0.txt").write_text(text)
    assert "logs submission_benchmark 'resnet'; bertctl judges BERT results only" in bad("--results", str(tmp_path))


def test_compliance_check_never_imports_torch(tmp_path):
    logs = tmp_path / "logs"
    for i, spec in enumerate(f.example_specs()):
        f.write_log(logs / f"result_{i}.txt", spec)
    code = ("import sys; from orchestrator.cli import main\n"
            f"rc = main(['compliance-check', '--results', {str(logs)!r}, '--json'])\n"
            "print(rc, 'torch' in sys.modules, file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "BERTCTL_HOME": str(tmp_path)})
    assert proc.stderr.strip().splitlines()[-1] == "0 False"
    assert json.loads(proc.stdout)["passed"] is True


def test_a_packed_runs_blocks_of_varying_length_are_not_a_damaged_log(tmp_path):
    """A packed run evaluates at the first step past each evaluation point (802, then 1,604 samples...), so the
    block it opens after an evaluation is shorter than the interval by the overshoot: block_start's epoch_count
    (the block's length) goes down and up while its first_epoch_num still only grows (the local recipe's packed
    run on the CPU: 800, then 798). Only the counts of samples trained must never go back."""
    from orchestrator.results.resultlog import parse

    log = f.write_log(tmp_path / "result_0.txt")
    lines = log.read_text().splitlines()
    starts = [i for i, line in enumerate(lines) if '"key": "block_start"' in line]
    assert len(starts) >= 3
    prefix, _, body = lines[starts[1]].partition(":::MLLOG ")
    event = json.loads(body)
    event["metadata"]["epoch_count"] -= 2
    lines[starts[1]] = prefix + ":::MLLOG " + json.dumps(event)
    log.write_text("\n".join(lines) + "\n")
    assert parse(log).problem_text is None
    event["metadata"]["first_epoch_num"] = 0  # the block's start going back is still a damaged log
    lines[starts[2]] = prefix + ":::MLLOG " + json.dumps(event)
    log.write_text("\n".join(lines) + "\n")
    assert "first_epoch_num 0 is below the previous" in parse(log).problem_text
