"""A loop-mode job's time limit covers all its runs (NEXP x slurm.time_per_run + time_margin, as
NVIDIA's scripts ask for NEXP x 8 + 5 minutes), and a limit over the partition's MaxTime is refused
before anything is written."""

import os
import shutil

import pytest
from conftest import run_bertctl


def sbatch_time(script: str) -> str:
    [line] = [x for x in script.splitlines() if x.startswith("#SBATCH --time=")]
    return line.split("=", 1)[1]


@pytest.mark.parametrize("nexp,mode,expected", [(10, "loop", "04:15:00"), (1, "loop", "00:30:00"),
                                                 (10, "array", "00:30:00"), (60, "loop", "1-01:05:00")])
def test_render_asks_for_every_run_of_a_loop_job(nexp, mode, expected):
    result = run_bertctl("render", "--cluster", "nvidia_dgxh100_1x8", "--nexp", str(nexp), "-o", f"slurm.nexp_mode={mode}")
    assert result.code == 0, result.err
    assert sbatch_time(result.out) == expected


def test_without_time_per_run_the_time_limit_is_the_jobs():
    result = run_bertctl("render", "--cluster", "nvidia_dgxa100_8x8", "--nexp", "10")
    assert result.code == 0 and sbatch_time(result.out) == "01:15:00"
    nvidia = run_bertctl("render", "--cluster", "nvidia_dgxa100_8x8", "--nexp", "10", "-o", "slurm.time_per_run=8",
                         "-o", "slurm.time_margin=5")
    assert sbatch_time(nvidia.out) == "01:25:00"  # NVIDIA's 10 x 8 + 5 minutes


@pytest.mark.parametrize("override,message", [
    ("slurm.time_per_run=soon", "slurm.time_per_run: must be a positive time"),
    ("slurm.time_per_run=0", "slurm.time_per_run: must be a positive time"),
    ("slurm.time_margin=-1", "slurm.time_margin: must be a non-negative time"),
])
def test_bad_run_times_are_one_line(override, message):
    result = run_bertctl("render", "--cluster", "nvidia_dgxh100_1x8", "-o", override)
    assert result.code == 2 and len(result.err.strip().splitlines()) == 1 and message in result.err


@pytest.mark.skipif(shutil.which("sbatch") is None, reason="needs a Slurm login node (the CI's real Slurm)")
def test_a_job_longer_than_the_partitions_max_time_is_refused_and_nothing_is_written(tmp_path):
    """Stand-in: the shared test Slurm's only partition has no MaxTime and must not be reconfigured,
    so a `sinfo` earlier on PATH reports a 2-hour MaxTime for it (nodes and GPUs as the real one)."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sinfo").write_text('#!/bin/sh\ncase "$*" in *"%P %l"*) echo "debug* 2:00:00";; *"%D"*) echo 2;; '
                                '*) echo "(null)";; esac\n')
    (fake / "sinfo").chmod(0o755)
    home = tmp_path / "home"
    env = {"PATH": f"{fake}:{os.environ['PATH']}", "BERTCTL_HOME": str(home)}
    result = run_bertctl("submit", "--cluster", "ci_slurm", "--nexp", "10", "-o", "slurm.time_per_run=00:15:00", env=env)
    assert result.code == 2, result.err
    [line] = result.err.strip().splitlines()
    assert line.startswith("bertctl: error: ") and line.endswith(
        "ci_slurm.yaml: slurm.time_per_run: the job asks for 02:35:00 (10 run(s) x 00:15:00 + 00:05:00) "
        "but partition debug allows at most 2:00:00")
    assert not any(home.rglob("experiment.json"))  # nothing written


def test_the_real_partitions_unlimited_max_time_lets_any_job_through():
    from orchestrator.config.clusters import load_cluster
    from orchestrator.jobs.submit import check_time_limit

    if shutil.which("sinfo") is None:
        pytest.skip("needs Slurm's sinfo")
    check_time_limit(load_cluster("ci_slurm", ["slurm.time_per_run=100:00:00"]), 10)  # 'infinite': no error
