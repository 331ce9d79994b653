"""`bertctl preflight` on a local Slurm cluster of many nodes, one of them throttled for real; timed.

    python benchmarks/preflight_rehearsal.py --nodes 8                 # pairwise rounds on 8 nodes
    python benchmarks/preflight_rehearsal.py --nodes 32 --repeats 1     # the largest that fits here

Starts a cluster of N slurmd on this host (`.ci/slurm.sh`), writes one synthetic shard per rank,
and runs the CI cluster's recipe (`ci_slurm`: a 2-layer BERT at length 128, gloo; no exchange padding: its
groups of 2 must stay inside a node) through
`bertctl preflight` at N nodes x R ranks, with small measurement sizes (the environment below: 0.3 s
windows, 3 of them, 2 training steps). In each repeat one node's ranks are moved into a cgroup CPU
quota as they start (tests/throttle.py): a fifth of the CPU a rank gets when every rank shares the
host's cores, so the node is about 5x slower than the others on every measure it computes. Every
repeat must flag exactly that node, and its pairwise all-reduce (judged by each node's best round)
must flag it and none of its partners: that is what the re-pairing is for. With `--throttle none`
no node may be flagged.

Each rank is a full torch process: about 140 MB of private memory and 1.5-2.5 s of CPU to import
torch alone on this machine, so 1,024 ranks (~145 GB) cannot run on a 24 GiB host; this is the
wiring and the judgement at the largest scale the host holds, not a 1,024-rank measurement.

Needs root (slurm.sh, cgroups). The last line per repeat:

    preflight-rehearsal: nodes=N ranks=R throttled=NODE flagged=[...] pair_flagged=[...] ok=BOOL wall_s=S
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the synthetic shards and the cgroup throttle of the tests

SMALL = {"BERTCTL_PREFLIGHT_WINDOW": "0.3", "BERTCTL_PREFLIGHT_WINDOWS": "3", "BERTCTL_PREFLIGHT_STEPS": "2"}
PAIR_LABEL = "all-reduce busbw, node pairs (best round)"


def sh(*args: str) -> None:
    subprocess.run(list(args), check=True, text=True)


def overrides(shards: Path, nodes: int, per_node: int) -> list[str]:
    """ci_slurm's recipe on the synthetic shards (tests/synthetic.py), at this scale."""
    from synthetic import ci_slurm_on_shards

    items = [f"resources.nodes={nodes}", f"resources.tasks_per_node={per_node}", "resources.cpus_per_task=1",
             f"run.train.global_batch_size={4 * nodes * per_node}", "slurm.time_limit=00:20:00",
             "run.balance.exchange_padding=none"]  # its groups of 2 must stay inside a node
    return ci_slurm_on_shards(shards) + [w for item in items for w in ("-o", item)]


def cpu_share(nodes: int) -> float:
    """The throttled node's ranks together get a fifth of one node's fair share of the host's CPUs."""
    return max(0.01, 0.2 * (os.cpu_count() or 1) / nodes)


def one_preflight(args, shards: Path, home: Path, node: str | None) -> dict:
    """One preflight with `node` throttled (None: no throttle, and then no node may be flagged)."""
    from throttle import Throttle

    env = {**os.environ, **SMALL, "BERTCTL_PREFLIGHT_WINDOW": str(args.window), "BERTCTL_HOME": str(home),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    started = time.perf_counter()
    with Throttle(node or "none", cpu_share=cpu_share(args.nodes)) as throttle:
        env["BERTCTL_TEST_TAG"] = throttle.tag
        done = subprocess.run([sys.executable, "-m", "orchestrator", "preflight", "--cluster", "ci_slurm",
                               *overrides(shards, args.nodes, args.ranks_per_node), "--threshold", str(args.threshold),
                               "--json"], capture_output=True, text=True, env=env, cwd=REPO, timeout=args.timeout)
    wall = time.perf_counter() - started
    if done.returncode not in (0, 1) or not done.stdout:
        raise SystemExit(f"preflight-rehearsal: bertctl preflight exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    verdict = json.loads(done.stdout)
    pair_flagged = [n["node"] for n in verdict["nodes"] if any(r.startswith(PAIR_LABEL) for r in n["reasons"])]
    for n in verdict["nodes"]:
        if n["flagged"]:
            print(f"  {n['node']}: " + "; ".join(n["reasons"]))
    expected = [node] if node else []
    ok = verdict["flagged"] == pair_flagged == expected and bool(throttle.moved["cpu"]) == bool(node)
    print(f"preflight-rehearsal: nodes={args.nodes} ranks={args.nodes * args.ranks_per_node} throttled={node} "
          f"flagged={verdict['flagged']} pair_flagged={pair_flagged} ok={ok} wall_s={wall:.1f}", flush=True)
    return {"wall_s": wall, "ok": ok, "flagged": verdict["flagged"], "pair_flagged": pair_flagged}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--ranks-per-node", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threshold", type=float, default=50.0)
    parser.add_argument("--window", type=float, default=0.3, help="seconds per measurement window")
    parser.add_argument("--throttle", default=None, help="the node to slow down (default: a middle one; none: no throttle)")
    parser.add_argument("--timeout", type=float, default=1200)
    parser.add_argument("--keep-cluster", action="store_true")
    args = parser.parse_args()
    import torch
    from synthetic import write_dataset

    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs; python {platform.python_version()}, "
          f"torch {torch.__version__}; {SMALL | {'BERTCTL_PREFLIGHT_WINDOW': str(args.window)}}")
    node = None if args.throttle == "none" else args.throttle or f"node{args.nodes // 2 + 1}"
    t0 = time.perf_counter()
    sh("bash", str(REPO / ".ci/slurm.sh"), "start", "--nodes", str(args.nodes),
       "--cpus-per-node", str(max(2, args.ranks_per_node)))
    print(f"cluster: {args.nodes} nodes up in {time.perf_counter() - t0:.1f} s; throttled node {node} "
          f"at {cpu_share(args.nodes):.3f} CPU")
    try:
        with tempfile.TemporaryDirectory(prefix="bertctl-preflight-") as tmp:
            shards = write_dataset(Path(tmp) / "train", shards=args.nodes * args.ranks_per_node, per_shard=4000,
                                   seed=1, vocab=64, max_len=128, max_pred=20)
            os.sync()
            results = [one_preflight(args, shards, Path(tmp) / f"home{i}", node) for i in range(args.repeats)]
    finally:
        if not args.keep_cluster:
            sh("bash", str(REPO / ".ci/slurm.sh"), "stop")
    print(f"summary: {sum(r['ok'] for r in results)}/{len(results)} repeats flagged exactly {[node] if node else []}; "
          f"wall_s {[round(r['wall_s'], 1) for r in results]}")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
