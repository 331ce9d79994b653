"""Preflight's judge trusts no figure it reads back: every figure is a finite, positive number with a
unit, or the measure failed on that rank (naming its file); a measure absurd on every node is a failure
of the measure, not "no node flagged"; a FIFO rank file never blocks; the JSON never holds NaN; the
prediction is never negative or infinite; bad settings are refused before anything is submitted."""

from __future__ import annotations

import json
import math
import os
import threading

import pytest
from conftest import run_cli
from synthetic import tiny_run_config

from orchestrator.checks import preflight
from orchestrator.errors import UserError


def report(rank: int, node: str, **figures) -> dict:
    return {"rank": rank, "node": node, "done": True, "errors": {},
            "measures": {k: {"value": v, "unit": "GB/s"} for k, v in figures.items()}}


def two_nodes(bad) -> dict[int, dict]:
    """node1 and node2, one rank each; node2's storage figure is `bad`."""
    return {0: report(0, "node1", matmul=10.0, storage=100.0), 1: report(1, "node2", matmul=10.0, storage=bad)}


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -5.0, 0, 1e308, "fast", None, True, [1], {"x": 1}])
def test_a_figure_that_is_no_positive_number_fails_its_measure_on_that_node(bad):
    verdict = preflight.assess("e", two_nodes(bad), 2, 1, threshold=10)
    assert verdict.flagged == ["node2"] and verdict.broken == {}
    (reason,) = verdict.nodes[1].reasons
    assert reason.startswith("rank 1: storage failed: rank_1.json: storage value is ") and "not a finite positive" in reason
    assert "storage" not in verdict.nodes[1].measures
    json.loads(preflight.strict_json(verdict.as_json()))  # no NaN, whatever the file held


@pytest.mark.parametrize("damage", [
    lambda r: r.pop("rank"), lambda r: r.update(rank="1"), lambda r: r.update(measures=[]),
    lambda r: r.update(errors="boom"), lambda r: r["measures"]["storage"].pop("unit"),
    lambda r: r["measures"].update(storage=7), lambda r: r.update(node=None),
])
def test_a_malformed_rank_report_is_a_flag_on_its_node_never_a_traceback(damage):
    reports = two_nodes(100.0)
    damage(reports[1])
    verdict = preflight.assess("e", reports, 2, 1, threshold=10)
    assert verdict.flagged == ["node2"] or (verdict.nodes[1].node == "node #1 of the job" and verdict.flagged)
    assert any("rank_1.json" in reason for reason in verdict.nodes[1].reasons)


def test_zero_on_every_node_is_a_failed_measure_not_no_node_flagged():
    reports = {r: report(r, f"node{r + 1}", matmul=10.0, storage=0.0) for r in range(3)}
    verdict = preflight.assess("e", reports, 3, 1, threshold=10)
    assert verdict.flagged == [] and verdict.failed
    assert list(verdict.broken) == ["storage"] and "not a finite positive number" in verdict.broken["storage"]
    assert verdict.as_json()["broken_measures"] == verdict.broken


def test_a_zero_algbw_gives_no_prediction_instead_of_a_zero_division(tmp_path):
    from trainer.config import load_run_config

    reports = {r: report(r, f"node{r + 1}", matmul=10.0) for r in range(2)}
    for r in reports.values():
        r["measures"]["train_compute"] = {"value": 100.0, "unit": "samples/s", "compute_s": 0.1}
        r["measures"]["allreduce_world"] = {"value": 5.0, "unit": "GB/s", "algbw": 0}
    run = load_run_config(tiny_run_config(tmp_path, world_size=2, batch_size=4))
    checked, broken = preflight.checked_reports(reports)
    assert "allreduce_world" in broken
    prediction = preflight.predicted_time(checked, run)
    assert "error" in prediction


@pytest.mark.parametrize("field, bad", [("eval_s", float("nan")), ("first_step_s", -1.0), ("steps_s", [0.3, math.inf]),
                                        ("steps_s", []), ("first_batch_s", "slow")])
def test_a_figure_the_prediction_adds_up_is_checked_too(field, bad):
    """The timed first step, the whole evaluation and each timed step feed the prediction: one that is not a
    finite positive number fails its measure on that rank, like the figure's value would."""
    reports = {r: report(r, f"node{r + 1}", matmul=10.0) for r in range(2)}
    for r in reports.values():
        r["measures"]["train_compute"] = {"value": 100.0, "unit": "samples/s", "compute_s": 0.1,
                                          "first_batch_s": 0.05, "first_step_s": 0.5, "eval_s": 1.0}
        r["measures"]["train_step"] = {"value": 90.0, "unit": "samples/s", "step_s": 0.11, "steps_s": [0.11, 0.12]}
    measure = "train_step" if field == "steps_s" else "train_compute"
    reports[1]["measures"][measure][field] = bad
    checked, broken = preflight.checked_reports(reports)
    assert broken == {} and measure in checked[0]["measures"] and measure not in checked[1]["measures"]
    assert any(f"{field} is" in e and "not a finite positive number" in e for e in checked[1]["errors"].values())


def test_a_prediction_out_of_bounds_is_refused(monkeypatch):
    from orchestrator.checks import predict

    class Absurd:
        def as_json(self):
            return {"minutes": -3.0, "step_s": math.inf}

    monkeypatch.setattr(predict, "earlier_converged_samples", lambda run: [])
    monkeypatch.setattr(predict, "from_preflight", lambda reports, run, converged: Absurd())
    assert preflight.predicted_time({}, None) == {"error": "the figures predict nothing sensible (minutes is -3.0)"}


def test_a_fifo_rank_file_never_blocks_and_is_named(tmp_path):
    folder = tmp_path / "preflight"
    folder.mkdir()
    os.mkfifo(folder / "rank_1.json")
    (folder / "rank_0.json").write_text(json.dumps(report(0, "node1", matmul=1.0)))
    (folder / "rank_2.json").write_text('{"rank": 2, "measures": {"matmul": {"value": 1')  # died while writing
    result: dict = {}
    reader = threading.Thread(target=lambda: result.update(preflight.rank_reports(tmp_path)), daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive(), "rank_reports blocked on a FIFO"
    assert set(result) == {0, 1, 2} and "FIFO" in result[1]["unreadable"]
    verdict = preflight.assess("e", result, 3, 1, threshold=10)
    assert verdict.flagged == ["node #1 of the job", "node #2 of the job"]
    assert "rank_1.json" in verdict.nodes[1].reasons[0] and "rank_2.json" in verdict.nodes[2].reasons[0]


@pytest.mark.parametrize("name,value", [
    ("BERTCTL_PREFLIGHT_WINDOW", "nan"), ("BERTCTL_PREFLIGHT_WINDOW", "inf"), ("BERTCTL_PREFLIGHT_WINDOW", "0"),
    ("BERTCTL_PREFLIGHT_WINDOW", "-1"), ("BERTCTL_PREFLIGHT_WINDOWS", "0"), ("BERTCTL_PREFLIGHT_WINDOWS", "2.5"),
    ("BERTCTL_PREFLIGHT_STEPS", "\u0663"), ("BERTCTL_PREFLIGHT_STEPS", ""), ("BERTCTL_PREFLIGHT_STEPS", "1e9"),
])
def test_bad_preflight_settings_are_refused_before_anything_is_submitted(name, value, monkeypatch, bertctl_home):
    monkeypatch.setenv(name, value)
    with pytest.raises(UserError, match=name):
        preflight.check_settings(os.environ)
    result = run_cli("preflight", "--cluster", "local")
    assert result.code == 2 and name in result.err and len(result.err.strip().splitlines()) == 1
    assert not (bertctl_home / "experiments").exists()


def test_good_preflight_settings_pass():
    preflight.check_settings({"BERTCTL_PREFLIGHT_WINDOW": "0.3", "BERTCTL_PREFLIGHT_WINDOWS": "3",
                              "BERTCTL_PREFLIGHT_STEPS": "2"})


def with_units(rank: int, node: str, **figures) -> dict:
    """A rank's report whose figures carry their own units: {"storage": (500, "MB/s")}."""
    return {"rank": rank, "node": node, "done": True, "errors": {},
            "measures": {k: {"value": v, "unit": unit} for k, (v, unit) in figures.items()}}


def test_figures_are_compared_in_one_unit():
    """0.5 GB/s was flagged as slower than 500 MB/s (the digits were compared), and a node reporting KB/s passed
    whatever its speed: each figure is converted to its quantity's unit before the median."""
    same = {0: with_units(0, "node1", storage=(0.5, "GB/s"), matmul=(40.0, "TFLOP/s")),
            1: with_units(1, "node2", storage=(500.0, "MB/s"), matmul=(40_000.0, "GFLOP/s")),
            2: with_units(2, "node3", storage=(490_000.0, "KB/s"), matmul=(4e13, "FLOP/s"))}
    verdict = preflight.assess("e", same, 3, 1, threshold=10)
    assert verdict.flagged == [] and verdict.medians["storage"] == pytest.approx(0.5)
    assert [n.measures["storage"].unit for n in verdict.nodes] == ["GB/s"] * 3
    slow = {**same, 2: with_units(2, "node3", storage=(200_000.0, "KB/s"), matmul=(4e13, "FLOP/s"))}
    verdict = preflight.assess("e", slow, 3, 1, threshold=10)
    assert verdict.flagged == ["node3"] and "0.2 GB/s on rank 2, 60 % below the median 0.5" in verdict.nodes[2].reasons[0]


def test_an_allreduce_in_mb_per_s_reaches_the_prediction_in_gb_per_s():
    reports = {r: with_units(r, f"node{r + 1}", allreduce_world=(2000.0, "MB/s")) for r in range(2)}
    for r in reports.values():
        r["measures"]["allreduce_world"]["algbw"] = 1500.0
    checked, broken = preflight.checked_reports(reports)
    assert broken == {} and checked[0]["measures"]["allreduce_world"] == {"value": 2.0, "unit": "GB/s", "algbw": 1.5}


@pytest.mark.parametrize("unit, why", [("furlongs/s", "no rate unit bertctl can compare"),
                                       ("Gb/s", "no rate unit bertctl can compare"),  # bits are not bytes
                                       ("samples/s", "storage counts samples/s, the other ranks GB/s")])
def test_a_figure_in_a_unit_that_cannot_be_compared_fails_its_measure_on_that_rank(unit, why):
    reports = {r: with_units(r, f"node{r + 1}", storage=(1.0, "GB/s"), matmul=(1.0, "TFLOP/s")) for r in range(3)}
    reports[2]["measures"]["storage"]["unit"] = unit
    verdict = preflight.assess("e", reports, 3, 1, threshold=10)
    assert verdict.flagged == ["node3"] and verdict.broken == {}
    (reason,) = verdict.nodes[2].reasons
    assert reason.startswith("rank 2: storage failed: rank_2.json: storage ") and why in reason


def test_two_files_for_one_rank_are_refused_in_one_line(tmp_path):
    folder = tmp_path / "preflight"
    folder.mkdir()
    for name, node in (("rank_0.json", "node1"), ("rank_1.json", "node2"), ("rank_01.json", "node9")):
        (folder / name).write_text(json.dumps(report(int(name[5:-5]), node, matmul=1.0)))
    with pytest.raises(UserError) as refused:
        preflight.rank_reports(tmp_path)
    assert "rank_01.json and rank_1.json both report rank 1" in str(refused.value) and "\n" not in str(refused.value)


def test_a_missing_rank_flags_its_node_in_one_line_and_a_rank_named_in_other_digits_is_no_rank(tmp_path):
    folder = tmp_path / "preflight"
    folder.mkdir()
    (folder / "rank_0.json").write_text(json.dumps(report(0, "node1", matmul=1.0)))
    (folder / "rank_\u0661.json").write_text(json.dumps(report(1, "node2", matmul=1.0)))  # not rank_1.json
    reports = preflight.rank_reports(tmp_path)
    assert set(reports) == {0}
    verdict = preflight.assess("e", reports, 2, 1, threshold=10)
    assert verdict.flagged == ["node #1 of the job"]
    assert verdict.nodes[1].reasons == ["no report from rank(s) 1: the node died or never started"]


def test_a_report_of_a_rank_the_job_does_not_have_fails_the_check_and_blames_no_node(tmp_path):
    """Two ranks stopped at the same point (the job was killed) beside rank_5.json of a job with more ranks: it
    is named, the check fails, and its further progress does not make the job's own ranks "stopped mid-check"."""
    from io import StringIO

    from rich.console import Console

    stopped = {r: {**report(r, f"node{r + 1}", matmul=10.0), "done": False} for r in (0, 1)}
    verdict = preflight.assess("e", {**stopped, 5: report(5, "node6", matmul=10.0, storage=1.0)}, 2, 1, threshold=10)
    assert verdict.flagged == [] and verdict.broken == {} and verdict.failed
    assert verdict.strangers == ["rank_5.json: rank 5, but the job has 2 rank(s), 0 to 1: written by another job or by "
                                 "a job started with more ranks than the cluster file gives it"]
    assert [n.reasons for n in verdict.nodes] == [[], []] and "storage" not in verdict.medians
    assert verdict.as_json()["reports_of_no_rank"] == verdict.strangers
    out = StringIO()
    preflight.print_tables(verdict, Console(file=out, width=300))
    assert "report of no rank rank_5.json: rank 5, but the job has 2 rank(s)" in out.getvalue()
    assert not preflight.assess("e", stopped, 2, 1, threshold=10).failed
