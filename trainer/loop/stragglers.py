"""Which rank holds the others back, at the progress cadence.

A synchronous step runs at the pace of its slowest rank: the others wait for it in the gradient
allreduce, so their step times are all the same and say nothing. What differs is the compute: each
rank times its forward passes (CUDA events on a GPU, queued with the work and read only when the
progress line is due, so no step waits for the device; the wall clock on a CPU). A rank's compute
is taken as 3x its forward time (the backward costs about twice the forward: the usual estimate,
not measured), and its wait as the rest of the window (allreduce, exchange, data). Rank 0 gathers
every rank's two figures in one all-gather per progress line; the record names the rank and node
with the most compute when it exceeds the median by more than `THRESHOLD`.
"""

from __future__ import annotations

import contextlib
import statistics
import time

import torch
import torch.distributed as dist

BACKWARD_OVER_FORWARD = 2.0  # backward ~ 2x forward FLOPs: compute ~ 3x the timed forward
THRESHOLD = 0.10  # a rank is named when its compute exceeds the median by more than this


class ComputeClock:
    """Forward time of this rank since the last progress line."""

    def __init__(self, device: torch.device, node: str, world_size: int):
        self.device, self.cuda = device, device.type == "cuda"
        self.pending: list[tuple] = []  # (start, end) CUDA events, read at the next report
        self.seconds = 0.0
        self.nodes = [node] * world_size
        if world_size > 1 and dist.is_available() and dist.is_initialized():
            dist.all_gather_object(self.nodes, node)  # once: which node each rank is on

    @contextlib.contextmanager
    def forward(self):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self.pending.append((start, end))
        else:
            began = time.perf_counter()
            yield
            self.seconds += time.perf_counter() - began

    def take(self) -> float:
        """Forward seconds since the last call (the device has finished the window's work by now)."""
        seconds = self.seconds + sum(s.elapsed_time(e) for s, e in self.pending) / 1000
        self.pending, self.seconds = [], 0.0
        return seconds

    def report(self, window_s: float) -> dict:
        """Every rank's compute and wait over the window, and the straggler if there is one (all ranks
        call this at the same point: it is one all-gather)."""
        compute = (1 + BACKWARD_OVER_FORWARD) * self.take()
        mine = torch.tensor([compute, max(window_s - compute, 0.0)], dtype=torch.float64, device=self.device)
        if len(self.nodes) > 1:
            everyone = [torch.zeros_like(mine) for _ in self.nodes]
            dist.all_gather(everyone, mine)
            rows = torch.stack(everyone).tolist()
        else:
            rows = [mine.tolist()]
        record = {"rank_compute_s": [round(c, 6) for c, _ in rows], "rank_wait_s": [round(w, 6) for _, w in rows]}
        named = straggler(record["rank_compute_s"], self.nodes)
        if named:
            record["straggler"] = named
        return record


def straggler(compute: list[float], nodes: list[str], threshold: float = THRESHOLD) -> dict | None:
    """The rank with the most compute, when it exceeds the median by more than `threshold`."""
    if len(compute) < 2:
        return None
    median = statistics.median(compute)
    rank = max(range(len(compute)), key=compute.__getitem__)
    if median <= 0 or compute[rank] <= median * (1 + threshold):
        return None
    return {"rank": rank, "node": nodes[rank], "compute_s": compute[rank], "median_s": median,
            "over_median": compute[rank] / median - 1}


def describe(named: dict) -> str:
    return (f"straggler: rank {named['rank']} on {named['node']}: compute {named['compute_s']:.3f} s, "
            f"{100 * named['over_median']:.0f} % over the median {named['median_s']:.3f} s")
