"""Checkpoints: everything needed to continue a run exactly, written atomically, the latest k kept.

A checkpoint is a directory `step_<N>/` with `shared.pt` (model, optimizer, scaler and loop state,
written by rank 0), `rank_<r>.pt` (each rank's data position and RNG states), `log_bytes` and `log_sha256`
(how long the run's MLPerf log was when it was taken, and the digest of those bytes: a resumed run cuts the
log back to it, so the events logged after the checkpoint, an evaluation above all, are logged once, by the
run that redoes them; trainer/config/checkpoint_folder.py checks the log first). It is assembled under a
temporary name, removed again if a write fails (a full disk), and renamed when every rank has written its part,
then `latest` is pointed at it: a directory named `step_<N>` is always complete. A resume loads and checks
the checkpoint (`Checkpoints.resume_point`) before it changes anything.

On SIGUSR2 (Slurm's warning before the time limit, sbatch --signal) or SIGTERM the run
saves a checkpoint at the next agreed step and exits with trainer.config.REQUEUE_EXIT_CODE; the job
script then requeues itself and the run resumes here.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import signal
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.distributed as dist

from trainer.config import FINAL_WEIGHTS, CheckpointConfig
from trainer.config.checkpoint_folder import (
    IDENTITY,
    LOG_BYTES,
    LOG_SHA256,
    SHARED,
    CheckpointRefused,
    LogRecord,
    check_log,
    describe,
    latest_checkpoint,
    log_record,
    step_name,
)
from trainer.config.regular import require_regular

if TYPE_CHECKING:  # the loop owns its state; a checkpoint only stores it
    from trainer.loop.state import LoopState


class OutputError(Exception):
    """A file the run must write cannot be written (a full, read-only or missing disk): a user error."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


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

    def save(self, step: int, shared: dict, per_rank: dict, log: LogRecord | None = None,
             identity: dict | None = None) -> Path:
        final = self.folder / step_name(step)
        staging = self.folder / f".{final.name}.partial"
        try:
            if self.rank == 0:
                shutil.rmtree(staging, ignore_errors=True)
                _write(staging.mkdir, staging, parents=True)
            _barrier()
            save_file(per_rank, staging / f"rank_{self.rank}.pt")
            if self.rank == 0:
                save_file(shared, staging / SHARED)
                if log is not None:
                    _write((staging / LOG_BYTES).write_text, staging / LOG_BYTES, str(log.size))
                    _write((staging / LOG_SHA256).write_text, staging / LOG_SHA256, log.sha256)
                if identity is not None:  # for bertctl, which checks the run without torch (check_parts)
                    _write((staging / IDENTITY).write_text, staging / IDENTITY, json.dumps(identity))
        except OutputError:  # a full disk: no half-written checkpoint stays behind (rank 0 made it, any rank may fail)
            shutil.rmtree(staging, ignore_errors=True)
            raise
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
        """The checkpoint a resume continues from, as `bertctl status` names it (trainer/config/checkpoint_folder.py)."""
        return latest_checkpoint(self.folder)

    def resume_point(self, log: Path, identity: dict) -> ResumePoint | None:
        """The latest checkpoint, loaded, once it is known to be this run's (`identity`: seed and run index) and the
        log `log` to begin with the bytes it saw; None without a checkpoint. Else CheckpointRefused, nothing changed."""
        path = self.latest()
        if path is None:
            return None
        record = check_log(path, log)
        shared, mine = self.load(path)
        theirs = {key: shared.get(key) for key in identity}
        if theirs != identity:
            raise CheckpointRefused(path / SHARED, f"is another run's ({describe(theirs)}), not this run's ({describe(identity)})")
        return ResumePoint(path, record, shared, mine)

    def load(self, path: Path) -> tuple[dict, dict]:
        return load_part(path / SHARED, SHARED_KEYS), load_part(path / f"rank_{self.rank}.pt", RANK_KEYS)

    def _prune(self) -> None:
        steps = sorted(p for p in self.folder.glob("step_*") if p.is_dir())
        for old in steps[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)


SHARED_KEYS = ("model", "optimizer", "scaler", "state")
RANK_KEYS = ("data", "rng")


def load_part(path: Path, keys: tuple[str, ...]) -> dict:
    """One file of a checkpoint, or CheckpointRefused naming it: missing, not a regular file, damaged, or not a part."""
    try:
        part = torch.load(require_regular(path), map_location="cpu", weights_only=False)
    except OSError as e:
        raise CheckpointRefused(path, e.strerror or str(e)) from None
    except Exception as e:  # noqa: BLE001 - a damaged file fails in the unpickler, the zip reader or torch's own checks
        raise CheckpointRefused(path, f"cannot be loaded ({type(e).__name__}: {(str(e).splitlines() or [''])[0][:120]})") from None
    lacking = [key for key in keys if not isinstance(part, dict) or key not in part]
    if lacking:
        raise CheckpointRefused(path, f"is no checkpoint part (it lacks {', '.join(lacking)})")
    return part


@dataclass
class ResumePoint:
    """A checkpoint a run may resume from, loaded: checked against the run and its log, nothing changed yet."""

    path: Path
    log: LogRecord
    shared: dict
    mine: dict  # this rank's part


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
        log = log_record(self.result_log) if self.result_log is not None and self.result_log.exists() else None
        return self.checkpoints.save(state.updates, shared, {"data": self.data.state_dict(), "rng": rng_state()}, log=log,
                                     identity=self.identity)

    def restore(self, fresh: LoopState, point: ResumePoint | None) -> tuple[LoopState, Path | None]:
        """Load the checkpoint `Checkpoints.resume_point` checked into the parts: its loop state and path, or `fresh`
        and None when there is none."""
        if point is None:
            return fresh, None
        shared, mine, path = point.shared, point.mine, point.path
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
    """The weights alone, as {"model": state_dict} (NVIDIA's phase-1 checkpoint format), atomically: a failed
    write names `path` and leaves no temporary file behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial")
    try:
        save_file({"model": model.state_dict()}, tmp)
        os.replace(tmp, path)
    except (OutputError, OSError) as e:
        tmp.unlink(missing_ok=True)
        raise OutputError(path, e.reason if isinstance(e, OutputError) else f"cannot write: {e.strerror or e}") from None
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


def _write(write, path: Path, *args, **kwargs) -> None:
    """`write(*args)` (a write to `path`), an OSError reported as the OutputError naming the file."""
    try:
        write(*args, **kwargs)
    except OSError as e:
        raise OutputError(path, f"cannot write: {e.strerror or e}") from None


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.partial")
    try:
        _write(tmp.write_text, tmp, text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
