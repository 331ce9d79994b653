"""`python -m trainer.launch.probe`: the launch rehearsal's two halves, without torch.

- Once per run, `--plan WORLD_SIZE`: loads the run's configuration and writes, for every rank, the
  shards it reads in the first epoch and its exchange group (probe/run_N/plan/rank_R.json), with the
  trainer's own code (trainer.config, trainer.data.dataset).
- On every rank: who it is (rank, node, local rank), its GPU, its CPU and memory binding and network
  device, the rendezvous address and the container it got; its shards and exchange group from the
  plan, each shard checked to be visible from its node. It prints this as one JSON line and writes
  it whole to probe/run_N/rank_R.json.

Why two halves: loading the configuration (pydantic) and numpy costs a process about 0.35 s of CPU,
which on 1,024 ranks sharing one test host is minutes. The plan is a pure function of the
configuration, the rank and the world size, so it is computed once; what can differ between nodes
(the environment Slurm and the binding wrapper give a rank, the mounts it sees) each rank reads
itself. A rank without a plan file (run by hand) computes its own entry. For the same reason the
rank half imports only small standard modules and trainer.launch.dist_env: on a 1,024-rank rehearsal each
millisecond of a rank's start is about half a second of the whole.

Submitted with `bertctl submit --probe`; `bertctl rehearsal EXP` (orchestrator/checks/rehearsal.py) checks
every rank's report.
"""

from __future__ import annotations

import argparse
import json
import os

from trainer.launch.dist_env import binding_plan, detect

MARKER = "BERTCTL_PROBE "
CONTAINER_VARIABLES = ("IMAGE", "NAME", "MOUNTS", "WORKDIR")  # what the pyxis stand-in exports (.ci/pyxis-standin)


def plan(cfg, world_size: int, seed: int) -> list[dict]:
    """Every rank's shards and exchange group, by rank: what the trainer would read and pool with."""
    from trainer.data.dataset import DataError, files_by_rank

    try:
        files, error = files_by_rank(cfg.data, cfg.balance, world_size, seed), None
    except (DataError, OSError, ValueError) as e:
        files, error = [[] for _ in range(world_size)], str(e)
    return [{"world_size": world_size, "shards": [str(p) for p in mine] if mine else None,
             "shards_error": error or (None if mine else f"{cfg.data.train_dir}: no shards for this rank"),
             "exchange": exchange_group(cfg.balance, rank, world_size)}
            for rank, mine in enumerate(files)]


def exchange_group(balance, rank: int, world_size: int) -> dict | None:
    """The ranks this one pools samples with, and its place among them (the deal order's index)."""
    mode = balance.exchange_padding
    if mode == "none" or world_size == 1:
        return None
    size = world_size if mode == "global" else balance.group_size
    first = rank - rank % size
    return {"mode": mode, "members": list(range(first, first + size)), "position": rank % size, "snake": balance.snake}


def run_folder(out: str, run_index: int, *parts: str) -> str:
    return os.path.join(out, "probe", f"run_{run_index}", *parts)


def write_json(path: str, value) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(value, f, sort_keys=True)


def write_plan(config: str, out: str, run_index: int, seed: int, world_size: int) -> None:
    from trainer.config import load_run_config

    for rank, entry in enumerate(plan(load_run_config(config), world_size, seed)):
        write_json(run_folder(out, run_index, "plan", f"rank_{rank}.json"), entry)


def planned(config: str | None, out: str | None, run_index: int, seed: int, rank: int, world_size: int) -> dict:
    """This rank's entry of the run's plan: from the plan file, else computed here."""
    path = run_folder(out, run_index, "plan", f"rank_{rank}.json") if out else None
    if path is not None and os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    if config is None:
        return {}
    from trainer.config import load_run_config

    return plan(load_run_config(config), world_size, seed)[rank]


def visible(entry: dict, world_size: int, node: str) -> dict:
    """The planned shards, or why this rank cannot read them: a plan for another world size, or shards
    its node does not see (a mount missing there)."""
    if entry.get("world_size", world_size) != world_size:
        return {"shards": None, "shards_error": f"the plan is for {entry['world_size']} ranks, this rank sees {world_size}"}
    missing = [f for f in entry.get("shards") or [] if not os.path.exists(f)]
    if missing:
        return {"shards": None, "shards_error": f"{missing[0]}: not visible on {node} ({len(missing)} of "
                f"{len(entry['shards'])} shard(s) missing)"}
    return {"shards": entry.get("shards"), "shards_error": entry.get("shards_error")}


def report(run_index: int = 0, seed: int = 0, environ: dict[str, str] | None = None) -> dict:
    """Who this rank is and what it was given: identity, GPU, CPUs, binding, rendezvous, container."""
    env = dict(os.environ if environ is None else environ)
    me = detect(env)
    visible_gpus = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    info = me.as_dict()
    info.update(
        node_rank=me.node_rank, run_index=run_index, seed=seed, job_id=env.get("SLURM_JOB_ID"),
        cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES"),
        gpu=visible_gpus[me.local_rank] if me.local_rank < len(visible_gpus) else None,  # what cuda:LOCAL_RANK is
        cpus=allowed_cpus(),
        binding=binding_plan(env),
        container=container_options(env),
    )
    return info


def allowed_cpus() -> str:
    """The CPUs this task may run on, as the kernel lists them ("0-3,8")."""
    with open("/proc/self/status") as f:
        return next(line.split(":", 1)[1].strip() for line in f if line.startswith("Cpus_allowed_list:"))


def container_options(env: dict[str, str]) -> dict | None:
    if "PYXIS_STANDIN" not in env:
        return None
    return {key.lower(): env.get(f"PYXIS_STANDIN_{key}") for key in CONTAINER_VARIABLES}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.launch.probe")
    parser.add_argument("--config", help="run.yaml: the run whose shards and exchange groups are reported")
    parser.add_argument("--out", help="the experiment folder: plan and reports go to probe/run_N/ there")
    parser.add_argument("--run-index", type=int, default=int(os.environ.get("BERTCTL_RUN_INDEX", "0")))
    parser.add_argument("--seed", type=int, default=int(os.environ.get("BERTCTL_SEED", "0")))
    parser.add_argument("--plan", type=int, metavar="WORLD_SIZE",
                        help="write the run's plan for this many ranks (once per run, before the ranks) and exit")
    args = parser.parse_args(argv)
    if args.plan is not None:
        if not (args.config and args.out):
            parser.error("--plan needs --config and --out")
        write_plan(args.config, args.out, args.run_index, args.seed, args.plan)
        return 0
    info = report(args.run_index, args.seed)
    entry = planned(args.config, args.out, args.run_index, args.seed, info["rank"], info["world_size"])
    if entry:
        info.update(visible(entry, info["world_size"], info["node"]), exchange=entry.get("exchange"))
    if args.out:  # in full to a file: srun splits long lines, and a rank may read thousands of shards
        write_json(run_folder(args.out, args.run_index, f"rank_{info['rank']}.json"), info)
    short = {k: v for k, v in info.items() if k != "shards"} | {"shard_count": len(info.get("shards") or [])}
    print(MARKER + json.dumps(short, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
