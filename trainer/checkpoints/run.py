"""Checkpoints: everything needed to continue a run exactly, written atomically, the latest k kept.

A checkpoint is a directory `step_<N>/` with `shared.pt` (model, optimizer, scaler and loop state,
written by rank 0), `rank_<r>.pt` (each rank's data position and RNG states) and `log_bytes` (how long
the run's MLPerf log was when it was taken: a resumed run cuts the log back to it, so the events logged
after the checkpoint, an evaluation above all, are logged once, by the run that redoes them). It is assembled
under a temporary name and renamed when every rank has written its part, then `latest` is
pointed at it: a directory named `step_<N>` is always complete.

On SIGUSR2 (Slurm's warning before the time limit, sbatch --signal) or SIGTERM the run
saves a checkpoint at the next agreed step and exits with trainer.config.REQUEUE_EXIT_CODE; the job
script then requeues itself and the run resumes here.
"""

from __future__ import annotations

import errno
import os
import random
import shutil
import signal
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.distributed as dist

from trainer.config import FINAL_WEIGHTS, CheckpointConfig

if TYPE_CHECKING:  # the loop owns its state; a checkpoint only stores it
    from trainer.loop.state import LoopState


class OutputError(Exception):
    """A file the run must write cannot be written (a full, read-only or missing disk): a user error."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


LOG_BYTES = "log_bytes"  # in a checkpoint: the MLPerf log's length when it was taken


def save_file(obj, path: Path) -> None:
    """torch.save, with a failed write reported as an OutputError naming the file. torch's zip writer
    turns a write error into a RuntimeError whose message names no cause ("unexpected pos 64 vs 0"),
    so a RuntimeError on a disk with no room left is read as what it is: a full disk."""
    try:
        torch.save(obj, path)
    except OSError as e:
        raise OutputError(path, f"cannot write: {e.strerror or e}") from None
    except RuntimeError as e:
        if not disk_full(Path(path).parent) and "write" not in str(e).lower():
            raise
        raise OutputError(path, f"cannot write: {os.strerror(errno.ENOSPC)}") from None


def disk_full(folder: Path, headroom: int = 1 << 20) -> bool:
    """Less than `headroom` bytes left for this folder (1 MiB: less than any checkpoint needs)."""
    try:
        return shutil.disk_usage(folder).free < headroom
    except OSError:
        return False


class Checkpoints:
    def __init__(self, folder: Path, keep: int, rank: int):
        self.folder, self.keep, self.rank = Path(folder), keep, rank

    def save(self, step: int, shared: dict, per_rank: dict, log_bytes: int | None = None) -> Path:
        final = self.folder / f"step_{step:08d}"
        staging = self.folder / f".step_{step:08d}.partial"
        if self.rank == 0:
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
        _barrier()
        save_file(per_rank, staging / f"rank_{self.rank}.pt")
        if self.rank == 0:
            save_file(shared, staging / "shared.pt")
            if log_bytes is not None:
                (staging / LOG_BYTES).write_text(str(log_bytes))
        _barrier()
        if self.rank == 0:
            shutil.rmtree(final, ignore_errors=True)
            os.rename(staging, final)
            _write_atomic(self.folder / "latest", final.name)
            self._prune()
        _barrier()
        return final

    @property
    def final_weights(self) -> Path:
        """Where the run leaves the weights it ended with (trainer/config/run.py::FINAL_WEIGHTS)."""
        return self.folder / FINAL_WEIGHTS

    def latest(self) -> Path | None:
        pointer = self.folder / "latest"
        if not pointer.exists():
            return None
        path = self.folder / pointer.read_text().strip()
        return path if (path / "shared.pt").exists() else None

    def log_position(self, path: Path) -> int | None:
        """How many bytes the run's MLPerf log held when checkpoint `path` was taken (None: not recorded)."""
        try:
            text = (path / LOG_BYTES).read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    def load(self, path: Path) -> tuple[dict, dict]:
        shared = torch.load(path / "shared.pt", map_location="cpu", weights_only=False)
        per_rank = torch.load(path / f"rank_{self.rank}.pt", map_location="cpu", weights_only=False)
        return shared, per_rank

    def _prune(self) -> None:
        steps = sorted(p for p in self.folder.glob("step_*") if p.is_dir())
        for old in steps[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)


def run_checkpoints(cfg: CheckpointConfig, out: Path, run_index: int, rank: int) -> Checkpoints:
    """Run N's checkpoints: in checkpoint.dir, or by default in OUT/checkpoints/run_N."""
    return Checkpoints(cfg.run_folder(out, run_index), cfg.keep, rank)


class RunCheckpoint:
    """A run's checkpoint contents: what it saves and how it restores them. The model, optimizer,
    loss scaler and loop state are shared; the data position and RNG states are each rank's."""

    def __init__(self, checkpoints: Checkpoints, model, optimizer, scaler, data, identity: dict,
                 result_log: Path | None = None):
        self.checkpoints = checkpoints
        self.model, self.optimizer, self.scaler, self.data = model, optimizer, scaler, data
        self.identity = identity  # what the run is (seed, run index): saved, for who reads the file
        self.result_log = result_log  # rank 0's MLPerf log, whose length each checkpoint records

    def save(self, state: LoopState) -> Path:
        """A checkpoint named after `state.updates` (whose sample count the caller made exact)."""
        shared = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                  "scaler": self.scaler.state_dict() if self.scaler else None, "state": asdict(state), **self.identity}
        return self.checkpoints.save(state.updates, shared, {"data": self.data.state_dict(), "rng": rng_state()},
                                     log_bytes=file_size(self.result_log))

    def restore(self, fresh: LoopState) -> tuple[LoopState, Path | None]:
        """Load the latest checkpoint into the parts: its loop state and path, or `fresh` and None when there is none."""
        path = self.checkpoints.latest()
        if path is None:
            return fresh, None
        shared, mine = self.checkpoints.load(path)
        self.model.load_state_dict(shared["model"])
        self.optimizer.load_state_dict(shared["optimizer"])
        if self.scaler and shared["scaler"]:
            self.scaler.load_state_dict(shared["scaler"])
        self.data.load_state_dict(mine["data"])
        set_rng_state(mine["rng"])
        return type(fresh)(**shared["state"]), path


def file_size(path: Path | None) -> int | None:
    try:
        return path.stat().st_size if path is not None else None
    except OSError:
        return None


def rewind_log(path: Path, position: int | None) -> int:
    """Cut the MLPerf log back to `position` bytes (a checkpoint's): the bytes cut, 0 when there is nothing
    to cut (no position recorded, or a log no longer than it)."""
    size = file_size(path)
    if position is None or size is None or size <= position:
        return 0
    os.truncate(path, position)
    return size - position


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():  # this rank's GPU only: the _all variants open a context on every visible GPU
        state["cuda"] = torch.cuda.get_rng_state(torch.cuda.current_device())
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        mine = state["cuda"]
        if isinstance(mine, list):  # written before 2026-11-24: every visible GPU's state
            mine = mine[torch.cuda.current_device()]
        torch.cuda.set_rng_state(mine, torch.cuda.current_device())


def write_model(path: str | Path, model: torch.nn.Module) -> Path:
    """The weights alone, as {"model": state_dict} (NVIDIA's phase-1 checkpoint format), atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial")
    save_file({"model": model.state_dict()}, tmp)
    os.replace(tmp, path)
    return path


class StopSignal:
    """Set by SIGUSR2/SIGTERM; every rank must agree before acting on it (`agreed`)."""

    def __init__(self) -> None:
        self.received: int | None = None
        for sig in (signal.SIGUSR2, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        self.received = signum

    def agreed(self, device) -> bool:
        flag = torch.tensor([1.0 if self.received else 0.0], device=device)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.partial")
    tmp.write_text(text)
    os.replace(tmp, path)
