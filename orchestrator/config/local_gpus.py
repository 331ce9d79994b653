"""`resources.gpus_per_node: auto`: a local cluster takes the GPUs of the machine it is submitted on.

The local executor runs the job on the submitting machine, so the machine is probed here, at load
time and without torch (the orchestrator never imports it): `nvidia-smi -L` lists the GPUs, else
/proc/driver/nvidia/gpus holds one folder per GPU; CUDA_VISIBLE_DEVICES narrows them as CUDA would.
With GPUs found and no device asked for, the run (and phase 1) takes one rank per GPU, CUDA, NCCL and
bf16, each unless an override says otherwise; without any, the file's CPU settings stand. An explicit
`run.runtime.device=cuda` on a machine without a GPU is refused here, in one line.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from orchestrator.errors import UserError

AUTO = "auto"
PROC_GPUS = Path("/proc/driver/nvidia/gpus")
# what a run on the found GPUs sets, each unless an override names the key
GPU_RUNTIME = {"device": "cuda", "backend": "nccl", "precision": "bf16"}


def installed_gpus() -> int:
    """GPUs the driver reports: `nvidia-smi -L` lines, else /proc's folders; 0 without a driver."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired):
            listed = None
        if listed is not None and listed.returncode == 0:
            return sum(1 for line in listed.stdout.splitlines() if line.startswith("GPU "))
    try:
        return sum(1 for entry in PROC_GPUS.iterdir() if entry.is_dir())
    except OSError:
        return 0


def visible_gpus(environ: dict[str, str] | None = None) -> int:
    """The GPUs a rank started here could use: CUDA_VISIBLE_DEVICES, when set, hides the others
    (an empty value or one starting with -1 hides them all, as CUDA reads it)."""
    environ = os.environ if environ is None else environ
    installed = installed_gpus()
    chosen = environ.get("CUDA_VISIBLE_DEVICES")
    if chosen is None:
        return installed
    listed = []
    for item in chosen.split(","):
        item = item.strip()
        if not item or item.startswith("-1"):
            break  # CUDA stops at the first invalid entry
        listed.append(item)
    return min(len(listed), installed)


def overridden_keys(overrides) -> set[str]:
    return {item.partition("=")[0].strip() for item in overrides}


def resolve_auto_gpus(raw: dict[str, Any], overrides, where: str) -> dict[str, Any]:
    """`raw` (overrides applied) with `gpus_per_node: auto` replaced by what this machine has."""
    res = raw.get("resources")
    if not isinstance(res, dict) or res.get("gpus_per_node") != AUTO:
        return raw
    if raw.get("executor") != "local":
        raise UserError("auto probes the machine bertctl runs on: only for executor local; give a number",
                        where=where, key="resources.gpus_per_node")
    given = overridden_keys(overrides)
    runtime = (raw.get("run") or {}).get("runtime") or {}
    asked = runtime.get("device") if "run.runtime.device" in given else None
    found = visible_gpus() if asked != "cpu" else 0
    if asked == "cuda" and found == 0:
        raise UserError("cuda, but this machine has no GPU (nvidia-smi -L lists none, no /proc/driver/nvidia/gpus, "
                        "or CUDA_VISIBLE_DEVICES hides them): leave it out to run on the CPU",
                        where=where, key="run.runtime.device")
    resolved = {**raw, "resources": {**res, "gpus_per_node": found}}
    return on_gpus(resolved, found, given) if found else resolved


def on_gpus(raw: dict[str, Any], gpus: int, given: set[str]) -> dict[str, Any]:
    """One rank per GPU, CUDA, NCCL, bf16 for the run and phase 1, except where an override decided.
    The file's train.batch_size stays per rank, so the global batch grows with the ranks."""
    raw = {**raw, "resources": {**raw["resources"]}, "run": {**raw.get("run", {})}}
    set_unless_given(raw["resources"], "tasks_per_node", gpus, "resources.tasks_per_node", given)
    ranks = raw["resources"]["tasks_per_node"]
    run = raw["run"]
    run["runtime"] = with_gpu_runtime(run.get("runtime"), "run.runtime", given)
    train = run.get("train")
    if isinstance(train, dict) and isinstance(train.get("batch_size"), int):
        run["train"] = {**train}
        set_unless_given(run["train"], "global_batch_size", train["batch_size"] * ranks * train.get("gradient_accumulation_steps", 1),
                         "run.train.global_batch_size", given)
    phase1 = (raw.get("prepare") or {}).get("phase1")
    if isinstance(phase1, dict) and phase1.get("runtime") is not None:
        raw["prepare"] = {**raw["prepare"], "phase1": {**phase1, "runtime": with_gpu_runtime(
            phase1["runtime"], "prepare.phase1.runtime", given)}}
    return raw


def with_gpu_runtime(runtime: Any, prefix: str, given: set[str]) -> dict[str, Any]:
    runtime = dict(runtime or {})
    for key, value in GPU_RUNTIME.items():
        set_unless_given(runtime, key, value, f"{prefix}.{key}", given)
    return runtime


def set_unless_given(section: dict[str, Any], key: str, value: Any, dotted: str, given: set[str]) -> None:
    if dotted not in given:
        section[key] = value
