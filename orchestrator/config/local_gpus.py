"""`resources.gpus_per_node: auto`: a local cluster takes the GPUs of the machine it is submitted on.

The local executor runs the job on the submitting machine, so the machine is probed here, at load
time and without torch (the orchestrator never imports it): `nvidia-smi -L` lists the GPUs, else
/proc/driver/nvidia/gpus holds one folder per GPU; CUDA_VISIBLE_DEVICES narrows them as CUDA would.
With GPUs found and no device asked for, the run (and phase 1) takes one rank per GPU, CUDA, NCCL and
bf16, then the cluster file's `on_gpus` keys (its recipe on GPUs), each unless an override says otherwise;
without any, the file's CPU settings stand. An explicit
`run.runtime.device=cuda` on a machine without a GPU is refused here, in one line.
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import UserError

AUTO = "auto"
PROC_GPUS = Path("/proc/driver/nvidia/gpus")
# what a run (and phase 1) on the found GPUs sets, each unless an override names the key; a cluster's own
# `on_gpus` keys (the recipe on GPUs: clusters/local.yaml runs the fast step as measured) come on top
GPU_RUNTIME = {"device": "cuda", "backend": "nccl", "precision": "bf16"}


# how long `nvidia-smi -L` may take (it waits for the driver on a machine without persistence mode); its output goes
# to a file, not a pipe, so a child it leaves behind holding that output costs nothing
SMI_TIMEOUT_S = 30
UUID = re.compile(r"\(UUID: ((?:GPU|MIG)-[^)\s]+)\)")


@dataclass(frozen=True)
class Installed:
    """The machine's GPUs: how many, their UUIDs (GPU-..., and MIG-... for MIG devices), what went wrong asking."""

    count: int
    uuids: tuple[str, ...] = ()
    note: str | None = None


def installed_gpus() -> Installed:
    """GPUs the driver reports: `nvidia-smi -L`'s `GPU N:` lines, else /proc's folders; none without a driver."""
    smi, note = shutil.which("nvidia-smi"), None
    if smi:
        listed, note = smi_listing(smi)
        if listed is not None:
            return Installed(sum(1 for line in listed.splitlines() if line.startswith("GPU ")), tuple(UUID.findall(listed)), note)
    try:
        folders = [entry for entry in PROC_GPUS.iterdir() if entry.is_dir()]
    except OSError:
        return Installed(0, (), note)
    uuids = []
    for folder in folders:  # each holds `information`, with a "GPU UUID: GPU-..." line
        with contextlib.suppress(OSError):
            uuids += re.findall(r"(?m)^GPU UUID:\s*(\S+)", (folder / "information").read_text(errors="replace"))
    return Installed(len(folders), tuple(uuids), note)


def smi_listing(smi: str) -> tuple[str | None, str | None]:
    """`nvidia-smi -L`'s output (None when it failed), and what went wrong, in one line."""
    with tempfile.TemporaryFile() as out:
        try:
            done = subprocess.run([smi, "-L"], stdout=out, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                                  timeout=SMI_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            return None, f"nvidia-smi -L did not answer within {SMI_TIMEOUT_S} s: GPUs counted from {PROC_GPUS}"
        except OSError as e:
            return None, f"nvidia-smi -L could not run ({e.strerror or e}): GPUs counted from {PROC_GPUS}"
        out.seek(0)
        raw = out.read(1 << 20)
    if done.returncode:
        return None, f"nvidia-smi -L failed (exit {done.returncode}): GPUs counted from {PROC_GPUS}"
    text = raw.decode("utf-8", errors="replace")
    note = "nvidia-smi -L printed bytes that are not UTF-8 (read leniently)" if "\ufffd" in text else None
    return text, note


def cuda_visible(value: str, installed: Installed) -> tuple[int, str | None]:
    """How many GPUs CUDA sees under CUDA_VISIBLE_DEVICES=`value`, read as the CUDA runtime reads it (and as torch's
    own device count mirrors it, torch.cuda._parse_visible_devices): entries are indices (the leading digits of each,
    as strtoul reads them) or GPU-/MIG- UUIDs (or a unique prefix of one); the first invalid entry (not a number,
    negative, out of range, an unknown or ambiguous UUID) ends the list, and an entry named twice hides every GPU.
    Returns the count and, when entries were dropped, why, in one line."""
    entries = value.split(",")
    uuid_mode = value.startswith(("GPU-", "MIG-"))
    chosen: list[int | str] = []
    for entry in entries:
        device = uuid_index(entry, installed.uuids) if uuid_mode else leading_number(entry.strip())
        if device is None or (not uuid_mode and not device < installed.count):
            break
        if device in chosen:
            return 0, f"CUDA_VISIBLE_DEVICES={value!r} names a GPU twice: CUDA sees no GPU"
        chosen.append(device)
    if len(chosen) == len(entries) or (not chosen and entries[0].strip() in ("", "-1")):
        return len(chosen), None  # every entry taken, or every GPU hidden on purpose (empty, or -1 first)
    bad = entries[len(chosen)]
    return len(chosen), (f"CUDA_VISIBLE_DEVICES={value!r}: {bad.strip()!r} is no GPU of this machine's {installed.count} "
                         f"(CUDA ignores it and every entry after it): {len(chosen)} GPU(s) visible")


def leading_number(entry: str) -> int | None:
    """The whole number `entry` begins with (strtoul's reading: `1gpu` is 1), None for none or a negative one."""
    match = re.match(r"\+?([0-9]+)", entry)  # ASCII digits: "٣" is no index to CUDA
    return int(match.group(1)) if match else None


def uuid_index(entry: str, uuids: tuple[str, ...]) -> int | None:
    """The one GPU whose UUID begins with `entry` (CUDA takes a unique prefix), None for no or several matches."""
    matches = [i for i, uuid in enumerate(uuids) if entry and entry.startswith(("GPU-", "MIG-")) and uuid.startswith(entry)]
    return matches[0] if len(matches) == 1 else None


def visible_gpus(environ: dict[str, str] | None = None) -> int:
    """The GPUs a rank started here could use: CUDA_VISIBLE_DEVICES, when set, narrows them as CUDA reads it
    (`cuda_visible`; an empty value hides them all). What went wrong finding them is said in one line on stderr."""
    environ = os.environ if environ is None else environ
    installed = installed_gpus()
    chosen = environ.get("CUDA_VISIBLE_DEVICES")
    count, note = (installed.count, None) if chosen is None else cuda_visible(chosen, installed)
    for line in filter(None, (installed.note, note)):
        print(f"bertctl: warning: {line}", file=sys.stderr)
    return count


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
    """One rank per GPU, CUDA, NCCL, bf16 for the run and phase 1, then the cluster's `on_gpus` keys, each except
    where an override decided. The file's train.batch_size stays per rank, so the global batch grows with the ranks
    (times balance.pack_average where packs are counted in sequences)."""
    raw = copy.deepcopy(raw)
    set_unless_given(raw["resources"], "tasks_per_node", gpus, "resources.tasks_per_node", given)
    defaults = {f"run.runtime.{key}": value for key, value in GPU_RUNTIME.items()}
    if isinstance((raw.get("prepare") or {}).get("phase1"), dict) and raw["prepare"]["phase1"].get("runtime") is not None:
        defaults |= {f"prepare.phase1.runtime.{key}": value for key, value in GPU_RUNTIME.items()}
    for key, value in {**defaults, **(raw.get("on_gpus") or {})}.items():
        if key not in given:
            set_path(raw, key.split("."), value)
    run = raw.setdefault("run", {})
    train, balance = run.get("train"), run.get("balance") or {}
    if isinstance(train, dict) and isinstance(train.get("batch_size"), int) and "run.train.global_batch_size" not in given:
        per_row = balance.get("pack_average") if balance.get("packing") and balance.get("pack_average") else 1
        train["global_batch_size"] = int(train["batch_size"] * raw["resources"]["tasks_per_node"]
                                         * train.get("gradient_accumulation_steps", 1) * per_row)
    return raw


def set_path(raw: dict[str, Any], path: list[str], value: Any) -> None:
    """raw[a][b]...[z] = value, making the sections on the way."""
    node = raw
    for part in path[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[path[-1]] = value


def set_unless_given(section: dict[str, Any], key: str, value: Any, dotted: str, given: set[str]) -> None:
    if dotted not in given:
        section[key] = value
