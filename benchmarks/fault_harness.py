"""Crash a run at every moment its files can record, resume it as `bertctl resume` does, count lost results;
then edit the state a kill left as a hand or a tool might, and kill a local job's shell under its trainer.

    python benchmarks/fault_harness.py [--cases N] [--seed 0] [--torn 3] [--parts crashes,edits,killed-shell]

One reference run (a tiny BERT on synthetic shards, converging at its third evaluation, a checkpoint
every CHECKPOINT_EVERY updates, every checkpoint kept) gives its MLPerf log and, in each checkpoint
(`log_bytes`), how long that log was when the checkpoint was taken. A SIGKILL at any moment leaves the
log cut at some byte B and, as the latest checkpoint, the newest one taken before the kill: one with
`log_bytes` < B surely, and one with `log_bytes` == B maybe (it was taken when the log had B bytes; the
kill came before or after it). A kill inside a checkpoint write also leaves its `.step_N.partial` folder.

For each line boundary B of the log (each event: step-boundary block events, evaluations, run_stop,
and the init phase), for both candidate checkpoints, and for `--torn` cuts inside lines (a write the
kill tore), the harness rebuilds that state in a fresh folder and does what `bertctl resume` does:
a run whose log holds run_stop is finished (status COMPLETED: not resumed); a run with a checkpoint
continues from it (the trainer, in this process); a run without one starts afresh (the job script
removes its log). It then compares the log with the reference's, event by event (times and measured
throughput aside), and counts:

  same      the events of the uninterrupted run, once each
  lost      the run no longer ends with the reference's run_stop (a converged run became something else)
  doubled   an evaluation or a run_stop logged twice
  different any other difference (a damaged log, another accuracy)

Edited states (`--parts edits`, issue 51): from the state of a kill after the second evaluation, each of EDITS
(a log shortened, cut, deleted, edited or a FIFO; `log_bytes` or `log_sha256` garbled or missing; `latest` naming a
deleted, incomplete or no checkpoint; a checkpoint file damaged, missing or another run's) must be refused by the
resumed trainer: exit 2, one line on stderr naming the file, and every file of the run as it was (`refused`); any
other outcome is `accepted` (it trained on), `changed` (it refused, but after changing a file), `unclear` (not one
line naming the file) or `traceback`. One more state, a complete checkpoint newer than `latest` (a kill between the
rename and the pointer), must resume to the reference log (`same`).

Killed shells (`--parts killed-shell`): a local job (`bertctl submit --cluster local`, the rendered script, the real
trainer) whose shell gets SIGKILL at a moment of its run (while its trainer imports torch, after its first progress
window, after its first and second evaluation). While its trainer lives, `bertctl status` must say RUNNING and
`bertctl resume` must refuse; the trainer must end by itself within KILLED_SHELL_END_S (it watches the shell:
trainer/loop/lifeline.py); then `bertctl resume` must finish the run to the log of an uninterrupted local job.

Prints the counts, the first example of each problem, and the machine and versions. Timings are
noisy on a shared machine; the counts are not.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the synthetic recipe (tests/synthetic.py)
sys.path.insert(0, str(REPO))

from synthetic import tiny_run_config  # noqa: E402

CHECKPOINT_EVERY = 4
RECIPE = dict(optim={"max_steps": 120}, model={"hidden_dropout": 0.0, "attention_dropout": 0.0},
              train={"target_accuracy": 0.04, "eval_every_samples": 80, "eval_start_samples": 80, "log_every_steps": 4},
              runtime={"num_threads": 1}, data={"eval_samples": 100},
              checkpoint={"every_steps": CHECKPOINT_EVERY, "keep": 10_000})
SEED = "0"


@dataclass(frozen=True)
class Crash:
    """What a kill leaves: the log's first `cut` bytes and, as latest, checkpoint `step` (None: none yet)."""

    cut: int
    step: int | None
    partial: bool = False  # a checkpoint write was under way: its staging folder is left behind

    def moment(self, reference: bytes) -> str:
        """What the kill came after: the last whole event's key, a torn line, a checkpoint being written."""
        if self.cut and reference[self.cut - 1:self.cut] != b"\n":
            return "inside a line"
        if self.partial:
            return "during a checkpoint write"
        return _key(reference[:self.cut].rstrip(b"\n").rsplit(b"\n", 1)[-1]) or "start"

    def describe(self, reference: bytes) -> str:
        before = reference[:self.cut].rstrip(b"\n").rsplit(b"\n", 1)[-1]
        key = _key(before) or "the init phase"
        torn = "" if self.cut == 0 or reference[self.cut - 1:self.cut] == b"\n" else " (inside a line)"
        where = f"checkpoint step {self.step}" if self.step is not None else "no checkpoint"
        return f"killed after {key} at byte {self.cut}{torn}, {where}{', a checkpoint half-written' if self.partial else ''}"


def _key(line: bytes) -> str | None:
    try:
        return json.loads(line.decode().partition(":::MLLOG")[2]).get("key")
    except ValueError:
        return None


def train(recipe: Path, out: Path) -> int:
    """One trainer run in this process (the torch import is paid once), its chatter swallowed."""
    return train_and_say(recipe, out)[0]


def train_and_say(recipe: Path, out: Path, limit_s: int = 0) -> tuple[int, str]:
    """One trainer run in this process: its exit code and what it wrote on stderr. With `limit_s`, a run that takes
    longer (one blocked on a FIFO) ends in a Hang."""
    from trainer.loop.entry import main

    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err), time_limit(limit_s):
        return main(["--config", str(recipe), "--out", str(out), "--seed", SEED]), err.getvalue()


class Hang(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: int):
    """SIGALRM after `seconds` (0: none) raises Hang in this thread, even inside a blocking open()."""
    def expire(signum, frame):
        raise Hang(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire) if seconds else None
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        if seconds:
            signal.signal(signal.SIGALRM, previous)


def reference_run(work: Path) -> tuple[Path, Path]:
    recipe = tiny_run_config(work / "recipe", world_size=1, batch_size=8, **RECIPE)
    out = work / "reference"
    code = train(recipe, out)
    if code != 0:
        raise SystemExit(f"the reference run failed (exit {code})")
    return recipe, out


def checkpoint_positions(out: Path) -> dict[int, int]:
    """{update: log bytes} of every checkpoint the reference run kept."""
    folder = out / "checkpoints" / "run_0"
    return {int(p.name.removeprefix("step_")): int((p / "log_bytes").read_text()) for p in folder.glob("step_*")}


def crashes(log: bytes, positions: dict[int, int], torn: int, rng: random.Random) -> list[Crash]:
    """Every line boundary with both candidate checkpoints, and `torn` cuts inside lines."""
    ends = [i + 1 for i, byte in enumerate(log) if byte == ord("\n")]
    cuts = [*ends, *rng.sample(sorted(set(range(1, len(log))) - set(ends)), torn)]
    found = set()
    for cut in cuts:
        surely = max((s for s, at in positions.items() if at < cut), default=None)
        maybe = max((s for s, at in positions.items() if at <= cut), default=None)
        found.add(Crash(cut, surely))
        found.add(Crash(cut, maybe))
        if maybe is not None and maybe != surely:
            found.add(Crash(cut, surely, partial=True))  # killed while writing `maybe`
    return sorted(found, key=lambda c: (c.cut, c.step or -1, c.partial))


def rebuild(crash: Crash, reference: Path, log: bytes, folder: Path) -> Path:
    """The run's folder as the kill left it."""
    (folder / "results").mkdir(parents=True)
    result = folder / "results" / "result_0.txt"
    result.write_bytes(log[:crash.cut])
    checkpoints = folder / "checkpoints" / "run_0"
    checkpoints.mkdir(parents=True)
    if crash.step is not None:
        name = f"step_{crash.step:08d}"
        shutil.copytree(reference / "checkpoints" / "run_0" / name, checkpoints / name)
        (checkpoints / "latest").write_text(name)
    if crash.partial:
        (checkpoints / f".step_{(crash.step or 0) + CHECKPOINT_EVERY:08d}.partial").mkdir()
    return result


FIXED = True  # False: behave as before issue 37 (undo_fixes)


def undo_fixes() -> None:
    """The trainer and status as they were: the log is never rewound, a logged run_stop stops nothing."""
    import trainer.loop.train

    global FIXED
    FIXED = False
    trainer.loop.train.rewind_log = lambda log, position: 0
    trainer.loop.train.logged_run_stop = lambda path: None


def resume(recipe: Path, folder: Path, result: Path) -> str:
    """What `bertctl resume` and the job script do with the run; returns what happened."""
    from orchestrator.results import summary as results

    summary = results.summarize(result)
    if FIXED and summary.finished and summary.problem is None:
        return "finished: not resumed"  # status shows it COMPLETED (orchestrator/jobs/status.py::ended_by_its_log)
    if not (folder / "checkpoints" / "run_0" / "latest").exists():
        result.unlink()  # no checkpoint: `resume` clears runs/N.started and the script starts the log afresh
    code = train(recipe, folder)
    return f"resumed: exit {code}"


def events(log: Path) -> list[tuple]:
    """The log's events without what differs between two runs of the same recipe (times, code lines,
    measured throughput)."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        event = json.loads(line.partition(":::MLLOG")[2])
        meta = {k: v for k, v in event.get("metadata", {}).items() if k not in ("file", "lineno")}
        value = event.get("value")
        if isinstance(value, dict):
            value = {k: v for k, v in value.items() if k != "throughput"}
        out.append((event["key"], json.dumps(value, sort_keys=True), json.dumps(meta, sort_keys=True)))
    return out


def judge(result: Path, expected: list[tuple]) -> str:
    try:
        got = events(result)
    except (OSError, ValueError) as e:
        return f"different: unreadable log ({e})"
    evals = [meta for key, _, meta in got if key == "eval_accuracy"]
    stops = [e for e in got if e[0] == "run_stop"]
    if len(stops) > 1 or len(evals) != len(set(evals)):
        return f"doubled: {len(evals)} evaluations ({len(set(evals))} distinct), {len(stops)} run_stop"
    if not stops or stops[-1] != [e for e in expected if e[0] == "run_stop"][-1]:
        return f"lost: the log ends {stops[-1][2] if stops else 'without run_stop'}"
    if got != expected:
        first = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
        return f"different: event {first + 1}: {got[first] if first < len(got) else 'none'}"
    return "same"


def run_case(crash: Crash, recipe: Path, reference: Path, log: bytes, expected: list[tuple], work: Path) -> tuple[str, str]:
    folder = Path(tempfile.mkdtemp(dir=work, prefix="case-"))
    try:
        result = rebuild(crash, reference, log, folder)
        action = resume(recipe, folder, result)
        return judge(result, expected), action
    except Exception as e:  # noqa: BLE001 - a case that breaks is a count, not the end of the harness
        return f"different: {type(e).__name__}: {e}", "traceback"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# ---- edited states: what a hand or a tool did to the state a kill left ---------------------------------------

@dataclass(frozen=True)
class Edit:
    """A change to a run's folder (`apply(folder)`) after a kill, and the file a refusal must name (relative to
    the folder; None: the state is a legitimate one the run must resume from to the reference log)."""

    name: str
    apply: Callable[[Path], None]
    names: str | None


LOG = "results/result_0.txt"
EDIT_LIMIT_S = 120  # a resume of the tiny run takes seconds: one still running after this is a hang
CHECKPOINTS = "checkpoints/run_0"


def latest_of(folder: Path) -> Path:
    return folder / CHECKPOINTS / (folder / CHECKPOINTS / "latest").read_text().strip()


def _write(relative: str, data: bytes | str) -> Callable[[Path], None]:
    def apply(folder: Path) -> None:
        path = folder / relative if not relative.startswith("@") else latest_of(folder) / relative[1:]
        path.write_bytes(data.encode() if isinstance(data, str) else data)
    return apply


def _cut_log(keep: Callable[[int], int]) -> Callable[[Path], None]:
    def apply(folder: Path) -> None:
        recorded = int((latest_of(folder) / "log_bytes").read_text())
        os.truncate(folder / LOG, keep(recorded))
    return apply


def _edit_log_before_checkpoint(folder: Path) -> None:
    """One digit of the last evaluation the checkpoint saw changed (a hand "fixing" an accuracy)."""
    recorded = int((latest_of(folder) / "log_bytes").read_text())
    log = bytearray((folder / LOG).read_bytes())
    at = log.rfind(b'"eval_accuracy"', 0, recorded)
    at = log.index(b'"value": 0.', at) + len(b'"value": 0.')
    log[at] = ord("9") if log[at] != ord("9") else ord("1")
    (folder / LOG).write_bytes(bytes(log))


def _log_fifo(folder: Path) -> None:
    (folder / LOG).unlink()
    os.mkfifo(folder / LOG)


def _point_latest_at(name: str) -> Callable[[Path], None]:
    return _write(f"{CHECKPOINTS}/latest", name)


def _delete_latest_folder(folder: Path) -> None:
    shutil.rmtree(latest_of(folder))


def _remove(relative: str) -> Callable[[Path], None]:
    def apply(folder: Path) -> None:
        (latest_of(folder) / relative).unlink()
    return apply


def _truncate_shared(folder: Path) -> None:
    path = latest_of(folder) / "shared.pt"
    os.truncate(path, path.stat().st_size // 2)


def _another_runs_checkpoint(folder: Path) -> None:
    """The checkpoint of run 0 with seed 1 (another run's, copied in by hand: its identity.json with it)."""
    import torch

    path = latest_of(folder) / "shared.pt"
    shared = torch.load(path, weights_only=False)
    shared["seed"] = 1
    torch.save(shared, path)
    (path.parent / "identity.json").write_text(json.dumps({"seed": 1, "run_index": 0}))


def _newer_checkpoint_without_pointer(folder: Path) -> None:
    """A copy of the latest checkpoint under a later step, `latest` not updated: a kill between a checkpoint's
    rename and its pointer (the run resumes from the pointer's, and later overwrites the newer folder)."""
    latest = latest_of(folder)
    shutil.copytree(latest, latest.with_name(f"step_{int(latest.name.removeprefix('step_')) + CHECKPOINT_EVERY:08d}"))


EDITS = [
    Edit("log shortened below its checkpoint's length", _cut_log(lambda recorded: recorded - 100), LOG),
    Edit("log cut to nothing", _cut_log(lambda recorded: 0), LOG),
    Edit("log deleted", lambda folder: (folder / LOG).unlink(), LOG),
    Edit("log edited inside what the checkpoint saw", _edit_log_before_checkpoint, LOG),
    Edit("log replaced by a FIFO", _log_fifo, LOG),
    Edit("log_bytes not a number", _write("@log_bytes", "twelve"), "log_bytes"),
    Edit("log_bytes negative", _write("@log_bytes", "-5"), "log_bytes"),
    Edit("log_bytes in exponent form", _write("@log_bytes", "1e3"), "log_bytes"),
    Edit("log_bytes empty", _write("@log_bytes", ""), "log_bytes"),
    Edit("log_bytes in other digits", _write("@log_bytes", "\u0661\u0662"), "log_bytes"),
    Edit("log_bytes two numbers", _write("@log_bytes", "12 34"), "log_bytes"),
    Edit("log_bytes missing", _remove("log_bytes"), "log_bytes"),
    Edit("log_bytes beyond the log", lambda folder: _write("@log_bytes", str((folder / LOG).stat().st_size + 10))(folder), LOG),
    Edit("log_sha256 missing", _remove("log_sha256"), "log_sha256"),
    Edit("log_sha256 garbled", _write("@log_sha256", "0" * 63 + "g"), "log_sha256"),
    Edit("latest names a deleted checkpoint", _delete_latest_folder, "latest"),
    Edit("latest names no checkpoint", _point_latest_at("../../results"), "latest"),
    Edit("latest names a checkpoint never written", _point_latest_at("step_99999999"), "latest"),
    Edit("latest names a folder without shared.pt", _remove("shared.pt"), "latest"),
    Edit("shared.pt cut in half", _truncate_shared, "shared.pt"),
    Edit("shared.pt replaced by garbage", _write("@shared.pt", b"\x80\x04garbage" * 100), "shared.pt"),
    Edit("rank_0.pt missing", _remove("rank_0.pt"), "rank_0.pt"),
    Edit("rank_0.pt empty", _write("@rank_0.pt", b""), "rank_0.pt"),
    Edit("another run's checkpoint", _another_runs_checkpoint, "shared.pt"),
    Edit("a complete checkpoint newer than latest (a legitimate crash state)", _newer_checkpoint_without_pointer, None),
]


def edited_crash(log: bytes, positions: dict[int, int]) -> Crash:
    """The state every edit starts from: killed after the second evaluation, its checkpoint surely before it."""
    ends, at = [], 0
    for line in log.splitlines(keepends=True):
        at += len(line)
        if _key(line) == "eval_accuracy":
            ends.append(at)
    return Crash(ends[1], max(s for s, at in positions.items() if at < ends[1]))


def snapshot(folder: Path) -> dict[str, str]:
    """Every file of the run's folder by its path: its digest (a FIFO as such), to tell whether a refusal changed anything."""
    import hashlib
    import stat

    files = {}
    for path in sorted(folder.rglob("*")):
        mode = path.lstat().st_mode
        if stat.S_ISREG(mode):
            files[str(path.relative_to(folder))] = hashlib.sha256(path.read_bytes()).hexdigest()
        elif not stat.S_ISDIR(mode):
            files[str(path.relative_to(folder))] = "special"
    return files


def run_edit(edit: Edit, crash: Crash, recipe: Path, reference: Path, log: bytes, expected: list[tuple],
             work: Path) -> tuple[str, str]:
    """The edit applied to the crash state, then the trainer resumed: its verdict and what the trainer said."""
    folder = Path(tempfile.mkdtemp(dir=work, prefix="edit-"))
    try:
        result = rebuild(crash, reference, log, folder)
        edit.apply(folder)
        if edit.names is None:
            code, said = train_and_say(recipe, folder, EDIT_LIMIT_S)
            return (judge(result, expected) if code == 0 else f"different: exit {code}"), said.strip()
        before = snapshot(folder)
        code, said = train_and_say(recipe, folder, EDIT_LIMIT_S)
        lines = said.strip().splitlines()
        if code == 0:
            return f"accepted: it trained on, and the log is {judge(result, expected)}", said.strip()
        if "Traceback" in said:
            return "traceback", lines[-1] if lines else ""
        if snapshot(folder) != before:
            return "changed: a file changed before the refusal", said.strip()
        named = str(folder / edit.names) if "/" in edit.names else edit.names
        if code != 2 or len(lines) != 1 or named not in lines[0]:
            return f"unclear: exit {code}, {len(lines)} line(s)", said.strip()
        return "refused", lines[0].replace(str(folder), "RUN")
    except Hang as e:
        return f"hang: {e}", ""
    except Exception as e:  # noqa: BLE001 - a case that breaks is a count, not the end of the harness
        return f"traceback: {type(e).__name__}: {e}", ""
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def edited_states(recipe: Path, reference: Path, log: bytes, expected: list[tuple], work: Path) -> tuple[list[str], int]:
    """Every edit's line, and how many did not end as they should."""
    crash = edited_crash(log, checkpoint_positions(reference))
    lines, wrong = [], 0
    for edit in EDITS:
        verdict, said = run_edit(edit, crash, recipe, reference, log, expected, work)
        wrong += verdict != ("same" if edit.names is None else "refused")
        shown = said.splitlines()[0][:220] if said and not verdict.startswith("accepted") else verdict
        lines.append(f"  {verdict.split(':')[0]:<10}{edit.name}: {shown}")
    head = (f"edited states: {len(EDITS)} edits of the state a kill left ({crash.describe(log)}): "
            f"{len(EDITS) - wrong} as they should end (refused in one line naming the file, nothing changed; the "
            f"legitimate one resumed to the same log), {wrong} not")
    return [head, *lines], wrong


# ---- killed shells: a local job whose shell is SIGKILLed under its trainer ---------------------------------------

KILLED_SHELL_END_S = 60  # the trainer's watch notices within a second; it stops at its next report, after a checkpoint
KILL_MOMENTS = ("while its trainer imports torch", "after its first progress window", "after its first evaluation",
                "after its second evaluation")


def local_cluster(work: Path, recipe: Path, name: str = "fault_harness") -> Path:
    """clusters/local.yaml running the recipe, as cluster `name` (work/NAME.yaml; tests/test_local_resume.py uses it)."""
    import yaml

    raw = yaml.safe_load((REPO / "clusters" / "local.yaml").read_text())
    run = yaml.safe_load(recipe.read_text())
    run.pop("world_size")
    raw.update(name=name, prepare={}, run=run)
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def bertctl(*args: str) -> subprocess.CompletedProcess:
    """`bertctl ARGS` as a user runs it, in this harness's BERTCTL_HOME (the venv's bin/ first on PATH, for the job)."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=300)


def view(exp: str):
    from orchestrator import experiments
    from orchestrator.jobs import status

    return status.collect([experiments.find(exp)])[0]


def wait_for(predicate, seconds: float, every: float = 0.05) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every)
    return False


def trainer_of(job: int) -> int | None:
    """The job's trainer (not its `python -m trainer.mlperf cache-clear`), found in the job's session."""
    out = subprocess.run(["pgrep", "-s", str(job), "-f", "[-]m trainer --config"], capture_output=True, text=True).stdout.split()
    return int(out[0]) if out else None


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def finished_log(exp: str) -> Path | None:
    """The job's result log, once the experiment has ended."""
    if not wait_for(lambda: view(exp).state.value not in ("PENDING", "RUNNING"), 600, every=1.0):
        return None
    from orchestrator import experiments

    return experiments.find(exp).result_file(0)


def submit(cluster: Path) -> tuple[str, int]:
    done = bertctl("submit", "--cluster", str(cluster))
    if done.returncode:
        raise RuntimeError(f"bertctl submit failed: {done.stderr.strip()[-500:]}")
    exp = done.stdout.strip()
    from orchestrator import experiments

    return exp, int(experiments.find(exp).job_ids[0])


def kill_moment_reached(moment: str, exp: str, job: int) -> bool:
    from orchestrator import experiments

    path = experiments.find(exp).path
    metrics, result = path / "metrics" / "run_0.jsonl", path / "results" / "result_0.txt"
    if moment == KILL_MOMENTS[0]:
        return wait_for(lambda: trainer_of(job) is not None, 300)
    if moment == KILL_MOMENTS[1]:
        return wait_for(lambda: metrics.exists() and metrics.read_text().count("\n") >= 1, 300, every=0.02)
    evaluations = 1 if moment == KILL_MOMENTS[2] else 2
    return wait_for(lambda: result.exists() and result.read_bytes().count(b'"eval_accuracy"') >= evaluations, 300, every=0.02)


def killed_shell_case(moment: str, cluster: Path, expected: list[tuple]) -> tuple[str, str]:
    """Kill the job's shell at `moment`; what status and resume said while the trainer lived, how it ended, and the
    resumed run's log against the reference's. Returns (verdict, what happened). Whatever it left running (a second
    job beside the first, a trainer that lingered) is stopped before the next case."""
    started: list[int] = []
    try:
        return killed_shell_steps(moment, cluster, expected, started)
    finally:
        stop_everything(started)


def stop_everything(pids: list[int]) -> None:
    """SIGKILL to each process this case started or found that still runs as this harness's (its BERTCTL_HOME: a
    pid that ended may be another's by now), and to the group it leads."""
    for pid in [pid for pid in pids if ours(pid)]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
            os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not any(ours(pid) for pid in pids), 10)


def ours(pid: int) -> bool:
    """Process `pid` lives and runs in this harness's BERTCTL_HOME (its environment says so)."""
    try:
        variables = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return alive(pid) and f"BERTCTL_HOME={os.environ['BERTCTL_HOME']}".encode() in variables


def killed_shell_steps(moment: str, cluster: Path, expected: list[tuple], started: list[int]) -> tuple[str, str]:
    from orchestrator import experiments
    from orchestrator.errors import UserError
    from orchestrator.jobs import lifecycle

    exp, job = submit(cluster)
    started.append(job)
    if not kill_moment_reached(moment, exp, job):
        return "different: the moment never came", ""
    trainer = trainer_of(job)
    started += [trainer] if trainer is not None else []
    os.kill(job, signal.SIGKILL)
    killed = time.monotonic()
    wait_for(lambda: not alive(job), 10)  # the signal is delivered, and init has reaped the shell
    said = []
    if trainer is not None and alive(trainer):
        state = view(exp).state.value
        try:
            started += [int(j) for j in lifecycle.resume(experiments.find(exp)).job_ids]
            refused = False
        except UserError:
            refused = True
        lives = alive(trainer)
        said.append(f"status {state} and resume {'refused' if refused else 'ACCEPTED'} while the trainer "
                    f"{'lived' if lives else 'was ending'}")
        if lives and state != "RUNNING":
            return f"lied: status {state} while the trainer ran", "; ".join(said)
        if not refused:
            return "second trainer: resume started a job beside the running trainer", "; ".join(said)
    if not wait_for(lambda: trainer is None or not alive(trainer), KILLED_SHELL_END_S, every=0.2):
        return f"lingered: the trainer trained on {KILLED_SHELL_END_S} s after its shell was killed", "; ".join(said)
    said.append(f"its trainer ended {time.monotonic() - killed:.1f} s after the kill")
    if not wait_for(lambda: view(exp).state.value not in ("PENDING", "RUNNING"), 60, every=0.5):
        return "lingered: the job's session outlived its trainer", "; ".join(said)
    said.append(f"status then {view(exp).state.value}")
    if view(exp).state.value == "COMPLETED":  # it finished its run before its next progress line: nothing to resume
        return judge(experiments.find(exp).result_file(0), expected), "; ".join(said)
    resumed = bertctl("resume", exp)
    started += [int(j) for j in experiments.find(exp).job_ids]
    if resumed.returncode:
        return f"lost: resume refused ({resumed.stderr.strip()[-200:]})", "; ".join(said)
    log = finished_log(exp)
    return (judge(log, expected) if log is not None else "lost: the resumed job never ended"), "; ".join(said)


def killed_shells(work: Path) -> tuple[list[str], int]:
    """Every kill moment's line, and how many did not end as they should. The recipe never reaches its target (it
    stops at its step limit, after a dozen evaluations), so that each kill comes mid-run."""
    os.environ["BERTCTL_HOME"] = str(work / "home")
    recipe = tiny_run_config(work / "recipe-killed-shell", world_size=1, batch_size=8,
                             **{**RECIPE, "train": {**RECIPE["train"], "target_accuracy": 0.99}})
    cluster = local_cluster(work, recipe)
    started = time.time()
    reference_exp, _ = submit(cluster)
    log = finished_log(reference_exp)
    if log is None or view(reference_exp).state.value != "COMPLETED":
        return [f"killed shells: the uninterrupted local job did not complete ({view(reference_exp).state.value})"], 1
    expected = events(log)
    lines, wrong = [], 0
    for moment in KILL_MOMENTS:
        try:
            verdict, said = killed_shell_case(moment, cluster, expected)
        except Exception as e:  # noqa: BLE001 - a case that breaks is a count
            verdict, said = f"traceback: {type(e).__name__}: {e}", ""
        wrong += verdict != "same"
        lines.append(f"  {verdict.split(':')[0]:<15}killed {moment}: {said}" + ("" if verdict == "same" else f" ({verdict})"))
    head = (f"killed shells: {len(KILL_MOMENTS)} local jobs (the rendered script, the real trainer) whose shell got SIGKILL, "
            f"against an uninterrupted local job's log ({len(expected)} events): {len(KILL_MOMENTS) - wrong} resumed to the "
            f"same log, {wrong} not (the part took {time.time() - started:.0f} s)")
    return [head, *lines], wrong


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=0, help="at most this many crash states, drawn at random (0: all)")
    parser.add_argument("--torn", type=int, default=3, help="cuts inside a line, drawn at random")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--with-checkpoint", action="store_true",
                        help="only the crash states with a checkpoint (the others start afresh, the same with or without the fixes)")
    parser.add_argument("--without-fixes", action="store_true",
                        help="as before issue 37: no log rewind; a logged run_stop neither stops the trainer nor counts as finished")
    parser.add_argument("--parts", default="crashes,edits,killed-shell",
                        help="which parts to run, comma-separated: crashes, edits, killed-shell")
    args = parser.parse_args(argv)
    parts = set(args.parts.split(","))
    if parts - {"crashes", "edits", "killed-shell"}:
        parser.error(f"--parts: unknown part(s) {', '.join(sorted(parts - {'crashes', 'edits', 'killed-shell'}))}")
    if args.without_fixes:
        undo_fixes()
    rng = random.Random(args.seed)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="fault-harness-") as tmp:
        work = Path(tmp)
        recipe, reference = reference_run(work)
        result = reference / "results" / "result_0.txt"
        log, expected = result.read_bytes(), events(result)
        cases = crashes(log, checkpoint_positions(reference), args.torn, rng) if "crashes" in parts else []
        if args.with_checkpoint:
            cases = [c for c in cases if c.step is not None]
        if args.cases:
            cases = sorted(rng.sample(cases, min(args.cases, len(cases))), key=lambda c: (c.cut, c.step or -1))
        counts, examples, actions, moments = Counter(), {}, Counter(), Counter()
        for crash in cases:
            verdict, action = run_case(crash, recipe, reference, log, expected, work)
            kind = verdict.split(":")[0]
            counts[kind] += 1
            actions[action] += 1
            moments[(crash.moment(log), kind)] += 1
            examples.setdefault(kind, f"{crash.describe(log)}: {verdict}")
        if cases:
            print(report(counts, examples, actions, len(log), len(expected), time.time() - started))
            print("by the moment of the kill (the last whole event before it): " +
                  ", ".join(f"{moment} {kind} {n}" for (moment, kind), n in sorted(moments.items())))
        wrong = 0
        for part, run_part in (("edits", lambda: edited_states(recipe, reference, log, expected, work)),
                               ("killed-shell", lambda: killed_shells(work))):
            if part in parts:
                lines, bad = run_part()
                print("\n".join(lines), flush=True)
                wrong += bad
    return 0 if set(counts) <= {"same"} and not wrong else 1


def report(counts: Counter, examples: dict, actions: Counter, size: int, events_count: int, seconds: float) -> str:
    import torch

    lines = [f"fault harness: {sum(counts.values())} crash states of one converged run "
             f"({events_count} events, {size} bytes of log, a checkpoint every {CHECKPOINT_EVERY} updates)"]
    for kind in ("same", "lost", "doubled", "different"):
        lines.append(f"  {kind:<10}{counts.get(kind, 0):>6}")
    lines.append("what resume did: " + ", ".join(f"{n} {a}" for a, n in sorted(actions.items())))
    for kind, example in examples.items():
        if kind != "same":
            lines.append(f"first {kind}: {example}")
    lines.append(f"took {seconds:.0f} s on {platform.node() and platform.machine()}, {os.cpu_count()} CPU(s) "
                 f"(shared: timings are noisy), Python {platform.python_version()}, torch {torch.__version__}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
