"""Attention with dropout on the CPU: each sequence on one core, the sequences spread over the cores.

With dropout, CPU SDPA leaves its fused kernel for op-by-op maths, and every op of one sequence is
small (heads x L x L). Split over the cores, each op ends in a barrier: at 2 threads a 300-token
sequence's GEMMs run 1.3x faster than on one, its softmax 1.4x and its dropout multiply not at all,
and when another process holds a core every barrier waits for it. Here a pool of single-threaded
workers takes the sequences, longest first, forward and backward (each sequence keeps its own small
autograd graph, whose backward its worker runs): no barrier inside a sequence, and a core that
falls behind just takes fewer sequences. With one intra-op thread the same code runs inline.

Masks: one seed per call from torch's generator (so torch.manual_seed and a checkpoint's RNG state
repeat them); sequence i's mask comes from the stream (seed, i), so the masks and therefore the
results do not depend on the thread count or on which worker took which sequence.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

import torch
from torch.autograd.function import once_differentiable

from trainer.dropout import draw_seed, dropout_noise

_pool: tuple[int, ThreadPoolExecutor] | None = None  # (workers, pool)
_pool_lock = threading.Lock()


def dropout_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: Sequence[int], dropout_p: float) -> torch.Tensor:
    """q, k, v: [T, heads, D] holding sequences of `lengths`; per sequence softmax(q k^T / sqrt(D)),
    dropped, times v: [T, heads, D]."""
    lengths, seed = tuple(lengths), draw_seed()
    if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
        return _SequenceParallelAttention.apply(q, k, v, lengths, dropout_p, seed)
    return torch.cat(_run(_attend, _sequences(q, k, v, lengths, dropout_p, seed), lengths))


def _sequences(q, k, v, lengths, dropout_p, seed) -> list[tuple]:
    return [(qs, ks, vs, dropout_p, (seed, i)) for i, (qs, ks, vs) in enumerate(zip(q.split(lengths), k.split(lengths), v.split(lengths)))]


def _attend(q, k, v, dropout_p: float, stream: tuple[int, int]) -> torch.Tensor:
    """One sequence: q, k, v [L, heads, D]; its mask from the random stream `stream`."""
    qh, kh, vh = (x.transpose(0, 1) for x in (q, k, v))  # [heads, L, D]
    weights = torch.softmax(torch.bmm(qh * qh.shape[-1] ** -0.5, kh.transpose(1, 2)), dim=-1)
    kept = dropout_noise(weights.numel(), dropout_p, weights.dtype, seed=stream).view(weights.shape)
    return torch.bmm(weights * kept, vh).transpose(0, 1)


def _attend_on_own_leaves(q, k, v, dropout_p, stream):
    """_attend recorded from leaves of its own, so that the sequence's backward can run alone, on a worker."""
    with torch.enable_grad():
        leaves = tuple(x.detach().requires_grad_() for x in (q, k, v))
        return leaves, _attend(*leaves, dropout_p, stream)


def _backward_one(leaves, out, grad_out):
    return torch.autograd.grad(out, leaves, grad_out)


class _SequenceParallelAttention(torch.autograd.Function):
    """The sequences' graphs (and their outputs, one more [T, heads, D] per layer) live until backward."""

    @staticmethod
    def forward(ctx, q, k, v, lengths, dropout_p, seed):
        ctx.graphs = _run(_attend_on_own_leaves, _sequences(q, k, v, lengths, dropout_p, seed), lengths)
        ctx.lengths = lengths
        return torch.cat([out.detach() for _, out in ctx.graphs])

    @staticmethod
    @once_differentiable  # the workers' backward records no graph: no second-order gradients
    def backward(ctx, grad_out):
        if not hasattr(ctx, "graphs"):
            raise RuntimeError("Trying to backward through the CPU dropout attention a second time: its graphs are freed after the first")
        graphs, lengths = ctx.graphs, ctx.lengths
        del ctx.graphs  # single-use, like autograd's own buffers
        grads = _run(_backward_one, [(leaves, out, g) for (leaves, out), g in zip(graphs, grad_out.split(lengths))], lengths)
        return (*(torch.cat(per_input) for per_input in zip(*grads)), None, None, None)


def _run(fn: Callable, items: list[tuple], sizes: Sequence[int]) -> list:
    """fn(*item) for every item, on the workers, longest first; results in the items' order."""
    workers = _workers()
    if workers is None:
        return [fn(*item) for item in items]
    mode = torch.is_grad_enabled(), torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")
    order = sorted(range(len(items)), key=lambda i: -sizes[i])
    futures = {i: workers.submit(_in_callers_mode, mode, fn, items[i]) for i in order}
    return [futures[i].result() for i in range(len(items))]


def _in_callers_mode(mode: tuple[bool, bool, torch.dtype], fn: Callable, item: tuple):
    """Grad mode and autocast are per thread: a worker takes the caller's (bf16 training on the CPU).
    Autocast is set, not entered: leaving a torch.autocast block clears the process-wide cache of
    cast weights, which the caller's forward is still using. (Other thread-local modes, such as
    saved-tensor hooks or dispatch modes, do not reach the workers; nothing here uses them.)"""
    grad, autocast, dtype = mode
    torch.set_autocast_enabled("cpu", autocast)
    torch.set_autocast_dtype("cpu", dtype)
    with torch.set_grad_enabled(grad):
        return fn(*item)


def _workers() -> ThreadPoolExecutor | None:
    """A pool of torch.get_num_threads() single-threaded workers (None for one thread), made anew
    when the thread count changes. One pool per process: callers on several threads with different
    thread counts would replace it under each other (bertctl calls attention from one thread)."""
    global _pool
    threads = torch.get_num_threads()
    if threads == 1:
        return None
    with _pool_lock:
        if _pool is None or _pool[0] != threads:
            if _pool is not None:
                _pool[1].shutdown(wait=False)
            _pool = threads, _single_threaded_pool(threads)
        return _pool[1]


def _forget_the_parents_pool() -> None:
    """A forked child has the pool object but not its threads (and maybe a lock held by one)."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_the_parents_pool)


def _single_threaded_pool(threads: int) -> ThreadPoolExecutor:
    """Every worker is started now, and the caller's thread count set again afterwards: a worker's
    torch.set_num_threads(1) also changes the default that threads started later take."""
    started = threading.Barrier(threads + 1)
    pool = ThreadPoolExecutor(threads, thread_name_prefix="cpu-attention", initializer=_one_thread)
    for _ in range(threads):
        pool.submit(started.wait, timeout=60)
    started.wait(timeout=60)  # a worker that cannot start breaks the barrier instead of hanging the step
    torch.set_num_threads(threads)
    return pool


def _one_thread() -> None:
    # A thread takes the process default on its first parallel op (lazily), which would undo a
    # count set before it: so that first, then this thread's own OpenMP and MKL count.
    torch.get_num_threads()
    torch.set_num_threads(1)
