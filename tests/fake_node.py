"""A fake /sys and /proc/driver/nvidia of a DGX A100, written under a test's tmp_path.

2 sockets x 64 cores with SMT (CPU c and c + 128 are one core), NPS4: 8 NUMA nodes of 16 cores.
The PCIe tree, bus ids and NUMA nodes of the 8 GPUs and 8 compute NICs are those of NVIDIA's
dgxa100_nic_affinity.xml (MLPerf training v1.0, NVIDIA BERT): each NUMA node with GPUs has one
PCIe switch holding two lower switches, each with one GPU and one NIC. The mlx5 names are assumed
to follow PCI order (the XML gives bus ids only); mlx5_4 and mlx5_5, the storage NICs, are left out.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

CORES, NUMA_NODES = 128, 8

# NUMA node: (root complex, root port, switch, [(lower switch, GPU, NIC, NIC name), ...])
PCI = {
    3: ("pci0000:00", "0000:00:01.1", "0000:01:00.0", [
        ("0000:03:00.0", "0000:07:00.0", "0000:12:00.0", "mlx5_1"),
        ("0000:0a:00.0", "0000:0f:00.0", "0000:0c:00.0", "mlx5_0")]),
    1: ("pci0000:40", "0000:40:01.1", "0000:41:00.0", [
        ("0000:43:00.0", "0000:47:00.0", "0000:54:00.0", "mlx5_3"),
        ("0000:49:00.0", "0000:4e:00.0", "0000:4b:00.0", "mlx5_2")]),
    7: ("pci0000:80", "0000:80:01.1", "0000:81:00.0", [
        ("0000:83:00.0", "0000:87:00.0", "0000:94:00.0", "mlx5_7"),
        ("0000:8b:00.0", "0000:90:00.0", "0000:8d:00.0", "mlx5_6")]),
    5: ("pci0000:b0", "0000:b0:01.1", "0000:b1:00.0", [
        ("0000:b3:00.0", "0000:b7:00.0", "0000:cc:00.0", "mlx5_9"),
        ("0000:b8:00.0", "0000:bd:00.0", "0000:ba:00.0", "mlx5_8")]),
}
GPUS = sorted(gpu for *_, lower in PCI.values() for _, gpu, _, _ in lower)  # nvidia-smi order: PCI bus order
IB_DEVICES = ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9")  # the selene list


def gpu_uuid(bus_id: str) -> str:
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, bus_id))


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def link(path: Path, target: Path) -> None:
    """A relative symlink, as sysfs has, so that it resolves inside the fake root."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(os.path.relpath(target, path.parent))


def dgx_a100(root: Path, *, driver: bool = True, numa_node: dict[str, int] | None = None,
             models: dict[str, str] | None = None, uuids_known: bool = True, switches: bool = True) -> Path:
    """Write the tree under `root`; `numa_node` overrides a device's numa_node file (e.g. -1);
    switches=False hangs every device directly off its NUMA node's root port."""
    sysfs = root / "sys"
    def node_cpus(n: int) -> str:
        return f"{16 * n}-{16 * n + 15},{CORES + 16 * n}-{CORES + 16 * n + 15}\n"

    for c in range(2 * CORES):
        write(sysfs / f"devices/system/cpu/cpu{c}/topology/thread_siblings_list", f"{c % CORES},{c % CORES + CORES}\n")
    for n in range(NUMA_NODES):
        write(sysfs / f"devices/system/node/node{n}/cpulist", node_cpus(n))
    overrides = numa_node or {}
    for node, (complex_, port, switch, lower) in PCI.items():
        for lower_switch, gpu, nic, name in lower:
            parent = sysfs / "devices" / complex_ / port / (f"{switch}/{lower_switch}" if switches else "")
            for bdf in (gpu, nic):
                device = parent / bdf
                write(device / "numa_node", f"{overrides.get(bdf, node)}\n")
                write(device / "local_cpulist", node_cpus(node))
                link(sysfs / "bus/pci/devices" / bdf, device)
            ib = parent / nic / "infiniband" / name
            ib.mkdir(parents=True)
            link(ib / "device", parent / nic)
            link(sysfs / "class/infiniband" / name, ib)
    if driver:
        for minor, bus_id in enumerate(GPUS):
            model = (models or {}).get(bus_id, "NVIDIA A100-SXM4-40GB")
            uid = gpu_uuid(bus_id) if uuids_known else "GPU-????????-????-????-????-????????????"
            write(root / f"proc/driver/nvidia/gpus/{bus_id}/information", (
                f"Model: \t\t {model}\nIRQ:   \t\t {200 + minor}\nGPU UUID: \t {uid}\n"
                "Video BIOS: \t 92.00.19.00.10\nBus Type: \t PCIe\nDMA Size: \t 47 bits\n"
                f"DMA Mask: \t 0x7fffffffffff\nBus Location: \t {bus_id}\nDevice Minor: \t {minor}\n"
                "GPU Excluded:\t No\n"))
    return root
