"""Hostile MLPerf result logs against compliance-check, status and plot: tracebacks, hangs, wrong verdicts.

    python benchmarks/hostile_logs.py [--random 120] [--seed 0] [--timeout 20] [--plot-every 1]

Generates damaged logs from valid ones (tests/mllog_factory.py): every case of tests/hostile_logs.py
(time, order, accuracy, counts, key, types, lines, file) on four different valid runs, plus random
edits (one to three fields of random events set to hostile JSON: NaN, 1e400, huge integers, strings,
lists, null, ...). Each log is run through, in this process with a SIGALRM timeout:

- `compliance-check --results DIR --no-score` on the log alone: a malformed log judged PASSED (exit 0)
  is a wrong verdict (the random edits have no known verdict and only count for tracebacks and hangs);
- `status --json` with the log as run 0 of one experiment beside a valid experiment: it must list
  both, exit 0;
- `plot --results DIR --out PNG`: exit 0 with a whole PNG, or one line and exit 2 with no PNG and no
  temporary file left (a half-written output).

As root, also plot and package onto a full tmpfs and count what they leave behind. Prints the counts,
with the machine and versions.
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
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

import hostile_logs  # noqa: E402  (tests/: the damage cases, shared with tests/test_hostile_logs.py)
import mllog_factory as f  # noqa: E402

HOSTILE_JSON = ["NaN", "Infinity", "-Infinity", "1e400", "1" + "0" * 40, "null", "true", "false", "[]", "{}", '"x"',
                '""', "-1", "0", "1e15", "1e20", "4102444800000", "[[[[1]]]]", '{"status": 5}', '"success"', "0.5", "2"]
FIELDS = [("time_ms", None), ("value", None), ("metadata", None), ("key", None), ("epoch_num", "metadata"),
          ("samples_count", "metadata"), ("status", "metadata")]


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang()


def bertctl(args: list[str], timeout: int) -> tuple[int | str, str, str]:
    """(exit code | 'traceback' | 'hang', stdout, stderr) of `bertctl ARGS` in this process."""
    from orchestrator.cli import main

    out, err = io.StringIO(), io.StringIO()
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(timeout)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(args)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 2
    except Hang:
        code = "hang"
    except Exception as e:  # noqa: BLE001 - what we count
        code = "traceback"
        err.write(f"Traceback: {type(e).__name__}: {e}")
    finally:
        signal.alarm(0)
    if code != "hang" and "Traceback" in err.getvalue():
        code = "traceback"
    return code, out.getvalue(), err.getvalue()


def random_case(rng: random.Random, k: int) -> hostile_logs.Case:
    edits = [(rng.random(), rng.choice(FIELDS), rng.choice(HOSTILE_JSON)) for _ in range(rng.randint(1, 3))]

    def damage(lines):
        events = [n for n, line in enumerate(lines) if hostile_logs.MARK in line]
        for where, (name, within), raw in edits:
            i = events[int(where * len(events))]
            if within and not isinstance(hostile_logs.event_of(lines[i]).get(within), dict):
                within = None
            lines[i] = hostile_logs.with_field(lines[i], name, raw, within)
        return lines

    return hostile_logs.Case(f"random/{k}", damage, reason="")


def base_specs() -> list:
    """Four valid, converged runs of different shapes."""
    example = f.example_specs(legacy_keys=False)
    return [example[0], example[5], f.tiny_closed_specs(1)[0], f.RunSpec(seed=3, tracked_stats=True, legacy_keys=False)]


def whole_png(path: Path) -> bool:
    data = path.read_bytes() if path.is_file() else b""
    return data[:8] == b"\x89PNG\r\n\x1a\n" and data.rstrip(b"\0").endswith(b"IEND\xaeB`\x82")


def run_case(case, valid: Path, work: Path, good_exp, timeout: int, counts: dict, plot: bool) -> None:
    logs = work / "logs"
    logs.mkdir(parents=True)
    log = logs / "result_0.txt"
    shutil.copyfile(valid, log)
    case.apply(log)
    known_bad = not case.name.startswith("random/")
    counts["cases"] += 1
    counts["known malformed"] += known_bad

    code, _, err = bertctl(["compliance-check", "--results", str(logs), "--no-score"], timeout)
    tally(counts, case, "compliance-check", code, err)
    if known_bad and code == 0:
        counts["wrong verdicts"] += 1
        counts["examples"].append(f"{case.name}: compliance-check PASSED a malformed log")

    exp = f.make_experiment([f.RunSpec(legacy_keys=False)])
    shutil.copyfile(valid, exp.result_file(0))
    case.apply(exp.result_file(0))
    code, out, err = bertctl(["status", "--json"], timeout)
    tally(counts, case, "status", code, err)
    if code == 0:
        listed = {v["id"] for v in json.loads(out)["experiments"]}
        if not {exp.id, good_exp.id} <= listed:
            counts["status blinded"] += 1
            counts["examples"].append(f"{case.name}: status did not list every experiment")
    elif code not in ("hang", "traceback"):
        counts["status blinded"] += 1
        counts["examples"].append(f"{case.name}: status exit {code}: {err.strip()[:120]}")
    shutil.rmtree(exp.path)  # the registry is its folders: the next case sees only the valid experiment

    if plot:
        png = work / "out" / "plot.png"
        png.parent.mkdir()
        code, _, err = bertctl(["plot", "--results", str(logs), "--out", str(png)], timeout)
        tally(counts, case, "plot", code, err)
        left = [p.name for p in png.parent.iterdir()]
        if (code == 0 and (left != ["plot.png"] or not whole_png(png))) or (code != 0 and left):
            counts["half-written outputs"] += 1
            counts["examples"].append(f"{case.name}: plot exit {code} left {left}")


def tally(counts: dict, case, verb: str, code, err: str) -> None:
    if code == "traceback":
        counts["tracebacks"] += 1
        counts["examples"].append(f"{case.name}: {verb}: {err.strip().splitlines()[-1][:160]}")
    elif code == "hang":
        counts["hangs"] += 1
        counts["examples"].append(f"{case.name}: {verb} ran past the timeout")
    elif code == 2 and len(err.strip().splitlines()) != 1:
        counts["not one line"] += 1
        counts["examples"].append(f"{case.name}: {verb}: {len(err.strip().splitlines())} lines on exit 2")


@contextlib.contextmanager
def tmpfs(mount: Path, size: str):
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True)
    try:
        yield mount if done.returncode == 0 else None
    finally:
        if done.returncode == 0:
            subprocess.run(["umount", "-l", str(mount)], check=False)


def full_disk(work: Path, timeout: int, counts: dict) -> str:
    """plot and package onto a tmpfs too small for them: what is left behind, and whether a retry works."""
    if os.geteuid() != 0:
        return "full disk: skipped (mounting a tmpfs needs root)"
    exp = f.make_experiment(f.example_specs(legacy_keys=False))
    attempts = 0
    for size in ("48k", "96k", "160k"):
        with tmpfs(work / f"plot-{size}", size) as mount:
            if mount is None:
                return "full disk: skipped (cannot mount a tmpfs here)"
            code, _, err = bertctl(["plot", exp.id, "--out", str(mount / "c.png")], timeout)
            attempts += 1
            tally(counts, hostile_logs.Case(f"full disk/plot {size}", None, ""), "plot", code, err)
            left = [p.name for p in mount.iterdir()]
            if code != 0 and left or code == 0 and not whole_png(mount / "c.png"):
                counts["half-written outputs"] += 1
                counts["examples"].append(f"plot onto a {size} disk: exit {code}, left {left}")
        with tmpfs(work / f"pkg-{size}", size) as mount:
            code, _, err = bertctl(["package", exp.id, "--org", "Org", "--out", str(mount / "pkg")], timeout)
            attempts += 1
            tally(counts, hostile_logs.Case(f"full disk/package {size}", None, ""), "package", code, err)
            files = [p for p in mount.rglob("*") if not p.is_dir()]
            if code == 2 and (files or (mount / "pkg" / "Org").exists()):
                counts["half-written outputs"] += 1
                counts["examples"].append(f"package onto a {size} disk left {len(files)} file(s)")
    return f"full disk: {attempts} plot/package attempts onto 48-160 KiB tmpfs"


def versions() -> str:
    from importlib.metadata import version

    cores = os.cpu_count()
    return (f"machine: {platform.machine()}, {cores} CPUs; python {platform.python_version()}; "
            f"mlperf-logging {version('mlperf-logging')}; matplotlib {version('matplotlib')}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--random", type=int, default=120, help="random edits on top of the table's cases")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=int, default=20, help="seconds before a verb counts as a hang")
    parser.add_argument("--plot-every", type=int, default=1, metavar="N",
                        help="plot every Nth case only (0: none); a plot takes seconds on a small machine")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hostile-logs-"))
    os.environ["BERTCTL_HOME"] = str(work / "home")
    os.environ.pop("BERTCTL_CLUSTERS", None)
    rng = random.Random(args.seed)
    counts = {"cases": 0, "known malformed": 0, "tracebacks": 0, "hangs": 0, "wrong verdicts": 0,
              "status blinded": 0, "half-written outputs": 0, "not one line": 0, "plots": 0, "examples": []}
    started = time.monotonic()
    try:
        valids = [f.write_log(work / f"valid_{i}.txt", spec) for i, spec in enumerate(base_specs())]
        good_exp = f.make_experiment([f.RunSpec(legacy_keys=False)])
        # matplotlib's first figure (imports, fonts) takes tens of seconds on a loaded machine: not a hang
        warm = time.monotonic()
        bertctl(["plot", good_exp.id, "--out", str(work / "warm-up.png")], timeout=600)
        warm = time.monotonic() - warm
        cases = [(case, valid) for valid in valids for case in hostile_logs.cases()]
        cases += [(random_case(rng, k), rng.choice(valids)) for k in range(args.random)]
        per_class: dict[str, int] = {}
        for k, (case, valid) in enumerate(cases):
            per_class[case.cls] = per_class.get(case.cls, 0) + 1
            plot = args.plot_every > 0 and k % args.plot_every == 0
            counts["plots"] += plot
            run_case(case, valid, work / f"case_{k}", good_exp, args.timeout, counts, plot=plot)
        disk = full_disk(work, args.timeout, counts)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(versions())
    print(f"cases: {counts['cases']} damaged logs ({counts['known malformed']} known malformed), by class: "
          + ", ".join(f"{cls} {n}" for cls, n in sorted(per_class.items())))
    print(f"verbs: compliance-check --no-score and status --json on each, plot on {counts['plots']}; {disk}")
    for key in ("tracebacks", "hangs", "wrong verdicts", "status blinded", "half-written outputs", "not one line"):
        extra = f" > {args.timeout} s" if key == "hangs" else " (malformed judged PASSED)" if key == "wrong verdicts" else ""
        print(f"{key}{extra}: {counts[key]}")
    for example in counts["examples"][:20]:
        print(f"  {example}")
    print(f"wall time: {time.monotonic() - started:.0f} s (matplotlib's first plot, untimed: {warm:.1f} s); "
          f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
