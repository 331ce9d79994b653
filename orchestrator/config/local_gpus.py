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
# What a run (and phase 1) on the found GPUs sets, each unless an override names the key: the fast step
# as it was measured (trainer/loop/fast_step.py: packs of at most 3 sequences, bf16, the whole model
# compiled, its forward and backward replayed as CUDA graphs where they can run: bf16, the fast step)
GPU_RUNTIME = {"device": "cuda", "backend": "nccl", "precision": "bf16", "unpad": True, "compile": True}
GPU_BALANCE = {"stratified": False, "packing": True, "pack_sequences": 3}


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
    run.update(fast_step_on_gpus(run, "run", given))
    train = run.get("train")
    if isinstance(train, dict) and isinstance(train.get("batch_size"), int):
        run["train"] = {**train}
        set_unless_given(run["train"], "global_batch_size", train["batch_size"] * ranks * train.get("gradient_accumulation_steps", 1),
                         "run.train.global_batch_size", given)
    phase1 = (raw.get("prepare") or {}).get("phase1")
    if isinstance(phase1, dict):  # without a runtime of its own it takes the run's (and so needs packs too)
        raw["prepare"] = {**raw["prepare"], "phase1": {**phase1, **fast_step_on_gpus(phase1, "prepare.phase1", given)}}
    return raw


def fast_step_on_gpus(section: dict[str, Any], prefix: str, given: set[str]) -> dict[str, Any]:
    """The runtime and balance sections of `section` (the run, or phase 1) for the fast step on GPUs: GPU_RUNTIME
    (where the section has a runtime), GPU_BALANCE unless an override chose the batches, and CUDA graphs where
    the result can replay them; each key unless an override names it."""
    runtime = dict(section.get("runtime") or {}) if section.get("runtime") is not None or prefix == "run" else None
    balance = dict(section.get("balance") or {})
    if runtime is not None:
        for key, value in GPU_RUNTIME.items():
            set_unless_given(runtime, key, value, f"{prefix}.runtime.{key}", given)
    if not given & {f"{prefix}.balance.{key}" for key in ("stratified", "packing", "bin_quotas")}:
        balance.pop("bin_quotas", None)  # the strata's quotas go with stratified batches
        for key, value in GPU_BALANCE.items():
            set_unless_given(balance, key, value, f"{prefix}.balance.{key}", given)
    replayable = (runtime or {}).get("precision", "bf16") == "bf16" and (runtime or {}).get("step") != "reference"
    if runtime is not None and replayable and balance.get("packing"):
        set_unless_given(runtime, "cuda_graph", True, f"{prefix}.runtime.cuda_graph", given)
    return {"balance": balance, **({"runtime": runtime} if runtime is not None else {})}


def set_unless_given(section: dict[str, Any], key: str, value: Any, dotted: str, given: set[str]) -> None:
    if dotted not in given:
        section[key] = value
