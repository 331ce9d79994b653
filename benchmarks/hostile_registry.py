"""Hostile input against the registry, references, node.env, files and YAML: generated cases, counted.

    python benchmarks/hostile_registry.py [--cases 300] [--seed 0] [--jobs 2] [--timeout 20] [--classes record,env,...]

Every case builds its own $BERTCTL_HOME (an experiment registry with one good experiment and, for
some classes, one damaged one) and runs one `bertctl` verb as a process, as a user would, with a
timeout. Classes (drawn in turn, values drawn at random from the seed):

  record     a damaged experiment.json (mutated key, truncated, bytes, FIFO, device, folder): `status`
             must list the good one and mark the damaged one; `cancel`/`diff` naming it: one line
  reference  empty, blank, path-like, long, glob or random references, and real prefixes: `cancel`,
             `status`, `diff`, `logs` refuse in one line, or find exactly the experiment they name
  env        node.env names: the job script's own and bash's are refused, ordinary ones accepted
  fifo       a FIFO, /dev/zero or a folder as a cluster file, manifest, --bert-config or experiment file
  yaml       YAML 1.1 surprises (010, 1:30, yes, merge keys) and hidden characters in cluster files
  bounds     --nexp, balance --ranks/--batch/--steps/--seed beyond their bounds

and counts: tracebacks, hangs (past the timeout), wrong outcomes (exit code or message not the one
expected), half-written outputs (a file a refused or read-only verb created or changed). Prints
the counts per class, the first example of each problem, and the machine and versions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import string
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the valid record it damages (tests/registry_records.py)

from registry_records import record  # noqa: E402

GOOD = "c-20260101-000000-aaaaaaaa"
BAD = "c-20260101-000002-cccccccc"
RESERVED = ["NEXP", "EXP_DIR", "SEEDS", "PYTHON", "MASTER_ADDR", "MASTER_PORT", "NTASKS", "WHERE", "CONTAINER",
            "BERTCTL_SEED", "BERTCTL_RUN_INDEX", "BERTCTL_HOME", "JOB_DIR", "FIRST", "SLURM_JOB_ID", "UID", "EUID",
            "PPID", "SHELLOPTS", "BASHOPTS", "BASH_ENV", "BASH_XTRACEFD", "IFS", "PIPESTATUS", "SECONDS", "RANDOM"]
ALLOWED = ["NCCL_DEBUG", "NCCL_IB_HCA", "GLOO_SOCKET_IFNAME", "OMP_NUM_THREADS", "PYTHONPATH", "UCX_TLS", "MY_VAR"]
ODD_VALUES = [None, "", "x", -1, 0, 10**12, 2**64, 1e308, True, False, [], {}, ["a"], [1.5], "\ud800", "[/bold]",
              "../../etc", "1; rm -rf ~", "\n", float("nan"), float("inf")]
HIDDEN = ["\u2028", "\u2029", "\u202e", "\u2066", "\u200b", "\x85", "\x1b", "\x7f", "\n", "\r", "\t"]  # (argv cannot hold NUL)
ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}\Z")  # what an experiment id may look like


@dataclass
class Case:
    kind: str
    args: list[str]
    expect: object  # callable(code, out, err) -> str | None (what is wrong)
    home: Path
    watch: Path | None = None  # a folder that must not change
    setup_note: str = ""


@dataclass
class Tally:
    cases: int = 0
    tracebacks: int = 0
    hangs: int = 0
    wrong: int = 0
    half_written: int = 0
    examples: list[str] = field(default_factory=list)


def add_experiment(home: Path, exp_id: str, created: float = 1.0) -> Path:
    exp_dir = home / "experiments" / exp_id
    exp_dir.mkdir(parents=True)
    (exp_dir / "experiment.json").write_text(json.dumps(record(exp_dir, created=created)))
    (exp_dir / "cluster.yaml").write_text("name: c\n")
    return exp_dir


def damage_record(rng: random.Random, path: Path) -> str:
    """Damage experiment.json at `path` one random way; returns how."""
    how = rng.choice(["value", "value", "value", "drop", "truncate", "bytes", "fifo", "device", "folder", "deep", "digits"])
    data = record(path.parent)
    if how == "value":
        key = rng.choice(sorted(data))
        data[key] = rng.choice(ODD_VALUES)
        path.write_text(json.dumps(data))
        return f"{key}={data[key]!r}"[:60]
    if how == "drop":
        key = rng.choice(sorted(data))
        del data[key]
        path.write_text(json.dumps(data))
        return f"without {key}"
    if how == "truncate":
        text = json.dumps(data)
        path.write_text(text[: rng.randrange(len(text))])
        return "truncated"
    if how == "bytes":
        path.write_bytes(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))))
        return "random bytes"
    if how == "fifo":
        os.mkfifo(path)
        return "FIFO"
    if how == "device":
        path.symlink_to("/dev/zero")
        return "/dev/zero"
    if how == "folder":
        path.mkdir()
        return "a folder"
    if how == "deep":
        path.write_text("[" * 200_000 + "]" * 200_000)
        return "deep nesting"
    path.write_text('{"nexp": 1%s}' % ("0" * 6000))
    return "6000-digit number"


def expect_status_lists_both(code, out, err):
    if code != 0:
        return f"exit {code}"
    if GOOD not in out:
        return "the good experiment is not listed"
    if BAD not in out:
        return "the damaged experiment is not listed"
    return None


def one_line(code: int = 2, *needles: str):
    def check(c, out, err):
        if c != code:
            return f"exit {c}, expected {code}"
        if len(err.strip().splitlines()) != 1:
            return f"{len(err.strip().splitlines())} lines on stderr"
        missing = [n for n in needles if n not in err]
        return f"message lacks {missing}" if missing else None
    return check


def succeeds(*needles: str, where: str = "out"):
    def check(c, out, err):
        if c != 0:
            return f"exit {c}: {err.strip()[-120:]}"
        text = out if where == "out" else err
        missing = [n for n in needles if n not in text]
        return f"output lacks {missing}" if missing else None
    return check


def record_case(rng, home) -> Case:
    add_experiment(home, GOOD)
    bad = home / "experiments" / BAD
    bad.mkdir(parents=True)
    how = damage_record(rng, bad / "experiment.json")
    verb = rng.choice(["status", "status", "status-json", "cancel", "diff"])
    if verb == "status":
        return Case("record", ["status"], expect_status_lists_both, home, home / "experiments", how)
    if verb == "status-json":
        def check(code, out, err):
            try:
                listing = json.loads(out)
            except ValueError:
                return f"exit {code}, not JSON"
            ids = [e["id"] for e in listing.get("experiments", [])] + [d["id"] for d in listing.get("damaged", [])]
            return None if code == 0 and GOOD in ids and BAD in ids else f"exit {code}, ids {ids}"
        return Case("record", ["status", "--json"], check, home, home / "experiments", how)
    if verb == "cancel":
        def check(code, out, err):  # refused in one line, or (a mutation that left it valid) nothing to cancel
            return None if code in (0, 2) and len(err.strip().splitlines()) == 1 else f"exit {code}: {err[-120:]}"
        return Case("record", ["cancel", BAD], check, home, None, how)
    return Case("record", ["diff", GOOD, BAD, "--json"],
                lambda c, o, e: None if c in (0, 2) and (c == 0 or len(e.strip().splitlines()) == 1) else f"exit {c}",
                home, home / "experiments", how)


OTHER = "d-20260101-000001-bbbbbbbb"


def named_by(ref: str) -> str | None:
    """The experiment a reference names by the rules (exact id, a prefix of exactly one id, `last`), else None."""
    if ref == "last":
        return OTHER
    if not ref.strip() or not ID_RE.match(ref):
        return None
    matches = [i for i in (GOOD, OTHER) if i.startswith(ref)]
    return matches[0] if len(matches) == 1 else None


def reference_case(rng, home) -> Case:
    add_experiment(home, GOOD)
    add_experiment(home, OTHER, created=2.0)
    refs = ["", " ", "\t", "  \n", "..", ".", "/", "../experiments/" + GOOD, GOOD + "/..", "/etc/passwd",
            "x" * rng.randrange(300, 20_000), "c*", "c?", "-", "-c", "~", "$HOME", GOOD + "x", "aaaaaaaa",
            "".join(rng.choice(string.printable) for _ in range(rng.randrange(1, 40)))]
    real = [GOOD[:n] for n in (1, 5, 12, len(GOOD))] + [OTHER[:3], "last"]
    ref = rng.choice(refs + real)
    verb = rng.choice(["cancel", "status", "logs", "diff"])
    args = [verb, ref] if verb != "diff" else ["diff", ref, ref, "--json"]
    name = named_by(ref)
    if name is not None:
        if verb == "logs":  # found; the run has no log yet
            return Case("reference", args, lambda c, o, e: None if c in (0, 1, 2) and "no such" not in e
                        and "empty" not in e else f"exit {c}: {e[-100:]}", home, None, repr(ref))
        return Case("reference", args, succeeds(name), home, None, repr(ref))
    if not ref.strip():
        return Case("reference", args, one_line(2, "empty experiment reference"), home, home / "experiments", repr(ref))

    def refused(c, o, e):
        if c != 2:
            return f"exit {c} for {ref[:30]!r}"
        return None if len(e.strip().splitlines()) == 1 else "not one line"
    return Case("reference", args, refused, home, home / "experiments", repr(ref)[:40])


def env_case(rng, home) -> Case:
    if rng.random() < 0.6:
        name = rng.choice(RESERVED + ["BASH_" + "".join(rng.choice(string.ascii_uppercase) for _ in range(4))])
        return Case("env", ["render", "--cluster", "ci_slurm", "-o", f"node.env.{name}=1"],
                    one_line(2, f"node.env: {name}: reserved"), home, None, name)
    name = rng.choice(ALLOWED)
    return Case("env", ["render", "--cluster", "ci_slurm", "-o", f"node.env.{name}=1"],
                succeeds(f"export {name}=1"), home, None, name)


def make_unreadable(rng, path: Path) -> str:
    how = rng.choice(["fifo", "fifo", "device", "folder"])
    if how == "fifo":
        os.mkfifo(path)
    elif how == "device":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()
    return how


def fifo_case(rng, home) -> Case:
    where = rng.choice(["cluster", "manifest", "bert-config", "job.exit", "run-exit", "run.yaml", "cluster.yaml"])
    work = home / "work"
    work.mkdir(parents=True)
    if where == "cluster":
        how = make_unreadable(rng, work / "c.yaml")
        return Case("fifo", ["render", "--cluster", str(work / "c.yaml")], one_line(2, "c.yaml"), home, work, how)
    if where == "manifest":
        how = make_unreadable(rng, work / "m.yaml")
        return Case("fifo", ["data", "verify", "--dataset", str(work / "m.yaml")], one_line(2, "m.yaml"), home, work, how)
    if where == "bert-config":
        how = make_unreadable(rng, work / "bert_config.json")
        (work / "model.ckpt.index").write_bytes(b"")
        return Case("fifo", ["convert-checkpoint", "--tf-checkpoint", str(work / "model.ckpt"), "--bert-config",
                             str(work / "bert_config.json"), "--output", str(work / "out.pt")],
                    one_line(2, "bert_config.json"), home, work, how)
    exp = add_experiment(home, GOOD)
    if where == "job.exit":
        data = record(exp, job_ids=["999999999"])
        (exp / "experiment.json").write_text(json.dumps(data))
        how = make_unreadable(rng, exp / "job.exit")
    elif where == "run-exit":
        (exp / "runs").mkdir()
        how = make_unreadable(rng, exp / "runs" / "0.exit")
    elif where == "run.yaml":
        how = make_unreadable(rng, exp / "run.yaml")
    else:
        (exp / "cluster.yaml").unlink()
        how = make_unreadable(rng, exp / "cluster.yaml")
        return Case("fifo", ["diff", GOOD, GOOD, "--json"], succeeds(GOOD), home, home / "experiments", f"{where} {how}")
    return Case("fifo", ["status"], succeeds(GOOD), home, home / "experiments", f"{where} {how}")


def yaml_case(rng, home) -> Case:
    work = home / "work"
    work.mkdir(parents=True)
    base = (REPO / "clusters" / "ci_slurm.yaml").read_text()
    path = work / "c.yaml"
    choice = rng.choice(["octal", "sexagesimal", "merge", "merge-alias", "hidden", "mem0", "yes"])
    if choice == "octal":
        digits = "0" + str(rng.randrange(1, 999))
        path.write_text(base.replace("  signal_seconds: 30", f"  signal_seconds: {digits}"))
        return Case("yaml", ["render", "--cluster", str(path)], one_line(2, "leading zero"), home, work, digits)
    if choice == "sexagesimal":
        t = f"{rng.randrange(1, 24)}:{rng.randrange(60):02d}:00"
        path.write_text(base.replace('time_limit: "00:30:00"', f"time_limit: {t}"))
        return Case("yaml", ["render", "--cluster", str(path)], succeeds(f"--time={t}"), home, work, t)
    if choice == "merge":
        path.write_text(base.replace("slurm:\n", "slurm:\n  <<: {exclusive: true}\n", 1))
        return Case("yaml", ["render", "--cluster", str(path)], one_line(2, "merge keys (<<)"), home, work, "<<: {}")
    if choice == "merge-alias":
        path.write_text("defaults: &d {exclusive: true}\n" + base.replace("slurm:\n", "slurm:\n  <<: *d\n", 1))
        return Case("yaml", ["render", "--cluster", str(path)], one_line(2, "merge keys (<<)"), home, work, "<<: *d")
    if choice == "hidden":
        char = rng.choice(HIDDEN)
        key = rng.choice(["slurm.partition", "description", "slurm.account", "experiments_dir"])
        value = f"a{char}b" if key != "experiments_dir" else f"/tmp/a{char}b"
        return Case("yaml", ["render", "--cluster", "ci_slurm", "-o", f"{key}={value}"],
                    one_line(2, f"{key}: must be one line"), home, None, f"{key} U+{ord(char):04X}")
    if choice == "mem0":
        path.write_text(base.replace("mem: null", "mem: 0"))
        return Case("yaml", ["render", "--cluster", str(path)], succeeds("#SBATCH --mem=0"), home, work, "mem: 0")
    path.write_text(base.replace("exclusive: false", f"exclusive: {rng.choice(['no', 'off', 'n', 'NO'])}"))
    # YAML 1.2 reads `no` as text; pydantic takes the words it knows as false, refuses the rest in one line
    return Case("yaml", ["render", "--cluster", str(path)],
                lambda c, o, e: None if c == 0 or (c == 2 and len(e.strip().splitlines()) == 1) else f"exit {c}",
                home, work, "exclusive: no")


def bounds_case(rng, home) -> Case:
    if rng.random() < 0.5:
        n = rng.choice([1001, 10**5, 10**8, 10**18, 10**40])
        verb = rng.choice(["render", "submit"])
        return Case("bounds", [verb, "--cluster", rng.choice(["ci_slurm", "local"]), "--nexp", str(n)],
                    one_line(2, "at most 1000 runs"), home, None, f"--nexp {n}")
    flag, value = rng.choice([("--ranks", 10**8), ("--ranks", 70_000), ("--batch", 10**8), ("--steps", 10**9),
                              ("--seed", -1), ("--ranks", 0)])
    args = {"--ranks": "8", "--batch": "4", "--steps": "10", "--seed": "0"}
    args[flag] = str(value)
    flat = [x for kv in args.items() for x in kv]
    return Case("bounds", ["balance", *flat, "--strategy", "global-exchange"],
                one_line(2, "bertctl balance: error"), home, None, f"{flag} {value}")


CLASSES = {"record": record_case, "reference": reference_case, "env": env_case, "fifo": fifo_case,
           "yaml": yaml_case, "bounds": bounds_case}


def snapshot(folder: Path | None) -> dict[str, tuple]:
    if folder is None or not folder.exists():
        return {}
    found = {}
    for path in sorted(folder.rglob("*")):
        st = path.lstat()
        found[str(path.relative_to(folder))] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return found


def run_case(case: Case, timeout: float) -> tuple[str, str | None, str]:
    """(outcome, detail, case note): outcome is ok | traceback | hang | wrong | half."""
    before = snapshot(case.watch)
    env = {**os.environ, "BERTCTL_HOME": str(case.home), "PYTHONPATH": str(REPO)}
    try:
        proc = subprocess.run([sys.executable, "-m", "orchestrator", *case.args], capture_output=True, text=True,
                              env=env, timeout=timeout, cwd=REPO, errors="replace")
    except subprocess.TimeoutExpired:
        return "hang", f"no answer in {timeout:.0f} s", case.setup_note
    if "Traceback" in proc.stderr:
        return "traceback", proc.stderr.strip().splitlines()[-1][:160], case.setup_note
    wrong = case.expect(proc.returncode, proc.stdout, proc.stderr)
    if wrong:
        return "wrong", f"{wrong} | {proc.stderr.strip()[-160:]}", case.setup_note
    if snapshot(case.watch) != before:
        return "half", "files under the watched folder changed", case.setup_note
    return "ok", None, case.setup_note


def versions() -> str:
    import pydantic
    import yaml

    from orchestrator import __version__

    cpu = platform.processor() or platform.machine()
    return (f"{cpu}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}, Python {platform.python_version()}, "
            f"bertctl {__version__}, PyYAML {yaml.__version__}, pydantic {pydantic.__version__}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2, help="cases run at once")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds before a case counts as a hang")
    parser.add_argument("--classes", default=",".join(CLASSES), help="comma-separated classes to draw from")
    args = parser.parse_args()
    classes = {kind: CLASSES[kind] for kind in args.classes.split(",")}
    rng = random.Random(args.seed)
    print(versions())
    print(f"{args.cases} cases, seed {args.seed}, {args.jobs} at once, hang = no answer in {args.timeout:.0f} s")
    tallies = {kind: Tally() for kind in classes}
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hostile-registry-") as tmp:
        cases = []
        for i in range(args.cases):
            kind = list(classes)[i % len(classes)]
            cases.append(classes[kind](rng, Path(tmp) / f"case{i}" / "home"))
        with ThreadPoolExecutor(args.jobs) as pool:
            results = list(pool.map(lambda c: run_case(c, args.timeout), cases))
    elapsed = time.monotonic() - start
    for case, (outcome, detail, note) in zip(cases, results):
        t = tallies[case.kind]
        t.cases += 1
        if outcome == "ok":
            continue
        counter = {"traceback": "tracebacks", "hang": "hangs", "wrong": "wrong", "half": "half_written"}[outcome]
        setattr(t, counter, getattr(t, counter) + 1)
        if len(t.examples) < 3:
            t.examples.append(f"{outcome}: bertctl {' '.join(repr(a)[:50] for a in case.args)} [{note}]: {detail}")
    print(f"{'class':<10} {'cases':>6} {'tracebacks':>11} {'hangs':>6} {'wrong':>6} {'half-written':>13}")
    total = Tally()
    for kind, t in tallies.items():
        print(f"{kind:<10} {t.cases:>6} {t.tracebacks:>11} {t.hangs:>6} {t.wrong:>6} {t.half_written:>13}")
        for name in ("cases", "tracebacks", "hangs", "wrong", "half_written"):
            setattr(total, name, getattr(total, name) + getattr(t, name))
    print(f"{'total':<10} {total.cases:>6} {total.tracebacks:>11} {total.hangs:>6} {total.wrong:>6} {total.half_written:>13}")
    print(f"({elapsed:.0f} s)")
    for kind, t in tallies.items():
        for example in t.examples:
            print(f"  {kind}: {example}")


if __name__ == "__main__":
    main()
