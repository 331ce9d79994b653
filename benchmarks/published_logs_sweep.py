"""Every published MLPerf BERT result set, judged by the official tools and by bertctl apart, then compared.

    python benchmarks/published_logs_sweep.py --repos GITDIR [GITDIR ...] [--out FILE] [--cache FILE]
        [--package-cache FILE] [--official-budget 3600] [--timeout 60] [--reuse-official] [--no-lies]

Each GITDIR is a clone (bare or not) of github.com/mlcommons/training_results_vX.Y; every
`ORG/results/SYSTEM/bert/result_*.txt` at HEAD is one log, the logs of one SYSTEM folder one set. A set
is judged by the ruleset of the round that first published it: later rounds republish earlier results
(v3.0's Lenovo SR670v2 set is v2.1's, file for file), so a set whose every log appeared in an earlier
round is judged by that round's rules.

The official side, computed without bertctl's verdict:
- the compliance checker on each log (`python -m mlperf_logging.compliance_checker`, one process per
  log, cached in --cache by ruleset and git blob id);
- the package checker on each set (`python -m mlperf_logging.package_checker`, on the set staged as
  ORG/results/SYSTEM/bert + ORG/systems/SYSTEM.json, `--rcp-bert-train-samples` where the logs count
  epochs, cached in --package-cache); its system-description verdict is recorded apart (bertctl checks no
  system description);
- both also by the ruleset as it stood at the round's publication: a log's messages that a rule change
  since explains (orchestrator/results/ruleset_changes.yaml) judged by the rule as it was, with the
  values the official parser (mlp_parser) reads from the log.

bertctl's side: `orchestrator.results.verdict.assess` on the staged set, which runs the official checker
itself (unless --reuse-official, which hands it this sweep's cached verdicts, said in the record).

Compared: bertctl's package view with the package checker's verdict as it stood (they must agree on
every set), bertctl's verdict with it (bertctl may only be stricter on a set the package checker fails
too, or say so), and every log the official checker passes as it stood against bertctl's own checks
(none may fail them; what bertctl doubts is a warning). Then the lies of tests/lies.py told with Dell's
v5.0 GB200 set, each judged by the package checker and by bertctl; and the fastest published rate per
accelerator class (orchestrator/results/accepted.yaml's `rates`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from orchestrator.errors import UserError  # noqa: E402
from orchestrator.results import accepted, compliance, identity, package, resultset, rulesets, verdict  # noqa: E402
from orchestrator.results.compliance import CheckResult  # noqa: E402

LOG_PATH = re.compile(r"^(?P<org>[^/]+)/results/(?P<system>[^/]+)/bert/(?P<name>result_\d+\.txt)$")
SYSTEM_PATH = re.compile(r"^(?P<org>[^/]+)/systems/(?P<system>[^/]+)\.json$")
RESULTS = REPO / "benchmarks" / "results"
DEFAULT_CACHE = RESULTS / "published_logs_checker.jsonl"
DEFAULT_PACKAGE_CACHE = RESULTS / "published_sets_package_checker.jsonl"
LIE_BASE = ("5.0.0", "Dell", "1xXE9712x4GB200")
# an eval epoch_num below this counts epochs, not samples (v1.x NVIDIA-derived logs): the package checker
# reads train_samples for RCP (--rcp-bert-train-samples), as those rounds' submitters ran it
EPOCH_COUNTER_BELOW = 1000


@dataclass
class PublishedLog:
    ruleset: str  # the round of the repository it is in
    org: str
    system: str
    name: str
    blob: str  # git's id of the file's content

    @property
    def set_id(self) -> str:
        return f"v{self.ruleset.rsplit('.', 1)[0]}/{self.org}/{self.system}"


@dataclass
class SetRecord:
    set_id: str
    ruleset: str  # the rules it is judged by: its first round's
    logs: int
    present: int = 0
    first_published: str | None = None  # "v2.1" when the set republishes an earlier round's logs
    official_today: int = 0  # logs the checker passes today
    official_stood: int = 0  # ... by the ruleset as it stood
    package_today: bool | None = None
    package_stood: bool | None = None
    package_errors: list[str] = field(default_factory=list)
    system_description_errors: list[str] = field(default_factory=list)
    bertctl_package_view: bool | None = None
    bertctl: bool | None = None
    bertctl_error: str | None = None
    accepted_failed: list[str] = field(default_factory=list)  # logs official-as-stood passes, bertctl's checks fail
    warned_logs: int = 0
    warnings: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    stricter: list[str] = field(default_factory=list)
    as_it_stood: int = 0  # logs that pass only by the ruleset as it stood
    score: float | None = None
    scaled: float | None = None
    rcp: str | None = None
    rate: tuple[float, str, str] | None = None  # (samples/s per accelerator, class, model)

    @property
    def agrees(self) -> bool:
        return self.package_stood is None or self.bertctl_package_view == self.package_stood


# ---- the mirrors


def round_ruleset(git_dir: Path) -> str:
    found = compliance.ruleset_from_path(git_dir)
    if not found:
        raise SystemExit(f"{git_dir}: no round (..._vX.Y) in the path")
    return found


def listing(git_dir: Path) -> list[tuple[str, str]]:
    """(path, blob) of every file at HEAD."""
    out = subprocess.run(["git", "-C", str(git_dir), "ls-tree", "-r", "HEAD"], capture_output=True, text=True,
                         check=True).stdout
    rows = []
    for line in out.splitlines():
        meta, _, path = line.partition("\t")
        kind, blob = meta.split()[1:3]
        if kind == "blob":
            rows.append((path, blob))
    return rows


class Blobs:
    """`git cat-file --batch` on one clone: a blob's bytes, or None where the snapshot lacks it."""

    def __init__(self, git_dir: Path):
        self.proc = subprocess.Popen(["git", "-C", str(git_dir), "cat-file", "--batch"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE)

    def read(self, blob: str) -> bytes | None:
        self.proc.stdin.write(blob.encode() + b"\n")
        self.proc.stdin.flush()
        header = self.proc.stdout.readline().split()
        if len(header) < 3 or header[1] != b"blob":
            return None
        return self.proc.stdout.read(int(header[2]) + 1)[:-1]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def head_commit(git_dir: Path) -> str:
    return subprocess.run(["git", "-C", str(git_dir), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                          text=True).stdout.strip()


# ---- the official side


def load_cache(path: Path, key_fields: tuple[str, ...]) -> dict:
    cache = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
                cache[tuple(record[k] for k in key_fields)] = record
            except (ValueError, KeyError):
                continue  # a line cut by a killed run
    return cache


def official_values(path: Path, ruleset: str) -> dict[str, list]:
    """What the official parser reads from the log, by key: the values a rule as it stood asks about."""
    from mlperf_logging.compliance_checker import mlp_parser

    lines, _ = mlp_parser.parse_file(str(path), ruleset=ruleset)
    values: dict[str, list] = defaultdict(list)
    for line in lines:
        values[line.key].append(line.value.get("value"))
    return values


def official_checks(todo: list[tuple[Path, str]], ruleset: str, cache: dict, cache_file, timeout: float) -> None:
    """The checker on each (path, blob) the cache lacks, four at a time; each verdict appended to the cache.
    Records of the sweep before issue 50 kept a summary only: they are checked again."""
    todo = [(path, blob) for path, blob in todo if "messages" not in cache.get((ruleset, blob), {})]

    def one(item):
        started = time.monotonic()
        return item, compliance.check_log(item[0], ruleset, timeout=timeout), time.monotonic() - started

    with ThreadPoolExecutor(max_workers=4) as pool:
        for (_, blob), result, seconds in pool.map(one, todo):
            record = {"ruleset": ruleset, "blob": blob, "compliant": result.compliant, "crashed": result.crashed,
                      "messages": result.messages, "summary": result.summary[:300], "seconds": round(seconds, 2)}
            cache[(ruleset, blob)] = record
            cache_file.write(json.dumps(record) + "\n")
    cache_file.flush()


def stood(record: dict, path: Path, ruleset: str) -> tuple[bool, str | None]:
    """The official checker's verdict by the ruleset as it stood (values from the official parser)."""
    if record["compliant"] or not rulesets.changes_since_publication(ruleset):
        return record["compliant"], None
    check = CheckResult(str(path), ruleset, record["compliant"], record["messages"], record.get("crashed", False))
    judged = rulesets.as_it_stood(check, official_values(path, ruleset))
    return judged.compliant, judged.as_it_stood


def counts_epochs(files: list[Path]) -> bool:
    """Do the logs' evaluations count epochs (eval_accuracy epoch_num below EPOCH_COUNTER_BELOW)?"""
    last = []
    for f in files:
        found = re.findall(r'"key": "eval_accuracy".*?"epoch_num": ([0-9.]+)', f.read_text(errors="replace"))
        if found:
            last.append(float(found[-1]))
    return bool(last) and max(last) < EPOCH_COUNTER_BELOW


def package_check(org_dir: Path, ruleset: str, digest: str, train_samples: bool, cache: dict, cache_file) -> dict:
    key = (ruleset, digest)
    if key not in cache:
        started = time.monotonic()
        v = package.check_package(org_dir, ruleset, bert_train_samples=train_samples)
        record = {"ruleset": ruleset, "digest": digest, "passed": v.passed, "verdict": v.verdict, "errors": v.errors,
                  "train_samples": train_samples, "seconds": round(time.monotonic() - started, 2)}
        cache[key] = record
        cache_file.write(json.dumps(record) + "\n")
        cache_file.flush()
    return cache[key]


def package_as_it_stood(record: dict, failing_as_stood: int) -> tuple[bool, list[str], list[str]]:
    """(passed, its errors on the set, its system-description errors) with the compliance count replaced
    by the logs that fail as the ruleset stood. The system description is judged apart."""
    errors, described = [], []
    for e in record["errors"]:
        if "System description" in e or "system_desc" in e.lower():
            described.append(e)
        elif re.match(r"\d+ files do not comply, directory cannot be accepted", e):
            continue
        else:
            errors.append(e)
    if failing_as_stood > 1:
        errors.append(f"{failing_as_stood} files do not comply (as the ruleset stood), directory cannot be accepted")
    return not errors, errors, described


# ---- one set


def judge_set(logs: list[PublishedLog], ruleset: str, data: dict[str, bytes], system_json: bytes | None,
              root: Path, caches, timeout: float, reuse: bool) -> SetRecord:
    first = logs[0]
    record = SetRecord(first.set_id, ruleset, len(logs))
    present = [log for log in logs if data.get(log.blob) is not None]
    record.present = len(present)
    if not present:
        record.bertctl_error = "no log of the set in the clone (git cat-file: missing)"
        return record
    org_dir = root / first.set_id.replace("/", "_") / first.org
    bert = org_dir / "results" / first.system / "bert"
    bert.mkdir(parents=True)
    for log in present:
        (bert / log.name).write_bytes(data[log.blob])
    if system_json is not None:
        (org_dir / "systems").mkdir()
        (org_dir / "systems" / f"{first.system}.json").write_bytes(system_json)
    official_cache, official_file, package_cache, package_file = caches
    by_name = {}
    official_checks([(bert / log.name, log.blob) for log in present], ruleset, official_cache, official_file, timeout)
    for log in present:
        path = bert / log.name
        result = official_cache[(ruleset, log.blob)]
        passed, note = stood(result, path, ruleset)
        by_name[log.name] = (result["compliant"], passed, note, result)
        record.official_today += result["compliant"]
        record.official_stood += passed
        record.as_it_stood += passed and not result["compliant"]
    if len(present) == len(logs) and system_json is not None:
        digest = hashlib.sha256("".join(sorted(log.blob for log in logs)).encode() + system_json).hexdigest()
        pkg = package_check(org_dir, ruleset, digest, counts_epochs(sorted(bert.glob("result_*.txt"))),
                            package_cache, package_file)
        record.package_today = pkg["passed"]
        failing = sum(not passed for _, passed, _, _ in by_name.values())
        record.package_stood, record.package_errors, record.system_description_errors = package_as_it_stood(pkg, failing)

    def cached(paths, ruleset_, werror=False):
        out = []
        for p in paths:
            r = by_name[Path(p).name][3]
            out.append(CheckResult(str(p), ruleset_, r["compliant"], r.get("messages") or [], r.get("crashed", False)))
        return out

    try:
        rs = resultset.from_directory(bert)
        report = verdict.assess(rs, ruleset, with_score=len(rs.files) == 10, summarizer=False,
                                check=cached if reuse else None)
    except UserError as e:
        record.bertctl_error = str(e)
        return record
    record.bertctl, record.bertctl_package_view = report.passed, report.package_view_passed
    record.problems, record.stricter, record.warnings = report.problems, report.stricter, list(report.warnings)
    record.score = report.score.minutes if report.score else None
    record.scaled = report.scaled_minutes
    if report.rcp is not None:
        record.rcp = ("pass" if report.rcp.passed else "fail") + f" ({report.rcp.message}) x{report.rcp.factor:.4f}"
    for run in report.runs:
        today, passed, _, _ = by_name.get(run.file, (None, None, None, None))
        record.warned_logs += bool(run.warnings)
        record.warnings += [f"{run.file}: {w}" for w in run.warnings]
        own = ([run.message] if run.message.startswith("malformed") else []) + run.failures
        if passed and own:
            record.accepted_failed.append(f"{run.file}: {own[0]}")
    record.rate = fastest_rate(rs)
    return record


def fastest_rate(rs) -> tuple[float, str, str] | None:
    """The set's fastest run: samples to converge / time to train / accelerators, with the class."""
    system, _ = identity.system_description(rs)
    count, model = identity._accelerators(system)
    rates = [s.samples_to_converge / (s.minutes * 60.0) / count for s in rs.summaries
             if count and identity.whole(s) and s.samples_to_converge and s.minutes and s.minutes > 0]
    if not rates:
        return None
    known = accepted.fastest(model)
    return max(rates), known.accelerator_class if known else "(no class)", model


# ---- the lies


def tell_lies(git_dirs: dict[str, Path], root: Path) -> list[str]:
    """Each lie of tests/lies.py on Dell's v5.0 GB200 set: the package checker's verdict and bertctl's."""
    import lies

    ruleset, org, system = LIE_BASE
    git_dir = git_dirs.get(ruleset)
    if git_dir is None:
        return ["lies: no v5.0 clone given"]
    blobs = Blobs(git_dir)
    base = root / "lies" / "base" / org
    try:
        for path, blob in listing(git_dir):
            if path.startswith(f"{org}/results/{system}/bert/result_") or path == f"{org}/systems/{system}.json":
                target = base / path.split("/", 1)[1]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(blobs.read(blob))
    finally:
        blobs.close()
    lines = ["", "## Lies told with Dell's accepted v5.0 GB200 set (tests/lies.py): package checker | bertctl", ""]
    caught = Counter()
    for lie in [None] + lies.LIES:
        work = root / "lies" / (re.sub(r"\W+", "-", lie.name) if lie else "true") / org
        shutil.copytree(base, work)
        bert = work / "results" / system / "bert"
        if lie:
            lie.tell(bert)
        pkg = package.check_package(work, ruleset)
        report = verdict.assess(resultset.from_directory(bert), ruleset, summarizer=False)
        reason = next(iter(report.problems), "")
        if lie:
            caught["package checker"] += not pkg.passed
            caught["bertctl"] += not report.passed
            caught["bertctl's reason"] += lie.reason in "\n".join(
                report.problems + [f for r in report.runs for f in r.failures] + [r.message for r in report.runs])
        lines.append(f"{lie.name if lie else 'the set as published'}: package checker "
                     f"{'PASS' if pkg.passed else 'FAIL (' + '; '.join(pkg.errors)[:120] + ')'} | bertctl "
                     f"{'PASSED' if report.passed else 'FAILED: ' + reason[:240]}")
    with_reason = caught["bertctl's reason"]
    lines.insert(2, f"{len(lies.LIES)} lies: the package checker fails {caught['package checker']}, bertctl "
                    f"{caught['bertctl']}, with the lie's own reason {with_reason}")
    return lines


# ---- the record


def machine_line() -> str:
    return (f"{platform.node()}: {platform.processor() or platform.machine()}, Python {platform.python_version()}, "
            f"mlperf-logging {compliance.checker_version()}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repos", nargs="+", type=Path, required=True, help="clones of mlcommons/training_results_vX.Y")
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--package-cache", type=Path, default=DEFAULT_PACKAGE_CACHE)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per official check")
    ap.add_argument("--reuse-official", action="store_true",
                    help="hand bertctl this sweep's cached checker verdicts instead of running the checker again")
    ap.add_argument("--no-lies", action="store_true")
    ap.add_argument("--out", type=Path, default=None, help="the record (default: print only)")
    args = ap.parse_args(argv)

    started = time.monotonic()
    official_cache = load_cache(args.cache, ("ruleset", "blob"))
    package_cache = load_cache(args.package_cache, ("ruleset", "digest"))
    rounds = sorted(((round_ruleset(g), g) for g in args.repos), key=lambda r: compliance._version_key(r[0]))
    first_round: dict[str, str] = {}  # blob -> the first round that published it
    sets_out: list[SetRecord] = []
    header = [f"# published BERT sets: the official tools vs bertctl, {dt.date.today().isoformat()}",
              f"# {machine_line()}",
              "# command: python benchmarks/published_logs_sweep.py --repos ... " + ("--reuse-official" if args.reuse_official
                                                                                    else "(bertctl ran the checker itself)"),
              "# clones: " + ", ".join(f"training_results_v{r.rsplit('.', 1)[0]}@{head_commit(g)}" for r, g in rounds), ""]
    lines = []
    totals = Counter()
    with tempfile.TemporaryDirectory(prefix="bertctl-sweep-") as tmp, \
            args.cache.open("a") as official_file, args.package_cache.open("a") as package_file:
        caches = (official_cache, official_file, package_cache, package_file)
        for ruleset, git_dir in rounds:
            rows = listing(git_dir)
            logs = [PublishedLog(ruleset, m["org"], m["system"], m["name"], blob) for path, blob in rows
                    if (m := LOG_PATH.match(path))]
            systems = {(m["org"], m["system"]): blob for path, blob in rows if (m := SYSTEM_PATH.match(path))}
            by_set = defaultdict(list)
            for log in logs:
                by_set[(log.org, log.system)].append(log)
                first_round.setdefault(log.blob, ruleset)
            blobs = Blobs(git_dir)
            try:
                records = []
                for key, group in sorted(by_set.items()):
                    data = {log.blob: blobs.read(log.blob) for log in group}
                    system_json = blobs.read(systems[key]) if key in systems else None
                    earliest = {first_round[log.blob] for log in group}
                    judged_by = min(earliest, key=compliance._version_key) if len(earliest) == 1 else ruleset
                    record = judge_set(group, judged_by, data, system_json, Path(tmp), caches, args.timeout,
                                       args.reuse_official)
                    if judged_by != ruleset:
                        record.first_published = "v" + judged_by.rsplit(".", 1)[0]
                    records.append(record)
            finally:
                blobs.close()
            sets_out += records
            summary = round_summary(records)
            totals.update(summary)
            print(format_summary(ruleset, summary), flush=True)
            lines.append(format_summary(ruleset, summary))
        lines.append(format_summary("all", totals))
        lie_lines = [] if args.no_lies else tell_lies({r: g for r, g in rounds}, Path(tmp))
    lines += lie_lines + rate_table(sets_out)
    lines += ["", f"# {time.monotonic() - started:.0f} s", "", "## Every set", ""] + [format_set(r) for r in sets_out]
    print("\n".join(lie_lines[:4]))
    if args.out:
        args.out.write_text("\n".join(header + lines) + "\n")
    return 0


def round_summary(records: list[SetRecord]) -> Counter:
    c = Counter()
    for r in records:
        c["sets"] += 1
        c["logs"] += r.logs
        c["present"] += r.present
        c["official_today"] += r.official_today
        c["official_stood"] += r.official_stood
        c["as_it_stood"] += r.as_it_stood
        c["accepted_failed"] += len(r.accepted_failed)
        c["warned"] += r.warned_logs
        c["republished"] += r.first_published is not None
        c["package_judged"] += r.package_stood is not None
        c["package_today"] += bool(r.package_today)
        c["package_stood"] += bool(r.package_stood)
        c["system_description_fails"] += bool(r.system_description_errors)
        for e in r.package_errors:
            kind = ("seed check" if e.startswith("Seed checker failed and") else "RCP check" if e.startswith("RCP Test Failed")
                    else "logs" if "do not comply" in e else "file count" if e.startswith("Incorrect number") else None)
            if kind:
                c[f"fails: {kind}"] += 1
        c["bertctl_view"] += bool(r.bertctl_package_view)
        c["bertctl"] += bool(r.bertctl)
        c["disagree"] += not r.agrees
        c["stricter"] += bool(r.bertctl_package_view) and r.bertctl is False
        c["refused"] += r.bertctl_error is not None
    return c


def format_summary(name: str, c: Counter) -> str:
    return (f"{name}: {c['sets']} sets ({c['republished']} republished from an earlier round), {c['present']} of "
            f"{c['logs']} logs in the clones; official checker: {c['official_today']} pass today, "
            f"{c['official_stood']} as the ruleset stood ({c['as_it_stood']} only so); bertctl's own checks fail "
            f"{c['accepted_failed']} of those and warn on {c['warned']} logs; package checker on "
            f"{c['package_judged']} whole sets: {c['package_today']} pass today, {c['package_stood']} with each log "
            f"judged as its ruleset stood and the system description apart ({c['system_description_fails']} fail "
            f"today's system-description check; failing: {_kinds(c)}); bertctl: package view {c['bertctl_view']} pass, "
            f"verdict {c['bertctl']} pass; {c['disagree']} disagreements, {c['stricter']} sets bertctl alone fails, "
            f"{c['refused']} refused (no log in the clone)")


def _kinds(c: Counter) -> str:
    kinds = [f"{k[len('fails: '):]} {n}" for k, n in sorted(c.items()) if k.startswith("fails: ")]
    return ", ".join(kinds) or "none"


def rate_table(records: list[SetRecord]) -> list[str]:
    best: dict[str, tuple[float, str, str]] = {}
    for r in records:
        if r.rate and r.first_published is None:
            rate, cls, model = r.rate
            if cls not in best or rate > best[cls][0]:
                best[cls] = (rate, r.set_id, model)
    lines = ["", "## The fastest published rate per accelerator class (samples/s per accelerator; "
                 "orchestrator/results/accepted.yaml's rates)", ""]
    listed = {f.accelerator_class: f for f in accepted.rates()}
    for cls, (rate, set_id, model) in sorted(best.items(), key=lambda kv: -kv[1][0]):
        recorded = listed.get(cls)
        same = recorded is not None and round(recorded.rate) == round(rate)
        lines.append(f"{cls}: {rate:,.0f} ({set_id}, {model}){'' if same else f'  [accepted.yaml: {recorded.rate if recorded else None}]'}")
    return lines


def format_set(r: SetRecord) -> str:
    judged = f" (first published in {r.first_published}: judged by its ruleset)" if r.first_published else ""
    head = (f"{r.set_id}{judged}: {r.present}/{r.logs} logs, official {r.official_today} today / {r.official_stood} as it "
            f"stood; package checker {_v(r.package_today)} today / {_v(r.package_stood)} as it stood; bertctl package "
            f"view {_v(r.bertctl_package_view)}, verdict {_v(r.bertctl)}")
    if r.score is not None:
        head += f", score {r.score:.3f} min" + (f" (RCP-scaled {r.scaled:.3f})" if r.scaled and r.scaled != r.score else "")
    if r.rcp:
        head += f", RCP {r.rcp}"
    details = [f"    refused: {r.bertctl_error}"] if r.bertctl_error else []
    details += [f"    DISAGREE: package checker {r.package_errors or 'no errors'}" for _ in [0] if not r.agrees]
    details += [f"    package checker: {e}" for e in r.package_errors]
    details += [f"    system description (not compared): {e[:160]}" for e in r.system_description_errors[:1]]
    details += [f"    ACCEPTED LOG FAILED: {a}" for a in r.accepted_failed]
    details += [f"    problem: {p}" for p in r.problems]
    details += [f"    stricter: {p}" for p in r.stricter if p not in r.problems]
    details += [f"    warning {w[:300]}" for w in r.warnings[:3]]
    return "\n".join([head] + details)


def _v(value: bool | None) -> str:
    return "-" if value is None else "PASS" if value else "FAIL"


if __name__ == "__main__":
    sys.exit(main())
