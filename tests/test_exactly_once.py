"""Exactly-once results: a run killed at any moment and resumed ends with the log an uninterrupted run
writes, each evaluation and run_stop once; a run whose log holds run_stop is finished, whatever its exit
record says. The crash states come from benchmarks/fault_harness.py (its full count is in
benchmarks/results/); here, the telling few."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest
from conftest import REPO
from mllog_factory import RunSpec, write_log
from registry_records import record

from orchestrator import experiments
from orchestrator.errors import UserError
from orchestrator.jobs import lifecycle, status
from orchestrator.jobs.scheduler import State

sys.path.insert(0, str(REPO / "benchmarks"))
import fault_harness as harness  # noqa: E402


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    work = tmp_path_factory.mktemp("faults")
    recipe, out = harness.reference_run(work)
    log = (out / "results" / "result_0.txt").read_bytes()
    return work, recipe, out, log, harness.checkpoint_positions(out)


def line_ends(log: bytes, key: str) -> list[int]:
    """The byte after each line of the log whose event is `key`."""
    ends, at = [], 0
    for line in log.splitlines(keepends=True):
        at += len(line)
        if harness._key(line) == key:
            ends.append(at)
    return ends


def crash_after(log: bytes, positions: dict[int, int], cut: int) -> harness.Crash:
    """The kill at byte `cut`, with the newest checkpoint surely taken before it."""
    return harness.Crash(cut, max((s for s, at in positions.items() if at < cut), default=None))


def outcome(reference, crash: harness.Crash) -> tuple[str, str]:
    work, recipe, out, log, _ = reference
    return harness.run_case(crash, recipe, out, log, harness.events(out / "results" / "result_0.txt"), work)


@pytest.mark.slow
def test_the_reference_run_converges_with_checkpoints_between_its_evaluations(reference):
    _, _, out, log, positions = reference
    summary = json.loads(log.splitlines()[-1].decode().partition(":::MLLOG")[2])
    assert summary["key"] == "run_stop" and summary["metadata"]["status"] == "success"
    evals = line_ends(log, "eval_accuracy")
    assert len(evals) >= 2
    # some checkpoint was taken between two evaluations: a kill after the second resumes from before it
    assert any(evals[0] <= at < evals[1] for at in positions.values())


@pytest.mark.slow
def test_a_kill_after_an_evaluation_before_the_next_checkpoint_logs_it_once(reference):
    _, _, _, log, positions = reference
    second_eval = line_ends(log, "eval_accuracy")[1]
    verdict, action = outcome(reference, crash_after(log, positions, second_eval))
    assert action == "resumed: exit 0"
    assert verdict == "same"


@pytest.mark.slow
def test_without_the_rewind_the_same_kill_doubles_the_evaluation(reference, monkeypatch):
    """The harness can fail: with the checkpoint's log position ignored, the resumed run logs the
    evaluation a second time (what happened before the fix)."""
    import trainer.loop.train

    monkeypatch.setattr(trainer.loop.train, "rewind_log", lambda log, position: 0)
    _, _, _, log, positions = reference
    verdict, _ = outcome(reference, crash_after(log, positions, line_ends(log, "eval_accuracy")[1]))
    assert verdict.startswith("doubled: "), verdict


@pytest.mark.slow
def test_a_kill_after_run_stop_keeps_the_converged_result(reference):
    _, _, _, log, positions = reference
    verdict, action = outcome(reference, crash_after(log, positions, len(log)))
    assert action == "finished: not resumed"
    assert verdict == "same"


@pytest.mark.slow
def test_a_kill_that_tears_the_run_stop_line_resumes_to_the_same_log(reference):
    _, _, _, log, positions = reference
    torn = len(log) - 20  # inside the last line: run_stop's write did not complete
    verdict, action = outcome(reference, crash_after(log, positions, torn))
    assert action == "resumed: exit 0"
    assert verdict == "same"


@pytest.mark.slow
def test_the_trainer_never_appends_to_a_log_that_ended(reference, tmp_path):
    """Even started by hand on a finished run with a checkpoint: it says so and leaves the log as it is."""
    work, recipe, out, log, positions = reference
    crash = harness.Crash(len(log), max(positions))
    result = harness.rebuild(crash, out, log, tmp_path / "run")
    assert harness.train(recipe, tmp_path / "run") == 0
    assert result.read_bytes() == log


def test_crash_states_cover_every_line_with_both_candidate_checkpoints():
    log = b"a\nbb\nccc\n"
    positions = {2: 2, 4: 5, 6: 5}  # two checkpoints taken when the log had 5 bytes
    states = harness.crashes(log, positions, torn=1, rng=random.Random(0))
    at_five = {(c.step, c.partial) for c in states if c.cut == 5}
    assert at_five == {(2, False), (6, False), (2, True)}  # before both, after both, inside the second's write
    assert {c.cut for c in states} >= {2, 5, 9} and len({c.cut for c in states}) == 4
    assert {c.step for c in states if c.cut == 2} == {None, 2}


def finished_experiment(home: Path, exit_record: str | None) -> experiments.Experiment:
    """A local experiment whose one run logged run_stop, its job gone, its exit recorded or not."""
    exp_dir = home / "experiments" / "c-20260101-000000-aaaaaaaa"
    (exp_dir / "runs").mkdir(parents=True)
    (exp_dir / "runs" / "0.started").touch()
    if exit_record is not None:
        (exp_dir / "runs" / "0.exit").write_text(exit_record)
    write_log(exp_dir / "results" / "result_0.txt", RunSpec(converged=True))
    (exp_dir / "experiment.json").write_text(json.dumps(record(exp_dir, job_ids=["2147483646"])))
    return experiments.find(exp_dir.name)


def test_a_run_killed_between_run_stop_and_its_exit_record_is_completed_and_not_resumed(bertctl_home):
    exp = finished_experiment(bertctl_home, exit_record=None)
    view = status.collect([exp])[0]
    assert view.runs[0].state is State.COMPLETED and view.runs[0].outcome == "success"
    assert view.state is State.COMPLETED
    with pytest.raises(UserError, match="every run completed"):
        lifecycle.resume(exp)


def test_a_recorded_failure_after_run_stop_stays_failed(bertctl_home):
    """An exit record is the run's own word: a run that logged run_stop, then failed (writing its final
    model) is FAILED, not taken for converged."""
    exp = finished_experiment(bertctl_home, exit_record="1")
    assert status.collect([exp])[0].runs[0].state is State.FAILED
