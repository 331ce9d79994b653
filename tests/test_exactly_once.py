"""Exactly-once results: a run killed at any moment and resumed ends with the log an uninterrupted run
writes, each evaluation and run_stop once; a run whose log holds run_stop is finished, whatever its exit
record says. The crash states come from benchmarks/fault_harness.py (its full count is in
benchmarks/results/); here, the telling few."""

from __future__ import annotations

import json
import random
import shutil
import sys
import time
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
    # each names its run for bertctl, which reads it without torch (trainer/config/checkpoint_folder.py::check_parts)
    assert {(p / "identity.json").read_text() for p in (out / "checkpoints" / "run_0").glob("step_*")} == {
        json.dumps({"seed": int(harness.SEED), "run_index": 0})}


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
def test_a_run_requeued_before_its_first_checkpoint_starts_its_log_over_after_cache_clear(reference, tmp_path):
    """A node fails while the run trains, before its first checkpoint; Slurm requeues the job, whose script keeps
    the log (the run had started: its cache_clear is logged) and starts the trainer again, from nothing. The
    earlier attempt's lines go, the launcher's cache_clear stays: not two init_starts and two run_starts."""
    from trainer.mlperf import log_cache_clear

    work, recipe, out, log, positions = reference
    cut = line_ends(log, "run_start")[0]  # the run began; its first checkpoint is taken after its first block_start
    assert cut < min(positions.values())
    result = tmp_path / "run" / "results" / "result_0.txt"
    result.parent.mkdir(parents=True)
    log_cache_clear(result)
    with result.open("ab") as f:
        f.write(log[:cut])
    assert harness.train(recipe, tmp_path / "run") == 0
    got = harness.events(result)
    assert got[0][0] == "cache_clear" and got[1:] == harness.events(out / "results" / "result_0.txt")


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


@pytest.mark.slow
@pytest.mark.parametrize("edit", harness.EDITS, ids=lambda edit: edit.name)
def test_a_resume_checks_the_state_it_finds_and_refuses_an_edited_one_changing_nothing(reference, edit):
    """A log shortened or edited, a garbled `log_bytes`, a `latest` naming a deleted checkpoint, a damaged or
    another run's checkpoint: the trainer refuses in one line naming the file (exit 2) and leaves every file as it
    was, where it once lost or doubled an evaluation, or started over with a second run_start. The legitimate state
    among them (a checkpoint newer than `latest`) resumes to the reference log."""
    work, recipe, out, log, positions = reference
    crash = harness.edited_crash(log, positions)
    verdict, said = harness.run_edit(edit, crash, recipe, out, log, harness.events(out / "results" / "result_0.txt"), work)
    assert verdict == ("same" if edit.names is None else "refused"), (verdict, said)


@pytest.mark.parametrize("edit", harness.EDITS, ids=lambda edit: edit.name)
def test_bertctl_refuses_each_edited_state_the_trainer_refuses_before_any_trainer_starts(reference, edit, tmp_path):
    """`bertctl status` and `bertctl resume` ask what the trainer will (trainer/config/checkpoint_folder.py::
    resume_point with the run's identity), without torch: a damaged part or another run's checkpoint was once
    accepted there, and the resumed job failed."""
    from trainer.config.checkpoint_folder import CheckpointRefused, resume_point

    _, _, out, log, positions = reference
    folder = tmp_path / "run"
    result = harness.rebuild(harness.edited_crash(log, positions), out, log, folder)
    edit.apply(folder)
    identity = {"seed": int(harness.SEED), "run_index": 0}
    if edit.names is None:
        assert resume_point(folder / "checkpoints" / "run_0", result, identity) is not None
        return
    with pytest.raises(CheckpointRefused) as refused:
        resume_point(folder / "checkpoints" / "run_0", result, identity)
    named = "identity.json" if edit.name == "another run's checkpoint" else edit.names  # the trainer: shared.pt's seed
    assert named.split("/")[-1] in str(refused.value) and "\n" not in str(refused.value)


EXP_ID = "c-20260101-000000-aaaaaaaa"


def interrupted_experiment(home: Path, reference) -> tuple[experiments.Experiment, harness.Crash]:
    """A local experiment whose run 0 was killed after its second evaluation and marked interrupted, its log and
    checkpoints as the kill left them."""
    _, _, out, log, positions = reference
    exp_dir = home / "experiments" / EXP_ID
    crash = harness.edited_crash(log, positions)
    harness.rebuild(crash, out, log, exp_dir)
    (exp_dir / "runs").mkdir()
    (exp_dir / "runs" / "0.started").touch()
    (exp_dir / "runs" / "0.interrupted").write_text("75\n")
    (exp_dir / "job.sh").write_text("#!/bin/bash\n")  # what resume starts again (launched by a stand-in here)
    (exp_dir / "experiment.json").write_text(json.dumps(record(exp_dir, job_ids=["2147483646"])))
    return experiments.find(EXP_ID), crash


@pytest.mark.slow
def test_status_names_the_checkpoint_the_trainer_resumes_from(reference, bertctl_home):
    """One function decides for both (trainer/config/checkpoint_folder.py::latest_checkpoint): with a complete
    checkpoint newer than `latest` (a kill between its rename and the pointer) both name `latest`'s."""
    from trainer.checkpoints.run import Checkpoints

    exp, crash = interrupted_experiment(bertctl_home, reference)
    harness._newer_checkpoint_without_pointer(exp.path)
    run = status.collect([exp])[0].runs[0]
    assert run.state is State.INTERRUPTED and run.error.startswith(f"checkpoint saved at update {crash.step}: ")
    assert status.checkpoint_update(exp, 0) == crash.step
    assert Checkpoints(exp.path / "checkpoints" / "run_0", keep=10, rank=0).latest().name == f"step_{crash.step:08d}"


@pytest.mark.slow
def test_a_resume_the_trainer_would_refuse_is_refused_before_anything_changes_and_restart_sets_the_run_aside(
        reference, bertctl_home, monkeypatch):
    exp, crash = interrupted_experiment(bertctl_home, reference)
    curves = sorted(p.relative_to(reference[2]).as_posix() for p in (reference[2] / "tensorboard" / "run_0").rglob("*"))
    assert any("tfevents" in name for name in curves), curves  # the reference run's TensorBoard event files
    shutil.copytree(reference[2] / "tensorboard" / "run_0", exp.path / "tensorboard" / "run_0")
    shutil.copytree(reference[2] / "metrics", exp.path / "metrics")
    harness._delete_latest_folder(exp.path)  # `latest` names a checkpoint that is gone
    pointer = exp.path / "checkpoints" / "run_0" / "latest"
    run = status.collect([exp])[0].runs[0]
    assert run.state is State.INTERRUPTED and run.error == f"cannot resume: {pointer}: names step_{crash.step:08d}, which does not exist"
    before = harness.snapshot(exp.path)
    with pytest.raises(UserError) as refused:
        lifecycle.resume(exp)
    assert "\n" not in str(refused.value) and str(refused.value).startswith(f"{EXP_ID}: run 0 cannot resume: {pointer}: ")
    assert f"bertctl resume {EXP_ID} --run 0 --restart (docs/recovery.md)" in str(refused.value)
    assert harness.snapshot(exp.path) == before  # nothing changed: the run was not reopened, its log not cut
    from orchestrator.jobs import submit

    launched = []
    monkeypatch.setattr(submit, "launch", lambda exp, runs: launched.append(runs) or ["4242"])
    assert lifecycle.resume(exp, restart=True).job_ids == ["4242"] and launched == [None]
    (aside,) = (exp.path / "set_aside").iterdir()
    assert sorted(p.name for p in aside.iterdir()) == ["result_0.txt", "run_0", "run_0.jsonl", "tensorboard"]  # kept, not deleted
    assert sorted("tensorboard/run_0/" + p.relative_to(aside / "tensorboard").as_posix()
                  for p in (aside / "tensorboard").rglob("*")) == curves
    assert not (exp.path / "runs" / "0.started").exists() and not (exp.path / "checkpoints" / "run_0").exists()
    assert not (exp.path / "tensorboard" / "run_0").exists() and not (exp.path / "metrics" / "run_0.jsonl").exists()


@pytest.mark.parametrize("edit", ["shared.pt replaced by garbage", "another run's checkpoint"])
def test_status_and_resume_refuse_a_damaged_part_or_another_runs_checkpoint(reference, bertctl_home, edit):
    """Both once said "checkpoint saved at update N: bertctl resume continues it", and resume reopened the run
    for a trainer that then refused it: now both refuse first, naming the file, nothing changed."""
    exp, crash = interrupted_experiment(bertctl_home, reference)
    next(e for e in harness.EDITS if e.name == edit).apply(exp.path)
    named = exp.path / "checkpoints" / "run_0" / f"step_{crash.step:08d}" / (
        "shared.pt" if edit.startswith("shared") else "identity.json")
    run = status.collect([exp])[0].runs[0]
    assert run.state is State.INTERRUPTED and run.error.startswith(f"cannot resume: {named}: "), run.error
    before = harness.snapshot(exp.path)
    with pytest.raises(UserError) as refused:
        lifecycle.resume(exp)
    assert f"run 0 cannot resume: {named}: " in str(refused.value) and harness.snapshot(exp.path) == before


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


# ---- the TensorBoard curves (trainer/loop/curves.py), exactly once as the log

def curves(folder: Path) -> dict[str, list]:
    """Every scalar tag of one event-file folder as TensorBoard's own reader gives it: [(step, value, wall time)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    reader = EventAccumulator(str(folder), size_guidance={"scalars": 0})  # 0: keep every point
    reader.Reload()
    return {tag: [(e.step, e.value, e.wall_time) for e in reader.Scalars(tag)] for tag in reader.Tags()["scalars"]}


def metrics(out: Path) -> list[dict]:
    """metrics/run_0.jsonl, the later record of an update winning (a resumed run reports the updates after its
    checkpoint again: the same reading as orchestrator/results/resultset.py::ResultSet.loss_curve)."""
    by_update = {}
    for line in (out / "metrics" / "run_0.jsonl").read_text().splitlines():
        record = json.loads(line)
        by_update[record["update"]] = record
    return [by_update[u] for u in sorted(by_update)]


def check_curves_against_metrics(out: Path) -> dict[str, list]:
    """Both folders' curves hold each record's scalars once, at its update and its samples, and each evaluation
    the MLPerf log holds, once."""
    from trainer.loop.curves import BY_SAMPLES, EVAL_TAG, TAGS

    records, folder = metrics(out), out / "tensorboard" / "run_0"
    by_update, by_samples = curves(folder), curves(folder / BY_SAMPLES)
    evals = [(e["metadata"]["epoch_num"], e["value"]) for e in map(json.loads, (
        line.partition(":::MLLOG")[2] for line in (out / "results" / "result_0.txt").read_text().splitlines()))
        if e["key"] == "eval_accuracy"]
    assert len(records) >= 8 and len(evals) >= 3
    for key, tag in TAGS.items():
        expected = [(r["update"], r["samples"], r[key]) for r in records if key in r]
        if key == "mfu":  # on a GPU only
            assert not expected and tag not in by_update
            continue
        assert [(s, v) for s, v, _ in by_update[tag]] == [(u, pytest.approx(x, rel=1e-6)) for u, _, x in expected], tag
        assert [(s, v) for s, v, _ in by_samples[f"{BY_SAMPLES}/{tag}"]] == [(n, pytest.approx(x, rel=1e-6)) for _, n, x in expected]
    assert [(s, v) for s, v, _ in by_samples[f"{BY_SAMPLES}/{EVAL_TAG}"]] == [(n, pytest.approx(a, rel=1e-6)) for n, a in evals]
    assert [s for s, _, _ in by_update[EVAL_TAG]] == sorted(set(s for s, _, _ in by_update[EVAL_TAG])) and len(evals) == len(by_update[EVAL_TAG])
    return by_update


@pytest.mark.slow
def test_the_curves_hold_the_metrics_and_evaluations_once(reference):
    _, _, out, _, _ = reference
    check_curves_against_metrics(out)


@pytest.mark.slow
def test_a_resumed_run_continues_its_curves_without_duplicates(reference, tmp_path):
    """Killed after its second evaluation, with the curves written past its latest checkpoint (all of the
    reference's, as an attempt that got that far leaves them): the resumed run's purge drops every point past
    the checkpoint and writes them again, so each point is there once and the points after the checkpoint are
    the resumed run's (their wall times are)."""
    _, _, out, _, _ = reference
    folder, crash, resumed_at = resumed_after_the_second_evaluation(reference, tmp_path)
    by_update = check_curves_against_metrics(folder)
    reference_curves = curves(out / "tensorboard" / "run_0")
    for tag, points in by_update.items():
        assert [s for s, _, _ in points] == [s for s, _, _ in reference_curves[tag]], tag  # each step once
        assert all((wall >= resumed_at) == (step > crash.step) for step, _, wall in points), tag
    assert any(step > crash.step for step, _, _ in by_update["eval/mlm_accuracy"])  # an evaluation was redone


@pytest.mark.slow
def test_without_the_purge_the_resumed_curves_hold_points_twice(reference, tmp_path, monkeypatch):
    """The test above can fail: with writers that purge nothing, the points past the checkpoint are there twice."""
    import torch.utils.tensorboard

    writer = torch.utils.tensorboard.SummaryWriter
    monkeypatch.setattr(torch.utils.tensorboard, "SummaryWriter", lambda folder, purge_step=None: writer(folder))
    folder, crash, _ = resumed_after_the_second_evaluation(reference, tmp_path)
    steps = [step for step, _, _ in curves(folder / "tensorboard" / "run_0")["train/loss"]]
    assert len(steps) > len(set(steps)) and min(s for s in steps if steps.count(s) > 1) > crash.step


def resumed_after_the_second_evaluation(reference, tmp_path: Path) -> tuple[Path, harness.Crash, float]:
    """The run killed after its second evaluation (its latest checkpoint before it), its curves and metrics as the
    reference wrote them to the end, then resumed: (its folder, the crash, when the resume began)."""
    _, recipe, out, log, positions = reference
    crash = crash_after(log, positions, line_ends(log, "eval_accuracy")[1])
    folder = tmp_path / "run"
    result = harness.rebuild(crash, out, log, folder)
    shutil.copytree(out / "tensorboard", folder / "tensorboard")
    shutil.copytree(out / "metrics", folder / "metrics")
    resumed_at = time.time()
    assert harness.resume(recipe, folder, result) == "resumed: exit 0"
    return folder, crash, resumed_at
