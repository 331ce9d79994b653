"""The small faults of issue 37, each a one-line refusal (exit 2) that leaves nothing half-written: a
walltime beyond what Slurm can say, other scripts' digits in a time limit, pack_average below one
sequence, balance's bad packing flags and plot paths, the GPU suite's empty runs and bad --out."""

from __future__ import annotations

import contextlib
import io
import json
import signal
import subprocess
import sys

import pytest
from conftest import REPO, run_cli

from trainer.config import BalanceConfig


def one_line(text: str) -> bool:
    return len(text.strip().splitlines()) == 1 and "Traceback" not in text


def test_a_walltime_beyond_999_days_is_refused_not_a_type_error(bertctl_home):
    result = run_cli("submit", "--cluster", "nvidia_dgxa100_8x8", "--nexp", "10", "-o", "slurm.time_per_run=999-00:00:00",
                     "--dry-run")
    assert result.code == 2 and one_line(result.err) and "slurm.time_per_run" in result.err and "9,990 days" in result.err
    assert not (bertctl_home / "experiments").exists()


@pytest.mark.parametrize("value", ["\u0661\u0660", "\uff11\uff10:00", "1-\u0662:00"])
def test_other_scripts_digits_in_a_time_limit_are_refused(value):
    result = run_cli("render", "--cluster", "nvidia_dgxa100_8x8", "-o", f"slurm.time_limit={value}")
    assert result.code == 2 and one_line(result.err) and "slurm.time_limit" in result.err


@pytest.mark.parametrize("average", [0.5, 0.999, float("nan"), float("inf"), -1.0])
def test_pack_average_below_one_sequence_is_refused(average):
    with pytest.raises(ValueError, match="pack_average"):
        BalanceConfig(packing=True, pack_average=average)
    assert BalanceConfig(packing=True, pack_average=1.0, pack_sequences=3).pack_average == 1.0


def balance(*args: str) -> subprocess.CompletedProcess:
    """`bertctl balance` in this process (what the CLI runs as `python -m trainer.balance.simulate`)."""
    from trainer.balance.simulate import main

    return in_process(main, ["--ranks", "8", "--batch", "4", "--steps", "2", *args])


def in_process(main, argv: list[str]) -> subprocess.CompletedProcess:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


@pytest.mark.parametrize("args,message", [
    (["--pack-sequences", "0"], "--pack-sequences must be 1.."),
    (["--pack-sequences", "3", "--pack-average", "nan"], "--pack-average must be"),
    (["--pack-sequences", "3", "--pack-average", "-2"], "--pack-average must be"),
    (["--pack-sequences", "3", "--pack-average", "0.5"], "--pack-average must be"),
    (["--plot", ""], "not a folder"),
])
def test_bad_balance_flags_are_one_line(args, message):
    proc = balance(*args)
    assert proc.returncode == 2 and one_line(proc.stderr) and message in proc.stderr, proc.stderr


def test_balance_plot_onto_a_folder_or_an_unwritable_place_writes_nothing(tmp_path):
    proc = balance("--plot", str(tmp_path))
    assert proc.returncode == 2 and "not a folder" in proc.stderr and list(tmp_path.iterdir()) == []
    assert not tmp_path.with_name(tmp_path.name + ".png").exists()
    proc = balance("--plot", "/proc/bertctl-plot.png")
    assert proc.returncode == 2 and one_line(proc.stderr) and "cannot write" in proc.stderr, proc.stderr


def suite(*args: str) -> subprocess.CompletedProcess:
    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_suite

    handler = signal.getsignal(signal.SIGTERM)  # the suite sets its own
    try:
        return in_process(gpu_suite.main, ["--device", "cpu", "--quick", *args])
    finally:
        signal.signal(signal.SIGTERM, handler)


@pytest.mark.parametrize("args,message", [
    (["--budget", "0"], "--budget must be a positive number"), (["--budget", "nan"], "--budget must be a positive"),
    (["--stages", ""], "--stages names no stage"), (["--stages", ","], "--stages names no stage"),
    (["--out", ""], "--out is empty"), (["--out", "/proc/bertctl-gpu-run"], "cannot write there"),
])
def test_the_gpu_suite_refuses_runs_that_would_check_nothing_or_write_nowhere(args, message):
    proc = suite(*args)
    assert proc.returncode == 2 and one_line(proc.stderr) and message in proc.stderr, proc.stderr


def test_the_gpu_suite_refuses_a_file_as_its_out_folder(tmp_path):
    target = tmp_path / "a-file"
    target.write_text("mine")
    proc = suite("--out", str(target))
    assert proc.returncode == 2 and "is a file, not a folder" in proc.stderr and target.read_text() == "mine"


def test_a_suite_whose_stages_were_all_skipped_has_not_passed(tmp_path):
    proc = suite("--stages", "throughput", "--budget", "1", "--out", str(tmp_path / "run"))
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["passed"] is False and proc.returncode == 1
    assert "no stage ran" in proc.stdout
