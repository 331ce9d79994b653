"""Who am I in the job? Rank, world size and rendezvous address from torchrun's or Slurm's variables,
and the CPU/memory/IB binding the wrapper gave this process (trainer/launch/binding.py).

Torch-free and light (the standard library's small modules only), so that the probe and the binding
wrapper can use it before the trainer starts: a launch rehearsal starts it 2,048 times on one host.
Group exchange padding assumes ranks node_rank * tasks_per_node + local_rank, which is what
torchrun and `srun --distribution=block` give.
"""

from __future__ import annotations

import json
import os
from typing import NamedTuple

BINDING_VARIABLE = "BERTCTL_BINDING"  # the binding wrapper's plan, as JSON, in the environment of the command it runs


# A NamedTuple rather than a dataclass: importing and building dataclasses costs a process about 20 ms,
# which the 2,048 processes of a 1,024-rank rehearsal on one host pay as a quarter of a minute.
class DistEnv(NamedTuple):
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node: str
    master_addr: str
    master_port: int
    launcher: str  # torchrun | slurm | single

    @property
    def node_rank(self) -> int:
        return self.rank // self.local_world_size

    def as_dict(self) -> dict:
        return self._asdict()


def detect(environ: dict[str, str] | None = None) -> DistEnv:
    env = os.environ if environ is None else environ
    node = env.get("SLURMD_NODENAME") or os.uname().nodename  # socket.gethostname(), without importing socket
    addr = env.get("MASTER_ADDR", "127.0.0.1")
    port = int(env.get("MASTER_PORT", "29500"))
    if "RANK" in env and "WORLD_SIZE" in env:  # torchrun (also the local executor)
        world = int(env["WORLD_SIZE"])
        return DistEnv(
            rank=int(env["RANK"]),
            local_rank=int(env.get("LOCAL_RANK", "0")),
            world_size=world,
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", str(world))),
            node=node, master_addr=addr, master_port=port, launcher="torchrun",
        )
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:  # one srun task per rank
        world = int(env["SLURM_NTASKS"])
        nodes = int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or "1")
        return DistEnv(
            rank=int(env["SLURM_PROCID"]),
            local_rank=int(env.get("SLURM_LOCALID", "0")),
            world_size=world,
            local_world_size=max(1, world // nodes),
            node=node, master_addr=addr, master_port=port, launcher="slurm",
        )
    return DistEnv(0, 0, 1, 1, node, addr, port, "single")


def binding_plan(environ: dict[str, str] | None = None) -> dict | None:
    """The plan the binding wrapper applied to this process (`binding.describe`'s dict), None without the wrapper."""
    env = os.environ if environ is None else environ
    text = env.get(BINDING_VARIABLE)
    return json.loads(text) if text else None
