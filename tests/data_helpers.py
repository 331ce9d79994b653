"""Shared by the tests/test_data_*.py files: one real build of the sample dataset per session, and
running bertctl / the data worker as a user would (separate processes, own $BERTCTL_HOME)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
from conftest import REPO, shared_between_workers

from trainer.data.layout import Shard

_SAMPLE_HOME: Path | None = None
# a quick slice of the real corpus for tests that build several times
SMALL = ["-o", "source.max_documents=80", "-o", "source.parts=2", "-o", "prepare.dupe_factor=2",
         "-o", "outputs.eval.pick=30", "-o", "outputs.train.shards=1", "-o", "outputs.train_128.shards=2",
         "-o", "expect.outputs={}",
         # a few hundred samples: the statistics are looser than on the real build
         "-o", "expect.nsp_tolerance=0.1", "-o", "expect.masking_tolerance=0.02", "-o", "expect.replacement_tolerance=0.05"]


def bertctl(*args: str, home: Path, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "BERTCTL_HOME": str(home), **(env or {})}
    full_env["PATH"] = f"{Path(sys.executable).parent}:{full_env.get('PATH', '')}"
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=REPO)


def worker(*args: str, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer.data.prepare", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, **kwargs)


def sample_home(tmp_path_factory) -> Path:
    """$BERTCTL_HOME holding the full sample dataset, built once per test run (every xdist worker shares
    it) by `bertctl data prepare --dataset sample`."""
    global _SAMPLE_HOME
    if _SAMPLE_HOME is None:
        _SAMPLE_HOME = shared_between_workers(tmp_path_factory, "sample-home", build_sample)
    return _SAMPLE_HOME


def build_sample(home: Path) -> None:
    result = bertctl("data", "prepare", "--dataset", "sample", home=home)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(home / "datasets" / "sample")


def home_with_sample(tmp_path_factory, name: str, phase1: bool = False) -> Path:
    """A fresh $BERTCTL_HOME holding a copy of the session's sample build (`sample_home`: 20 MB, copied
    in well under a second, where building it again takes ~30 s of CPU), for tests whose subject is
    what runs on the dataset rather than its build: `bertctl data prepare` there finds it complete.
    With `phase1`, the session's phase-1 checkpoint too (`phase1_home`): a job's phase-1 step there
    finds it and skips. A copy, not links, so a test that changes a file changes only its own."""
    home = tmp_path_factory.mktemp(name)
    copy_sample(phase1_home(tmp_path_factory) if phase1 else sample_home(tmp_path_factory), home, phase1)
    return home


def copy_sample(source: Path, home: Path, phase1: bool) -> None:
    """The sample dataset of one $BERTCTL_HOME into another, its phase-1 checkpoint only if asked for."""
    shutil.copytree(source / "datasets" / "sample", home / "datasets" / "sample",
                    ignore=None if phase1 else shutil.ignore_patterns("phase1_checkpoint"))


_PHASE1_HOME: Path | None = None


def phase1_home(tmp_path_factory) -> Path:
    """$BERTCTL_HOME holding the sample dataset and the embedded recipe's phase-1 checkpoint, trained once
    per test run (every xdist worker shares it) by the step a job runs for it: `python -m trainer --config
    phase1.yaml --once` on the phase-1 configuration the job script carries (clusters/local.yaml's
    prepare.phase1; ci_slurm's trains the same model on the same data). Its output is `phase1.log` there.
    Trained once and not by each job: ~120 CPU-seconds each time (issue 38)."""
    global _PHASE1_HOME
    if _PHASE1_HOME is None:
        _PHASE1_HOME = shared_between_workers(tmp_path_factory, "phase1-home", lambda home: train_phase1(
            home, sample_home(tmp_path_factory)))
    return _PHASE1_HOME


def train_phase1(home: Path, sample: Path) -> None:
    from orchestrator.config.clusters import load_cluster

    copy_sample(sample, home, phase1=False)
    (home / "phase1.yaml").write_text(load_cluster("local").config.phase1_run().to_yaml())
    env = {**os.environ, "BERTCTL_HOME": str(home)}
    proc = subprocess.run([sys.executable, "-u", "-m", "trainer", "--config", str(home / "phase1.yaml"),
                           "--out", str(home / "phase1"), "--once"], capture_output=True, text=True, env=env,
                          timeout=900, cwd=REPO)
    (home / "phase1.log").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, proc.stderr[-3000:]


def digests(root: Path) -> dict[str, str]:
    """Every output file's content digest, as recorded by the build."""
    record = json.loads((root / "prepared.json").read_text())
    return {path: f["digest"] for out in record["outputs"].values() for path, f in out["files"].items()}


def all_samples(files) -> list:
    return [s for f in files for s in Shard(f).samples(range(len(Shard(f))))]


def as_key(sample) -> tuple:
    return (tuple(sample.input_ids.tolist()), tuple(sample.segment_ids.tolist()),
            tuple(sample.masked_lm_positions.tolist()), tuple(sample.masked_lm_ids.tolist()), sample.next_sentence_label)


def same_samples(a, b) -> bool:
    return len(a) == len(b) and all(
        np.array_equal(x.input_ids, y.input_ids) and np.array_equal(x.segment_ids, y.segment_ids)
        and np.array_equal(x.masked_lm_positions, y.masked_lm_positions)
        and np.array_equal(x.masked_lm_ids, y.masked_lm_ids) and x.next_sentence_label == y.next_sentence_label
        for x, y in zip(a, b))
