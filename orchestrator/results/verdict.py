"""The verdict on a set of BERT runs: every log through the official checker, the olympic score, the RCP check.

`assess` gathers what the official tools say (orchestrator.results.compliance for the per-log checker,
orchestrator.results.scoring for the score and RCP) and decides whether the set is a valid MLPerf result:
at most one run may fail the checker or miss the target (it is the dropped one), there must be a
score, and a closed-division set must pass its RCP check.

bertctl's own checks come first (orchestrator/results/resultlog.py): a log that breaks them (a second
run_start, NaN times, evaluations after convergence, ...) fails with its line and reason and is never
handed to the official tools, which pass many such logs. Its run has no time and never enters the
score. The set then fails outright: MLPerf's olympic scoring drops one run that ran and was judged
(non-compliant or not converged), but a malformed log could not be judged by the official checker at
all, so bertctl does not let it be the dropped run, and skips the summarizer and the RCP check (they
would read it with the official parser). `print_report` is the table on stderr,
`Report.as_json` the contract scripts read on stdout.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.results import resultlog, scoring
from orchestrator.results.compliance import BENCHMARK, CheckResult, check_logs, checker_version, choose_ruleset, shorten

# The package checker accepts one non-compliant run "under olympic scoring"; the result summarizer
# counts it as the dropped slowest.
MAX_BAD_RUNS = 1


@dataclass
class RunVerdict:
    file: str
    compliant: bool
    converged: bool
    status: str | None  # run_stop's status
    minutes: float | None
    samples_to_converge: int | None
    samples_source: str | None  # epoch_num | train_samples
    accuracy: float | None  # the last eval_accuracy
    seed: int | None
    message: str  # the checker's messages in one line; empty when compliant
    checker_messages: list[str]
    warnings: list[str] = field(default_factory=list)  # what bertctl doubts in a log the official checker passes


@dataclass
class Report:
    source: str  # "experiment" | "directory"
    label: str
    directory: str
    division: str | None
    ruleset: str
    ruleset_reason: str
    checker: str
    runs: list[RunVerdict]
    score: scoring.Score | None = None  # None with --no-score
    summarizer: scoring.SummarizerScore | None = None
    rcp: scoring.RcpVerdict | None = None
    rcp_note: str | None = None  # why there is no RCP verdict
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems

    @property
    def scaled_minutes(self) -> float | None:
        """The score as MLPerf publishes it: times the RCP factor (>= 1) when the runs converged faster
        than the reference mean, as the round's rcp_checker computes it; rounds without RCPs (v0.7) and
        the open division are not scaled."""
        if self.score is None or self.score.minutes is None:
            return None
        factor = self.rcp.factor if self.rcp is not None and self.rcp.passed else 1.0
        return self.score.minutes * factor

    def as_json(self) -> dict:
        score = self.score
        return {
            "source": self.source,
            "label": self.label,
            "directory": self.directory,
            "benchmark": BENCHMARK,
            "division": self.division,
            "ruleset": self.ruleset,
            "ruleset_reason": self.ruleset_reason,
            "checker": f"mlperf-logging {self.checker}",
            "runs": [vars(r) for r in self.runs],
            "score_minutes": score.minutes if score else None,
            "scaled_score_minutes": self.scaled_minutes,
            "score_note": score.note if score else "not scored (--no-score)",
            "dropped": score.dropped if score else [],
            "official_score_minutes": self.summarizer.minutes if self.summarizer else None,
            "official_notes": self.summarizer.notes if self.summarizer else [],
            "rcp": self.rcp.as_json() if self.rcp else None,
            "rcp_note": self.rcp_note,
            "notes": self.notes,
            "problems": self.problems,
            "passed": self.passed,
        }


def assess(rs, ruleset: str | None = None, werror: bool = False, with_score: bool = True,
           check=None, summarizer: bool = True) -> Report:
    """Check every log of the set with the official checker, then score it and check its RCP.

    `check(paths, ruleset, werror)` gives the checker's verdicts (benchmarks/published_logs_sweep.py
    passes verdicts it cached, and no summarizer: it re-runs the checker on every log)."""
    if with_score:
        rs.require_runs(scoring.required_runs())
    chosen, reason = choose_ruleset(rs.directory, rs.first_time_ms, ruleset, rs.recorded_ruleset)
    checks = _checks(rs, chosen, werror, check or check_logs)
    report = Report(
        source="experiment" if rs.experiment else "directory", label=rs.label, directory=str(rs.directory),
        division=rs.division, ruleset=chosen, ruleset_reason=reason, checker=checker_version(),
        runs=[_run_verdict(s, c) for s, c in zip(rs.summaries, checks)],
    )
    crashed = [c for c in checks if c.crashed]
    if crashed:  # not a verdict on the logs: the tool itself failed
        report.problems.append(f"the compliance checker crashed on {len(crashed)} log(s): {crashed[0].messages[0]}")
    malformed = [r.file for r, s in zip(report.runs, rs.summaries) if own_problem(s)]
    report.problems += repeated_runs(rs)
    if with_score:
        _score(report, rs, skip_official=bool(malformed), summarizer=summarizer)
    _judge(report, with_score, malformed)
    if malformed:
        report.problems.append(
            f"{len(malformed)} malformed log(s) ({', '.join(malformed)}): bertctl's checks fail them before the "
            "official checker, and a malformed log cannot be the run olympic scoring drops")
    return report


def repeated_runs(rs) -> list[str]:
    """Runs that are not separate runs: one file under two names (a link), two files with the same bytes,
    or two logs with the same seed. No published set has any of them; the official seed checker only
    catches the same seed logged from the same source line, and only in the package checker."""
    problems, seen_file, seen_bytes, seen_seed = [], {}, {}, {}
    for f, s in zip(rs.files, rs.summaries):
        try:
            info = os.stat(f)
            data, _ = resultlog.read_bounded(f)
        except (OSError, resultlog.UserError):
            continue  # its reader already said what is wrong with it
        digest = hashlib.sha256(data).hexdigest()
        first = seen_file.get((info.st_dev, info.st_ino)) or seen_bytes.get(digest)
        if first:
            how = "the same file as" if (info.st_dev, info.st_ino) in seen_file else "a copy of"
            problems.append(f"{f.name} is {how} {first}: one run counted twice")
        elif s.seed is not None and s.seed in seen_seed:
            problems.append(f"{f.name} and {seen_seed[s.seed]} log the same seed {s.seed}: one run repeated, "
                            "not two runs")
        seen_file.setdefault((info.st_dev, info.st_ino), f.name)
        seen_bytes.setdefault(digest, f.name)
        if s.seed is not None:
            seen_seed.setdefault(s.seed, f.name)
    return problems


def own_problem(s) -> str | None:
    """What bertctl's own checks find in a log read for a verdict: a broken rule, or a run not whole."""
    return s.problem or s.incomplete


def _checks(rs, ruleset: str, werror: bool, check) -> list[CheckResult]:
    """The official checker's verdict on every log that passed bertctl's checks; ours on the others."""
    judged = [f for f, s in zip(rs.files, rs.summaries) if not own_problem(s)]
    official = iter(check(judged, ruleset, werror))
    return [CheckResult(str(f), ruleset, False, [f"malformed log (bertctl's checks): {own_problem(s)}"])
            if own_problem(s) else next(official) for f, s in zip(rs.files, rs.summaries)]


def _run_verdict(s, check: CheckResult) -> RunVerdict:
    return RunVerdict(
        file=Path(s.file).name, compliant=check.compliant, converged=s.converged, status=s.status,
        minutes=s.minutes, samples_to_converge=s.samples_to_converge, samples_source=s.samples_source,
        accuracy=s.last_accuracy, seed=s.seed, message="" if check.compliant else check.summary,
        checker_messages=check.messages, warnings=list(s.warnings),
    )


def _score(report: Report, rs, skip_official: bool = False, summarizer: bool = True) -> None:
    report.score = scoring.olympic_score([(r.file, r.minutes, r.converged) for r in report.runs])
    if skip_official:
        report.rcp_note = "not checked: a malformed log would reach the official parser"
        report.notes.append("result_summarizer and RCP not run: they would read the malformed log(s)")
        return
    try:
        report.summarizer = scoring.summarizer_score(rs.directory, report.ruleset) if summarizer else None
    except Exception as e:  # noqa: BLE001  (the official tool's own failure, whatever it is, is one line)
        report.problems.append(f"the official result summarizer crashed on these logs: {_one_line(e)}")
    report.rcp_note = scoring.rcp_applies(report.division, report.ruleset)
    if report.rcp_note is None:
        if rs.uses_train_samples:
            report.notes.append("eval_accuracy epoch_num is not a sample count in these logs: samples to "
                                "converge and RCP use train_samples (rcp_checker --bert_train_samples)")
        try:
            report.rcp = scoring.check_rcp(rs.directory, report.ruleset, rs.uses_train_samples,
                                           scoring.rcp_bypass_reason(rs.run_config))
        except Exception as e:  # noqa: BLE001
            report.rcp_note = "the official RCP checker crashed"
            report.problems.append(f"the official RCP checker crashed on these logs: {_one_line(e)}")


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return shorten(f"{type(error).__name__}: {text}" if text else type(error).__name__, 200)


def _judge(report: Report, with_score: bool, malformed: list[str] = ()) -> None:
    """What keeps the set from being a valid MLPerf result; the empty list means it passes."""
    failing = [r.file for r in report.runs if not r.compliant]
    bad = [r.file for r in report.runs if not r.compliant or not r.converged]
    allowed = MAX_BAD_RUNS if with_score else 0
    if len(failing) == len(report.runs) and failing:
        report.problems.append(f"every log fails the compliance checker (ruleset {report.ruleset})")
    elif len(bad) > allowed:
        report.problems.append(
            f"{len(bad)} run(s) fail the checker or did not converge ({', '.join(bad)}); "
            f"{'olympic scoring accepts at most 1' if with_score else 'every run must pass'}")
    elif bad and bad[0] not in malformed:
        report.notes.append(f"{bad[0]} fails or did not converge: accepted under olympic scoring as the dropped run")
    if with_score and report.score.minutes is None:
        report.problems.append(report.score.note)
    rcp = report.rcp
    if rcp is not None:
        if not rcp.passed:
            report.problems.append(f"RCP check failed ({rcp.message}): {_rcp_numbers(rcp)}")
        elif rcp.bypassed:
            report.notes.append(f"{rcp.bypassed} (the check itself: {rcp.message}, {_rcp_numbers(rcp)})")


def _rcp_numbers(rcp) -> str:
    if rcp.submission_mean is None or rcp.min_samples is None:
        return "no convergence numbers"
    return (f"submission mean {rcp.submission_mean:,.0f} samples, acceptable minimum {rcp.min_samples:,.0f}, "
            f"RCP mean {rcp.rcp_mean:,.0f}")


def print_report(report: Report, console) -> None:
    """The per-run table and the verdict, for people (stderr)."""
    from rich.markup import escape
    from rich.table import Table

    # the heading on its own line: as a table title it would be folded to the table's width
    console.print(escape(f"{report.label}: compliance with ruleset {report.ruleset} ({report.ruleset_reason})"),
                  highlight=False)
    table = Table()
    for column in ("run", "checker", "converged", "samples", "minutes", "checker's message"):
        table.add_column(column, justify="right" if column in ("samples", "minutes") else "left")
    for r in report.runs:
        table.add_row(
            r.file, "[green]PASS[/]" if r.compliant else "[red]FAIL[/]",
            "yes" if r.converged else f"[yellow]no[/] ({r.status or 'no run_stop'})",
            f"{r.samples_to_converge:,}" if r.samples_to_converge is not None else "-",
            f"{r.minutes:.3f}" if r.minutes is not None else "-",
            escape(shorten(r.message, 110)),
        )
    console.print(table)
    score = report.score
    if score is not None and score.minutes is not None:
        console.print(f"score: {score.minutes:.3f} min ({score.note})", highlight=False)
        if report.scaled_minutes != score.minutes:
            console.print(f"score with the RCP scaling: {report.scaled_minutes:.3f} min (x{report.rcp.factor:.4f}: "
                          "the runs converged faster than the RCP mean)", highlight=False)
    elif score is not None:
        console.print(f"score: {score.note}", highlight=False)
    if report.summarizer is not None:
        official = report.summarizer.minutes
        console.print(f"result_summarizer: {f'{official:.3f} min' if official is not None else 'no score'}"
                      f"{' (it drops every run that fails the checker)' if official is None else ''}",
                      highlight=False)
    if report.rcp is not None:
        rcp = report.rcp
        verdict = "PASS" if rcp.passed else "FAIL"
        console.print(f"RCP ({rcp.ruleset}, pruned): {verdict}, {escape(rcp.message)}, factor {rcp.factor:.4f}; "
                      f"{_rcp_numbers(rcp)}", highlight=False)
    elif report.rcp_note:
        console.print(f"RCP: not checked ({report.rcp_note})", highlight=False)
    for note in report.notes:
        console.print(f"note: {escape(note)}", highlight=False)
    for r in report.runs:  # doubts the official checker does not share: published, accepted logs have them
        for warning in r.warnings:
            console.print(f"[yellow]warning:[/] {escape(r.file)} {escape(warning)}", highlight=False)
    for problem in report.problems:
        console.print(f"[red]problem:[/] {escape(problem)}", highlight=False)
    console.print("[green]PASSED[/]" if report.passed else "[red]FAILED[/]")
