"""The sample dataset built as Slurm job arrays on the CI cluster: the same files as the local build."""

import json

import pytest
from data_helpers import all_samples, bertctl, digests, same_samples, sample_home

from trainer.data.layout import shard_files

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm")]


def test_the_job_arrays_write_the_same_files_as_the_local_build(tmp_path, tmp_path_factory):
    local = sample_home(tmp_path_factory) / "datasets" / "sample"
    home = tmp_path / "home"
    result = bertctl("data", "prepare", "--dataset", "sample", "--cluster", "ci_slurm", "--wait", home=home, timeout=600)
    assert result.returncode == 0, result.stderr
    root = home / "datasets" / "sample"
    assert result.stdout.strip() == str(root)
    job_dir = next((home / "data-jobs").iterdir())
    jobs = json.loads((job_dir / "jobs.json").read_text())
    assert jobs["stages"] == ["corpus", "examples", "combine", "finish"] and len(set(jobs["job_ids"])) == 4
    assert len(list((job_dir / "logs").glob("examples_*.out"))) == 9  # one array task per text part
    assert (root / "vocab.txt").read_bytes() == (local / "vocab.txt").read_bytes()
    assert digests(root) == digests(local)
    for folder in ("train/512", "train_128", "eval"):  # and not only the digests: the samples themselves
        assert same_samples(all_samples(shard_files(root / folder)), all_samples(shard_files(local / folder)))
    again = bertctl("data", "prepare", "--dataset", "sample", "--cluster", "ci_slurm", home=home)
    assert again.returncode == 0 and "complete" in again.stderr and again.stdout.strip() == str(root)
    assert len(list((home / "data-jobs").iterdir())) == 1  # nothing submitted the second time


def test_a_failing_stage_fails_the_wait_with_its_error_and_cancels_the_rest(tmp_path):
    home = tmp_path / "home"
    result = bertctl("data", "prepare", "--dataset", "sample", "--cluster", "ci_slurm", "--wait",
                     "-o", "source.parts=600", home=home, timeout=300)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("bertctl: stage corpus (job ") and "failed" in last
    assert "for 600 parts: use more documents or fewer parts" in last


def test_a_cluster_key_given_with_o_reaches_sbatch(tmp_path):
    """-o slurm.partition goes to the cluster file: sbatch itself refuses the partition that does not exist."""
    result = bertctl("data", "prepare", "--dataset", "sample", "--cluster", "ci_slurm", "-o", "slurm.partition=nosuchpart",
                     home=tmp_path / "home", timeout=120)
    assert result.returncode == 2 and "sbatch refused the job" in result.stderr, result.stderr
    assert "invalid partition" in result.stderr.lower(), result.stderr
