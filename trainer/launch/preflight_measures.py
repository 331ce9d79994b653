"""The preflight's measures on one rank: each returns a `Figure` (a rate: higher is better) or raises.

- `matmul_rate`: dense matmul at the model's GEMM shapes (bf16 on a GPU, fp32 on a CPU), TFLOP/s.
- `copy_bandwidth`: device memory copy, GB/s (read + write), GPU only.
- `read_bandwidth`: this rank's share of the training shards, read cold from the mount, MB/s.
- `allreduce_busbw`: all-reduce bus bandwidth in a group, GB/s, nccl-tests' definition:
  algbw = bytes / time, busbw = algbw x 2(n-1)/n (what each rank's link carries in a ring).
- `train_steps`: real steps of the recipe (trainer/loop/train.py's Trainer), samples/s per rank, and the
  same steps' compute alone (forward and backward without DDP's allreduce), which pins a slow rank
  where the synchronous step time cannot (every rank waits for the slowest).

Timing: a figure is the best of `windows` windows, each at least `window_s` long. Best-of keeps other
load on a shared machine out; windows of many scheduler periods keep a throttled rank (a CPU quota,
low clocks) from hiding in a short burst.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

DDP_BUCKET_BYTES = 25 * 2**20  # DistributedDataParallel's default bucket_cap_mb
READ_CHUNK = 4 * 2**20


@dataclass(frozen=True)
class Timing:
    window_s: float = 1.0
    windows: int = 3


@dataclass
class Figure:
    value: float
    unit: str
    detail: dict = field(default_factory=dict)

    def as_json(self) -> dict:
        return {"value": self.value, "unit": self.unit, **self.detail}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def together() -> None:
    """Every rank starts the window at once (when there is a group), so that no rank's figure comes from
    a moment when the others had stopped and left it the machine or the network."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def in_windows(timing: Timing, window) -> list:
    """`window()` once per window, each after a barrier of all ranks. A rank whose measure fails still
    joins every barrier (then raises), so the others are not left waiting for it."""
    results, error = [], None
    for _ in range(timing.windows):
        together()
        if error is None:
            try:
                results.append(window())
            except Exception as e:  # raised below, after the last barrier
                error = e
    if error is not None:
        raise error
    return results


def sit_out(timing: Timing) -> None:
    in_windows(timing, lambda: None)


def best_rate(work, amount: float, device: torch.device, timing: Timing) -> tuple[float, int]:
    """The best of `timing.windows` windows of `amount / seconds`, where `work()` does `amount` once;
    each window repeats it until `window_s` has passed. Returns the rate and the repeats per window."""
    first = True

    def window() -> tuple[float, int]:
        nonlocal first
        if first:  # warm-up: allocator, kernels, first-touch pages (in the window: a failure joins the barriers)
            work()
            synchronize(device)
            first = False
        start, n = time.perf_counter(), 0
        while True:
            work()
            n += 1
            synchronize(device)
            elapsed = time.perf_counter() - start
            if elapsed >= timing.window_s:
                return amount * n / elapsed, n

    return max(in_windows(timing, window))


def gemm_shapes(model, tokens: int) -> list[tuple[int, int, int]]:
    """(m, k, n) of the encoder layer's GEMMs for `tokens` rows: QKV, attention output, FFN in and out."""
    h, i = model.hidden_size, model.intermediate_size
    return [(tokens, h, 3 * h), (tokens, h, h), (tokens, h, i), (tokens, i, h)]


def matmul_rate(cfg, device: torch.device, timing: Timing) -> Figure:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    tokens = cfg.train.batch_size * cfg.data.max_seq_length
    operands = [(torch.randn(m, k, device=device, dtype=dtype), torch.randn(k, n, device=device, dtype=dtype),
                 torch.empty(m, n, device=device, dtype=dtype)) for m, k, n in gemm_shapes(cfg.model, tokens)]
    flops = sum(2 * a.shape[0] * a.shape[1] * b.shape[1] for a, b, _ in operands)

    def work():
        for a, b, out in operands:
            torch.matmul(a, b, out=out)

    rate, repeats = best_rate(work, flops, device, timing)
    return Figure(rate / 1e12, "TFLOP/s", {"dtype": str(dtype).removeprefix("torch."), "tokens": tokens,
                                           "repeats": repeats})


def copy_bandwidth(device: torch.device, timing: Timing, megabytes: int = 256) -> Figure:
    source = torch.empty(megabytes * 2**20, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    rate, repeats = best_rate(lambda: target.copy_(source), 2 * source.numel(), device, timing)
    return Figure(rate / 1e9, "GB/s", {"bytes": source.numel(), "repeats": repeats})


class StorageError(Exception):
    """This rank cannot read its shards (a mount missing on its node, a folder without shards)."""


def my_shards(cfg, rank: int, world_size: int, seed: int) -> list[Path]:
    from trainer.config import PathError, expand_path
    from trainer.data.dataset import DataError, files_by_rank

    # expanded as the trainer expands it on this node ($BERTCTL_HOME, ~): the literal text is no folder
    try:
        folder = expand_path(cfg.data.train_dir)
    except PathError as e:
        raise StorageError(f"data.train_dir: {e}") from None
    if not os.path.isdir(folder):
        shown = cfg.data.train_dir if folder == cfg.data.train_dir else f"{cfg.data.train_dir} (here {folder})"
        raise StorageError(f"data.train_dir {shown}: not visible on this node (is the mount there?)")
    try:
        return files_by_rank(cfg.data, cfg.balance, world_size, seed)[rank]
    except (DataError, OSError) as e:
        raise StorageError(str(e)) from None


def read_bandwidth(files: list[Path], timing: Timing) -> Figure:
    """Read the files in turn as the first epoch would, from the mount and not from this node's page
    cache (each file's cached pages are dropped before it is read: POSIX_FADV_DONTNEED), in windows
    like the other figures; a window reads at least one whole file."""
    turn = 0

    def window() -> float:
        nonlocal turn
        if not files:
            raise StorageError("this rank has no shards to read")
        done, start = 0, time.perf_counter()
        while True:
            done += read_cold(files[turn % len(files)])
            turn += 1
            elapsed = time.perf_counter() - start
            if elapsed >= timing.window_s:
                return done / elapsed

    best = max(in_windows(timing, window))
    if not best:
        raise StorageError("this rank's shards are empty")
    return Figure(best / 1e6, "MB/s", {"files": min(turn, len(files)), "reads": turn})


def read_cold(path: Path) -> int:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        done = 0
        while chunk := os.read(fd, READ_CHUNK):
            done += len(chunk)
        return done
    finally:
        os.close(fd)


def allreduce_bytes(cfg) -> int:
    """DDP's bucket: its default cap, or the whole gradient when the model is smaller (fp32 gradients)."""
    from trainer.model.bert import BertForPreTraining

    with torch.device("meta"):
        params = sum(p.numel() for p in BertForPreTraining(cfg.model).parameters())
    return min(DDP_BUCKET_BYTES, 4 * params)


def allreduce_busbw(group, size_bytes: int, device: torch.device, timing: Timing) -> Figure | None:
    """All-reduce busbw in `group` (None: this rank sits this measure out). Every rank of the job calls
    it, at the same point: the groups of one measure (every node's, every pair's) run their windows at
    the same time, each window after a barrier of all ranks, with one repeat count for all, so no
    group gets the machine or the network to itself while the others are done."""
    tensor = torch.ones(size_bytes // 4, dtype=torch.float32, device=device) if group is not None else None
    seconds = math.inf
    if group is not None:
        dist.all_reduce(tensor, group=group)  # warm-up: connections, buffers
        synchronize(device)
        start = time.perf_counter()
        dist.all_reduce(tensor, group=group)
        synchronize(device)
        seconds = time.perf_counter() - start
    estimate = torch.tensor([math.ceil(timing.window_s / max(seconds, 1e-6)) if group is not None else 1], device=device)
    dist.all_reduce(estimate, op=dist.ReduceOp.MAX)
    repeats = int(min(estimate.item(), 1000))
    best = math.inf
    for _ in range(timing.windows):
        dist.barrier()
        if group is None:
            continue
        start = time.perf_counter()
        for _ in range(repeats):
            dist.all_reduce(tensor, group=group)
        synchronize(device)
        best = min(best, (time.perf_counter() - start) / repeats)
    if group is None:
        return None
    n = dist.get_world_size(group)
    algbw = size_bytes / best
    return Figure(algbw * 2 * (n - 1) / n / 1e9, "GB/s",
                  {"ranks": n, "bytes": size_bytes, "seconds": best, "algbw": algbw / 1e9, "repeats": repeats})


def pair_rounds(nodes: int) -> list[list[tuple[int, int]]]:
    """Node pairs in rounds: (0,1), (2,3), ... then re-paired (1,2), (3,4), ..., so a slow node is slow
    in every round and each of its partners is fast in another. Every node meets two partners: with an
    even count the second round closes the ring with (last,0); with an odd count one node sits out
    each of the first two rounds (the last, then node 0), and a third round pairs the two of them.
    Two nodes: one round."""
    if nodes < 2:
        return []
    first = [(i, i + 1) for i in range(0, nodes - 1, 2)]
    if nodes == 2:
        return [first]
    if nodes % 2 == 0:
        return [first, [(i, (i + 1) % nodes) for i in range(1, nodes, 2)]]
    return [first, [(i, i + 1) for i in range(1, nodes - 1, 2)], [(nodes - 1, 0)]]


def train_steps(cfg, out: str, run_index: int, seed: int, steps: int, timing: Timing) -> tuple[Figure, Figure]:
    """Real steps of the recipe after the trainer's own warm-up: `steps` synchronous steps (samples/s of
    the best), and the compute of one step's batches alone, forward and backward under DDP's no_sync
    (no collective), timed in windows like the other figures; beside it the first step (data pipeline
    starting) and one whole evaluation, each timed once as the run pays them."""
    from trainer.loop.run_args import RunArgs
    from trainer.loop.train import Trainer

    # checkpoints in the preflight's own folder: never resume from, or write to, the run's; random weights
    # (a step costs the same, and the phase-1 checkpoint may not be built yet on a fresh machine)
    cfg = cfg.model_copy(update={"checkpoint": cfg.checkpoint.model_copy(update={"dir": None, "final_model": None}),
                                 "train": cfg.train.model_copy(update={"init_checkpoint": None})})
    trainer = Trainer(cfg, RunArgs(config="", out=out, run_index=run_index, seed=seed))
    device, per_step = trainer.device, cfg.train.batch_size * cfg.train.gradient_accumulation_steps
    try:
        trainer.warm_up()
        # the first step after the warm-up starts the data pipeline (workers, shards) and meets the kernels'
        # and the allocator's first calls: the run pays it once inside its timed region, the prediction's
        # start-up (what it costs beyond a steady step)
        started = time.perf_counter()
        first = trainer.next_micro_batches()
        first_batch_s = time.perf_counter() - started
        trainer.train_step(first)
        synchronize(device)
        first_step_s = time.perf_counter() - started
        step_s = []
        for _ in range(steps):
            batches = trainer.next_micro_batches()
            synchronize(device)
            start = time.perf_counter()
            trainer.train_step(batches)
            synchronize(device)
            step_s.append(time.perf_counter() - start)
        batches = trainer.next_micro_batches()

        def compute():
            for batch in batches:
                local = trainer.ddp.no_sync() if trainer.ddp else contextlib.nullcontext()
                trainer.forward_backward(batch, 1e-3, 1e-3, local)
            trainer.optimizer.zero_grad()

        rate, repeats = best_rate(compute, per_step, device, timing)
        eval_s = whole_eval_s(trainer, device)
    finally:
        trainer.close()
    step = min(step_s)
    return (Figure(per_step / step, "samples/s", {"step_s": step, "steps_s": step_s}),
            Figure(rate, "samples/s", {"compute_s": per_step / rate, "repeats": repeats, "first_batch_s": first_batch_s,
                                       "first_step_s": first_step_s} | ({"eval_s": eval_s} if eval_s is not None else {})))


def whole_eval_s(trainer, device: torch.device) -> float | None:
    """One evaluation as the run makes it (the trainer's own evaluator: this rank's share of the eval set,
    the accuracy summed over ranks); None when the recipe has no eval set."""
    if trainer.evaluator is None:
        return None
    synchronize(device)
    started = time.perf_counter()
    trainer.evaluator.accuracy(trainer.model, trainer.autocast)
    synchronize(device)
    return time.perf_counter() - started
