"""Full and read-only disks, for real: a small tmpfs mounted for the test (root only; elsewhere the
tests are skipped and say why). Every writer of a user path ends in one line naming the path, exit 2,
and leaves nothing half-written: the registry (BERTCTL_HOME), the trainer's --out, convert-checkpoint."""

import contextlib
import os
import subprocess
import sys

import pytest
from conftest import REPO, run_bertctl
from synthetic import tiny_run_config

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root (CI runs as root)")


@contextlib.contextmanager
def tmpfs(mount, options: str):
    """A tmpfs mounted at `mount` for the block (skips the test where mounting is not allowed)."""
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount)], capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def full_disk(tmp_path):
    """A 256 KiB tmpfs, filled to the last byte."""
    with tmpfs(tmp_path / "full", "size=256k") as mount:
        (mount / "existing").mkdir()
        fd = os.open(mount / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:  # ENOSPC: full
            pass
        finally:
            os.close(fd)
        yield mount


@pytest.fixture
def read_only_disk(tmp_path):
    with tmpfs(tmp_path / "ro", "size=1m,ro") as mount:
        yield mount


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("disk", ["full_disk", "read_only_disk"])
def test_a_registry_on_a_full_or_read_only_disk_is_one_line_and_nothing_starts(disk, request):
    mount = request.getfixturevalue(disk)
    home = mount / "existing" / "home" if disk == "full_disk" else mount / "home"
    before = sorted(p for p in mount.rglob("*") if not p.is_dir())
    result = run_bertctl("submit", "--cluster", "local", env={"BERTCTL_HOME": str(home)})
    line = one_line(result.err)
    assert result.code == 2 and result.out == "" and line.startswith("bertctl: error: ") and str(mount) in line, line
    assert ("No space left on device" in line) if disk == "full_disk" else ("Read-only file system" in line)
    # nothing half-written and no job started: no file, and no experiment directory (empty parents may stay)
    assert sorted(p for p in mount.rglob("*") if not p.is_dir()) == before
    assert not [p for p in mount.rglob("*") if p.is_dir() and p.parent.name == "experiments"]


def test_the_trainer_with_out_on_a_full_disk_names_the_path(full_disk, tmp_path):
    config = tiny_run_config(tmp_path / "recipe", optim={"max_steps": 5}, train={"max_samples_termination": 40})
    out = full_disk / "existing" / "run"
    proc = subprocess.run([sys.executable, "-m", "trainer", "--config", str(config), "--out", str(out)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    line = one_line(proc.stderr)
    assert proc.returncode == 2 and line.startswith("error: ") and str(out) in line and "No space left on device" in line, line


def test_convert_checkpoint_onto_a_full_disk_names_the_output(full_disk):
    tf = REPO / "tests" / "data" / "tf_bert"
    output = full_disk / "existing" / "model.pt"
    result = run_bertctl("convert-checkpoint", "--tf-checkpoint", str(tf / "model.ckpt-5"), "--bert-config",
                         str(tf / "bert_config.json"), "--output", str(output))
    line = one_line(result.err)
    assert result.code == 2 and str(output) in line and "No space left on device" in line, line
    assert not output.exists() and [p.name for p in output.parent.iterdir()] == []  # no partial file, no temp file


@pytest.mark.parametrize("where", ["a new folder", "an existing folder"])
def test_a_checkpoint_that_does_not_fit_leaves_no_staging_folder(full_disk, where):
    """The checkpoint's `.step_N.partial` folder, half-written, once stayed behind on a full disk: the failed write
    is one OutputError naming the file, and the folder is gone (the run's earlier checkpoints stay as they were)."""
    import torch

    from trainer.checkpoints.run import Checkpoints, OutputError

    folder = full_disk / "existing" / ("checkpoints" if where == "a new folder" else "")
    with pytest.raises(OutputError) as failed:
        Checkpoints(folder, keep=2, rank=0).save(4, {"model": torch.zeros(1 << 18)}, {"data": {}, "rng": {}})
    assert "No space left on device" in str(failed.value) and str(folder) in str(failed.value)
    assert not [p for p in full_disk.rglob("*") if p.name.endswith(".partial") or p.name.startswith("step_")]


def test_final_weights_that_do_not_fit_name_the_file_and_leave_no_temporary_file(full_disk):
    """A run's final weights (trainer/checkpoints/run.py::write_model) on a full disk once named their hidden
    temporary file `.final.pt.partial`, and left it behind."""
    import torch

    from trainer.checkpoints.run import OutputError, write_model

    with pytest.raises(OutputError) as failed:
        write_model(full_disk / "existing" / "final.pt", torch.nn.Linear(256, 256))
    assert str(failed.value) == f"{full_disk / 'existing' / 'final.pt'}: cannot write: No space left on device"
    assert list((full_disk / "existing").iterdir()) == []
