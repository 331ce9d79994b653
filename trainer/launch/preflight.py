"""`python -m trainer.launch.preflight`: one rank's part of `bertctl preflight` (orchestrator/checks/preflight.py).

Started like a training rank (same script, container, binding and environment: the render path's
`preflight` program), it measures, in this order (trainer/launch/preflight_measures.py):
  1. alone: matmul rate at the model's GEMM shapes; on a GPU the memory copy bandwidth; the read
     bandwidth of this rank's share of the training shards;
  2. with the others: all-reduce busbw at DDP's bucket size within this node, across all ranks, and
     between node pairs in rounds;
  3. real training steps of the recipe (skipped on every rank when some rank cannot read its shards).
After each measure the rank rewrites preflight/rank_R.json in the experiment: a node that dies
mid-check leaves what it had measured, and the judge names what is missing. A measure that fails
is recorded with its error and the rank goes on; after a failed collective it skips the others
(the group is broken).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import traceback

from trainer.launch.dist_env import detect

MARKER = "BERTCTL_PREFLIGHT "


class Report:
    """This rank's figures, written whole after every measure (atomically: the judge may read it early)."""

    def __init__(self, out: str | None, identity: dict):
        self.path = os.path.join(out, "preflight", f"rank_{identity['rank']}.json") if out else None
        self.data = {**identity, "measures": {}, "errors": {}, "done": False}

    def record(self, name: str, work) -> object | None:
        try:
            figure = work()
        except Exception as e:  # recorded and judged: a measure that fails flags its node
            self.data["errors"][name] = f"{type(e).__name__}: {e}".splitlines()[0]
            if not isinstance(e, (OSError, ValueError)):
                traceback.print_exc(file=sys.stderr)
            self.write()
            return None
        if figure is not None:
            self.data["measures"][name] = figure.as_json()
            self.write()
        return figure

    def skip(self, name: str, why: str) -> None:
        self.data.setdefault("skipped", {})[name] = why

    def write(self) -> None:
        if self.path is None:
            return
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        temporary = f"{self.path}.tmp"
        with open(temporary, "w") as f:
            json.dump(self.data, f, sort_keys=True)
        os.replace(temporary, self.path)


def run(args: argparse.Namespace) -> dict:
    import torch.distributed as dist

    from trainer.config import load_run_config
    from trainer.launch import preflight_measures as m
    from trainer.parallel import distributed

    cfg = load_run_config(args.config)
    me = detect()
    seed = cfg.train.seed + args.run_index if args.seed is None else args.seed
    report = Report(args.out, {"rank": me.rank, "node": me.node or socket.gethostname(), "local_rank": me.local_rank,
                               "world_size": me.world_size})
    timing = m.Timing(args.window, args.windows)
    env, device = distributed.init(cfg)
    report.data["device"] = str(device)
    report.write()

    report.record("matmul", lambda: m.matmul_rate(cfg, device, timing))
    if device.type == "cuda":
        report.record("memcpy", lambda: m.copy_bandwidth(device, timing))
    report.record("storage", lambda: storage(cfg, me, seed, timing))
    if not distributed.initialized():  # one rank: nothing to reduce with; the steps still run
        report.skip("allreduce_world", "one rank: nothing to reduce with")
        return train(report, "storage" in report.data["measures"], lambda: steps(cfg, args, seed, report))

    nodes = [None] * me.world_size
    dist.all_gather_object(nodes, report.data["node"])
    readable = agree(dist, device, "storage" in report.data["measures"])
    size = m.allreduce_bytes(cfg)
    names = sorted(set(nodes), key=nodes.index)  # in rank order: block distribution puts node k's ranks k-th
    mine = [r for r, n in enumerate(nodes) if n == report.data["node"]]
    groups_ok = True

    def collective(name: str, ranks: list[int] | None) -> None:
        """Every rank calls this for every measure, in the same order; `ranks`: this rank's group, or
        None to sit out (a node without a pair in this round)."""
        nonlocal groups_ok
        if not groups_ok:
            report.skip(name, "an earlier collective failed")
            return
        group = None
        if ranks is not None:
            group = dist.new_group(ranks, use_local_synchronization=True) if len(ranks) < me.world_size else dist.group.WORLD
        if report.record(name, lambda: m.allreduce_busbw(group, size, device, timing)) is None and name in report.data["errors"]:
            groups_ok = False

    if max(nodes.count(n) for n in names) > 1:
        collective("allreduce_node", mine if len(mine) > 1 else None)
    collective("allreduce_world", list(range(me.world_size)))
    for i, pairs in enumerate(m.pair_rounds(len(names))):
        pair = next(((a, b) for a, b in pairs if report.data["node"] in (names[a], names[b])), None)
        if pair is not None:
            members = {names[pair[0]], names[pair[1]]}
            report.data.setdefault("partners", {})[f"allreduce_pair_{i}"] = (members - {report.data["node"]}).pop()
        collective(f"allreduce_pair_{i}", [r for r, n in enumerate(nodes) if n in members] if pair else None)
    return train(report, readable, lambda: steps(cfg, args, seed, report))


def storage(cfg, me, seed: int, timing):
    from trainer.launch import preflight_measures as m

    try:
        files = m.my_shards(cfg, me.rank, me.world_size, seed)
    except m.StorageError:
        m.sit_out(timing)  # the other ranks' windows wait for every rank
        raise
    return m.read_bandwidth(files, timing)


def train(report: Report, readable: bool, work) -> dict:
    if readable:
        report.record("train_step", work)
    else:
        report.skip("train_step", "a rank could not read its shards")
    return finish(report)


def agree(dist, device, ok: bool) -> bool:
    """True on every rank when it holds on every rank."""
    import torch

    flag = torch.tensor([1 if ok else 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def steps(cfg, args: argparse.Namespace, seed: int, report: Report):
    from trainer.launch import preflight_measures as m

    step, compute = m.train_steps(cfg, os.path.join(args.out or ".", "preflight", "trainer"), args.run_index, seed,
                                  args.steps, m.Timing(args.window, args.windows))
    report.data["measures"]["train_compute"] = compute.as_json()
    return step


def finish(report: Report) -> dict:
    report.data["done"] = True
    report.write()
    short = {k: report.data[k] for k in ("rank", "node")} | {
        name: round(v["value"], 4) for name, v in report.data["measures"].items()} | {"errors": report.data["errors"]}
    # one write of the whole line: the ranks share one stdout (torchrun's children), and print's separate
    # write of the newline let two ranks' lines run together on an unbuffered stream
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), (MARKER + json.dumps(short, sort_keys=True) + "\n").encode())
    return report.data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.launch.preflight")
    parser.add_argument("--config", required=True, help="run.yaml: the recipe whose shapes, shards and steps are measured")
    parser.add_argument("--out", help="the experiment folder: figures go to preflight/rank_R.json there")
    parser.add_argument("--run-index", type=int, default=int(os.environ.get("BERTCTL_RUN_INDEX", "0")))
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--window", type=float, default=float(os.environ.get("BERTCTL_PREFLIGHT_WINDOW", "1.0")),
                        help="seconds per timing window (each figure is the best of --windows windows)")
    parser.add_argument("--windows", type=int, default=int(os.environ.get("BERTCTL_PREFLIGHT_WINDOWS", "3")))
    parser.add_argument("--steps", type=int, default=int(os.environ.get("BERTCTL_PREFLIGHT_STEPS", "10")),
                        help="training steps timed (after the trainer's warm-up and its first step): the best "
                             "compares nodes, the mean predicts the run")
    args = parser.parse_args(argv)
    from trainer.parallel import distributed

    run(args)
    distributed.exit_process(0)  # a rank that used a process group leaves without the interpreter's teardown
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
