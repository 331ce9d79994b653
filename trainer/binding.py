"""`python -m trainer.binding [policy] -- cmd ...`: bind one rank, then exec its command.

The policies are NVIDIA's bind.sh ones, computed from this node's real topology (/sys) instead
of `lscpu` text:

- cpu exclusive: the node's physical cores split into equal contiguous shares, one per local rank,
  with their SMT siblings; exclusive_nosmt: the same without siblings; node: the rank's NUMA node.
- mem node: memory bound to the rank's NUMA node (`numactl --membind`).
- ib single: one InfiniBand device per rank (`UCX_NET_DEVICES`, `OMPI_MCA_btl_openib_if_include`).

On a DGX A100 (2 x 64 cores, SMT, 8 NUMA nodes, 8 ranks) rank r gets cores 16r..16r+15 and their
siblings 128+16r.., and NUMA node r.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from trainer.dist_env import detect

SYS_CPU = Path("/sys/devices/system/cpu")
SYS_NODE = Path("/sys/devices/system/node")


@dataclass(frozen=True)
class Topology:
    cores: list[list[int]]  # physical cores in order, each the list of its hardware threads
    numa_nodes: list[list[int]]  # CPUs of each NUMA node


@dataclass
class Plan:
    numactl: list[str] = field(default_factory=list)
    cpus: list[int] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


def parse_cpu_list(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]"""
    cpus: list[int] = []
    for part in filter(None, text.strip().split(",")):
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def read_topology() -> Topology:
    allowed = os.sched_getaffinity(0)
    cores: dict[tuple[int, ...], None] = {}
    for cpu_dir in sorted(SYS_CPU.glob("cpu[0-9]*"), key=lambda p: int(p.name[3:])):
        siblings = cpu_dir / "topology" / "thread_siblings_list"
        threads = parse_cpu_list(siblings.read_text()) if siblings.exists() else [int(cpu_dir.name[3:])]
        threads = [t for t in threads if t in allowed]
        if threads:
            cores.setdefault(tuple(threads), None)
    numa = [
        [c for c in parse_cpu_list((d / "cpulist").read_text()) if c in allowed]
        for d in sorted(SYS_NODE.glob("node[0-9]*"), key=lambda p: int(p.name[4:]))
        if re.fullmatch(r"node\d+", d.name)
    ]
    return Topology(cores=[list(c) for c in cores], numa_nodes=[n for n in numa if n] or [sorted(allowed)])


def plan_binding(
    local_rank: int, tasks_per_node: int, topo: Topology,
    cpu: str = "none", mem: str = "none", ib: str = "none", ib_devices: tuple[str, ...] = (),
) -> Plan:
    plan = Plan()
    numa = local_rank * len(topo.numa_nodes) // tasks_per_node
    if cpu in ("exclusive", "exclusive_nosmt"):
        share = len(topo.cores) // tasks_per_node
        if share == 0:
            raise ValueError(f"{len(topo.cores)} physical cores cannot give {tasks_per_node} ranks one each")
        mine = topo.cores[local_rank * share:(local_rank + 1) * share]
        primaries = [threads[0] for threads in mine]
        siblings = [t for threads in mine for t in threads[1:]]
        plan.cpus = sorted(primaries + ([] if cpu == "exclusive_nosmt" else siblings))
        plan.numactl.append("--physcpubind=" + format_cpu_list(plan.cpus))
    elif cpu == "node":
        plan.cpus = topo.numa_nodes[numa]
        plan.numactl.append(f"--cpunodebind={numa}")
    if mem == "node":
        plan.numactl.append(f"--membind={numa}")
    if ib == "single":
        dev = ib_devices[local_rank * len(ib_devices) // tasks_per_node]
        plan.env.update(UCX_NET_DEVICES=f"{dev}:1", OMPI_MCA_btl_openib_if_include=dev)
    return plan


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


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if "--" not in args:
        print("usage: python -m trainer.binding [options] -- command ...", file=sys.stderr)
        return 2
    split = args.index("--")
    parser = argparse.ArgumentParser(prog="python -m trainer.binding")
    parser.add_argument("--cpu", choices=["none", "exclusive", "exclusive_nosmt", "node"], default="none")
    parser.add_argument("--mem", choices=["none", "node"], default="none")
    parser.add_argument("--ib", choices=["none", "single"], default="none")
    parser.add_argument("--ib-devices", default="")
    parser.add_argument("--tasks-per-node", type=int, required=True)
    opts = parser.parse_args(args[:split])
    command = args[split + 1:]
    me = detect()
    try:
        plan = plan_binding(
            me.local_rank, opts.tasks_per_node, read_topology(), opts.cpu, opts.mem, opts.ib,
            tuple(d for d in opts.ib_devices.split(",") if d),
        )
    except ValueError as e:
        print(f"error: binding rank {me.rank}: {e}", file=sys.stderr)
        return 2
    os.environ.update(plan.env)
    if plan.numactl:
        numactl = shutil.which("numactl")
        if numactl:
            os.execv(numactl, [numactl, *plan.numactl, *command])
        if opts.mem != "none":
            print("error: memory binding needs numactl (install it, or set node.binding.mem=none)", file=sys.stderr)
            return 2
        os.sched_setaffinity(0, plan.cpus)  # CPU binding alone works without numactl
    os.execvp(command[0], command)
    return 1  # not reached


if __name__ == "__main__":
    raise SystemExit(main())
