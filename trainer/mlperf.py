"""MLPerf logging: every `:::MLLOG` event bertctl writes comes from this module.

Torch-free: the launcher calls `python -m trainer.mlperf cache-clear --file result_N.txt` on every
node before a run (the MLPerf rules want one `cache_clear` per node), then rank 0 of the trainer
appends the rest of the run's events to the same file through `RunLogger`.

The official `mlperf_logging.mllog` writes the lines. Its default logger also prints to stdout and
its file handler appends, so each logger here gets its own `logging.Logger` with exactly one handler.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from mlperf_logging.mllog import mllog
from mlperf_logging.mllog import constants as K

# Two call frames sit between the caller and mllog: the public method and `_emit`.
_STACK_OFFSET = 3


class EventLog:
    """Appends MLLOG lines to one file (and nowhere else)."""

    def __init__(self, path: str | Path, echo: bool = False):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        logger = logging.getLogger(f"bertctl.mllog.{self.path.resolve()}")
        logger.handlers.clear()
        logger.propagate = False
        logger.setLevel(logging.INFO)
        logger.addHandler(logging.FileHandler(self.path, mode="a", encoding="utf-8"))
        if echo:
            logger.addHandler(logging.StreamHandler(sys.stdout))
        self._mllogger = mllog.MLLogger(logger=logger, default_stack_offset=_STACK_OFFSET)

    # time_ms: None for now; tests and log generators pass a virtual clock
    def event(self, key: str, value=None, metadata: dict | None = None, time_ms: int | None = None) -> None:
        self._emit(self._mllogger.event, key, value, metadata, time_ms)

    def start(self, key: str, value=None, metadata: dict | None = None, time_ms: int | None = None) -> None:
        self._emit(self._mllogger.start, key, value, metadata, time_ms)

    def end(self, key: str, value=None, metadata: dict | None = None, time_ms: int | None = None) -> None:
        self._emit(self._mllogger.end, key, value, metadata, time_ms)

    def _emit(self, method, key, value, metadata, time_ms) -> None:
        method(key=key, value=value, metadata=metadata, time_ms=time_ms)
        for handler in self._mllogger.logger.handlers:
            handler.flush()

    def close(self) -> None:
        for handler in list(self._mllogger.logger.handlers):
            handler.close()
            self._mllogger.logger.removeHandler(handler)


def log_cache_clear(path: str | Path) -> None:
    """The launcher's event after the page cache was dropped (or, with log_only, instead of it)."""
    log = EventLog(path)
    log.event(K.CACHE_CLEAR, True)
    log.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.mlperf")
    sub = parser.add_subparsers(dest="command", required=True)
    clear = sub.add_parser("cache-clear", help="append a cache_clear event to a result file")
    clear.add_argument("--file", required=True)
    args = parser.parse_args(argv)
    if args.command == "cache-clear":
        log_cache_clear(args.file)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
