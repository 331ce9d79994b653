"""A run's checkpoint folder as both halves read it, torch-free: which checkpoint is the latest (`latest_checkpoint`:
the trainer resumes from it, `bertctl status` and `bertctl resume` name it) and whether the run's MLPerf log is
still the log that checkpoint saw (`check_log`). The trainer writes the folder (trainer/checkpoints/run.py::Checkpoints).

A checkpoint `step_<N>/` records how long the log was when it was taken (`log_bytes`) and the SHA-256 of those
bytes (`log_sha256`). A resumed run cuts the log back to that length, but only a log at least that long that
begins with exactly those bytes: a log that was shortened, edited or replaced, a garbled record or a `latest`
that names no complete checkpoint is refused (CheckpointRefused: one line naming the file, nothing changed), where
it once lost an evaluation, logged one twice, or started the run again beside its own log. docs/recovery.md says
how to start such a run again.
"""

from __future__ import annotations

import hashlib
import json
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

from trainer.config.regular import open_regular, read_regular_text

LATEST = "latest"  # the pointer: the name of the newest complete checkpoint
SHARED = "shared.pt"  # rank 0's part of a checkpoint; a folder without it is no checkpoint
LOG_BYTES = "log_bytes"
LOG_SHA256 = "log_sha256"
IDENTITY = "identity.json"  # the run the checkpoint is of ({"seed": S, "run_index": N}), readable without torch
STEP = re.compile(r"step_([0-9]{8,18})")
BYTE_COUNT = re.compile(r"[0-9]{1,18}")  # ASCII digits only: int() would take "٣", " +3" or "1_000"
SHA256 = re.compile(r"[0-9a-f]{64}")
HOW_TO_RESTART = "nothing was changed; docs/recovery.md says how to start the run again"


class CheckpointRefused(Exception):
    """A checkpoint a run must not resume from, or a log it must not cut: `path: reason (what to do)`, one line."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"{path}: {reason} ({HOW_TO_RESTART})")
        self.path, self.reason = Path(path), reason


@dataclass(frozen=True)
class LogRecord:
    """A log's first `size` bytes and their SHA-256 (hex)."""

    size: int
    sha256: str


def step_name(step: int) -> str:
    return f"step_{step:08d}"


def step_of(checkpoint: Path) -> int:
    """The update a checkpoint folder was taken at (its name: step_<N>)."""
    return int(STEP.fullmatch(checkpoint.name).group(1))


def latest_checkpoint(folder: Path) -> Path | None:
    """The checkpoint `latest` names, None when there is no `latest` (the run never completed one). A pointer
    that cannot be read, names no checkpoint, or names one that is gone or incomplete is refused: a resume from
    nothing would start the run over on top of its own log."""
    pointer = Path(folder) / LATEST
    try:
        name = read_regular_text(pointer, limit=256, errors="replace").strip()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise CheckpointRefused(pointer, f"cannot be read ({why(e)})") from None
    if not STEP.fullmatch(name):
        raise CheckpointRefused(pointer, f"names {name[:60]!r}, not a checkpoint (step_NNNNNNNN)")
    path = pointer.parent / name
    if not (path / SHARED).is_file():
        gone = "is incomplete (it has no shared.pt)" if path.is_dir() else "does not exist"
        raise CheckpointRefused(pointer, f"names {name}, which {gone}")
    return path


def recorded_log(checkpoint: Path) -> LogRecord:
    """What checkpoint `checkpoint` recorded of the log: its length (a plain number of bytes) and digest."""
    size = _record(checkpoint / LOG_BYTES, BYTE_COUNT, "a number of bytes")
    digest = _record(checkpoint / LOG_SHA256, SHA256, "a SHA-256 in hex")
    return LogRecord(int(size), digest)


def _record(path: Path, form: re.Pattern, what: str) -> str:
    try:
        text = read_regular_text(path, limit=256, errors="replace").strip()
    except FileNotFoundError:
        raise CheckpointRefused(path, f"is missing (the checkpoint does not say which log it saw; {what} was expected)") from None
    except OSError as e:
        raise CheckpointRefused(path, f"cannot be read ({why(e)})") from None
    if not form.fullmatch(text):
        raise CheckpointRefused(path, f"holds {text[:40]!r}, not {what}")
    return text


def check_log(checkpoint: Path, log: Path) -> LogRecord:
    """The checkpoint's record of the log, when the log still begins with the bytes it recorded; else refused."""
    record = recorded_log(checkpoint)
    try:
        now = log_record(log, record.size)
    except FileNotFoundError:
        raise CheckpointRefused(log, f"does not exist, but checkpoint {checkpoint.name} saw {record.size} bytes of it") from None
    except OSError as e:
        raise CheckpointRefused(log, f"cannot be read ({why(e)})") from None
    if now.size < record.size:
        raise CheckpointRefused(log, f"holds {now.size} bytes, fewer than the {record.size} checkpoint {checkpoint.name} "
                                     "saw: it was cut or replaced")
    if now.sha256 != record.sha256:
        raise CheckpointRefused(log, f"its first {record.size} bytes are not those checkpoint {checkpoint.name} saw: "
                                     "it was edited or replaced")
    return record


def resume_point(folder: Path, log: Path, identity: dict | None = None) -> tuple[Path, LogRecord] | None:
    """The latest checkpoint and its record of the log, checked; None when the run has no checkpoint. With
    `identity` (the run's seed and index), its parts and its run are checked too, as far as they can be without
    torch (`check_parts`): what `bertctl status` and `bertctl resume` ask before a trainer loads it."""
    path = latest_checkpoint(folder)
    if path is None:
        return None
    record = check_log(path, log)
    if identity is not None:
        check_parts(path, identity)
    return path, record


def check_parts(checkpoint: Path, identity: dict) -> None:
    """Each part of the checkpoint (shared.pt, rank_0.pt, every rank_N.pt) is a whole torch archive (a zip
    whose directory, at its end, is there: a file cut short or replaced has none), and the checkpoint is the
    run's `identity`, where it records one. The trainer still loads every part and checks its keys."""
    for part in [checkpoint / SHARED, checkpoint / "rank_0.pt", *sorted(checkpoint.glob("rank_*.pt"))]:
        try:
            with open_regular(part, "rb") as f:
                whole = zipfile.is_zipfile(f)
        except FileNotFoundError:
            raise CheckpointRefused(part, "is missing") from None
        except OSError as e:
            raise CheckpointRefused(part, f"cannot be read ({why(e)})") from None
        if not whole:
            raise CheckpointRefused(part, "is no whole checkpoint part (not a torch archive: cut short or replaced)")
    try:
        recorded = json.loads(read_regular_text(checkpoint / IDENTITY, limit=4096))
    except FileNotFoundError:  # written before checkpoints recorded it: the trainer's load checks the run
        return
    except (OSError, ValueError) as e:
        raise CheckpointRefused(checkpoint / IDENTITY, f"cannot be read ({why(e) if isinstance(e, OSError) else e})") from None
    theirs = {key: recorded.get(key) if isinstance(recorded, dict) else None for key in identity}
    if theirs != identity:
        raise CheckpointRefused(checkpoint / IDENTITY, f"is another run's ({describe(theirs)}), not this run's "
                                                       f"({describe(identity)})")


def describe(identity: dict) -> str:
    return ", ".join(f"{key} {value}" for key, value in identity.items())


def log_record(log: Path, limit: int | None = None) -> LogRecord:
    """The log's length now (up to `limit` bytes) and the SHA-256 of those bytes. OSError when it cannot be read."""
    digest, size = hashlib.sha256(), 0
    with open_regular(log, "rb") as f:
        while limit is None or size < limit:
            chunk = f.read(1 << 20 if limit is None else min(1 << 20, limit - size))
            if not chunk:
                break
            digest.update(chunk)
            size += len(chunk)
    return LogRecord(size, digest.hexdigest())


def why(e: OSError) -> str:
    return e.strerror or str(e)
