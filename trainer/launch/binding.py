"""`python -m trainer.launch.binding [policy] -- cmd ...`: bind one rank near its GPU, then exec its command.

The policies are NVIDIA's bind.sh ones, applied where the rank's GPU sits (trainer/launch/topology.py
reads that from /sys and the NVIDIA driver's procfs):

- cpu exclusive: the physical cores of the GPU's NUMA node, split into equal contiguous shares among
  the local ranks whose GPUs sit on that node (disjoint), with their SMT siblings; exclusive_nosmt:
  the same without siblings; node: the whole NUMA node.
- mem node: memory bound to the GPU's NUMA node (`numactl --membind`).
- ib single: of the listed InfiniBand devices, the one nearest the GPU on its NUMA node (deepest
  shared PCIe switch), exported as `UCX_NET_DEVICES` and `OMPI_MCA_btl_openib_if_include`.

On a DGX A100 (2 x 64 cores, SMT, 8 NUMA nodes; GPUs 0-1 on NUMA node 3, 2-3 on 1, 4-5 on 7, 6-7
on 5) rank 0 gets cores 48-55 and 176-183, memory node 3 and mlx5_1 (behind GPU 0's PCIe switch).

Where the locality cannot be read (no NVIDIA driver, a GPU whose numa_node is -1, ...), the rank is
placed by position as bind.sh does: all the node's cores split by local rank, NUMA node
local_rank * nodes / ranks, IB device local_rank * devices / ranks. The wrapper then prints one line
to stderr, `binding: rank R: <why>: <what> by position`. The plan it applied is exported to the
command as JSON in BERTCTL_BINDING (read back by `dist_env.binding_plan`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections import Counter
from pathlib import Path
from typing import NamedTuple  # records as NamedTuples: this wrapper starts once per rank (see dist_env)

from trainer.launch.dist_env import BINDING_VARIABLE, detect
from trainer.launch.topology import (
    Gpu,
    NoLocality,
    PciPlace,
    Topology,
    cuda_devices,
    format_cpu_list,
    gpu_place,
    ib_place,
    nvidia_gpus,
    parse_cpu_list,
    read_topology,
)

TOPOLOGY_ROOT_VARIABLE = "BERTCTL_TOPOLOGY_ROOT"
ALL_CPUS = set(range(1 << 14))  # a copied tree's CPUs are not this machine's: take them all


class Policy(NamedTuple):
    cpu: str = "none"  # none | exclusive | exclusive_nosmt | node
    mem: str = "none"  # none | node
    ib: str = "none"  # none | single
    ib_devices: tuple[str, ...] = ()


class Placement(NamedTuple):
    """Where a rank goes, before a policy turns it into numactl options."""

    numa_node: int
    node_cpus: list[int]  # the CPUs of that NUMA node
    cores: list[list[int]]  # physical cores this rank splits with the others in its group
    slot: int  # this rank's share of `cores`
    slots: int  # how many ranks split `cores`
    gpu: str | None = None  # PCI bus id of the rank's GPU
    ib_device: str | None = None
    fallback: str | None = None  # why part of the placement went by position


class Plan(NamedTuple):
    local_rank: int
    numa_node: int
    gpu: str | None
    ib_device: str | None
    cpus: list[int]
    numactl: list[str]
    env: dict[str, str]
    fallback: str | None

    def as_dict(self) -> dict:
        """JSON-ready: `cpus` as a cpulist string ('48-55,176-183'); fallback None when all went by locality."""
        return {**self._asdict(), "cpus": format_cpu_list(self.cpus)}


def plan_rank(
    local_rank: int, tasks_per_node: int, policy: Policy, root: Path | str = "/",
    environ: dict[str, str] | None = None, allowed: set[int] | None = None,
) -> Plan:
    """The binding of one rank: by its GPU's locality, else by position with the reason in `fallback`."""
    if not 0 <= local_rank < tasks_per_node:
        raise ValueError(f"local rank {local_rank} is not below --tasks-per-node {tasks_per_node}")
    if policy.ib == "single" and not policy.ib_devices:
        raise ValueError("--ib single needs --ib-devices (e.g. mlx5_0,mlx5_1)")
    env = dict(os.environ if environ is None else environ)
    topo = read_topology(root, allowed)
    try:
        placement = by_locality(local_rank, tasks_per_node, topo, policy, Path(root), env)
    except NoLocality as why:
        what = "NUMA node and IB device" if policy.ib == "single" else "NUMA node"
        placement = by_position(local_rank, tasks_per_node, topo, policy)
        placement = placement._replace(fallback=f"{why}: {what} by position")
    return apply_policy(local_rank, placement, policy)


def by_position(local_rank: int, tasks_per_node: int, topo: Topology, policy: Policy) -> Placement:
    """bind.sh's rule: rank r of n takes NUMA node r * nodes / n and the r-th share of all the node's cores."""
    nodes = sorted(topo.numa_nodes)
    return Placement(
        numa_node=(node := nodes[local_rank * len(nodes) // tasks_per_node]),
        node_cpus=topo.numa_nodes[node], cores=topo.cores, slot=local_rank, slots=tasks_per_node,
        ib_device=ib_by_position(local_rank, tasks_per_node, policy),
    )


def ib_by_position(local_rank: int, tasks_per_node: int, policy: Policy) -> str | None:
    if policy.ib != "single":
        return None
    return policy.ib_devices[local_rank * len(policy.ib_devices) // tasks_per_node]


def by_locality(
    local_rank: int, tasks_per_node: int, topo: Topology, policy: Policy, root: Path, environ: dict[str, str],
) -> Placement:
    """The rank's GPU's NUMA node; its cores split among the local ranks whose GPUs share that node.

    Every rank of the node reads the same files and checks all the node's GPUs, so either all ranks
    go by locality or all by position: their CPU shares never overlap."""
    devices = cuda_devices(nvidia_gpus(root), environ)
    if len(devices) < tasks_per_node:
        raise NoLocality(f"{visible_devices(environ)} gives {len(devices)} GPUs for {tasks_per_node} ranks per node")
    places = [gpu_place(root, gpu) for gpu in devices[:tasks_per_node]]
    check_node(devices, places, topo, policy)
    mine = places[local_rank]
    group = [rank for rank, place in enumerate(places) if place.numa_node == mine.numa_node]
    placement = Placement(
        numa_node=mine.numa_node, node_cpus=topo.numa_nodes[mine.numa_node], cores=topo.cores_of(mine.numa_node),
        slot=group.index(local_rank), slots=len(group), gpu=devices[local_rank].bus_id,
    )
    if policy.ib != "single":
        return placement
    try:
        return placement._replace(ib_device=nearest_ib(mine, placement.slot, policy.ib_devices, root))
    except NoLocality as why:
        return placement._replace(ib_device=ib_by_position(local_rank, tasks_per_node, policy),
                       fallback=f"{why}: IB device by position")


def check_node(devices: list[Gpu], places: list[PciPlace], topo: Topology, policy: Policy) -> None:
    """Raise unless every rank of the node can be placed by its GPU."""
    for gpu, place in zip(devices, places):
        if place.numa_node < 0:
            raise NoLocality(f"GPU {gpu.bus_id} has numa_node -1 (the firmware does not say where it sits)")
        if place.numa_node not in topo.numa_nodes:
            raise NoLocality(f"GPU {gpu.bus_id} sits on NUMA node {place.numa_node}, where this task may use no CPU")
    if policy.cpu in ("exclusive", "exclusive_nosmt"):
        for node, ranks in sorted(Counter(p.numa_node for p in places).items()):
            if len(topo.cores_of(node)) < ranks:
                raise NoLocality(f"NUMA node {node} has {len(topo.cores_of(node))} physical cores for {ranks} ranks")


def visible_devices(environ: dict[str, str]) -> str:
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    return "the driver" if visible is None else f"CUDA_VISIBLE_DEVICES={visible!r}"


def nearest_ib(gpu: PciPlace, slot: int, names: tuple[str, ...], root: Path) -> str:
    """Of the listed devices on the GPU's NUMA node, the one sharing the most PCIe bridges with it;
    ranks whose GPUs are equally near several take them in turn (by their slot on the node)."""
    places = {name: ib_place(root, name) for name in names}
    local = [name for name in names if places[name].numa_node == gpu.numa_node]
    if not local:
        raise NoLocality(f"none of the IB devices {','.join(names)} sits on NUMA node {gpu.numa_node}")
    depth = {name: gpu.shared_depth(places[name]) for name in local}
    nearest = [name for name in local if depth[name] == max(depth.values())]
    return nearest[slot % len(nearest)]


def apply_policy(local_rank: int, placement: Placement, policy: Policy) -> Plan:
    p = placement
    cpus: list[int] = []
    numactl: list[str] = []
    if policy.cpu in ("exclusive", "exclusive_nosmt"):
        share = len(p.cores) // p.slots
        if share == 0:
            raise ValueError(f"{len(p.cores)} physical cores cannot give {p.slots} ranks one each")
        mine = p.cores[p.slot * share:(p.slot + 1) * share]
        primaries = [threads[0] for threads in mine]
        siblings = [t for threads in mine for t in threads[1:]]
        cpus = sorted(primaries + ([] if policy.cpu == "exclusive_nosmt" else siblings))
        numactl.append("--physcpubind=" + format_cpu_list(cpus))
    elif policy.cpu == "node":
        cpus = p.node_cpus
        numactl.append(f"--cpunodebind={p.numa_node}")
    if policy.mem == "node":
        numactl.append(f"--membind={p.numa_node}")
    env = {"UCX_NET_DEVICES": f"{p.ib_device}:1", "OMPI_MCA_btl_openib_if_include": p.ib_device} if p.ib_device else {}
    return Plan(local_rank, p.numa_node, p.gpu, p.ib_device, cpus, numactl, env, p.fallback)


def describe(
    policy: Policy, tasks_per_node: int | None = None, environ: dict[str, str] | None = None,
    root: Path | str = "/", allowed: set[int] | None = None,
) -> dict:
    """The plan for this process's rank as a dict (torch-free): rank, local_rank, gpu (PCI bus id),
    numa_node, cpus (cpulist string), ib_device, numactl, env, fallback (None: all by GPU locality)."""
    env = dict(os.environ if environ is None else environ)
    me = detect(env)
    plan = plan_rank(me.local_rank, tasks_per_node or me.local_world_size, policy, root, env, allowed)
    return {"rank": me.rank, **plan.as_dict()}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if "--" not in args:
        print("usage: python -m trainer.launch.binding [options] -- command ...", file=sys.stderr)
        return 2
    split = args.index("--")
    parser = argparse.ArgumentParser(prog="python -m trainer.launch.binding")
    parser.add_argument("--cpu", choices=["none", "exclusive", "exclusive_nosmt", "node"], default="none")
    parser.add_argument("--mem", choices=["none", "node"], default="none")
    parser.add_argument("--ib", choices=["none", "single"], default="none")
    parser.add_argument("--ib-devices", default="")
    parser.add_argument("--tasks-per-node", type=int, required=True)
    opts = parser.parse_args(args[:split])
    command = args[split + 1:]
    policy = Policy(opts.cpu, opts.mem, opts.ib, tuple(d for d in opts.ib_devices.split(",") if d))
    # A launch rehearsal on a machine that is not the target reads the target's topology from a copy
    # of its /sys and /proc tree and only computes the plan (bertctl submit --probe, benchmarks/rehearsal.py).
    root = os.environ.get(TOPOLOGY_ROOT_VARIABLE, "/")
    try:
        plan = describe(policy, opts.tasks_per_node, root=root, allowed=None if root == "/" else ALL_CPUS)
    except ValueError as e:
        print(f"error: binding rank {detect().rank}: {e}", file=sys.stderr)
        return 2
    if plan["fallback"]:
        print(f"binding: rank {plan['rank']}: {plan['fallback']}", file=sys.stderr, flush=True)
    os.environ.update(plan["env"])
    os.environ[BINDING_VARIABLE] = json.dumps(plan, sort_keys=True)
    if root != "/":
        os.execvp(command[0], command)  # planned for another machine: nothing to apply here
    return exec_bound(plan, opts.mem != "none", command)


def exec_bound(plan: dict, needs_numactl: bool, command: list[str]) -> int:
    if plan["numactl"]:
        numactl = shutil.which("numactl")
        if numactl:
            os.execv(numactl, [numactl, *plan["numactl"], *command])
        if needs_numactl:
            print("error: memory binding needs numactl (install it, or set node.binding.mem=none)", file=sys.stderr)
            return 2
        os.sched_setaffinity(0, parse_cpu_list(plan["cpus"]))  # CPU binding alone works without numactl
    os.execvp(command[0], command)
    return 1  # not reached


if __name__ == "__main__":
    raise SystemExit(main())
