"""The official MLPerf compliance checker, run on each result log, and which ruleset to run it with.

Each log is checked by `python -m mlperf_logging.compliance_checker` in its own process: the
checker keeps module-level state between files, crashes with a traceback on rulesets without BERT
rules, and its verdict and messages are exactly what a reviewer running it by hand would see.
This module adds no rules of its own; it picks the ruleset, runs the tool and keeps its messages.
bertctl's own checks (orchestrator/results/resultlog.py) run before it: only a log that passed them gets here.
"""

from __future__ import annotations

import datetime as dt
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from orchestrator.errors import UserError

USAGE = "training"
BENCHMARK = "bert"
SEPARATOR = "-" * 30  # between the checker's messages in its one WARNING block

# When each MLPerf Training round that had BERT published its results. A log written after round
# R-1 was published and before round R was belongs to round R; that is only a hint, used for logs
# that name no ruleset (no round in their path, no --ruleset).
ROUND_PUBLISHED = {
    "0.7.0": dt.date(2020, 7, 29),
    "1.0.0": dt.date(2021, 6, 30),
    "1.1.0": dt.date(2021, 12, 1),
    "2.0.0": dt.date(2022, 6, 29),
    "2.1.0": dt.date(2022, 11, 9),
    "3.0.0": dt.date(2023, 6, 27),
    "3.1.0": dt.date(2023, 11, 8),
    "4.0.0": dt.date(2024, 6, 12),
    "4.1.0": dt.date(2024, 11, 13),
    "5.0.0": dt.date(2025, 6, 4),
}
ROUND_IN_PATH = re.compile(r"(?:^|.*[_-])v(\d+)\.(\d+)$")  # training_results_v1.1, v1.1


@dataclass
class CheckResult:
    """The checker's verdict on one log, with its own words."""

    file: str
    ruleset: str
    compliant: bool
    messages: list[str] = field(default_factory=list)  # one per problem, as the checker wrote them
    crashed: bool = False  # the checker raised instead of judging
    # why the log passes by its ruleset as it stood at publication though today's checker fails it
    # (orchestrator/results/rulesets.py::as_it_stood), or None
    as_it_stood: str | None = None

    @property
    def summary(self) -> str:
        """One line: the head of each message, plus the failed test where the head does not say it."""
        heads = []
        for message in self.messages:
            lines = [line.strip() for line in message.splitlines() if line.strip()]
            if not lines:
                continue
            head = lines[0]
            failed = next((line for line in lines[1:] if line.startswith("failed test:")), None)
            if failed and "failed test" not in head:
                head = f"{head} {failed}"
            if head.endswith(("(", "[", "{")):  # a multi-line test, e.g. the 398 BERT tensor names
                head += " ..."
            heads.append(head)
        return "; ".join(heads)


# ---- rulesets


def checker_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mlperf-logging")
    except PackageNotFoundError:
        return "unknown"


@lru_cache(maxsize=None)
def known_rulesets() -> tuple[str, ...]:
    from mlperf_logging.compliance_checker.mlp_compliance import rule_choices

    return tuple(sorted(rule_choices(), key=_version_key))


@lru_cache(maxsize=None)
def bert_rulesets() -> tuple[str, ...]:
    """The training rulesets whose benchmark list, in the installed mlperf-logging, has BERT."""
    from mlperf_logging.benchmark_meta import get_allowed_benchmarks

    accepted = []
    for ruleset in known_rulesets():
        try:
            if BENCHMARK in get_allowed_benchmarks(USAGE, ruleset):
                accepted.append(ruleset)
        except ValueError:  # a ruleset the benchmark list does not know
            continue
    return tuple(accepted)


def newest_bert_ruleset() -> str:
    return bert_rulesets()[-1]


def require_bert_ruleset(ruleset: str, where: str = "--ruleset") -> str:
    """The ruleset, if the installed checker can judge a BERT log with it; else one clear UserError."""
    if ruleset not in known_rulesets():
        raise UserError(
            f"unknown ruleset {ruleset!r} (mlperf-logging {checker_version()} has {', '.join(known_rulesets())})",
            where=where,
        )
    if ruleset not in bert_rulesets():
        rules = _rules_dir(ruleset) / f"closed_{BENCHMARK}.yaml"
        why = ("it no longer lists bert among its benchmarks, so every BERT log fails" if rules.exists()
               else "it has no BERT rule files and the checker crashes on BERT logs")
        raise UserError(
            f"ruleset {ruleset} cannot check BERT: {why}; BERT rulesets in mlperf-logging "
            f"{checker_version()}: {bert_rulesets()[0]} to {newest_bert_ruleset()} (use {newest_bert_ruleset()})",
            where=where,
        )
    return ruleset


def ruleset_from_path(path: Path) -> str | None:
    """`.../training_results_v1.1/...` or `.../v1.1/...` names the round: 1.1.0."""
    for part in reversed(Path(path).resolve().parts):
        m = ROUND_IN_PATH.match(part)
        if m:
            candidate = f"{int(m.group(1))}.{int(m.group(2))}.0"
            if candidate in known_rulesets():
                return candidate
    return None


def ruleset_from_date(first_time_ms: float | None) -> str | None:
    """The round a log was written for, from its first timestamp; logs newer than the last BERT round
    get the newest ruleset that still accepts BERT."""
    if not first_time_ms:
        return None
    day = dt.datetime.fromtimestamp(first_time_ms / 1000.0, tz=dt.timezone.utc).date()
    for ruleset, published in ROUND_PUBLISHED.items():
        if day <= published and ruleset in bert_rulesets():
            return ruleset
    return newest_bert_ruleset()


def choose_ruleset(log_dir: Path, first_time_ms: float | None, explicit: str | None = None,
                   recorded: str | None = None) -> tuple[str, str]:
    """(ruleset, why): --ruleset, else the one recorded in run.yaml, else a hint from the logs."""
    if explicit:
        return require_bert_ruleset(explicit), "--ruleset"
    if recorded:
        return require_bert_ruleset(recorded, where="run.yaml mlperf.ruleset"), "recorded in the experiment's run.yaml"
    from_path = ruleset_from_path(log_dir)
    if from_path:
        return require_bert_ruleset(from_path, where=str(log_dir)), "the round named in the path"
    from_date = ruleset_from_date(first_time_ms)
    if from_date:
        day = dt.datetime.fromtimestamp(first_time_ms / 1000.0, tz=dt.timezone.utc).date()
        return from_date, f"the logs' date ({day.isoformat()}); --ruleset overrides"
    return newest_bert_ruleset(), "the newest ruleset that accepts BERT"


# ---- running the checker


def check_log(path: str | Path, ruleset: str, werror: bool = False, timeout: float | None = None) -> CheckResult:
    """`python -m mlperf_logging.compliance_checker` on one log; its exit code is the verdict.

    A checker that runs past `timeout` seconds gave no verdict: that is a crash, said in one line."""
    with tempfile.TemporaryDirectory(prefix="bertctl-cc-") as tmp:
        command = [sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", USAGE,
                   "--ruleset", ruleset, "--log_output", str(Path(tmp) / "compliance_checker.log")]
        if werror:
            command.append("--werror")
        # absolute: the checker runs in its own folder, so a relative log path would name nothing
        try:
            proc = subprocess.run(command + [str(Path(path).absolute())], capture_output=True, text=True, cwd=tmp,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            return CheckResult(str(path), ruleset, False, [f"the checker ran past {timeout:g} s"], crashed=True)
    if "Traceback (most recent call last)" in proc.stderr:
        last = [line for line in proc.stderr.strip().splitlines() if line.strip()][-1]
        return CheckResult(str(path), ruleset, False, [f"the checker crashed: {last}"], crashed=True)
    return CheckResult(str(path), ruleset, proc.returncode == 0, checker_messages(proc.stderr))


def check_logs(paths: list[Path], ruleset: str, werror: bool = False) -> list[CheckResult]:
    """Every log checked, in parallel (one small process each), results in the order given."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(lambda p: check_log(p, ruleset, werror), paths))


def checker_messages(output: str) -> list[str]:
    """The checker's WARNING records, split into its messages.

    Output lines look like `LEVEL - text`; a record continues over lines without such a prefix.
    The last WARNING record is the verdict: all messages, separated by a line of 30 dashes. Any
    WARNING records before it are the parser's (`Found parsing errors:`, the bad line, `^^ why`).
    """
    records: list[list[str]] = []
    for line in output.splitlines():
        level = re.match(r"^(INFO|WARNING|ERROR|CRITICAL) - ?(.*)$", line)
        if level:
            records.append([level.group(1), level.group(2).strip()])
        elif records and not line.startswith("** Logging output"):
            records[-1].append(line)
    warnings = ["\n".join(text).strip() for level, *text in records if level == "WARNING"]
    if not warnings:
        return []
    *parsing, verdict = warnings
    messages = [" ".join(shorten(p) for p in parsing)] if parsing else []
    return messages + [chunk.strip() for chunk in verdict.split(SEPARATOR) if chunk.strip()]


def shorten(text: str, width: int = 160) -> str:
    """At most `width` characters, with `...` where it was cut."""
    return text if len(text) <= width else text[: width - 3] + "..."


def _rules_dir(ruleset: str) -> Path:
    import mlperf_logging.compliance_checker as cc

    return Path(cc.__file__).parent / f"{USAGE}_{ruleset}"


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split(".") if x.isdigit())
