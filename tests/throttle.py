"""Slow one Slurm node down for real, for the preflight and straggler tests and the preflight
rehearsal (benchmarks/preflight_rehearsal.py): the processes of one tagged job on one node are moved,
as they appear, into cgroup (v1) groups with a CPU quota or a block-device read limit. A job is
tagged by BERTCTL_TEST_TAG in its environment (the node by SLURMD_NODENAME, which slurmd sets)."""

from __future__ import annotations

import math
import os
import threading
import time
import uuid
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


class Unavailable(RuntimeError):
    """This host cannot throttle (not root, or no cgroup v1 controller): the caller skips."""


class Throttle:
    """Moves every process of the tagged job on `node` into cgroup v1 groups as it appears: `cpu` with
    a CFS quota (a share of one CPU for all of the node's ranks), `blkio` with a read limit on the
    shards' device. A process joins once torch is loaded: Python and its libraries start at full
    speed (reading them at 2 MB/s, or importing torch on a tenth of a CPU, would take minutes), the
    measures run throttled. With `from_shards`, a process joins once it has a training shard open:
    a training run then builds its model and starts at full speed too, and its steps run throttled."""

    def __init__(self, node: str, cpu_share: float | None = None, read_bps: tuple[str, int] | None = None,
                 from_shards: bool = False):
        self.node, self.tag, self.from_shards = node, uuid.uuid4().hex, from_shards
        self.groups: dict[str, Path] = {}
        self.moved: dict[str, set[int]] = {"cpu": set(), "blkio": set()}
        if cpu_share is not None:
            # a short period spreads the share evenly over a measure's window: with the default 100 ms a
            # process ran at full speed until its quota ran out, then not at all, and a 0.3 s window
            # caught anything between (the kernel's smallest quota is 1 ms)
            period = max(10_000, math.ceil(1000 / cpu_share))
            self.groups["cpu"] = self.make("cpu", {"cpu.cfs_period_us": str(period),
                                                   "cpu.cfs_quota_us": str(int(period * cpu_share))})
        if read_bps is not None:
            device, rate = read_bps
            self.groups["blkio"] = self.make("blkio", {"blkio.throttle.read_bps_device": f"{device} {rate}"})
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.watch, daemon=True)

    def make(self, controller: str, settings: dict[str, str]) -> Path:
        if not (CGROUP / controller / "cgroup.procs").exists() or os.geteuid() != 0:
            raise Unavailable(f"needs root and the cgroup v1 {controller} controller at {CGROUP / controller}")
        group = CGROUP / controller / f"bertctl-test-{self.tag}"
        group.mkdir()
        for name, value in settings.items():
            (group / name).write_text(value)
        return group

    def watch(self) -> None:
        marks = (f"BERTCTL_TEST_TAG={self.tag}".encode(), f"SLURMD_NODENAME={self.node}".encode())
        while not self.stop.is_set():
            for entry in Path("/proc").iterdir():
                if entry.name.isdigit():
                    self.consider(int(entry.name), entry, marks)
            time.sleep(0.05)

    def consider(self, pid: int, entry: Path, marks: tuple[bytes, bytes]) -> None:
        if all(pid in moved for name, moved in self.moved.items() if name in self.groups):
            return
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            if not all(m in environ for m in marks):
                return
            for name, group in self.groups.items():
                if pid in self.moved[name] or not self.started(entry):
                    continue
                (group / "cgroup.procs").write_text(str(pid))
                self.moved[name].add(pid)
        except OSError:
            pass  # gone, or not ours to read

    def started(self, entry: Path) -> bool:
        """Whether the process got to the part that runs throttled (see the class's docstring)."""
        if self.from_shards:
            return any(os.readlink(fd).endswith(".hdf5") for fd in (entry / "fd").iterdir())
        return b"libtorch_cpu" in (entry / "maps").read_bytes()

    def __enter__(self) -> "Throttle":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
        for group in self.groups.values():
            for _ in range(100):  # the job's processes have ended; the kernel empties the group
                try:
                    group.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)
