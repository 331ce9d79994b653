"""Every published MLPerf BERT result log, judged by the official checker and by bertctl: where do they differ?

    python benchmarks/published_logs_sweep.py --repos GITDIR [GITDIR ...] [--cache FILE] [--official-budget 2400]
        [--timeout 60] [--official-only] [--out FILE]

Each GITDIR is a clone (bare or not) of github.com/mlcommons/training_results_vX.Y; the round in its
path (`..._v3.0`) picks the ruleset (3.0.0), as bertctl's compliance-check does. Every
`ORG/results/SYSTEM/bert/result_N.txt` at HEAD is one log; the logs of one SYSTEM folder are one set.

- The official checker (`python -m mlperf_logging.compliance_checker --usage training --ruleset X.Y.0`)
  runs on each log in its own process, with a timeout; its verdicts are cached in --cache (one JSON line
  per log, keyed by ruleset and the git blob id, so a rerun only checks logs it has not seen) and the
  whole official pass stops after --official-budget seconds (the rest stay "not judged").
- bertctl judges each set as `compliance-check --results DIR --ruleset X.Y.0` does (orchestrator.results.verdict
  .assess, with the cached official verdicts in place of new checker processes): per log, malformed
  (bertctl's own checks), warned, or the official verdict; per set, the olympic score and the RCP check.
- A disagreement is a log the official checker passes and bertctl fails (a false alarm), or the
  other way round. For every set it also compares bertctl's score with the olympic mean of
  run_stop - run_start read with nothing but a substring search.

Prints one line per round and writes the whole record (per set) to --out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO)]

from orchestrator.errors import UserError  # noqa: E402
from orchestrator.results import compliance, resultset, scoring, verdict  # noqa: E402
from orchestrator.results.compliance import CheckResult  # noqa: E402

LOG_PATH = re.compile(r"^(?P<org>[^/]+)/results/(?P<system>[^/]+)/bert/(?P<name>result_\d+\.txt)$")
DEFAULT_CACHE = REPO / "benchmarks" / "results" / "published_logs_official.jsonl"
NOT_IN_CLONE = "no log of the set in the clone (git cat-file: missing)"
# The sets of issue 35's table: checked first, so a bounded official pass always judges them
ISSUE_SETS = ("v2.0/Google/cloud-tpu-v4-8192-TF", "v2.0/Graphcore/ipu-pod16-POPART-closed",
              "v2.1/MosaicML/8xA100_80GB-baseline", "v2.1/NVIDIA/dgxh100_preview", "v3.0/Azure/ND_H100_v5_pytorch",
              "v3.0/Intel-HabanaLabs/HLS-Gaudi2-PT", "v3.0/NVIDIA/dgxh100_ngc23.04_pytorch",
              "v3.1/NVIDIA/eos_n434_ngc23.09_pytorch", "v4.0/Dell/XE9680x8H100-SXM-80GB",
              "v4.0/NVIDIA/h200_ngc23.09_pytorch")


@dataclass
class PublishedLog:
    ruleset: str
    org: str
    system: str
    name: str
    blob: str  # git's id of the file's content: the cache key

    @property
    def set_id(self) -> str:
        return f"v{self.ruleset.rsplit('.', 1)[0]}/{self.org}/{self.system}"


@dataclass
class SetRecord:
    set_id: str
    logs: int
    official_pass: int = 0
    official_judged: int = 0
    bertctl_malformed: int = 0
    bertctl_pass: int = 0
    warned: int = 0
    disagreements: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    bertctl_error: str | None = None  # compliance-check's one-line refusal (bad input), if any
    passed: bool | None = None
    problems: list[str] = field(default_factory=list)
    score: float | None = None
    raw_olympic: float | None = None  # olympic mean of run_stop - run_start read by substring search
    rcp: str | None = None
    rcp_factor: float | None = None
    scaled: float | None = None  # the score times the RCP factor, where the round's rcp_checker gives one


def round_ruleset(git_dir: Path) -> str:
    found = compliance.ruleset_from_path(git_dir)
    if not found:
        raise SystemExit(f"{git_dir}: no round (..._vX.Y) in the path")
    return found


def published_logs(git_dir: Path) -> list[PublishedLog]:
    ruleset = round_ruleset(git_dir)
    listing = subprocess.run(["git", "-C", str(git_dir), "ls-tree", "-r", "HEAD"], capture_output=True, text=True,
                             check=True).stdout
    logs = []
    for line in listing.splitlines():
        meta, _, path = line.partition("\t")
        m = LOG_PATH.match(path)
        if m and meta.split()[1] == "blob":
            logs.append(PublishedLog(ruleset, m["org"], m["system"], m["name"], meta.split()[2]))
    return logs


def write_blobs(git_dir: Path, logs: list[PublishedLog], root: Path) -> dict[str, Path]:
    """Each log's content under root/ORG/results/SYSTEM/bert/, as published; blobs the clone lacks are skipped."""
    written = {}
    proc = subprocess.Popen(["git", "-C", str(git_dir), "cat-file", "--batch"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    try:
        for log in logs:
            proc.stdin.write(log.blob.encode() + b"\n")
            proc.stdin.flush()
            header = proc.stdout.readline().split()
            if len(header) < 3 or header[1] != b"blob":
                continue  # "<id> missing": the snapshot did not keep this file
            data = proc.stdout.read(int(header[2]) + 1)[:-1]
            path = root / log.org / "results" / log.system / "bert" / log.name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            written[log.blob] = path
    finally:
        proc.stdin.close()
        proc.wait()
    return written


# ---- the official checker, cached


def official_order(logs: list[PublishedLog]) -> list[PublishedLog]:
    """The issue's sets first, then breadth first: every set's result_0, then every set's result_1, ...
    so that a pass cut by its budget has judged some logs of every set."""
    def rank(log: PublishedLog):
        run = int(re.search(r"\d+", log.name).group())
        return (log.set_id not in ISSUE_SETS, run, log.set_id)
    return sorted(logs, key=rank)


def load_cache(path: Path) -> dict[tuple[str, str], dict]:
    cache = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
                cache[(record["ruleset"], record["blob"])] = record
            except (ValueError, KeyError):
                continue  # a line cut by a killed run
    return cache


def official_pass(logs, files, cache, cache_path: Path, timeout: float, deadline: float) -> int:
    """Run the checker on every log not in the cache, until the deadline; returns how many it ran."""
    ran = 0
    with cache_path.open("a") as out:
        for log in logs:
            key = (log.ruleset, log.blob)
            if key in cache or log.blob not in files or time.monotonic() > deadline:
                continue
            started = time.monotonic()
            result = compliance.check_log(files[log.blob], log.ruleset, timeout=timeout)
            record = {"ruleset": log.ruleset, "blob": log.blob, "set": log.set_id, "name": log.name,
                      "compliant": result.compliant, "crashed": result.crashed, "summary": result.summary[:300],
                      "seconds": round(time.monotonic() - started, 2)}
            cache[key] = record
            out.write(json.dumps(record) + "\n")
            out.flush()
            ran += 1
    return ran


# ---- bertctl's verdict


def raw_olympic_minutes(files: list[Path]) -> float | None:
    """The olympic mean of run_stop - run_start, each taken from the first line naming the key."""
    times = []
    for f in files:
        start = stop = None
        for line in f.read_text(errors="replace").splitlines():
            if start is None and '"key": "run_start"' in line:
                start = json.loads(line.split(":::MLLOG ", 1)[1])["time_ms"]
            elif stop is None and '"key": "run_stop"' in line:
                stop = json.loads(line.split(":::MLLOG ", 1)[1])["time_ms"]
        if start is not None and stop is not None:
            times.append((stop - start) / 60000.0)
    if len(times) < 3:
        return None
    times.sort()
    return sum(times[1:-1]) / (len(times) - 2)


def judge_set(logs: list[PublishedLog], files: dict[str, Path], cache) -> SetRecord:
    record = SetRecord(logs[0].set_id, len(logs))
    present = [log for log in logs if log.blob in files]
    by_file = {str(files[log.blob].absolute()): cache.get((log.ruleset, log.blob)) for log in present}
    for official in by_file.values():
        if official is not None:
            record.official_judged += 1
            record.official_pass += official["compliant"]
    if not present:
        record.bertctl_error = NOT_IN_CLONE
        return record
    folder = files[present[0].blob].parent
    record.raw_olympic = raw_olympic_minutes(sorted(folder.glob("result_*.txt")))

    def cached_checks(paths, ruleset, werror=False):
        results = []
        for p in paths:
            official = by_file.get(str(Path(p).absolute()))
            if official is None:
                results.append(CheckResult(str(p), ruleset, False, ["not judged by the official checker (budget)"],
                                           crashed=True))
            else:
                results.append(CheckResult(str(p), ruleset, official["compliant"], [official["summary"]]
                                           if official["summary"] else [], crashed=official["crashed"]))
        return results

    try:
        rs = resultset.from_directory(folder)
        full = len(rs.files) == scoring.required_runs()
        report = verdict.assess(rs, logs[0].ruleset, with_score=full, check=cached_checks, summarizer=False)
    except UserError as e:
        record.bertctl_error = str(e)
        for official in by_file.values():
            if official and official["compliant"]:
                record.disagreements.append(f"set refused as bad input, official passes: {e}")
                break
        return record
    record.passed, record.problems = report.passed, report.problems
    record.score = report.score.minutes if report.score else None
    record.scaled = report.scaled_minutes
    if report.rcp is not None:
        record.rcp, record.rcp_factor = ("pass" if report.rcp.passed else "fail") + f" ({report.rcp.message})", \
            report.rcp.factor
    for run, f in zip(report.runs, rs.files):
        official = by_file.get(str(f.absolute()))
        own = verdict.own_problem(next(s for s in rs.summaries if Path(s.file).name == f.name))
        record.bertctl_malformed += bool(own)
        record.bertctl_pass += run.compliant
        record.warned += bool(run.warnings)
        record.warnings += [f"{f.name}: {w}" for w in run.warnings]
        if official is None:
            continue
        if official["compliant"] != run.compliant:
            why = own or run.message
            record.disagreements.append(f"{f.name}: official {'PASS' if official['compliant'] else 'FAIL'}, "
                                        f"bertctl {'PASS' if run.compliant else 'FAIL'}: {why}")
    return record


# ---- the record


def machine_line() -> str:
    return (f"{platform.node()}: {platform.processor() or platform.machine()}, Python {platform.python_version()}, "
            f"mlperf-logging {compliance.checker_version()}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repos", nargs="+", type=Path, required=True, help="clones of mlcommons/training_results_vX.Y")
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--official-budget", type=float, default=2400.0, help="seconds for new official checks")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per official check")
    ap.add_argument("--official-only", action="store_true", help="fill the cache, judge nothing")
    ap.add_argument("--from-end", action="store_true", help="check from the end of the order (a second process "
                    "beside a first one: both append to the cache)")
    ap.add_argument("--out", type=Path, default=None, help="the record (default: print only)")
    args = ap.parse_args(argv)

    cache = load_cache(args.cache)
    deadline = time.monotonic() + args.official_budget
    started = time.monotonic()
    lines = [f"# published BERT logs: official checker vs bertctl, {dt.date.today().isoformat()}",
             f"# {machine_line()}", "# command: python benchmarks/published_logs_sweep.py --repos ... "
             "(timings on 2 shared cores: noisy)", ""]
    totals: Counter = Counter()
    sets_out = []
    with tempfile.TemporaryDirectory(prefix="bertctl-sweep-") as tmp:
        rounds, files = [], {}
        for git_dir in args.repos:
            logs = published_logs(git_dir)
            files.update(write_blobs(git_dir, logs, Path(tmp) / round_ruleset(git_dir)))
            rounds.append((round_ruleset(git_dir), logs))
        everything = [log for _, logs in rounds for log in logs]
        order = official_order(everything)
        ran = official_pass(order[::-1] if args.from_end else order, files, cache, args.cache, args.timeout, deadline)
        judged = sum((log.ruleset, log.blob) in cache for log in everything)
        print(f"{len(everything)} logs, {len(files)} in the clones; official checker: {ran} newly run, "
              f"{judged} judged", flush=True)
        lines.append(f"{len(everything)} logs listed, {len(files)} present in the clones, {judged} judged by "
                     f"the official checker")
        if args.official_only:
            return 0
        for ruleset, logs in rounds:
            by_set = defaultdict(list)
            for log in logs:
                by_set[log.set_id].append(log)
            records = [judge_set(group, files, cache) for group in by_set.values()]
            sets_out += records
            summary = round_summary(ruleset, records)
            totals.update(summary)
            print(format_summary(ruleset, summary), flush=True)
            lines.append(format_summary(ruleset, summary))
    lines.append(format_summary("all", totals))
    print(format_summary("all", totals))
    lines += ["", f"# {time.monotonic() - started:.0f} s", ""] + [format_set(r) for r in sets_out]
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


def round_summary(ruleset: str, records: list[SetRecord]) -> Counter:
    c = Counter()
    for r in records:
        c["sets"] += 1
        c["logs"] += r.logs
        c["official_judged"] += r.official_judged
        c["official_pass"] += r.official_pass
        c["bertctl_pass"] += r.bertctl_pass
        c["bertctl_malformed"] += r.bertctl_malformed
        c["warned_logs"] += r.warned
        c["disagreements"] += len(r.disagreements)
        absent = r.bertctl_error == NOT_IN_CLONE
        c["sets_absent"] += absent
        c["sets_refused"] += r.bertctl_error is not None and not absent
        c["sets_passed"] += bool(r.passed)
        if r.score is not None and r.raw_olympic:
            c["scored"] += 1
            c["score_within_1pct"] += abs(r.score / r.raw_olympic - 1) <= 0.01
    return c


def format_summary(name: str, c: Counter) -> str:
    return (f"{name}: {c['sets']} sets, {c['logs']} logs; official {c['official_pass']}/{c['official_judged']} "
            f"pass; bertctl {c['bertctl_pass']} pass, {c['bertctl_malformed']} malformed, {c['warned_logs']} "
            f"warned; {c['disagreements']} disagreements; {c['sets_passed']} sets pass, {c['sets_refused']} "
            f"refused as bad input, {c['sets_absent']} absent from the clone; score within 1% of raw olympic "
            f"mean: {c['score_within_1pct']}/{c['scored']}")


def format_set(r: SetRecord) -> str:
    head = (f"{r.set_id}: {r.logs} logs, official {r.official_pass}/{r.official_judged}, bertctl {r.bertctl_pass} "
            f"pass / {r.bertctl_malformed} malformed / {r.warned} warned, set "
            f"{'PASSED' if r.passed else 'FAILED' if r.passed is False else 'refused'}")
    if r.score is not None:
        head += f", score {r.score:.3f} min (raw olympic {r.raw_olympic or float('nan'):.3f})"
        if r.scaled is not None and r.scaled != r.score:
            head += f", RCP-scaled {r.scaled:.3f}"
    if r.rcp:
        head += f", RCP {r.rcp} x{r.rcp_factor:.4f}"
    details = [f"    bad input: {r.bertctl_error}"] if r.bertctl_error else []
    details += [f"    DISAGREE {d}" for d in r.disagreements]
    details += [f"    problem: {p}" for p in r.problems]
    details += [f"    warning {w}" for w in r.warnings[:3]]
    return "\n".join([head] + details)


if __name__ == "__main__":
    sys.exit(main())
