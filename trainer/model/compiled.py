"""torch.compile as a run uses it: a compiled function beside its eager twin, and one rule for a failure.

Compiling happens at a function's first call (the warm-up's), on every rank apart. A rank that quietly
falls back to eager runs ~14 % slower, and the slowest rank sets the pace of all, so by default a failure
ends the run (`runtime.compile_fallback: error`) with one line naming the function and the cause. With
`runtime.compile_fallback: eager` the function runs eager from then on, after one warning line: the maths
is the same. The model's pointwise tails (trainer/model/bert.py::Pointwise), the fast step's whole model
(trainer/loop/fast_step.py::CompiledForward), the evaluation (trainer/loop/evaluate.py) and the LAMB update
(trainer/optim.py::Lamb) all follow it.
"""

from __future__ import annotations

import sys
from typing import Callable


class CompileFailed(RuntimeError):
    """torch.compile failed and the run does not allow falling back to eager."""


def root_cause(error: BaseException) -> str:
    """'Type: first line' of the innermost cause (torch wraps compiler errors in its own)."""
    while (error.__cause__ or error.__context__) is not None:
        error = error.__cause__ or error.__context__
    return f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:200]}"


class Guarded:
    """Calls `compiled`; if it raises, either ends the run (CompileFailed) or, with `fallback`, runs `eager`
    from then on after one warning line. `failed` says why compiling failed (None while it has not)."""

    def __init__(self, compiled: Callable, eager: Callable, what: str, fallback: bool):
        self.compiled, self.eager, self.what, self.fallback = compiled, eager, what, fallback
        self.failed: str | None = None

    def __call__(self, *args, **kwargs):
        if self.failed is None:
            try:
                return self.compiled(*args, **kwargs)
            except Exception as e:  # noqa: BLE001 - whatever broke the compiler, the rule below decides
                self.fail(e)
        return self.eager(*args, **kwargs)

    def fail(self, error: BaseException) -> None:
        """Record the failure; raise unless the run allows eager (then one warning line)."""
        self.failed = root_cause(error)
        if not self.fallback:
            raise CompileFailed(f"runtime.compile: torch.compile of {self.what} failed ({self.failed}); "
                                "set runtime.compile: false, or runtime.compile_fallback: eager to run it eager") from error
        print(f"warning: torch.compile of {self.what} failed ({self.failed}); runtime.compile_fallback: eager runs it eager",
              file=sys.stderr, flush=True)
