"""Where things sit on this node: cores and NUMA nodes, a rank's GPU and its NUMA node, InfiniBand devices.

Read from the kernel's and the NVIDIA driver's files only (/sys, /proc/driver/nvidia): no CUDA, no
nvidia-smi, so the binding wrapper can run before the trainer, and torch-free. Every reader takes the
file-system `root` ("/" on a real node; a fake tree in tests). What cannot be read raises `NoLocality`
with a sentence saying why, which the binding prints before it falls back to its position rule.

Which GPU a CUDA device index names (CUDA_VISIBLE_DEVICES, or the local rank when it is unset):
- CUDA numbers devices by PCI bus id with CUDA_DEVICE_ORDER=PCI_BUS_ID. Its default, FASTEST_FIRST,
  ranks by a speed guess; identical GPUs tie and keep PCI bus order (what NVML, nvidia-smi and Slurm
  use). So indexes follow PCI bus order unless the node mixes GPU models and the order is not
  PCI_BUS_ID: then the index is ambiguous and we say so rather than guess.
- Slurm with ConstrainDevices renumbers CUDA_VISIBLE_DEVICES from 0 over the job's GPUs, while
  SLURM_STEP_GPUS / SLURM_JOB_GPUS keep the global ids (the N of /dev/nvidiaN, the driver's Device
  Minor). The procfs lists every GPU of the node either way, so the indexes count only the job's GPUs
  then.
- GPU UUIDs (`GPU-...`, a unique prefix is enough, as for CUDA) and old-style MIG ids
  (`MIG-GPU-<uuid>/gi/ci`) name their GPU directly; new-style `MIG-<uuid>` ids do not name it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import NamedTuple  # records as NamedTuples: the binding wrapper starts once per rank (see dist_env)


class NoLocality(Exception):
    """Why a rank's GPU locality cannot be read (the message is one sentence without a final period)."""


def parse_cpu_list(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]"""
    cpus: list[int] = []
    for part in filter(None, text.strip().split(",")):
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def format_cpu_list(cpus: list[int]) -> str:
    """[0, 1, 2, 3, 8] -> '0-3,8'"""
    ranges, start = [], None
    for i, c in enumerate(cpus):
        if start is None:
            start = c
        if i + 1 == len(cpus) or cpus[i + 1] != c + 1:
            ranges.append(f"{start}-{c}" if c != start else str(c))
            start = None
    return ",".join(ranges)


# --- cores and NUMA nodes ---------------------------------------------------------------------

class Topology(NamedTuple):
    cores: list[list[int]]  # physical cores in order, each the list of its hardware threads
    numa_nodes: dict[int, list[int]]  # NUMA node id -> its CPUs (only nodes with CPUs this task may use)

    def cores_of(self, node: int) -> list[list[int]]:
        cpus = set(self.numa_nodes[node])
        return [threads for threads in self.cores if threads[0] in cpus]


def numbered(directory: Path, prefix: str) -> list[tuple[int, Path]]:
    """The entries `<prefix><number>` of a sysfs directory, by number."""
    found = [(int(p.name[len(prefix):]), p) for p in directory.glob(f"{prefix}*")
             if re.fullmatch(rf"{prefix}\d+", p.name)]
    return sorted(found)


def read_topology(root: Path | str = "/", allowed: set[int] | None = None) -> Topology:
    """This node's cores and NUMA nodes, limited to the CPUs this task may run on (`allowed`)."""
    root = Path(root)
    allowed = os.sched_getaffinity(0) if allowed is None else allowed
    cores: dict[tuple[int, ...], None] = {}
    seen: set[int] = set()  # siblings of cores already read: their own files say the same
    for cpu, cpu_dir in numbered(root / "sys/devices/system/cpu", "cpu"):
        if cpu in seen:
            continue
        siblings = cpu_dir / "topology" / "thread_siblings_list"
        threads = parse_cpu_list(siblings.read_text()) if siblings.exists() else [cpu]
        seen.update(threads)
        threads = [t for t in threads if t in allowed]
        if threads:
            cores.setdefault(tuple(threads), None)
    nodes = {
        node: [c for c in parse_cpu_list((d / "cpulist").read_text()) if c in allowed]
        for node, d in numbered(root / "sys/devices/system/node", "node")
    }
    nodes = {node: cpus for node, cpus in nodes.items() if cpus}
    return Topology(cores=[list(c) for c in cores], numa_nodes=nodes or {0: sorted(allowed)})


# --- GPUs -------------------------------------------------------------------------------------

class Gpu(NamedTuple):
    bus_id: str  # PCI address as the driver and sysfs spell it: 0000:07:00.0
    minor: int  # N of /dev/nvidiaN
    uuid: str  # GPU-...; GPU-????... while the driver has not initialised the GPU
    model: str


NVIDIA_PROC = "proc/driver/nvidia/gpus"


def nvidia_gpus(root: Path | str = "/") -> list[Gpu]:
    """The node's GPUs from the NVIDIA driver's procfs, in PCI bus order (excluded GPUs left out)."""
    base = Path(root) / NVIDIA_PROC
    if not base.is_dir():
        raise NoLocality(f"no /{NVIDIA_PROC} (no NVIDIA driver)")
    gpus = [gpu for d in base.iterdir() if (gpu := read_gpu(d)) is not None]
    if not gpus:
        raise NoLocality(f"/{NVIDIA_PROC} lists no GPU")
    return sorted(gpus, key=lambda g: g.bus_id)


def read_gpu(directory: Path) -> Gpu | None:
    """One GPU's `information` file (`Key: value` lines); None for a GPU the driver excludes."""
    try:
        text = (directory / "information").read_text()
    except OSError as e:
        raise NoLocality(f"cannot read /{NVIDIA_PROC}/{directory.name}/information ({e.strerror})") from None
    fields = dict(
        (key.strip(), value.strip()) for key, sep, value in (line.partition(":") for line in text.splitlines()) if sep
    )
    if fields.get("GPU Excluded", "No") == "Yes":
        return None
    try:
        return Gpu(bus_id=directory.name.lower(), minor=int(fields["Device Minor"]),
                   uuid=fields.get("GPU UUID", ""), model=fields.get("Model", ""))
    except (KeyError, ValueError):
        raise NoLocality(f"/{NVIDIA_PROC}/{directory.name}/information has no Device Minor") from None


def cuda_devices(gpus: list[Gpu], environ: dict[str, str]) -> list[Gpu]:
    """The GPUs this process's CUDA devices 0, 1, ... are, in that order."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return index_order(gpus, environ)
    entries = [e.strip() for e in visible.split(",")]
    devices: list[Gpu] = []
    for entry in entries:
        gpu = resolve_entry(entry, gpus, entries, environ)
        if gpu is None:
            break  # CUDA too ignores an invalid entry and every one after it
        devices.append(gpu)
    return devices


def resolve_entry(entry: str, gpus: list[Gpu], entries: list[str], environ: dict[str, str]) -> Gpu | None:
    """One CUDA_VISIBLE_DEVICES entry -> its GPU; None where CUDA would find the entry invalid."""
    if entry.isdigit():
        counted = index_universe(gpus, entries, environ)
        return counted[int(entry)] if int(entry) < len(counted) else None
    if entry.startswith("MIG-GPU-"):  # driver < 470: MIG-GPU-<gpu uuid>/<gi>/<ci>
        return by_uuid(entry[len("MIG-"):].partition("/")[0], gpus)
    if entry.startswith("MIG-"):
        raise NoLocality(
            f"CUDA_VISIBLE_DEVICES names MIG instance {entry}, whose GPU the driver's procfs does not tell")
    if entry.startswith("GPU-"):
        return by_uuid(entry, gpus)
    return None


def by_uuid(prefix: str, gpus: list[Gpu]) -> Gpu | None:
    matches = [g for g in gpus if g.uuid.lower().startswith(prefix.lower())]
    if len(matches) == 1:
        return matches[0]
    if not matches and any("?" in g.uuid for g in gpus):
        raise NoLocality(f"CUDA_VISIBLE_DEVICES names {prefix}, but the driver shows GPU UUIDs as GPU-???? "
                         "(GPUs not initialised: is the persistence daemon running?)")
    return None


def index_order(gpus: list[Gpu], environ: dict[str, str]) -> list[Gpu]:
    """All GPUs in CUDA's index order (see the module docstring)."""
    if environ.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST") != "PCI_BUS_ID" and len({g.model for g in gpus}) > 1:
        raise NoLocality("this node mixes GPU models and CUDA_DEVICE_ORDER is not PCI_BUS_ID, "
                         "so CUDA's device order is unknown")
    return gpus


def index_universe(gpus: list[Gpu], entries: list[str], environ: dict[str, str]) -> list[Gpu]:
    """The GPUs CUDA_VISIBLE_DEVICES indexes count: all of the node's, or under Slurm with constrained
    devices only the job's (its indexes then run from 0 while SLURM_STEP_GPUS keeps the global ids)."""
    order = index_order(gpus, environ)
    slurm = environ.get("SLURM_STEP_GPUS") or environ.get("SLURM_JOB_GPUS")
    if not slurm:
        return order
    try:
        global_ids = parse_cpu_list(slurm)
    except ValueError:
        return order
    indexes = [int(e) for e in entries if e.isdigit()]
    if indexes == global_ids or not all(i < len(global_ids) for i in indexes):
        return order  # Slurm wrote the global ids: devices are not constrained
    return [g for g in order if g.minor in global_ids]


# --- PCI devices: NUMA node and place in the PCI tree -----------------------------------------

class PciPlace(NamedTuple):
    numa_node: int  # -1 where the firmware does not say
    path: tuple[str, ...]  # bridges from the root complex down to the device itself

    def shared_depth(self, other: "PciPlace") -> int:
        """How many bridges two devices share: more means closer (same PCIe switch)."""
        depth = 0
        for a, b in zip(self.path, other.path):
            if a != b:
                break
            depth += 1
        return depth


def pci_place(root: Path, device: Path, name: str) -> PciPlace:
    """A PCI device's NUMA node and path, from its sysfs directory (a symlink into /sys/devices)."""
    try:
        node = int((device / "numa_node").read_text())
    except (OSError, ValueError):
        raise NoLocality(f"cannot read the numa_node of {name} in sysfs") from None
    real, devices = device.resolve(), (root / "sys/devices").resolve()
    path = real.relative_to(devices).parts if real.is_relative_to(devices) else real.parts
    return PciPlace(numa_node=node, path=path)


def gpu_place(root: Path | str, gpu: Gpu) -> PciPlace:
    device = Path(root) / "sys/bus/pci/devices" / gpu.bus_id
    if not device.exists():
        raise NoLocality(f"no /sys/bus/pci/devices/{gpu.bus_id}")
    return pci_place(Path(root), device, gpu.bus_id)


def ib_place(root: Path | str, name: str) -> PciPlace:
    """An InfiniBand device's place (/sys/class/infiniband/<name>/device is its PCI function)."""
    device = Path(root) / "sys/class/infiniband" / name / "device"
    if not device.exists():
        raise NoLocality(f"{name} is not in /sys/class/infiniband")
    return pci_place(Path(root), device, name)
