"""`bertctl data prepare --wait` on a scheduler that does not answer, or answers without accounting: the project's
rule (orchestrator/jobs/scheduler.py) that a command that fails or times out is no answer, never an end, and that a
job the queue listed and lists no more has ended. Stand-in sacct and squeue on PATH (test_job_evidence.py's
`stand_in`): a controller that cannot be reached is what a real one here cannot be made to be on demand."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from test_job_evidence import stand_in

from orchestrator.data.slurm_arrays import wait_for_jobs
from orchestrator.errors import WorkFailed
from orchestrator.jobs import scheduler

NO_CONTROLLER = "echo 'slurm_load_jobs error: Unable to contact slurm controller (connect failure)' >&2; exit 1"
NO_ACCOUNTING = "echo 'sacct: error: Slurm accounting storage is disabled' >&2; exit 1"


@pytest.fixture
def bin_dir(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "bin"
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    return folder


def queue_answers(bin_dir: Path, *answers: str) -> None:
    """squeue answers each call with the next of `answers` (a shell body), the last one ever after."""
    for i, body in enumerate(answers):
        stand_in(bin_dir, f"answer_{i}", body)
    stand_in(bin_dir, "squeue", f'n=$(cat {bin_dir}/calls 2>/dev/null || echo 0); echo $((n + 1)) > {bin_dir}/calls\n'
                                f'exec {bin_dir}/answer_$((n < {len(answers) - 1} ? n : {len(answers) - 1}))')


def waited(job_dir: Path, stages: list[str], job_ids: list[str], **limits) -> tuple[list[str], object]:
    """wait_for_jobs in a thread (a wait that never ends must fail the test, not hang it): what it said, and what it
    returned or raised."""
    said, outcome = [], []

    def wait() -> None:
        try:
            outcome.append(wait_for_jobs(job_dir, stages, job_ids, said.append, poll_s=0.01, **limits))
        except Exception as e:  # noqa: BLE001 (the test looks at what it was)
            outcome.append(e)

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    thread.join(20)
    assert not thread.is_alive(), f"still waiting after 20 s; said {said[:5]}"
    return said, outcome[0]


def test_a_scheduler_that_does_not_answer_is_waited_for_then_one_line_names_the_jobs(tmp_path, bin_dir):
    """Was: squeue's failure escaped as a SchedulerError, a traceback in the CLI."""
    stand_in(bin_dir, "sacct", NO_CONTROLLER)
    queue_answers(bin_dir, NO_CONTROLLER)
    said, outcome = waited(tmp_path, ["corpus", "examples"], ["4101", "4102"], silence_limit_s=0.3)
    assert isinstance(outcome, WorkFailed), outcome
    message = str(outcome)
    assert "\n" not in message and "Unable to contact slurm controller" in message
    assert "jobs 4101,4102 may still run" in message and "`squeue -j 4101,4102` or `sacct -j 4101,4102`" in message
    assert int((bin_dir / "calls").read_text()) > 2  # it kept asking
    assert said == ["  the scheduler did not answer (squeue: slurm_load_jobs error: Unable to contact slurm controller "
                    "(connect failure)): waiting up to 0.3 s for an answer"]  # once, however many polls


def test_without_accounting_a_job_the_queue_listed_and_lists_no_more_has_ended(tmp_path, bin_dir):
    """Was: a job absent from the queue was skipped, so the wait never ended. A controller that does not answer
    for a moment is waited out, said once."""
    stand_in(bin_dir, "sacct", NO_ACCOUNTING)
    running = "echo '4201|RUNNING|1|0:05|node1|None|data-sample-corpus|/tmp'"
    queue_answers(bin_dir, NO_CONTROLLER, NO_CONTROLLER, running, running, "exit 0")
    said, outcome = waited(tmp_path, ["corpus"], ["4201"])
    assert outcome == ["corpus"]  # its end is inferred: the caller says so, and how to check the result
    assert said == ["  the scheduler did not answer (squeue: slurm_load_jobs error: Unable to contact slurm controller "
                    "(connect failure)): waiting up to 600 s for an answer",
                    "  corpus (job 4201): RUNNING",
                    "  corpus (job 4201): ended (the queue no longer lists it and no accounting says how; no task recorded "
                    "an error)"]


def test_without_accounting_an_ended_stage_with_an_error_record_fails_with_it(tmp_path, bin_dir):
    stand_in(bin_dir, "sacct", NO_ACCOUNTING)
    queue_answers(bin_dir, "echo '4301|PENDING|1|0:00||Dependency|data-sample-examples|/tmp'", "exit 0")
    (tmp_path / "errors").mkdir()
    (tmp_path / "errors" / "examples_3.json").write_text(json.dumps({"exit_code": 1, "file": "/data/part-3.txt",
                                                                      "message": "not UTF-8 at byte 12"}))
    said, outcome = waited(tmp_path, ["examples"], ["4301"])
    assert isinstance(outcome, WorkFailed)
    assert str(outcome) == f"stage examples (job 4301) failed: /data/part-3.txt: not UTF-8 at byte 12 (log: {tmp_path / 'logs'})"
    assert said == ["  examples (job 4301): PENDING", "  examples (job 4301): FAILED"]


def test_a_job_no_answer_ever_listed_has_ended_after_the_accounting_grace(tmp_path, bin_dir, monkeypatch):
    """As orchestrator/jobs/status.py::job_info: not listed yet is PENDING for ACCOUNTING_GRACE_S, then over."""
    monkeypatch.setattr(scheduler, "ACCOUNTING_GRACE_S", 0.2)
    stand_in(bin_dir, "sacct", NO_ACCOUNTING)
    queue_answers(bin_dir, "exit 0")
    said, outcome = waited(tmp_path, ["corpus", "examples"], ["4401", "4402"])
    assert outcome == ["corpus", "examples"] and int((bin_dir / "calls").read_text()) > 1 and len(said) == 2
