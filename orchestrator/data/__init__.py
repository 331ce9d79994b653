"""`bertctl data prepare|verify|list` and `bertctl convert-checkpoint`: the control-plane side.

The manifest (datasets/<name>.yaml) is loaded, overridden with `-o key.path=value` and validated
here (`manifest`); with --cluster, `-o` also reaches the cluster file's keys (`split_overrides`
says which file a key belongs to); the work runs in trainer-side worker processes (`workers`), so that the control
plane never imports torch:

  locally     a pool of worker processes, stage after stage, with progress (`local`, `progress`);
  on Slurm    one job array per stage, each depending on the previous one (`slurm_arrays`).

Both run the same tasks, which write the same files.

May import: orchestrator, orchestrator.config, orchestrator.rendering, orchestrator.jobs, trainer.config,
trainer.data
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Callable

from orchestrator.data import workers
from orchestrator.data.local import Prepared, prepare_locally
from orchestrator.data.manifest import (
    LoadedManifest,
    check_inputs,
    describe,
    find_manifest,
    load_manifest,
    manifest_files,
    split_overrides,
    write_manifest,
)
from orchestrator.data.slurm_arrays import array_groups, prepare_on_slurm, render_stage
from orchestrator.errors import UserError
from trainer.config import PathError, expand_path
from trainer.config.regular import require_regular

__all__ = ["LoadedManifest", "Prepared", "array_groups", "convert_checkpoint", "describe", "find_manifest",
           "load_manifest", "manifest_files", "prepare", "render_stage", "split_overrides", "verify"]


def prepare(loaded: LoadedManifest, cluster: str | None = None, workers: int | None = None, force: bool = False,
            wait: bool = False, say: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
            cluster_overrides: list[str] | tuple[str, ...] = ()) -> Prepared:
    """Build the dataset here, or on the Slurm cluster named by `cluster`, with `cluster_overrides`
    applied to its file (a local cluster builds here)."""
    check_inputs(loaded)
    slurm = None
    if cluster is not None:
        from orchestrator.config.clusters import load_cluster

        slurm = load_cluster(cluster, list(cluster_overrides))  # a bad key or value: one line before any work
        if slurm.config.executor != "slurm":
            slurm = None
    if slurm is None:
        return prepare_locally(loaded, workers or os.cpu_count() or 1, force, say)
    return prepare_on_slurm(loaded, slurm, force, wait, say)


def verify(loaded: LoadedManifest, as_json: bool = False, stats_files: int | None = None) -> tuple[int, str]:
    """(exit code, report): 0 when every check passes, 1 otherwise."""
    with tempfile.TemporaryDirectory(prefix="bertctl-data-") as tmp:
        return workers.verify(write_manifest(loaded, Path(tmp)), as_json, stats_files)


def refuse_irregular(option: str, path: str) -> None:
    """A FIFO, device or folder given where a file belongs: one line (a missing file is the worker's to report)."""
    try:
        require_regular(path)
    except FileNotFoundError:
        return
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: {getattr(e, 'strerror', None) or e}", where=option) from None


def convert_checkpoint(tf_checkpoint: str, bert_config: str, output: str) -> str:
    out = Path(output).expanduser().resolve()
    try:
        tf_checkpoint, bert_config = expand_path(tf_checkpoint), expand_path(bert_config)
    except PathError as e:
        raise UserError(str(e)) from None
    for option, path in (("--bert-config", bert_config), ("--tf-checkpoint", tf_checkpoint.removesuffix(".index") + ".index")):
        refuse_irregular(option, path)  # answered here at once, before a worker starts
    workers.convert_checkpoint(tf_checkpoint, bert_config, out)
    return str(out)
