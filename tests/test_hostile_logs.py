"""Hostile MLPerf result logs (tests/hostile_logs.py damages valid ones from tests/mllog_factory.py):
compliance-check never judges a malformed log PASS nor scores it, and no log hangs or crashes
compliance-check, status, plot or package. Plus a relative --results and plot/package on a full disk."""

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time

import hostile_logs
import mllog_factory as f
import pytest
from conftest import REPO, run_bertctl, run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.errors import UserError
from orchestrator.results import resultlog
from orchestrator.results import summary as results

CASES = hostile_logs.cases()
IDS = [c.name for c in CASES]
DAMAGED = 1  # the index of the damaged log in a set


@pytest.fixture(scope="module")
def valid_logs(tmp_path_factory):
    """Two valid logs, written once; each test copies them."""
    folder = tmp_path_factory.mktemp("valid")
    for i, spec in enumerate(f.example_specs(legacy_keys=False)[:2]):
        f.write_log(folder / f"result_{i}.txt", spec)
    return folder


def damaged_set(valid_logs, tmp_path, case) -> tuple:
    logs = tmp_path / "logs"
    shutil.copytree(valid_logs, logs)
    path = logs / f"result_{DAMAGED}.txt"
    case.apply(path)
    return logs, path


def run(case, *args):
    """In this process (fast); as a process with a timeout where a file could block before the fix."""
    return run_bertctl(*args, timeout=60) if case.replace is not None else run_cli(*args)


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0]


# ---- the reader: each class found, with its line


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_reader_finds_each_damage_with_its_line(case, valid_logs, tmp_path):
    _, path = damaged_set(valid_logs, tmp_path, case)
    if case.replace is not None:
        with pytest.raises(UserError, match=case.reason.replace("(", r"\(").replace(")", r"\)")):
            results.summarize(path)
        return
    s = results.summarize(path)
    said = (f"line {s.damaged[0][0]}: {s.damaged[0][1]}" if s.damaged else s.problem) or s.incomplete
    assert said and case.reason in said, said
    assert bool(s.damaged) == case.damaged, said
    assert s.minutes is None or s.problem is None and s.incomplete  # a damaged run has no time to train
    assert not s.converged or s.problem is None and s.incomplete


def test_published_and_generated_logs_break_no_rule(tmp_path):
    """No false alarms: every published v1.1 log and every kind of log the factory writes passes."""
    published = sorted((REPO / "tests" / "data" / "mlperf-results").rglob("result_*.txt"))
    assert len(published) == 20
    # NVIDIA at 8 to 4,320 GPUs (every rank logs the init phase with its own clock: lines out of order
    # by milliseconds; start_warmup_step -25), Habana (evaluations written after the training blocks,
    # with the time they were taken; submission keys after run_stop), Graphcore (counts as [n]); the
    # archives keep their files' old mtimes
    for archive in sorted((REPO / "tests" / "data" / "mlperf-published").rglob("*.tar.gz")):
        with tarfile.open(archive) as tar:
            tar.extractall(tmp_path / archive.name, filter="data")
    archived = sorted(tmp_path.rglob("result_*.txt"))
    assert len(archived) == 60
    published += archived
    generated = [f.write_log(tmp_path / f"r{i}.txt", spec) for i, spec in enumerate(
        f.example_specs()[:2] + f.tiny_closed_specs(2) + [f.RunSpec(tracked_stats=True), f.RunSpec(converged=False),
                                                          f.RunSpec(block_start_at_begin=False)])]
    for path in published + generated:
        log = resultlog.parse(path)
        assert (log.damaged, log.problem, log.incomplete()) == ([], None, None), path


def test_the_issues_example_names_the_second_run_start_and_both_lines(valid_logs, tmp_path):
    _, path = damaged_set(valid_logs, tmp_path, hostile_logs.Case("x", hostile_logs.before_last_line("run_start"), ""))
    lines = path.read_text().splitlines()
    first = next(i for i, line in enumerate(lines, 1) if '"key": "run_start"' in line)
    assert results.summarize(path).problem == f"line {len(lines) - 1}: a second run_start (the first is on line {first})"


# ---- compliance-check: FAILED (or one line, exit 2), never PASSED


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_compliance_check_never_passes_a_damaged_log(case, valid_logs, tmp_path):
    logs, path = damaged_set(valid_logs, tmp_path, case)
    result = run(case, "compliance-check", "--results", str(logs), "--no-score", "--json")
    assert "Traceback" not in result.err and "PASSED" not in result.err, result.err[-3000:]
    if case.damaged:
        line = one_line(result.err)
        assert result.code == 2 and path.name in line and case.reason in line, line
        return
    report = json.loads(result.out)
    verdict = report["runs"][DAMAGED]
    assert result.code == 1 and report["passed"] is False and verdict["compliant"] is False, result.err[-3000:]
    assert verdict["minutes"] is None and verdict["converged"] is False
    if verdict["message"].startswith("malformed log (bertctl's checks): line "):
        assert case.reason in verdict["message"]
    else:  # a run that never finished reaches the official checker, which fails it as the package checker does
        assert any(case.reason in failure for failure in verdict["failures"]) and verdict["checker_messages"]
    assert report["runs"][0]["compliant"] is True  # the valid log beside it is judged as before


def test_a_malformed_log_fails_a_ten_run_set_and_never_enters_the_score(tmp_path, monkeypatch):
    """MLPerf drops one run that was judged and failed; a malformed log passes the official checker (which
    does not see the break), so the package checker would count it: bertctl fails the set, says it is
    stricter, leaves the run's time out of the score, and still lets the official tools judge the log
    (it reads in seconds) for the package checker's view."""
    from orchestrator.results import verdict

    logs = tmp_path / "logs"
    for i, spec in enumerate(f.example_specs()):
        f.write_log(logs / f"result_{i}.txt", spec)
    hostile_logs.Case("x", hostile_logs.run_stop_at(-60_000), "").apply(logs / "result_4.txt")
    handed = []
    real = verdict.check_logs
    monkeypatch.setattr(verdict, "check_logs", lambda paths, *a: handed.extend(paths) or real(paths, *a))
    result = run_cli("compliance-check", "--results", str(logs), "--json")
    report = json.loads(result.out)
    assert result.code == 1 and report["passed"] is False and "FAILED" in result.err
    assert report["runs"][4]["minutes"] is None and report["dropped"] == ["result_4.txt"]
    assert report["runs"][4]["compliant"] is False and report["runs"][4]["official"] is True
    kept = sorted(m for i, m in enumerate(f.EXAMPLE_MINUTES) if i != 4)
    assert report["score_minutes"] == pytest.approx(sum(kept[1:]) / 8, abs=1e-4)
    assert report["problems"][-1].startswith("1 malformed log(s) (result_4.txt): their events break bertctl's rules "
                                             "(result_4.txt line 508: time_ms ")
    assert report["stricter"] == report["problems"] and report["package_checker_view"]["passed"] is True
    assert report["rcp"]["pass"] is True and sorted(p.name for p in handed) == [f"result_{i}.txt" for i in range(10)]


# ---- lies a set tells: one run counted twice


def two_run_set(tmp_path, **second) -> tuple:
    logs = tmp_path / "logs"
    specs = f.example_specs()[:2]
    f.write_log(logs / "result_0.txt", specs[0])
    f.write_log(logs / "result_1.txt", f.RunSpec(**{**vars(specs[1]), **second}))
    return logs, logs / "result_0.txt", logs / "result_1.txt"


@pytest.mark.parametrize("how, said", [("copy", "result_1.txt is a copy of result_0.txt"),
                                       ("hard link", "result_1.txt is the same file as result_0.txt"),
                                       ("same seed", "result_1.txt and result_0.txt log the same seed 1000")])
def test_one_run_counted_twice_fails_the_set(how, said, tmp_path):
    """No published set repeats a run, a file or a seed; the official checker judges each log alone."""
    logs, first, second = two_run_set(tmp_path, seed=f.example_specs()[0].seed)
    if how == "copy":
        shutil.copyfile(first, second)
    elif how == "hard link":
        second.unlink()
        os.link(first, second)
    result = run_cli("compliance-check", "--results", str(logs), "--no-score", "--json")
    report = json.loads(result.out)
    assert result.code == 1 and report["passed"] is False and "Traceback" not in result.err
    assert [r["compliant"] for r in report["runs"]] == [True, True]  # each log alone is fine
    assert any(said in p for p in report["problems"]), report["problems"]


def test_a_division_the_official_tools_crash_on_is_one_line_each(tmp_path):
    """submission_division "closed " makes the official checker and summarizer raise FileNotFoundError."""
    logs = tmp_path / "logs"
    for i, spec in enumerate(f.example_specs()):
        f.write_log(logs / f"result_{i}.txt", spec)
        hostile_logs.Case("x", hostile_logs.set_field("submission_division", "value", '"closed "', last=False),
                          "").apply(logs / f"result_{i}.txt")
    result = run_cli("compliance-check", "--results", str(logs), "--json")
    report = json.loads(result.out)
    assert result.code == 1 and report["passed"] is False and "Traceback" not in result.err
    crashes = [p for p in report["problems"] if "crashed" in p]
    assert len(crashes) == 2 and all("\n" not in p and "FileNotFoundError" in p for p in crashes), crashes
    assert "summarizer" in crashes[1]


def test_a_long_line_does_not_hang_compliance_check_plot_or_status(valid_logs, tmp_path):
    case = next(c for c in CASES if c.name == "lines/300 KB line")
    logs, _ = damaged_set(valid_logs, tmp_path, case)
    started = time.monotonic()
    for verb in (("compliance-check", "--results", str(logs), "--no-score"), ("plot", "--results", str(logs))):
        result = run_bertctl(*verb, timeout=60)
        assert result.code == 2 and "an event of 300," in one_line(result.err)
    assert time.monotonic() - started < 60


# ---- status: one hostile log never takes the registry down


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_status_lists_every_experiment_and_marks_the_damaged_log(case, valid_logs, tmp_path):
    good = f.make_experiment(f.example_specs(legacy_keys=False)[:2])
    bad = f.make_experiment(f.example_specs(legacy_keys=False)[:2])
    shutil.copyfile(valid_logs / f"result_{DAMAGED}.txt", bad.result_file(DAMAGED))
    case.apply(bad.result_file(DAMAGED))
    result = run(case, "status", "--json")
    assert result.code == 0 and "Traceback" not in result.err, result.err[-3000:]
    views = {v["id"]: v for v in json.loads(result.out)["experiments"]}
    assert set(views) == {good.id, bad.id}
    assert all(r["error"] is None or not r["error"].startswith("damaged log") for r in views[good.id]["runs"])
    if case.name == "order/no run_stop":  # an unfinished log is a run in progress, not a damaged one
        return
    error = views[bad.id]["runs"][DAMAGED]["error"]
    assert error.startswith("damaged log: ") and case.reason in error, error
    assert "\n" not in error


def test_status_marks_a_completed_run_with_a_malformed_log_failed(valid_logs):
    exp = f.make_experiment(f.example_specs(legacy_keys=False)[:2])
    (exp.path / "runs").mkdir(exist_ok=True)
    for i in range(2):
        (exp.path / "runs" / f"{i}.started").touch()
        exp.exit_file(i).write_text("0\n")
    hostile_logs.Case("x", hostile_logs.append_copy("run_stop"), "").apply(exp.result_file(1))
    view = json.loads(run_cli("status", exp.id, "--json").out)["experiments"][0]
    assert [r["state"] for r in view["runs"]] == ["COMPLETED", "FAILED"]
    assert view["runs"][1]["error"].startswith("damaged log: result_1.txt line ")


def test_a_fifo_run_log_is_named_not_waited_for(tmp_path):
    exp = f.make_experiment(f.example_specs(legacy_keys=False)[:1])
    exp.log_file(0).parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(exp.log_file(0))
    result = run_bertctl("logs", exp.id, "--run", "0", timeout=30)
    assert result.code == 2 and "not a regular file (a FIFO)" in one_line(result.err)
    exp.exit_file(0).parent.mkdir(parents=True, exist_ok=True)
    exp.exit_file(0).write_text("1\n")
    view = json.loads(run_bertctl("status", exp.id, "--json", timeout=30).out)["experiments"][0]
    assert "not a regular file (a FIFO)" in view["runs"][0]["error"]


# ---- no traceback from any value in any field


JSON_VALUES = st.one_of(
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1" + "0" * 40, "null", "true", "[]", "{}",
                     '"x"', '""', "-1", "0", "1e15", "9007199254740993", "[[[[[[1]]]]]]", '{"status": 5}']),
    st.integers(min_value=-(10**20), max_value=10**20).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(json.dumps),
    st.text(max_size=12).map(json.dumps),
)
FIELDS = [("time_ms", None), ("value", None), ("metadata", None), ("key", None), ("epoch_num", "metadata"),
          ("samples_count", "metadata"), ("status", "metadata"), ("throughput", None)]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_value_in_any_field_is_read_without_a_traceback(data, valid_logs, tmp_path_factory):
    path = tmp_path_factory.mktemp("h") / "result_0.txt"
    shutil.copyfile(valid_logs / "result_0.txt", path)
    lines = path.read_text().splitlines()
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.sampled_from([n for n, line in enumerate(lines) if hostile_logs.MARK in line]))
        name, within = data.draw(st.sampled_from(FIELDS))
        if within and not isinstance(hostile_logs.event_of(lines[i]).get(within), dict):
            within = None
        lines[i] = hostile_logs.with_field(lines[i], name, data.draw(JSON_VALUES), within)
    path.write_text("\n".join(lines) + "\n")
    s = results.summarize(path)  # never raises: a damaged line or a broken rule is reported, not thrown
    # what reaches the table, the JSON and the score is a plain finite number or None
    for number in (s.minutes, s.samples, s.last_accuracy, s.first_time_ms, s.train_samples, s.seed):
        assert number is None or (type(number) in (int, float) and abs(number) < 2**63)
    json.dumps({"s": s.minutes, "a": s.last_accuracy, "seed": s.seed}, allow_nan=False)
    s.throughput()
    s.accuracy_curve()


# ---- item 8: a relative --results, and plot/package on a full disk


def test_a_relative_results_folder_is_checked_like_an_absolute_one(valid_logs, tmp_path, monkeypatch):
    shutil.copytree(valid_logs, tmp_path / "logs")
    monkeypatch.chdir(tmp_path)
    result = run_cli("compliance-check", "--results", "logs", "--no-score", "--json")
    report = json.loads(result.out)
    assert result.code == 0 and [r["compliant"] for r in report["runs"]] == [True, True], result.err


def test_plot_onto_a_full_disk_leaves_nothing_and_a_retry_works(tmp_path):
    from test_full_disk import tmpfs

    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    exp = f.make_experiment(f.example_specs(legacy_keys=False)[:2])
    with tmpfs(tmp_path / "small", "size=64k") as mount:
        out = mount / "convergence.png"
        result = run_cli("plot", exp.id, "--out", str(out))
        assert result.code == 2 and "No space left on device" in one_line(result.err)
        assert list(mount.iterdir()) == []  # no half-written PNG, no temporary file
    with tmpfs(tmp_path / "big", "size=8m") as mount:
        result = run_cli("plot", exp.id, "--out", str(mount / "convergence.png"))
        assert result.code == 0 and [p.name for p in mount.iterdir()] == ["convergence.png"]


def test_package_onto_a_full_disk_leaves_nothing_and_a_retry_works(tmp_path):
    from test_full_disk import tmpfs

    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    exp = f.make_experiment(f.example_specs())
    size = sum(exp.result_file(i).stat().st_size for i in range(10))
    with tmpfs(tmp_path / "small", f"size={size // 2 // 4096 * 4096}") as mount:
        result = run_cli("package", exp.id, "--org", "Org", "--out", str(mount / "pkg"))
        assert result.code == 2 and "No space left on device" in one_line(result.err)
        assert [p for p in mount.rglob("*") if not p.is_dir()] == []  # no half-written logs
        assert not (mount / "pkg" / "Org").exists()  # nothing in the way of a retry
    with tmpfs(tmp_path / "big", "size=16m") as mount:
        result = run_cli("package", exp.id, "--org", "Org", "--out", str(mount / "pkg"))
        assert result.code == 0 and (mount / "pkg" / "Org" / "results").is_dir(), result.err[-2000:]
        assert sorted(p.name for p in (mount / "pkg").iterdir()) == ["Org"]


def test_package_refuses_a_malformed_log_before_writing_anything(tmp_path):
    exp = f.make_experiment(f.example_specs())
    hostile_logs.Case("x", hostile_logs.before_last_line("run_start"), "").apply(exp.result_file(2))
    result = run_cli("package", exp.id, "--org", "Org", "--out", str(tmp_path / "pkg"))
    line = one_line(result.err)
    assert result.code == 2 and "result_2.txt: malformed MLPerf log: line " in line and "a second run_start" in line
    assert not (tmp_path / "pkg").exists()


def test_the_reader_never_imports_torch():
    code = "import sys, orchestrator.results.resultlog, orchestrator.results.summary; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0


def test_a_line_still_being_written_is_not_damage(valid_logs, tmp_path):
    """status reads the logs of running runs: their last line may lack its end (and its newline) for a moment."""
    path = tmp_path / "result_0.txt"
    lines = (valid_logs / "result_0.txt").read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:40]) + lines[40][:50])
    s = results.summarize(path)
    assert (s.damaged, s.problem, s.incomplete) == ([], None, "line 41: no run_stop") and s.events == 40
    path.write_text("".join(lines[:40]) + lines[40][:50] + "\n")  # ended: now it is damage
    assert [line for line, _ in results.summarize(path).damaged] == [41]
