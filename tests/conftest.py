"""Shared fixtures. Every test gets its own $BERTCTL_HOME, so nothing touches ~/.bertctl."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import time
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest

REPO = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden"

# `make test` runs three xdist workers on the CI's two cores. PyTorch's OpenMP threads (libgomp) spin
# while they wait for each other, and beside another worker's load they burn the time slices that load
# needs: two concurrent 30-step runs of the local recipe took 53 s each (100 CPU-seconds together, 31 alone)
# and 28-31 s with passive waiting, which costs a run alone nothing (20.2 s either way). Set before any
# test imports torch, so this process and every subprocess (trainer, jobs, Slurm ranks) inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture(autouse=True)
def bertctl_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "bertctl-home"
    monkeypatch.setenv("BERTCTL_HOME", str(home))
    monkeypatch.delenv("BERTCTL_CLUSTERS", raising=False)
    return home


@dataclass
class CliResult:
    code: int
    out: str
    err: str


def run_cli(*args: str) -> CliResult:
    """`bertctl ARGS` in this process (fast); stdout and stderr captured separately."""
    from orchestrator.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as e:  # argparse usage errors
            code = e.code if isinstance(e.code, int) else 2
    return CliResult(code, out.getvalue(), err.getvalue())


def status_now(exp: str, home: Path | str | None = None) -> dict:
    """The experiment as `bertctl status EXP --json` shows it, asked in this process (in `home` if given,
    else this test's $BERTCTL_HOME): what a test polls while a job runs. A `bertctl` process per poll costs
    ~0.9 CPU-seconds (benchmarks/results/process_startup_2026-11-28.txt) of the cores the job itself needs
    (issue 38); what a user reads of the finished experiment is still asked of a separate `bertctl` process
    where a test checks it (tests/test_demo.py)."""
    with mock.patch.dict(os.environ, {"BERTCTL_HOME": str(home)} if home is not None else {}):
        result = run_cli("status", exp, "--json")
    assert result.code == 0, result.err
    return json.loads(result.out)["experiments"][0]


def run_bertctl(*args: str, env: dict | None = None, timeout: float = 120, cwd: Path = REPO) -> CliResult:
    """`bertctl ARGS` as a separate process, as a user would run it (in `cwd`: the repository unless given)."""
    full_env = {**os.environ, **(env or {})}
    # the job uses the Python that submitted it: make sure its bin/ is on PATH like an activated venv
    full_env["PATH"] = f"{Path(sys.executable).parent}:{full_env.get('PATH', '')}"
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", *args], capture_output=True, text=True,
        env=full_env, timeout=timeout, cwd=cwd,
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


def slurm_is_up() -> bool:
    if shutil.which("sinfo") is None:
        return False
    try:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and any(s in out.stdout for s in ("idle", "mixed", "alloc"))


@pytest.fixture(scope="session")
def slurm() -> None:
    """The real local Slurm cluster. Started here if it is not up and we may; otherwise the test fails."""
    if slurm_is_up():
        return
    if os.geteuid() == 0:
        subprocess.run(["bash", str(REPO / ".ci" / "slurm.sh"), "start"], check=False, timeout=600)
        if slurm_is_up():
            return
    pytest.fail(
        "these tests need the local Slurm test cluster: run `sudo bash .ci/slurm.sh start` "
        "(Debian 12; installs slurm-wlm, munge, mariadb) and try again"
    )


# The longest chains of tests that must run one after another on one worker: every Slurm test (~540 s of
# a bulk pass on CI's machine of 2026-11-28) and the main job (`make demo`'s, ~150 s, after the phase-1
# checkpoint it waits for). Handed out first, they end with the rest instead of after it (issue 38).
FIRST_GROUPS = ("slurm", "demo-local")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups (it appends them to the node ids)
def pytest_collection_modifyitems(config, items) -> None:
    """Under pytest-xdist (`make test` runs `-n 3 --dist loadgroup`), whole files go to one worker, so a
    module's fixtures are built once, and every file that uses the Slurm cluster goes to the same worker:
    its jobs would otherwise queue behind another test's on the two nodes and run out their waits. A test
    marked with its own xdist_group keeps it.

    The groups are handed out in this order (`make test` turns xdist's own reordering off): FIRST_GROUPS,
    then the rest as xdist orders them, most tests first. xdist alone handed the main job, a group of one
    test, out last: its 150 s ran on one worker after the other two had finished (bulk 818 s, 744 when
    balanced)."""
    uses_slurm = {item.path for item in items if item.get_closest_marker("slurm") or "slurm" in item.fixturenames}
    for item in items:
        if item.get_closest_marker("xdist_group"):  # a test that says where it runs (tests/test_demo.py)
            continue
        group = "slurm" if item.path in uses_slurm else item.path.name
        item.add_marker(pytest.mark.xdist_group(group))
    groups = [item.get_closest_marker("xdist_group").args[0] for item in items]
    items[:] = [items[i] for i in dispatch_order(groups)]


def dispatch_order(groups: list[str]) -> list[int]:
    """The tests' indices in the order their groups are handed out: FIRST_GROUPS, then the groups of most
    tests first (xdist's own order), ties in collection order; a group's tests keep their order."""
    size = {group: groups.count(group) for group in set(groups)}
    first_seen = {group: i for i, group in reversed(list(enumerate(groups)))}

    def rank(group: str) -> tuple:
        if group in FIRST_GROUPS:
            return (FIRST_GROUPS.index(group), 0, 0)
        return (len(FIRST_GROUPS), -size[group], first_seen[group])

    return sorted(range(len(groups)), key=lambda i: (rank(groups[i]), i))


def shared_between_workers(tmp_path_factory, name: str, build) -> Path:
    """`build(folder)` once per test run, not once per xdist worker: the first worker builds under a lock
    in the run's common temporary folder, the others wait for it and reuse the folder."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        folder = tmp_path_factory.mktemp(name)
        build(folder)
        return folder
    import fcntl

    root = tmp_path_factory.getbasetemp().parent
    folder, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # a worker that failed half-way
            folder.mkdir()
            build(folder)
            done.touch()
    return folder


# How often a test asks `bertctl status` whether a job has moved on. Asked as a process (~0.7 CPU-seconds) every
# 0.3 s, a one-minute wait cost ~40 CPU-seconds of the two cores the jobs themselves need (issue 38); polls
# now ask in the test's own process (status_now), and Slurm's sacct and squeue still answer each one.
STATUS_EVERY = 2.0


def wait(predicate, timeout: float, what: str, every: float = 0.3) -> None:
    """Poll `predicate` until it holds; fail naming `what` after `timeout` seconds. A predicate that runs
    `bertctl status` polls every STATUS_EVERY seconds."""
    end = time.time() + timeout
    while time.time() < end:
        if predicate():
            return
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")
