"""Who am I in the job? Rank, world size and rendezvous address from torchrun's or Slurm's variables.

Torch-free, so that the probe and the binding wrapper can use it before the trainer starts.
Group exchange padding assumes ranks node_rank * tasks_per_node + local_rank, which is what
torchrun and `srun --distribution=block` give.
"""

from __future__ import annotations

import os
import socket
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class DistEnv:
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
        return asdict(self)


def detect(environ: dict[str, str] | None = None) -> DistEnv:
    env = os.environ if environ is None else environ
    node = env.get("SLURMD_NODENAME") or socket.gethostname()
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
