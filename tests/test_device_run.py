"""The GPU machine's device command (`bash benchmarks/gpu/device_run.sh`), rehearsed on the CPU in a
Python built like the GPU machine's: a fresh virtual environment whose site-packages holds only torch
and packages that machine's image has (numpy, h5py, pyyaml, jinja2, rich, protobuf, tokenizers,
transformers, pandas, scipy, matplotlib, pip, and what they need), linked from this test environment (the same
files, no download), and none of what it lacks (pydantic, mlperf-logging, madgrad, argcomplete,
google-crc32c). The carried wheels come from `make gpu-wheels` for this Python's version and are
installed the way the GPU machine installs them: without a registry, `pip --target` + PYTHONPATH.

Stand-ins, because they cannot exist here: the CPU for the GPU (`--device cpu --quick`), this
machine's Python 3.11 and torch 2.13 for the image's 3.12 and 2.11."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import venv
from importlib import metadata
from pathlib import Path

import pytest
from conftest import REPO
from packaging.requirements import Requirement

DEVICE_RUN = REPO / "benchmarks" / "gpu" / "device_run.sh"
PINS = dict(line.split("==") for line in (REPO / "benchmarks" / "gpu" / "requirements.txt").read_text().splitlines()
            if line and not line.startswith("#"))
TAG = f"cp{sys.version_info.major}{sys.version_info.minor}"
# what the GPU machine's image has and the suite uses (KINDS.md of the device machines lists them)
IMAGE_HAS = ["torch", "numpy", "h5py", "pyyaml", "jinja2", "rich", "protobuf", "tokenizers", "transformers", "pandas",
             "scipy", "matplotlib", "packaging", "pip"]
IMAGE_LACKS = ["pydantic", "pydantic-core", "mlperf-logging", "madgrad", "argcomplete", "google-crc32c", "annotated-types",
               "typing-inspection"]
STAGE_FILES = ["a_environment.json", "b_product.json", "c_parity_attention.json", "d_precision.json", "e_throughput.json",
               "f_trainer_sync.json", "g_apex.json", "h_profile.json", "i_trainer_throughput.json"]  # benchmarks/gpu/stages.py::STAGES


def closure(names: list[str]) -> set[str]:
    """The distributions `names` need, transitively, on this platform (extras left out)."""
    seen, todo = set(), list(names)
    while todo:
        name = todo.pop()
        key = name.lower().replace("_", "-")
        if key in seen or key in IMAGE_LACKS:  # wanted by some package (not on its import path): not in the image
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # an optional need this environment does not have either
        seen.add(key)
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def link_distribution(name: str, site: Path) -> None:
    """Every top-level file and package of one installed distribution, linked into `site` (a namespace
    package such as google/ is made here and only its own subpackage linked)."""
    dist = metadata.distribution(name)
    for file in dist.files or []:
        parts = Path(file).parts
        if parts[0] == ".." or parts[0] == "__pycache__":
            continue
        source = Path(dist.locate_file(parts[0]))
        target = site / parts[0]
        if source.is_dir() and not (source / "__init__.py").exists() and not parts[0].endswith(("-info", ".libs")) and len(parts) > 2:
            target.mkdir(exist_ok=True)
            source, target = source / parts[1], target / parts[1]
        if not target.exists() and not target.is_symlink():
            target.symlink_to(source)


@pytest.fixture(scope="module")
def gpu_like_python(tmp_path_factory) -> Path:
    return make_gpu_like_python(tmp_path_factory.mktemp("gpu-like-python"))


def make_gpu_like_python(root: Path) -> Path:
    venv.EnvBuilder(with_pip=False, symlinks=True).create(root / "venv")
    site = next((root / "venv" / "lib").glob("python3*/site-packages"))
    wanted = closure(IMAGE_HAS)
    for name in sorted(wanted):
        link_distribution(name, site)
    python = root / "venv" / "bin" / "python"
    probe = subprocess.run([python, "-c", "import torch, transformers, yaml, h5py, mlperf_logging"], capture_output=True, text=True)
    assert probe.returncode == 1 and "No module named 'mlperf_logging'" in probe.stderr, probe.stderr  # as on the GPU machine
    return python


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    """`make gpu-wheels` for this Python's version (the README's command, cp312 by default)."""
    folder = tmp_path_factory.mktemp("wheels") / TAG
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    made = subprocess.run(["make", "-s", "gpu-wheels", f"GPU_PYTHON={version}", f"GPU_WHEELS={folder}", f"PYTHON={sys.executable}"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
    return folder


def device_env(python: Path, wheels: Path, tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, "PYTHON": str(python), "BERTCTL_WHEELS": str(wheels), "BERTCTL_SITE": str(tmp / "site"),
            "PATH": f"{python.parent}:{env['PATH']}", **extra}


def start(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(["bash", str(DEVICE_RUN), *args], env=env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def watch(proc: subprocess.Popen, out: Path, until: str | None = None, timeout: float = 600) -> dict[str, float]:
    """When each stage record appeared (seconds after the start), polling until the process ends or
    the record `until` appears."""
    started, seen = time.time(), {}
    while time.time() - started < timeout:
        for name in STAGE_FILES:
            if name not in seen and (out / name).exists():
                seen[name] = time.time() - started
        if (until and until in seen) or proc.poll() is not None:
            return seen
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    pytest.fail(f"the device command ran past {timeout} s; records so far: {seen}")


def records(out: Path) -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted(out.glob("?_*.json"))}


MAIN_STAGES = ["a_environment.json", "b_product.json", "f_trainer_sync.json", "g_apex.json", "i_trainer_throughput.json"]


@pytest.mark.slow
def test_the_device_command_runs_its_stages_in_a_python_like_the_gpu_machines(gpu_like_python, wheels, tmp_path):
    """The product end to end (bertctl submit + compliance-check), the torchrun children (they need the
    carried wheels through the PYTHONPATH they inherit), apex's skip and the trainer's own rate (stage i). The code of stages c and d runs
    in tests/test_gpu_suite.py (on a CPU, throughput's compiled models take minutes), c also starts in
    the killed runs below, and e is skipped for the budget below."""
    out = tmp_path / "run"
    proc = start(["--device", "cpu", "--quick", "--stages", "environment,product,trainer_sync,apex,trainer_throughput", "--budget", "1500",
                  "--out", str(out)], device_env(gpu_like_python, wheels, tmp_path))
    appeared = watch(proc, out, timeout=1500)
    stdout, stderr = proc.communicate()
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    assert "installed: " in stdout and "pydantic_core" in stdout and "machine: " in stdout
    found = records(out)
    assert list(found) == MAIN_STAGES, list(found)
    # one by one: each record was on disk well before the next stage ended, not all at the end
    times = [appeared[name] for name in MAIN_STAGES]
    gaps = [later - earlier for earlier, later in zip(times, times[1:])]
    # the stages with work (product, torchrun children) took seconds after the record before them;
    # apex's (the fourth) is a skip in a process of its own: after the one before it, but maybe within seconds
    assert all(gap > 5 for i, gap in enumerate(gaps) if i != 2) and gaps[2] > 0.2, appeared
    environment = found["a_environment.json"]
    assert environment["status"] == "pass" and environment["torch"] == torch_version(gpu_like_python)
    product = found["b_product.json"]
    assert product["status"] == "pass", product
    assert [r["compliant"] for r in product["runs"]] == [True] and product["checker"].startswith("mlperf-logging 4.1")
    # the README's GPU command, word for word, is refused here in one line (no GPU), then the device-less
    # submit runs the same experiment on the CPU
    assert product["readme_command"] == ("bertctl submit --cluster local -o run.runtime.device=cuda "
                                         "-o run.runtime.precision=bf16 --nexp 1 --follow")
    assert "run.runtime.device: cuda, but this machine has no GPU" in product["readme_command_refused"]
    assert product["command"].startswith("bertctl submit --cluster local --nexp 1 --follow") and product["run_device"] == "cpu"
    trainer = found["f_trainer_sync.json"]
    assert trainer["status"] == "pass", trainer
    assert trainer["checks"][0]["runs"]["bucket"]["steps_logged"] >= 20  # python -m trainer under torchrun
    assert found["g_apex.json"]["status"] == "skip" and "apex is not usable" in found["g_apex.json"]["reason"]
    rate = found["i_trainer_throughput.json"]
    assert rate["status"] == "pass" and rate["checks"][0]["runs"]["local"]["seq_per_s"] > 0, rate
    last = json.loads(stdout.strip().splitlines()[-1])
    assert last["passed"] and [r["stage"] for r in last["records"]] == [n[:-5] for n in MAIN_STAGES]
    log = (out / "suite.log").read_text()
    assert "==== stage b_product" in log and "==== bertctl submit: " in log and "==== trainer bucket: " in log


def torch_version(python: Path) -> str:
    return subprocess.run([python, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True).stdout.strip()


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (those in sessions of their own too), parents before children."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(0), [])
        found += children
        todo += children
    return found


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGKILL to every process", "SIGTERM to the suite"])
def test_a_run_killed_mid_way_leaves_its_finished_records_readable(how, gpu_like_python, wheels, tmp_path):
    out = tmp_path / "run"
    proc = start(["--device", "cpu", "--quick", "--stages", "environment,parity_attention,precision", "--out", str(out)],
                 device_env(gpu_like_python, wheels, tmp_path))
    appeared = watch(proc, out, until="a_environment.json", timeout=300)
    assert "a_environment.json" in appeared, proc.communicate()
    time.sleep(3)  # stage c is under way
    if how.startswith("SIGKILL"):
        for pid in reversed([proc.pid, *descendants(proc.pid)]):  # children first: none is left to run on
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    else:
        proc.send_signal(signal.SIGTERM)  # bash exec'd the suite: this is the suite's process
    stdout, _ = proc.communicate(timeout=60)
    found = records(out)
    assert found["a_environment.json"]["status"] == "pass"
    assert not list(out.glob(".*.tmp")), "a half-written record was left"
    if how.startswith("SIGTERM"):
        assert proc.returncode == 143, stdout[-2000:]
        assert found["c_parity_attention.json"]["status"] == "fail"
        assert found["c_parity_attention.json"]["reason"].startswith("interrupted by SIGTERM"), found
        assert "d_precision.json" not in found
    else:
        assert proc.returncode == -signal.SIGKILL and set(found) <= {"a_environment.json", "c_parity_attention.json"}


def one_line(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, (result.returncode, result.stderr)
    return lines[0]


def run_device(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(DEVICE_RUN), *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_a_missing_wheel_is_one_line_naming_it_and_how_to_get_it(gpu_like_python, tmp_path):
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    line = one_line(run_device(device_env(gpu_like_python, empty, tmp_path), "--device", "cpu", "--out", str(tmp_path / "run")))
    assert line == (f"device_run: {empty}: no wheel of pydantic=={PINS['pydantic']}, which this Python lacks: make gpu-wheels "
                    f"GPU_PYTHON={version} (on a machine with a registry; then carry {empty} along)")
    assert not (tmp_path / "run").exists()


def test_a_wheel_for_another_python_is_one_line(gpu_like_python, wheels, tmp_path):
    # the GPU machine's cp312 wheels, here where the Python is another (names only: the check reads the
    # wheel's tags, so the files are this Python's wheels renamed, no second download)
    other_tag = "cp312" if TAG != "cp312" else "cp311"
    other = tmp_path / other_tag
    other.mkdir()
    for wheel in wheels.glob("*.whl"):
        (other / wheel.name.replace(TAG, other_tag)).write_bytes(wheel.read_bytes())
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    line = one_line(run_device(device_env(gpu_like_python, other, tmp_path), "--device", "cpu"))
    core = next(other.glob(f"pydantic_core-{PINS['pydantic-core']}-{other_tag}-*.whl")).name
    assert line == (f"device_run: {other}: {core} "
                    f"is not for this Python ({sys.version.split()[0]}): make gpu-wheels GPU_PYTHON={version} "
                    f"(on a machine with a registry; then carry {other} along)")


def test_no_gpu_for_device_cuda_is_one_line_before_any_stage(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = run_device({**env, "PYTHON": sys.executable}, "--out", str(tmp_path / "run"))
    assert one_line(result) == "gpu_suite: no CUDA device here (torch sees none; use --device cpu --quick for a rehearsal on the CPU)"
    assert not (tmp_path / "run").exists()


def test_a_python_that_does_not_run_is_one_line(tmp_path):
    result = run_device({**os.environ, "PYTHON": str(tmp_path / "python3.12")})
    assert one_line(result) == f"device_run: cannot run the Python '{tmp_path / 'python3.12'}' (set PYTHON to the interpreter with torch)"


@pytest.mark.slow
def test_the_wheels_can_go_into_the_interpreter_itself_and_the_budget_skips_what_no_longer_fits(wheels, tmp_path):
    python = make_gpu_like_python(tmp_path / "own-python")
    env = device_env(python, wheels, tmp_path, BERTCTL_WHEELS_INTO="interpreter")
    # the throughput stage expects 30 s with --quick: more than a 20-second budget can leave it
    result = run_device(env, "--device", "cpu", "--quick", "--stages", "environment,throughput", "--budget", "20",
                        "--out", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr[-3000:]
    found = records(tmp_path / "run")
    assert found["a_environment.json"]["status"] == "pass"
    skipped = found["e_throughput.json"]
    assert skipped["status"] == "skip" and re.fullmatch(r"the budget has \d+ s left, the stage expects 30 s", skipped["reason"])
    assert "skipped for the budget (20 s): e_throughput" in result.stdout
    assert not (tmp_path / "site").exists()  # nothing went to a --target folder
    imported = subprocess.run([python, "-c", "import pydantic, mlperf_logging, google_crc32c"], capture_output=True, text=True,
                              env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert imported.returncode == 0, imported.stderr


def test_a_python_without_torch_is_one_line(tmp_path):
    venv.EnvBuilder(with_pip=False, symlinks=True).create(tmp_path / "bare")
    python = tmp_path / "bare" / "bin" / "python"
    result = run_device({**os.environ, "PYTHON": str(python)})
    assert one_line(result) == f"device_run: the Python '{python}' has no torch (set PYTHON to the interpreter with torch)"
