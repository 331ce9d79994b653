"""`python -m trainer.probe --config run.yaml ...`: each rank prints, as one JSON line, what the trainer
would use there, without torch: who it is (rank, node, local rank), its GPU, its CPU and memory
binding and network device, the rendezvous address, the shards it would read, its exchange group,
and the container it got.

Submitted with `bertctl submit --probe`, it rehearses a cluster's launch path in seconds;
`bertctl rehearsal EXP` (orchestrator/rehearsal.py) checks every rank's report.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from trainer import binding
from trainer.config import RunConfig, load_run_config
from trainer.dist_env import detect
from trainer.topology import format_cpu_list

MARKER = "BERTCTL_PROBE "
CONTAINER_VARIABLES = ("IMAGE", "NAME", "MOUNTS", "WORKDIR")  # what the pyxis stand-in exports (.ci/pyxis-standin)


def report(cfg: RunConfig | None, run_index: int = 0, seed: int = 0, environ: dict[str, str] | None = None) -> dict:
    env = dict(os.environ if environ is None else environ)
    me = detect(env)
    visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    info = me.as_dict()
    info.update(
        node_rank=me.node_rank, run_index=run_index, seed=seed, job_id=env.get("SLURM_JOB_ID"),
        cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES"),
        gpu=visible[me.local_rank] if me.local_rank < len(visible) else None,  # what cuda:LOCAL_RANK is
        cpus=format_cpu_list(sorted(os.sched_getaffinity(0))),
        binding=binding.applied(env),
        container=container_options(env),
    )
    if cfg is not None:
        info.update(shards(cfg, me.rank, me.world_size, seed), exchange=exchange_group(cfg, me.rank, me.world_size))
    return info


def shards(cfg: RunConfig, rank: int, world_size: int, seed: int) -> dict:
    """The shards this rank reads in the first epoch, by path, or why they cannot be listed here."""
    from trainer.data.dataset import DataError, rank_files

    try:
        mine = rank_files(cfg.data, cfg.balance, rank, world_size, seed)
    except (DataError, OSError, ValueError) as e:
        return {"shards": None, "shards_error": str(e)}
    if not mine:
        return {"shards": None, "shards_error": f"{cfg.data.train_dir}: no shards for this rank"}
    return {"shards": [str(p) for p in mine], "shards_error": None}


def exchange_group(cfg: RunConfig, rank: int, world_size: int) -> dict | None:
    """The ranks this one pools samples with, and its place among them (the deal order's index)."""
    mode = cfg.balance.exchange_padding
    if mode == "none" or world_size == 1:
        return None
    size = world_size if mode == "global" else cfg.balance.group_size
    first = rank - rank % size
    return {"mode": mode, "members": list(range(first, first + size)), "position": rank % size,
            "snake": cfg.balance.snake}


def container_options(env: dict[str, str]) -> dict | None:
    if "PYXIS_STANDIN" not in env:
        return None
    return {key.lower(): env.get(f"PYXIS_STANDIN_{key}") for key in CONTAINER_VARIABLES}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.probe")
    parser.add_argument("--config", help="run.yaml: report the shards and exchange group the run would use")
    parser.add_argument("--out", help="the experiment folder: the whole report goes to probe/run_N/rank_R.json there")
    parser.add_argument("--run-index", type=int, default=int(os.environ.get("BERTCTL_RUN_INDEX", "0")))
    parser.add_argument("--seed", type=int, default=int(os.environ.get("BERTCTL_SEED", "0")))
    args = parser.parse_args(argv)
    cfg = load_run_config(args.config) if args.config else None
    info = report(cfg, args.run_index, args.seed)
    if args.out:  # in full to a file: srun splits long lines, and a rank may read thousands of shards
        path = Path(args.out) / "probe" / f"run_{args.run_index}" / f"rank_{info['rank']}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(info, sort_keys=True))
    short = {k: v for k, v in info.items() if k != "shards"} | {"shard_count": len(info.get("shards") or [])}
    print(MARKER + json.dumps(short, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
