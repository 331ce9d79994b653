"""Progress of a local data build: a rich bar on a terminal, plain periodic lines in batch logs."""

from __future__ import annotations

import threading
import time


class progress_display:
    """Stage progress in tasks; a rich bar on a terminal, otherwise a line every 10 s and per stage."""

    PLAIN_EVERY_S = 10.0

    def __init__(self, stream):
        self.stream = stream
        self.tty = stream.isatty()
        self._rich = None
        self._task = None
        self._lock = threading.Lock()

    def __enter__(self):
        if self.tty:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._rich = Progress(TextColumn("{task.description:>9}"), BarColumn(), MofNCompleteColumn(),
                                  TextColumn("tasks"), TimeElapsedColumn(), console=Console(file=self.stream))
            self._rich.__enter__()
        return self

    def __exit__(self, *exc):
        if self._rich is not None:
            self._rich.__exit__(*exc)

    def begin(self, stage: str, total: int) -> None:
        self.stage, self.total, self.done, self.t0, self.last_line = stage, total, 0, time.perf_counter(), time.perf_counter()
        self.tokens = 0
        if self._rich is not None:
            self._task = self._rich.add_task(stage, total=total)

    def advance(self, stage: str, reports: list[dict]) -> None:
        with self._lock:
            self.done += 1
            self.tokens += sum(r.get("output_tokens", 0) for r in reports)
            if self._rich is not None:
                self._rich.update(self._task, completed=self.done)
            elif self.done < self.total and time.perf_counter() - self.last_line >= self.PLAIN_EVERY_S:
                self.last_line = time.perf_counter()
                print(f"  {stage}: {self.done}/{self.total} tasks, {self.last_line - self.t0:.0f} s", file=self.stream, flush=True)

    def end(self, stage: str) -> None:
        seconds = time.perf_counter() - self.t0
        rate = f", {self.tokens / seconds:,.0f} tokens/s" if self.tokens else ""
        if self._rich is None:
            print(f"  {stage}: {self.total} task(s) done in {seconds:.1f} s{rate}", file=self.stream, flush=True)
