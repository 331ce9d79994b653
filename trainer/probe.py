"""`python -m trainer.probe`: each rank prints, as one JSON line, where it runs and who it is.

Submitted with `bertctl submit --probe`, it checks a cluster's launch path (ranks, nodes, GPUs, CPU
binding, rendezvous address) in seconds, before anyone spends an allocation on training.
"""

from __future__ import annotations

import json
import os

from trainer.dist_env import detect


def report(environ: dict[str, str] | None = None) -> dict:
    env = os.environ if environ is None else environ
    info = detect(env).as_dict()
    info.update(
        run_index=int(env.get("BERTCTL_RUN_INDEX", "0")),
        seed=int(env.get("BERTCTL_SEED", "0")),
        job_id=env.get("SLURM_JOB_ID"),
        cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES"),
        cpus=sorted(os.sched_getaffinity(0)),
    )
    return info


def main() -> int:
    print("BERTCTL_PROBE " + json.dumps(report(), sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
