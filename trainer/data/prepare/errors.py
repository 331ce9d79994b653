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


# The orchestrator reads a failed worker's error as data, not from its stderr: it names a file in
# this variable, and the worker writes {"exit_code", "file", "message"} there before it exits.
ERROR_FILE_VARIABLE = "BERTCTL_ERROR_FILE"


def report_failure(exit_code: int, file: str | None, message: str) -> int:
    """One line on stderr (`error: <file>: <what>`) and, when asked for, the same as a JSON record."""
    import json
    import os
    import sys

    line = f"{file}: {message}" if file else message
    print(f"error: {line}".replace("\n", "\\n"), file=sys.stderr, flush=True)
    target = os.environ.get(ERROR_FILE_VARIABLE)
    if target:
        try:
            Path(target).parent.mkdir(parents=True, exist_ok=True)
            Path(target).write_text(json.dumps({"exit_code": exit_code, "file": file, "message": message}))
        except OSError:
            pass  # the stderr line is still there
    return exit_code
