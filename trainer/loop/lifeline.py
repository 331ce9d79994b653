"""What ties a `python -m trainer` process to the job that started it, from its first moment (trainer/__main__.py).

- A SIGTERM or SIGUSR2 that comes before the run's own handler (trainer/checkpoints/run.py::StopSignal), while torch
  still imports, ends the process as an interrupted run (exit REQUEUE_EXIT_CODE: nothing to save yet), not killed
  by the signal (exit 143, which the job script records as a failed run).
- The trainer ends with its job. A local job's script exports its own pid (BERTCTL_JOB_PID, templates/local.sh.j2);
  when that process is gone (its shell was killed), the trainer stops as on SIGTERM: it checkpoints and exits, and
  never trains on unwatched beside the second trainer `bertctl resume` would start. A watch thread, as the shard
  workers watch the trainer (trainer/data/dataset.py::die_with_parent); the job's start time, not its pid alone,
  names it, since a pid is reused.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from trainer.config.exits import REQUEUE_EXIT_CODE  # not .run: pydantic would load before the handler is set

JOB_PID = "BERTCTL_JOB_PID"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR2)


def stop_before_the_run() -> None:
    """Until StopSignal replaces it: a stop signal ends the process at once as an interrupted run."""

    def stop(signum, frame) -> None:
        print(f"signal {signum} before the run began: stopped, nothing to save yet (exit {REQUEUE_EXIT_CODE})", flush=True)
        sys.stderr.flush()
        os._exit(REQUEUE_EXIT_CODE)  # at once: unwinding a half-done `import torch` helps no one

    for sig in STOP_SIGNALS:
        signal.signal(sig, stop)


def process_start(pid: int) -> str | None:
    """When process `pid` started (field 22 of /proc/PID/stat, in clock ticks since boot), None when there is
    no such process or it is a zombie: with the pid, what names one process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if len(fields) < 20 or fields[0] in ("Z", "X") else fields[19]


def end_with_job(environ: Mapping[str, str] = os.environ, every_s: float = 1.0) -> int | None:
    """Watch the job named by BERTCTL_JOB_PID (if any): when it is gone, SIGTERM this process. Returns the pid watched."""
    text = environ.get(JOB_PID, "")
    if not (text.isascii() and text.isdigit()) or int(text) <= 1:
        return None
    job, started = int(text), process_start(int(text))

    def watch() -> None:
        while started is not None and process_start(job) == started:
            time.sleep(every_s)
        print(f"the job's shell (pid {job}) is gone: stopping as on SIGTERM", flush=True)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="end-with-job", daemon=True).start()
    return job
