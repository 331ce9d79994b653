"""What `python -m trainer` was asked to do (`RunArgs`) and how it says no (`fail`): shared by the torch-free
front door (trainer/loop/entry.py) and the run it starts (trainer/loop/train.py), so neither imports the other."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass
class RunArgs:
    config: str
    out: str
    run_index: int = 0
    seed: int | None = None
    once: bool = False

    @property
    def result_log(self) -> Path:
        return Path(self.out) / "results" / f"result_{self.run_index}.txt"


def fail(message: str) -> int:
    """A user's mistake: one line on stderr, exit code 2."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    return 2
