"""The two ways a preparation step fails, as the worker's command line reports them.

BadInput: the input is wrong (empty or non-UTF-8 text, a missing vocab, a corrupt TFRecord, an
unexpected checkpoint variable): exit code 2. StepFailed: the work itself failed (a write that ran
out of space): exit code 1. Both print one line, `error: <file>: <what>`, naming the file and, where
there is one, the record index or variable.
"""

from __future__ import annotations

from pathlib import Path


class PrepareError(Exception):
    exit_code = 1

    def __init__(self, path: str | Path, what: str):
        self.path = str(path)
        self.what = what
        super().__init__(f"{self.path}: {what}")


class BadInput(PrepareError):
    exit_code = 2


class StepFailed(PrepareError):
    exit_code = 1
