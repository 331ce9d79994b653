"""Rehearse a big cluster's launch on this machine and time it.

    python benchmarks/rehearsal.py --cluster samsung_dgxa100               # 128 nodes x 8 = 1,024 ranks
    python benchmarks/rehearsal.py --cluster nvidia_dgxa100_128x8 --nodes 16 --keep-cluster

Starts a local Slurm cluster of that many nodes with 8 fake GPUs each (`.ci/slurm.sh`, with the pyxis
and enroot stand-ins), writes what the job's mounts point at (a dataset of empty shards in the
cluster's layout, an eval folder, a phase-1 folder) and a copy of a DGX A100's /sys and /proc tree for
the binding plans, submits the shipped cluster file's script unmodified but for `-o` overrides that
put partition, time and paths on this host (`bertctl submit --probe`), waits, checks every rank's
report (`bertctl rehearsal`) and stops the cluster. The last line:

    rehearsal: cluster=NAME nodes=N ranks=R verified=V wall_s=S      (S: submit to verdict)

Needs root (slurm.sh). Runs as CI's 16-node rehearsal too (.ci/run).
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
sys.path.insert(0, str(REPO / "tests"))  # the DGX A100 tree the binding tests use (tests/fake_node.py)

SHARDS = {"samsung_dgxa100": {"bins": 2048}, "nvidia_dgxa100_128x8": {"flat": 4320}}


def sh(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), check=True, text=True, **kw)


def bertctl(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], capture_output=True, text=True, env=env, cwd=REPO)


def write_dataset(root: Path, layout: dict) -> None:
    """Empty shard files in the cluster's layout: the probe lists them, it never opens them."""
    if "bins" in layout:
        for edge in (128, 256, 384, 512):
            folder = root / str(edge)
            folder.mkdir(parents=True)
            for i in range(layout["bins"]):
                (folder / f"part_{i:05d}_of_{layout['bins']}.hdf5").touch()
    else:
        root.mkdir(parents=True)
        for i in range(layout["flat"]):
            (root / f"part_{i:05d}_of_{layout['flat']}.hdf5").touch()


def overrides(cluster: str, nodes: int, work: Path) -> list[str]:
    """Only what puts the job on this host: partition, time, scale, paths, this Python."""
    from orchestrator.config.clusters import load_cluster

    c = load_cluster(cluster).config
    mounts = [{"host": str(work / m.container.strip("/").replace("/", "_")), "container": m.container}
              for m in c.container.mounts]
    per_rank_batch = c.run.train.batch_size * c.run.train.gradient_accumulation_steps
    values = {
        "slurm.partition": "debug",
        "slurm.time_limit": "00:20:00",
        "resources.nodes": str(nodes),
        "run.train.global_batch_size": str(nodes * c.resources.tasks_per_node * per_rank_batch),
        # the closed division's evaluation cadence follows the batch: the rules' interval for the new one
        "run.train.eval_every_samples": "null",
        "run.train.eval_start_samples": "null",
        "container.python": str(work / "image" / "bin" / "python"),
        "container.install": "wheel",  # a stock image: the job installs this bertctl first
        "container.mounts": json.dumps(mounts),
        "experiments_dir": str(work / "experiments"),
        "node.env.BERTCTL_TOPOLOGY_ROOT": str(work / "dgx_a100"),
    }
    if c.container.preload_dir:
        values["container.preload_dir"] = str(work / "preload")
    return [f"{k}={v}" for k, v in values.items()]


def stock_image_python(root: Path) -> None:
    """A Python like a stock image's: bertctl's dependencies importable, bertctl itself not installed
    (the job installs its wheel). A venv whose one .pth line puts this Python's site-packages on its
    path: without the developer's editable install, whose import hook would cost every process of
    the rehearsal about 12 ms, a cluster-wide 25 s of CPU on 2,048 processes that no cluster pays."""
    import sysconfig

    sh(sys.executable, "-m", "venv", "--without-pip", str(root))
    site = next(root.glob("lib/python*/site-packages"))
    paths = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (site / "dependencies.pth").write_text("".join(f"{p}\n" for p in paths))


def prepare_host(cluster: str, work: Path) -> None:
    from fake_node import dgx_a100

    from orchestrator.config.clusters import load_cluster

    c = load_cluster(cluster).config
    for m in c.container.mounts:
        (work / m.container.strip("/").replace("/", "_")).mkdir(parents=True, exist_ok=True)
    data_mount = next(m for m in c.container.mounts if m.container == c.run.data.train_dir)
    data = work / data_mount.container.strip("/").replace("/", "_")
    data.rmdir()
    write_dataset(data, SHARDS.get(cluster, {"flat": 8 * c.world_size}))
    (work / "preload").mkdir()
    dgx_a100(work / "dgx_a100")
    stock_image_python(work / "image")


def wait_for(exp: str, env: dict, timeout_s: float) -> None:
    end = time.time() + timeout_s
    while time.time() < end:
        view = json.loads(bertctl("status", exp, "--json", env=env).stdout)["experiments"][0]
        if view["state"] not in ("PENDING", "RUNNING", "UNKNOWN"):
            return
        time.sleep(2)
    raise SystemExit(f"rehearsal: {exp} did not finish within {timeout_s:.0f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cluster", default="samsung_dgxa100")
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--keep-cluster", action="store_true", help="leave the cluster running (CI stops it)")
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args()
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs; python {platform.python_version()}")
    t0 = time.perf_counter()
    sh("bash", str(REPO / ".ci/slurm.sh"), "start", "--nodes", str(args.nodes), "--gpus-per-node", "8",
       "--cpus-per-node", "8")
    print(f"cluster: {args.nodes} nodes x 8 GPUs up in {time.perf_counter() - t0:.1f} s")
    try:
        with tempfile.TemporaryDirectory(prefix="bertctl-rehearsal-") as tmp:
            work = Path(tmp)
            prepare_host(args.cluster, work)
            env = {**os.environ, "BERTCTL_HOME": str(work / "home"), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
            words = [w for o in overrides(args.cluster, args.nodes, work) for w in ("-o", o)]
            started = time.perf_counter()
            submitted = bertctl("submit", "--cluster", args.cluster, "--probe", *words, env=env)
            if submitted.returncode:
                print(submitted.stderr.strip())
                return 2
            exp = submitted.stdout.strip()
            wait_for(exp, env, args.timeout)
            verdict = bertctl("rehearsal", exp, "--json", env=env)
            wall = time.perf_counter() - started
            report = json.loads(verdict.stdout)
            for check in report["checks"]:
                print(f"  {'PASS' if check['ok'] else 'FAIL'}  {check['name']}: {check['detail']}"
                      + (f"  [{check['key']}]" if check["key"] else ""))
            print(f"rehearsal: cluster={args.cluster} nodes={args.nodes} ranks={report['ranks']} "
                  f"verified={report['verified']} wall_s={wall:.1f}")
            return 0 if report["passed"] else 1
    finally:
        if not args.keep_cluster:
            sh("bash", str(REPO / ".ci/slurm.sh"), "stop")


if __name__ == "__main__":
    raise SystemExit(main())
