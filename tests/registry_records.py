"""A valid experiment.json record (orchestrator/experiments.py), for the hostile-registry test and
benchmark to damage."""

from __future__ import annotations

from pathlib import Path


def record(exp_dir: Path, **changes) -> dict:
    data = {"id": exp_dir.name, "cluster": "c", "cluster_source": "clusters/local.yaml", "executor": "local",
            "nexp": 1, "seeds": [0], "program": "train", "overrides": [], "script": "job.sh", "created": 1.0,
            "dir": str(exp_dir), "job_ids": [], "submitted": True, "steps": [], "array": False,
            "container": "none", "history": []}
    data.update(changes)
    return data
