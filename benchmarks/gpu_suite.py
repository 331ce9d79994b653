"""The GPU suite: everything bertctl does on a GPU, checked and measured in stages, within a budget.

    bash benchmarks/gpu/device_run.sh --budget 480 --out gpu-run    # on a GPU machine: wheels, machine, suite
    python benchmarks/gpu_suite.py --device cpu --quick --out DIR   # the same code on a CPU, tiny shapes

Stages, in the order a first contact with a GPU most needs them (benchmarks/gpu/stages.py says what
each proves): a environment, b product (bertctl submit end to end, compliance included), c parity and
attention backends, d bf16/fp16 steps with the overflow case, e throughput Hugging Face vs ours (FP8 and
MLPerf's length mix included), f torchrun clip-mode runs and the steady-state sync count, g apex, h the profile,
i the trainer's own rate, j attention kernels (cuDNN's SDPA measured), k FP8 against bf16 over 300 updates.

Each stage runs in a child process with its own time limit and writes OUT/<key>_<name>.json the
moment it ends (pass, fail with its one-line reason, or skip saying why); `--budget SECONDS` skips
the stages whose expected time no longer fits and says so in their records. Every child's stderr
goes to OUT/suite.log. The last line printed is one JSON object with every record; a run cut short
leaves the records of the stages it finished. Bad input (no GPU for --device cuda, a package this
Python lacks) is one line and exit 2 before any stage starts.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "benchmarks")]

from gpu.children import child_env, last_error_line  # noqa: E402
from gpu.stages import BY_NAME, STAGES, Stage, write_record  # noqa: E402

# what the product path imports beyond torch: a missing one is a carried wheel not installed
NEEDED = ["pydantic", "yaml", "jinja2", "numpy", "h5py", "mlperf_logging.mllog", "trainer.config", "trainer.mlperf",
          "orchestrator.cli", "orchestrator.results.summary", "orchestrator.results.compliance"]
HINT = "make gpu-wheels, then bash benchmarks/gpu/device_run.sh installs it"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--quick", action="store_true", help="tiny shapes (a rehearsal of the suite's code, not a measurement)")
    parser.add_argument("--out", metavar="DIR", default="gpu-run", help="where the stages' records and suite.log go (default gpu-run)")
    parser.add_argument("--budget", metavar="SECONDS", type=float, default=540,
                        help="skip the stages whose expected time no longer fits (default 540)")
    parser.add_argument("--stages", metavar="NAMES", help="comma-separated stage names (default: all, in order)")
    parser.add_argument("--stage", help=argparse.SUPPRESS)  # the child: run this one stage
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def preflight(args: argparse.Namespace) -> str | None:
    """What makes the suite unable to start, in one line; None when it can."""
    if problem := settings_problem(args):  # first: they need no import
        return problem
    for module in NEEDED:
        try:
            __import__(module)
        except ImportError as e:
            return f"this Python ({sys.executable}) cannot import {e.name or module} ({e}): {HINT}"
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        return "no CUDA device here (torch sees none; use --device cpu --quick for a rehearsal on the CPU)"
    unknown = [n for n in (args.stages or "").split(",") if n and n not in BY_NAME]
    if unknown:
        return f"--stages: unknown {unknown}; the stages are {', '.join(BY_NAME)}"
    return None


def settings_problem(args: argparse.Namespace) -> str | None:
    """A run that would check nothing (no stage, no budget) or write nowhere (--out), in one line."""
    if args.stages is not None and not any(args.stages.split(",")):
        return f"--stages names no stage; the stages are {', '.join(BY_NAME)}"
    if not (math.isfinite(args.budget) and args.budget > 0):
        return f"--budget must be a positive number of seconds, got {args.budget}"
    return out_problem(args.out)


def out_problem(out: str) -> str | None:
    """--out must be a folder the suite can write its records into (made here if missing; a probe file
    is written and removed): checked before any stage runs, so a bad one is one line, not a traceback."""
    if not out.strip():
        return "--out is empty; expected a folder for the records (default gpu-run)"
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        return f"--out {out}: is a file, not a folder"
    made = next((p for p in reversed([folder, *folder.absolute().parents]) if not p.exists()), None)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".write-probe"
        probe.write_text("probe")
        probe.unlink()
        return None
    except OSError as e:
        return f"--out {out}: cannot write there: {e.strerror or e}"
    finally:  # a refusal leaves nothing behind; the suite makes the folder again when it runs
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)


def run_child_stage(args: argparse.Namespace) -> int:
    """In the child: one stage, its record written the moment it ends."""
    stage, out = BY_NAME[args.stage], Path(args.out)
    # stopped by the suite: unwind (the product stage cancels its detached job, children are killed)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    started = time.perf_counter()
    try:
        from gpu.stages import run_stage

        record = run_stage(stage.name, args.device, args.quick, args.deadline, out / "suite.log")
    except Exception as e:  # noqa: BLE001 - a failed stage is a result: its reason, and the suite goes on
        traceback.print_exc()
        record = {"status": "fail", "reason": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]}
    write_record(out, stage, {**record, "seconds": round(time.perf_counter() - started, 1)})
    return 0


class Interrupted(Exception):
    pass


def on_signal(signum, frame):
    raise Interrupted(signal.Signals(signum).name)


def run_stage_process(args: argparse.Namespace, stage: Stage, timeout: float, log: Path) -> dict:
    """One stage in its own process (its own group: a timeout ends what it started); its record."""
    out = Path(args.out)
    command = [sys.executable, str(Path(__file__).resolve()), "--stage", stage.name, "--device", args.device,
               "--out", str(out), "--deadline", str(time.time() + timeout)] + (["--quick"] if args.quick else [])
    started = time.perf_counter()
    log_offset = log.stat().st_size if log.exists() else 0
    with open(log, "a") as err:
        err.write(f"==== stage {stage.key}_{stage.name}: {' '.join(command)}\n")
        err.flush()
        proc = subprocess.Popen(command, stderr=err, stdin=subprocess.DEVNULL, cwd=REPO, env=child_env(), start_new_session=True)
        interrupted = False
        try:
            # the child ends its own children at the deadline and then writes its record; this is for a
            # stage hung in its own process (a run may overrun its budget by these seconds, and the 10 below)
            proc.wait(timeout=timeout + 10)
            ended = f"exit {proc.returncode}"
        except subprocess.TimeoutExpired:
            ended = f"killed after {timeout:.0f} s, its time limit"
        except Interrupted as e:
            ended, interrupted = f"interrupted by {e} (the suite was stopped)", True
        finally:
            if proc.poll() is None:
                kill_group(proc)
    seconds = round(time.perf_counter() - started, 1)
    path = out / stage.file
    # an interrupted child's own record is not trusted: a library may swallow the SystemExit its SIGTERM
    # raised mid-import, and the stage then fails for a reason that is only the interruption's echo
    if path.exists() and proc.returncode == 0 and not interrupted:
        return json.loads(path.read_text())
    with open(log) as f:
        f.seek(log_offset)
        tail = last_error_line(f.read())
    record = {"status": "fail", "reason": f"{ended}: {tail}"[:300], "seconds": seconds}
    write_record(out, stage, record)
    return json.loads(path.read_text())


def kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM first (the product stage cancels its detached job), SIGKILL 10 s later."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=wait)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def run_suite(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "suite.log"
    wanted = args.stages.split(",") if args.stages else [s.name for s in STAGES]
    # an earlier call's record of a stage this call runs would read as this call's; the others stay (stage i compares
    # the trainer with stage e's record of an earlier call into the same folder) and suite.log gains this call's lines
    for stale in [out / s.file for s in STAGES if s.name in wanted]:
        stale.unlink(missing_ok=True)
    budget_end = time.time() + args.budget
    signal.signal(signal.SIGTERM, on_signal)
    records = []
    for stage in [s for s in STAGES if s.name in wanted]:
        left = budget_end - time.time()
        expected, limit = stage.seconds(args.quick)
        if left < expected:
            record = {"status": "skip", "reason": f"the budget has {max(left, 0):.0f} s left, the stage expects {expected} s",
                      "seconds": 0}
            write_record(out, stage, record)
            record = {"stage": f"{stage.key}_{stage.name}", **record}
        else:
            print(f"[stage {stage.key}] {stage.name}: {stage.proves} (expected {expected} s, at most {min(limit, left):.0f} s)",
                  flush=True)
            try:
                record = run_stage_process(args, stage, min(limit, left), log)
            except Interrupted:
                break
        records.append(record)
        print(f"[{record['status']:>4}] {record['stage']} ({record['seconds']} s)"
              + (f": {record['reason']}" if record.get("reason") else ""), flush=True)
        if record.get("reason", "").startswith("interrupted by"):
            print(json.dumps({"suite": "bertctl gpu_suite", "interrupted": True, "records": records}))
            return 143
    skipped = [r["stage"] for r in records if r["status"] == "skip" and r.get("reason", "").startswith("the budget")]
    if skipped:
        print(f"skipped for the budget ({args.budget:.0f} s): {', '.join(skipped)}", flush=True)
    ran = [r for r in records if r["status"] != "skip"]
    if not ran:
        print("no stage ran: nothing was checked, so nothing passed", flush=True)
    passed = bool(ran) and all(r["status"] != "fail" for r in records)
    print(json.dumps({"suite": "bertctl gpu_suite", "quick": args.quick, "device": args.device, "out": str(out),
                      "passed": passed, "records": records}))
    return 0 if passed else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.stage:
        return run_child_stage(args)
    problem = preflight(args)
    if problem:
        print(f"gpu_suite: {problem}", file=sys.stderr)
        return 2
    return run_suite(args)


if __name__ == "__main__":
    sys.exit(main())
