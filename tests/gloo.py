"""Run a function on N real gloo ranks (separate processes, a real torch.distributed process group)."""

from __future__ import annotations

import os
import pickle
import socket
import tempfile
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp

from trainer.parallel.distributed import exit_process


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(fn, world: int, *args) -> list:
    """fn(rank, world, *args) on every rank; returns the ranks' results in rank order."""
    with tempfile.TemporaryDirectory() as tmp:
        # forked, not spawned: each rank starts from this process's imports instead of importing torch
        # again (~3 CPU-seconds a rank on CI's cores); it sets one thread before any torch op
        mp.start_processes(_entry, args=(fn, world, free_port(), args, tmp), nprocs=world, join=True,
                           start_method="fork")
        return [pickle.loads((Path(tmp) / f"{r}.pkl").read_bytes()) for r in range(world)]


def _entry(rank: int, fn, world: int, port: int, args: tuple, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world), OMP_NUM_THREADS="1")
    import torch

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        result = fn(rank, world, *args)
    finally:
        dist.destroy_process_group()
    (Path(out) / f"{rank}.pkl").write_bytes(pickle.dumps(result))
    exit_process(0)  # what the trainer does too: no interpreter teardown under live gloo threads
