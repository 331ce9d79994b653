"""Open only regular files. Torch-free, so the orchestrator and the trainer share it.

A FIFO where a file belongs blocks `open()` until a writer appears (forever, for a hostile or stale
one), and a device (`/dev/zero`) reads without end. Every file bertctl opens by a path a user or an
experiment directory supplies goes through here: such a path is one `NotRegularFile` (an OSError, so
existing `except OSError` handlers report it) naming the path and what it is instead.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
         (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


class NotRegularFile(OSError):
    def __init__(self, path, mode: int):
        kind = next((name for test, name in KINDS if test(mode)), "not a regular file")
        code = errno.EISDIR if stat.S_ISDIR(mode) else errno.EINVAL
        super().__init__(code, f"is {kind}, not a regular file", str(path))

    def __str__(self) -> str:  # one line naming the path, without the errno prefix
        return f"{self.filename}: {self.strerror}"


def require_regular(path: str | os.PathLike) -> Path:
    """`path`, if it is a regular file (symlinks followed); FileNotFoundError if it does not exist.

    For paths handed to a library that opens them itself (h5py, a tokenizer, torch.load)."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise NotRegularFile(path, mode)
    return Path(path)


def open_regular(path: str | os.PathLike, mode: str = "r", **kwargs):
    """open(path, mode) for reading, refusing anything but a regular file without blocking on it.

    O_NONBLOCK makes opening a FIFO return at once (instead of waiting for a writer); the check on
    the opened descriptor (not on the name, which could be swapped in between) then refuses it."""
    if any(flag in mode for flag in "wax+"):
        raise ValueError("open_regular opens files for reading")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(path, st.st_mode)
        os.set_blocking(fd, True)
        return os.fdopen(fd, mode, **kwargs)
    except BaseException:
        os.close(fd)
        raise


def read_regular_text(path: str | os.PathLike, limit: int | None = None, **kwargs) -> str:
    """The text of a regular file; with `limit`, a file larger than `limit` bytes is refused (OSError
    EFBIG) rather than read whole."""
    with open_regular(path, "r", **kwargs) as f:
        if limit is not None and os.fstat(f.fileno()).st_size > limit:
            raise OSError(errno.EFBIG, f"larger than {limit:,} bytes", str(path))
        return f.read() if limit is None else f.read(limit + 1)


def read_regular_bytes(path: str | os.PathLike) -> bytes:
    with open_regular(path, "rb") as f:
        return f.read()
