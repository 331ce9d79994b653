"""Process group set-up: rank and world from the launcher, gloo on CPU, NCCL on CUDA."""

from __future__ import annotations

import datetime
import os
import sys

import torch
import torch.distributed as dist

from trainer.config import RunConfig, RuntimeConfig
from trainer.launch.dist_env import DistEnv, detect
from trainer.model.apex_kernels import apex_missing
from trainer.model.attention import AttentionUnavailable, check_attention
from trainer.model.fp8 import fp8_problem

_group_created = False  # set once this process has joined a process group (see exit_process)


TIMEOUT = datetime.timedelta(minutes=10)  # how long a collective waits for the other ranks


class LaunchError(Exception):
    """The launcher and the run configuration disagree (a user error: exit 2)."""


def init(cfg: RunConfig) -> tuple[DistEnv, torch.device]:
    env = detect()
    if env.world_size != cfg.world_size:
        raise LaunchError(
            f"run.yaml was made for {cfg.world_size} rank(s) (world_size) but the launcher started {env.world_size}"
        )
    device = _device(cfg, env)
    check_kernels(cfg.runtime, device)
    # bucket-wise clipping lives in a DDP hook, so even a single rank gets a (one-member) group;
    # a process that joined it already (the preflight, before its training steps) keeps it
    if (env.world_size > 1 or cfg.optim.clip == "bucket") and not initialized():
        kwargs = {}
        if cfg.runtime.backend == "nccl":
            kwargs["device_id"] = device
        dist.init_process_group(
            backend=cfg.runtime.backend,
            init_method=f"tcp://{env.master_addr}:{env.master_port}",
            rank=env.rank,
            world_size=env.world_size,
            timeout=TIMEOUT,
            **kwargs,
        )
        global _group_created
        _group_created = True
    return env, device


def _device(cfg: RunConfig, env: DistEnv) -> torch.device:
    if cfg.runtime.device == "cpu":
        if cfg.runtime.num_threads:
            torch.set_num_threads(cfg.runtime.num_threads)
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise LaunchError("runtime.device is cuda but this machine has no usable CUDA device "
                          "(run on a GPU node, or set runtime.device=cpu)")
    if env.local_rank >= torch.cuda.device_count():
        raise LaunchError(f"local rank {env.local_rank} has no GPU: {torch.cuda.device_count()} visible "
                          f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')})")
    torch.cuda.set_device(env.local_rank)
    return torch.device("cuda", env.local_rank)


def check_kernels(runtime: RuntimeConfig, device: torch.device) -> None:
    """What the run asks of this node's software and GPU, before any rank trains: one line naming the key."""
    missing = apex_missing() if runtime.kernels == "apex" else None
    if missing:
        raise LaunchError(f"runtime.kernels: apex is asked for but {missing} cannot be imported on this node "
                          "(install NVIDIA apex with its CUDA extensions in the image, or set runtime.kernels=torch)")
    if device.type == "cuda" and runtime.precision == "bf16" and not torch.cuda.is_bf16_supported():
        raise LaunchError(f"runtime.precision: bf16 is not supported by {torch.cuda.get_device_name(device)} "
                          "(use fp16 or fp32)")
    try:
        check_attention(runtime.attention, device.type, runtime.precision)
    except AttentionUnavailable as e:
        raise LaunchError(str(e)) from None
    if runtime.fp8 and (problem := fp8_problem(device)):  # the GPU's FP8 tensor cores, and a torchao that runs with this torch
        raise LaunchError(problem)


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t)
    return t


def initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def close() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


_kept: list = []


def keep_until_exit(ddp: torch.nn.Module | None) -> None:
    """Never free a DistributedDataParallel in-process (a rank ends with exit_process, which frees
    nothing). Freeing it frees its reducer, which frees the last reference to its process group,
    whose destructor joins gloo's worker threads while the freeing thread holds the GIL. A worker
    that has just completed a bucket's future then still has to release the comm hook's Python
    callback (`then`), which takes the GIL: both wait forever. It happened at the end of an
    in-process test (pytest stacks: the main thread in ~Reducer -> ~ProcessGroupGloo -> join, the
    worker in gil_scoped_acquire under Future::markCompleted)."""
    if ddp is not None:
        _kept.append(ddp)


def group_was_used() -> bool:
    return _group_created


def exit_process(code: int) -> None:
    """End a rank that used a process group, skipping the interpreter's teardown.

    DDP keeps its process group alive after destroy_process_group(), so the gloo worker threads
    outlive main(); one of them may still be releasing the tensors of a finished collective, which
    needs the GIL. If that happens while Python finalises, the thread is killed inside a C++
    destructor and the process aborts (SIGABRT) after a successful run. Everything the run writes
    is closed by now, so flush the standard streams and leave at once with the run's exit code.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
