"""`bertctl submit --follow`: stay with an experiment until it ends, then judge it.

Streams (to stderr) the log of each preparatory step (dataset, phase 1) and of each run in turn,
waits for the job itself to finish, then prints what the official MLPerf tools say about the runs
(orchestrator/results/verdict.py), the score (the olympic mean needs 10 runs; fewer get their mean time to
train, named as such) and the path of the convergence plot.
"""

from __future__ import annotations

import sys
import time

from orchestrator.experiments import Experiment
from orchestrator.jobs import logs, status
from orchestrator.jobs.scheduler import State

MLPERF_TARGET = 0.720


def follow(exp: Experiment, console) -> int:
    """Exit code: 0 when the job completed and (for training) its runs pass the compliance check."""
    for step in exp.steps:
        say(f"--- {step} ---")
        logs.follow_step(exp, step, sys.stderr)
    for run in range(exp.nexp):
        say(f"--- run {run} ---")
        logs.show(exp, run, rank=None, follow=True, out=sys.stderr)
    final = wait_until_finished(exp)
    say(f"{exp.id}: {final.state.value}")
    if final.state != State.COMPLETED:
        return 1
    if exp.program == "probe":
        from orchestrator.checks import rehearsal

        verdict = rehearsal.assess(exp)
        rehearsal.print_verdict(verdict, console)
        return 0 if verdict.passed else 1
    return 0 if judge(exp, console) else 1


def wait_until_finished(exp: Experiment):
    view = status.collect([exp])[0]
    while not view.state.finished:  # the runs are done; the job is wrapping up
        time.sleep(logs.POLL_S)
        view = status.collect([exp])[0]
    return view


def judge(exp: Experiment, console) -> bool:
    """The compliance verdict, the score and the plot of a finished experiment."""
    from orchestrator.results import plot, resultset, scoring, verdict

    rs = resultset.from_experiment(exp)
    scored = exp.nexp >= scoring.required_runs()
    report = verdict.assess(rs, with_score=scored)
    verdict.print_report(report, console)
    target = (rs.run_config or {}).get("train", {}).get("target_accuracy")
    if rs.division == "open" and target is not None and target < MLPERF_TARGET:
        say(f"division: open, because the target accuracy {target} is below MLPerf's {MLPERF_TARGET} "
            f"(a {describe_model(rs.run_config)} cannot reach it in minutes on a CPU)")
    if not scored:
        minutes = [r.minutes for r in report.runs if r.minutes is not None]
        mean = f"{sum(minutes) / len(minutes):.3f} min" if minutes else "n/a"
        say(f"score: no olympic score with {exp.nexp} run(s) (MLPerf needs {scoring.required_runs()}); "
            f"mean time to train: {mean}")
    say(f"plot: {plot.plot([rs], plot.default_output([rs]))}")
    return report.passed


def describe_model(run_config: dict | None) -> str:
    model = (run_config or {}).get("model", {})
    return f"{model.get('num_layers', '?')}-layer, {model.get('hidden_size', '?')}-hidden BERT"


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
