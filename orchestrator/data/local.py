"""Building a dataset on this machine: stage after stage on one pool of long-lived worker processes
(`serve`), each taking the next task as it finishes one; the first failure stops all. The pool lives
for the whole build: a worker's start-up (Python, numpy, h5py, tokenizers: about a CPU-second) is
paid once, not once per stage."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from orchestrator.data import workers
from orchestrator.data.manifest import LoadedManifest, write_manifest
from orchestrator.data.progress import progress_display
from trainer.config.regular import read_regular_text


@dataclass
class Prepared:
    root: str
    state: str  # complete (nothing to do), built (locally), submitted (Slurm)
    job_ids: list[str]
    job_dir: Path | None = None


def prepare_locally(loaded: LoadedManifest, workers_count: int, force: bool, say) -> Prepared:
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bertctl-data-") as tmp:
        manifest_file = write_manifest(loaded, Path(tmp))
        plan = workers.start(manifest_file, force)
        root = plan["root"]
        if not plan["stages"]:
            say(f"{loaded.config.name}: complete at {root} (bertctl data verify --dataset {loaded.config.name} checks it)")
            return Prepared(root, "complete", [])
        say(f"{loaded.config.name}: preparing at {root} with {workers_count} worker process(es)"
            + (" (continuing an interrupted build)" if plan["state"] == "partial" else ""))
        size = min(workers_count, max(stage["tasks"] for stage in plan["stages"]))
        with progress_display(sys.stderr) as bar, WorkerPool(manifest_file, size, Path(tmp)) as pool:
            for stage in plan["stages"]:
                pool.run_stage(stage["name"], stage["tasks"], bar)
    say(summary(loaded, Path(root), time.perf_counter() - t0))
    return Prepared(root, "built", [])


class WorkerPool:
    """`size` worker processes for every stage of a build, fed `STAGE INDEX` lines over their stdin."""

    def __init__(self, manifest_file: Path, size: int, scratch: Path):
        self.command = [sys.executable, *workers.WORKER, "serve", "--manifest", str(manifest_file)]
        self.size, self.scratch = size, scratch
        self.stage, self.queue = "", []
        self.lock = threading.Lock()
        self.failed: list[Exception] = []
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> WorkerPool:
        # stderr to a file, not a pipe: a chatty worker must not block on a pipe nobody reads until the end
        self.stderr_files = [tempfile.TemporaryFile("w+") for _ in range(self.size)]
        self.error_files = [self.scratch / f"worker-{i}.json" for i in range(self.size)]
        self.procs = [subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                                       text=True, env=workers.worker_env(error))
                      for stderr, error in zip(self.stderr_files, self.error_files)]
        return self

    def __exit__(self, *exc) -> None:
        for p in self.procs:  # a closed stdin ends a worker's loop
            with contextlib.suppress(OSError):
                p.stdin.close()
        self.reap()
        for f in self.stderr_files:
            f.close()

    def run_stage(self, stage: str, tasks: int, bar) -> None:
        """Every task of `stage` on the pool's workers; the first failure is raised once they stopped."""
        bar.begin(stage, tasks)
        self.stage, self.queue = stage, list(range(tasks))
        threads = [threading.Thread(target=self.drive, args=(p, s, e, bar))
                   for p, s, e in zip(self.procs, self.stderr_files, self.error_files)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if self.failed:
            raise self.failed[0]
        bar.end(stage)

    def next_task(self) -> int | None:
        with self.lock:
            return self.queue.pop(0) if self.queue and not self.failed else None

    def drive(self, proc: subprocess.Popen, stderr, error_file: Path, bar) -> None:
        while (index := self.next_task()) is not None:
            line = self.ask(proc, f"{self.stage} {index}")
            if not line:  # the worker stopped: bad input, a failure, or killed
                with contextlib.suppress(OSError):
                    proc.stdin.close()
                code = proc.wait()
                stderr.seek(0)
                self.fail(workers.failure(code, workers.read_error(error_file), stderr.read(), f"{self.stage} task {index}"),
                          proc)
                return
            bar.advance(self.stage, [json.loads(line)])

    @staticmethod
    def ask(proc: subprocess.Popen, task: str) -> str:
        try:
            proc.stdin.write(f"{task}\n")
            proc.stdin.flush()
            return proc.stdout.readline()
        except (BrokenPipeError, OSError, ValueError):  # ValueError: its stdin was closed after a failure
            return ""

    def fail(self, error: Exception, culprit: subprocess.Popen) -> None:
        with self.lock:
            if not self.failed:
                self.failed.append(error)
                for other in self.procs:
                    if other is not culprit:
                        other.terminate()

    def reap(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
            p.stdout.close()


def summary(loaded: LoadedManifest, root: Path, seconds: float) -> str:
    try:
        record = json.loads(read_regular_text(root / "prepared.json", limit=64 << 20))
        counts = ", ".join(f"{name} {out['samples']}" for name, out in record["outputs"].items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # a damaged record: no counts
        counts = "?"
    return f"{loaded.config.name}: prepared at {root} in {seconds:.1f} s (samples: {counts})"
