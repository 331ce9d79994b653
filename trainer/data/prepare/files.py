"""Atomic file writing: every output is written under a hidden temporary name in its own folder and
renamed when complete, so a file that exists under its real name is whole (the same rule as
`trainer.data.layout.write_shard`). A failed write leaves nothing behind."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
from pathlib import Path
from typing import Any, Iterator

from trainer.config.regular import open_regular
from trainer.data.prepare.errors import BadInput, PrepareError, StepFailed


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to `path`; rename it to `path` if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise write_error(path, e) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path: str | Path, text: str) -> Path:
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    return Path(path)


def write_json(path: str | Path, data: Any) -> Path:
    return write_text(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


def read_json(path: str | Path) -> Any:
    """A JSON file bertctl wrote (prepared.json, a stamp); anything else there is BadInput naming it."""
    try:
        with open_regular(path, encoding="utf-8") as f:  # a FIFO where prepared.json belongs must not block
            return json.load(f)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise BadInput(path, f"cannot read: {e.strerror or e}") from None
    except (ValueError, RecursionError) as e:
        raise BadInput(path, f"not the JSON bertctl writes: {str(e).splitlines()[0][:120]}") from None


def remove_temporaries(folder: str | Path) -> None:
    """Temporary files left by a killed process (a crash cannot clean up after itself)."""
    folder = Path(folder)
    if folder.is_dir():
        for stale in folder.rglob(".*.tmp-*"):
            stale.unlink(missing_ok=True)


# a path that cannot take the files (the user points it elsewhere or frees it): bad input, exit 2;
# any other failed write (a file size limit, an I/O error) is the work failing, exit 1
PATH_PROBLEMS = {os.strerror(e) for e in (errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EDQUOT)}


def write_error(path: str | Path, error: BaseException) -> PrepareError:
    """The one-line error for a failed write of `path`."""
    reason = write_failure(error)
    kind = BadInput if reason in PATH_PROBLEMS else StepFailed
    return kind(path, f"cannot write: {reason}")


def write_failure(error: BaseException) -> str:
    """What went wrong in a failed write, in a few words ("No space left on device"): the system
    error of the first OSError in the exception chain, or the first line of the message."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno:
            return os.strerror(seen.errno)
        # HDF5 wraps the system error in a RuntimeError: "... errno = 28, error message = '...' ..."
        found = re.search(r"error message = '([^']+)'", str(seen))
        if found:
            return found.group(1)
        seen = seen.__context__
    return str(error).splitlines()[0] if str(error) else type(error).__name__
