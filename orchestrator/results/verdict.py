"""The verdict on a set of BERT runs: the package checker's view of it, and bertctl's own checks on top.

`assess` judges a set two ways and says both:

- as MLPerf's package checker sees it: every log through the official compliance checker, judged by its
  ruleset as it stood when its round was published (orchestrator/results/rulesets.py: today's
  mlperf-logging fails every accepted v1.1 and v2.1 log on rules changed since, and the report names
  them); at most one log may fail (the dropped run); the seed check (closed division, rulesets 1.0.0
  on); the RCP check with the round's sample source; a submission tree's systems/SYSTEM.json, which it
  reads. `Report.package_view_passed` is that verdict.
- with bertctl's own checks, which the official tools do not make: one log's events (resultlog.py: a
  log that breaks them fails the set outright; the official tools still judge it for the package
  checker's view where they can read it in seconds), what a run
  and a set claim to be (identity.py: counted accuracies, samples per step, the rate per accelerator,
  one system, one recipe, no copies), and the closed division read from the log (closed_log.py). A
  run that fails one of them counts as a failing run, as a non-compliant log does.

Each is a failure unless a published, accepted result shows it: then a warning naming that round and
set. Where bertctl fails a set the package checker would pass, the report says so in a line of its own
(`Report.stricter`). There must be a score: at most one run may fail or not converge. `print_report` is
the table on stderr, `Report.as_json` the contract scripts read on stdout.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.results import closed_log, identity, resultlog, rulesets, scoring
from orchestrator.results.compliance import BENCHMARK, CheckResult, check_logs, checker_version, choose_ruleset, shorten

# The package checker accepts one non-compliant run "under olympic scoring"; the result summarizer
# counts it as the dropped slowest.
MAX_BAD_RUNS = 1
MALFORMED = "malformed log (bertctl's checks): "


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
    # the official checker's verdict alone (by the ruleset as it stood), also on a log bertctl's event rules
    # fail; None where the official tools were not given it (beyond the size they read in seconds)
    official: bool | None = None
    warnings: list[str] = field(default_factory=list)  # what bertctl doubts in a log the official checker passes
    failures: list[str] = field(default_factory=list)  # bertctl's own checks this run fails (identity, closed rules)
    as_it_stood: str | None = None  # why it passes by its ruleset as it stood, though today's checker fails it

    @property
    def passed(self) -> bool:
        """The official checker (as the ruleset stood) and bertctl's own checks pass it."""
        return self.compliant and not self.failures


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
    problems: list[str] = field(default_factory=list)  # every reason the set fails
    package_problems: list[str] = field(default_factory=list)  # those the package checker would find
    stricter: list[str] = field(default_factory=list)  # where bertctl fails a set the package checker passes
    warnings: list[str] = field(default_factory=list)  # about the set: what accepted results also show
    ruleset_history: str | None = None  # the ruleset's rules changed since its round was published

    @property
    def passed(self) -> bool:
        return not self.problems

    @property
    def package_view_passed(self) -> bool:
        """The set as MLPerf's package checker sees it (by the ruleset as it stood)."""
        return not self.package_problems

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
            "warnings": self.warnings,
            "ruleset_history": self.ruleset_history,
            "problems": self.problems,
            "package_checker_view": {"passed": self.package_view_passed, "problems": self.package_problems},
            "stricter": self.stricter,
            "passed": self.passed,
        }


def assess(rs, ruleset: str | None = None, werror: bool = False, with_score: bool = True,
           check=None, summarizer: bool = True) -> Report:
    """Judge the set as the package checker does, and by bertctl's own checks (see the module).

    `check(paths, ruleset, werror)` gives the official checker's verdicts (check_logs by default: the
    checker run now, one process per log)."""
    if with_score:
        rs.require_runs(scoring.required_runs())
    chosen, reason = choose_ruleset(rs.directory, rs.first_time_ms, ruleset, rs.recorded_ruleset)
    checks = [rulesets.as_it_stood(c, s.values, werror) if c else None
              for c, s in zip(_checks(rs, chosen, werror, check or check_logs), rs.summaries)]
    system, where = identity.system_description(rs)
    found = own_findings(rs, chosen, system, where)
    report = Report(
        source="experiment" if rs.experiment else "directory", label=rs.label, directory=str(rs.directory),
        division=identity.package_division(rs.division, system), ruleset=chosen, ruleset_reason=reason,
        checker=checker_version(),
        runs=[_run_verdict(s, c, found) for s, c in zip(rs.summaries, checks)],
        ruleset_history=rulesets.history(chosen), notes=list(found.notes), warnings=list(found.set_warnings),
    )
    crashed = [c for c in checks if c and c.crashed]
    if crashed:  # not a verdict on the logs: the tool itself failed
        _package_problem(report, f"the compliance checker crashed on {len(crashed)} log(s): {crashed[0].messages[0]}")
    malformed = [(r.file, s.problem) for r, s in zip(report.runs, rs.summaries) if s.problem]
    unread = [r.file for r in report.runs if r.official is None]
    described = identity.description_problem(rs, system, where)
    if described:
        _package_problem(report, described)
    seeds = identity.Findings()
    identity.seeds(rs.summaries, chosen, report.division, seeds)
    for problem in seeds.problems:
        _package_problem(report, problem)
    for problem in repeated_runs(rs) + found.problems:
        _own_problem(report, problem)
    if with_score:
        _score(report, rs, skip_official=bool(unread), summarizer=summarizer)
    _judge(report, with_score, [f for f, _ in malformed])
    if malformed:
        (first, why), *_ = malformed
        _own_problem(report, f"{len(malformed)} malformed log(s) ({', '.join(f for f, _ in malformed)}): their events break "
                             f"bertctl's rules ({first} {why}), and a malformed log cannot be the run olympic scoring drops")
    return report


def own_findings(rs, ruleset: str, system: dict | None, where: str) -> identity.Findings:
    """bertctl's checks beyond one log's events: each run's claims, the set's identity, the closed rules."""
    found = identity.run_findings(rs.summaries)
    found.merge(identity.rate_findings(rs.summaries, system, where))
    found.merge(identity.set_findings(rs.summaries))
    found.merge(identity.division_findings(rs.division, system, where))
    return found.merge(closed_log.findings(rs.summaries, ruleset, rs.division, rs.run_config))


def _package_problem(report: Report, problem: str) -> None:
    report.problems.append(problem)
    report.package_problems.append(problem)


def _own_problem(report: Report, problem: str) -> None:
    """A problem of bertctl's own checks: the package checker does not find it."""
    report.problems.append(problem)
    report.stricter.append(problem)


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


def _checks(rs, ruleset: str, werror: bool, check) -> list[CheckResult | None]:
    """The official checker's verdict on every log it can read in seconds (a run that did not finish, or
    one that breaks bertctl's rules, included: the package checker would judge it too); None for the rest."""
    judged = [f for f, s in zip(rs.files, rs.summaries) if s.official_safe]
    official = iter(check(judged, ruleset, werror))
    return [next(official) if s.official_safe else None for s in rs.summaries]


def _run_verdict(s, check: CheckResult | None, found: identity.Findings) -> RunVerdict:
    """One run: the official checker's verdict, and bertctl's. A log that breaks bertctl's event rules is
    not compliant whatever the checker says (`official` keeps what it says), and its message is the rule."""
    name = Path(s.file).name
    official = check.compliant if check else None
    if s.problem:
        message = MALFORMED + s.problem
    else:
        message = "" if check.compliant and not check.as_it_stood else check.summary
    return RunVerdict(
        file=name, compliant=bool(official) and not s.problem, converged=s.converged, status=s.status,
        minutes=s.minutes, samples_to_converge=s.samples_to_converge, samples_source=s.samples_source,
        accuracy=s.last_accuracy, seed=s.seed, message=message, checker_messages=check.messages if check else [],
        official=official, warnings=list(s.warnings) + found.warnings.get(name, []),
        failures=found.failures.get(name, []) + ([f"incomplete: {s.incomplete}"] if s.incomplete and not s.problem else []),
        as_it_stood=check.as_it_stood if check else None,
    )


def _score(report: Report, rs, skip_official: bool = False, summarizer: bool = True) -> None:
    report.score = scoring.olympic_score([(r.file, r.minutes, r.converged and not r.failures) for r in report.runs])
    if skip_official:
        report.rcp_note = "not checked: the official parser would read a log too large for it"
        report.notes.append("result_summarizer and RCP not run: a log is beyond what the official parser reads in seconds")
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
            _package_problem(report, f"the official RCP checker crashed on these logs: {_one_line(e)}")


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return shorten(f"{type(error).__name__}: {text}" if text else type(error).__name__, 200)


def _judge(report: Report, with_score: bool, malformed: list[str] = ()) -> None:
    """What keeps the set from being a valid MLPerf result: the package checker's view (at most one log
    failing the official checker, the RCP check), then bertctl's (at most one run failing any check or
    not converged, and a score)."""
    failing = [r.file for r in report.runs if not r.official]
    bad = [r.file for r in report.runs if not r.passed or not r.converged]
    allowed = MAX_BAD_RUNS if with_score else 0
    if len(failing) == len(report.runs) and failing:
        _package_problem(report, f"every log fails the compliance checker (ruleset {report.ruleset})")
    elif len(failing) > allowed:
        _package_problem(report, f"{len(failing)} log(s) fail the compliance checker ({', '.join(failing)}); "
                                 f"{'the package checker accepts at most 1' if with_score else 'every log must pass'}")
    elif len(bad) > allowed:
        _own_problem(report, f"{len(bad)} run(s) fail or did not converge ({', '.join(_why_bad(report, f) for f in bad)}); "
                             f"{'olympic scoring accepts at most 1' if with_score else 'every run must pass'}")
    elif bad and bad[0] not in malformed:
        report.notes.append(f"{bad[0]} fails or did not converge: accepted under olympic scoring as the dropped run")
    if with_score and report.score.minutes is None and not any(p.startswith("no score") for p in report.problems):
        _own_problem(report, report.score.note)
    rcp = report.rcp
    if rcp is not None:
        if not rcp.passed:
            _package_problem(report, f"RCP check failed ({rcp.message}): {_rcp_numbers(rcp)}")
        elif rcp.bypassed:
            report.notes.append(f"{rcp.bypassed} (the check itself: {rcp.message}, {_rcp_numbers(rcp)})")


def _why_bad(report: Report, file: str) -> str:
    run = next(r for r in report.runs if r.file == file)
    if run.message.startswith(MALFORMED):
        return f"{file} ({run.message[len(MALFORMED):]})"
    if not run.compliant:
        return f"{file} (fails the checker)"
    if run.failures:
        return f"{file} (fails {run.failures[0]})"
    return f"{file} (did not converge)"


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
            r.file, ("[green]PASS[/] as it stood" if r.as_it_stood else "[green]PASS[/]") if r.compliant else "[red]FAIL[/]",
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
    if report.ruleset_history:
        console.print(f"ruleset: {escape(report.ruleset_history)}", highlight=False)
    for note in report.notes:
        console.print(f"note: {escape(note)}", highlight=False)
    by_reason: dict[str, list[str]] = {}
    for r in report.runs:
        if r.as_it_stood:
            by_reason.setdefault(r.as_it_stood, []).append(r.file)
    for reason, files in by_reason.items():
        console.print(f"note: {escape(', '.join(files))}: {escape(reason)}", highlight=False)
    # doubts the official checker does not share (published, accepted logs have them), one line per doubt
    for warning, files in _by_text(report.runs, "warnings").items():
        console.print(f"[yellow]warning:[/] {escape(', '.join(files))} {escape(warning)}", highlight=False)
    for warning in report.warnings:
        console.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False)
    # bertctl's own checks: each a failure the official checker does not find
    for failure, files in _by_text(report.runs, "failures").items():
        console.print(f"[red]fails:[/] {escape(', '.join(files))} {escape(failure)}", highlight=False)
    for problem in report.problems:
        console.print(f"[red]problem:[/] {escape(problem)}", highlight=False)
    if report.stricter:
        verdict = "passes" if report.package_view_passed else "fails"
        console.print(f"stricter than the package checker: it {verdict} this set; bertctl's own checks find "
                      f"{len(report.stricter)} more problem(s) above", highlight=False)
    console.print("[green]PASSED[/]" if report.passed else "[red]FAILED[/]")


def _by_text(runs: list[RunVerdict], field_name: str) -> dict[str, list[str]]:
    """{one warning or failure: the runs that have it}, in the runs' order."""
    grouped: dict[str, list[str]] = {}
    for r in runs:
        for text in getattr(r, field_name):
            grouped.setdefault(text, []).append(r.file)
    return grouped
