"""bertctl submits through submitit's executor plugin interface (orchestrator/jobs/executors.py).

The shape of every submitit method bertctl overrides or calls is pinned here (a new submitit that
changes one fails these tests before it fails a submission); the local executor runs for real on
this machine, the Slurm one on the CI's real Slurm."""

import inspect
import subprocess
import sys
import time
from pathlib import Path

import pytest
import submitit
from conftest import STATUS_EVERY, run_bertctl, status_now, wait
from submitit.core import core, utils

from orchestrator.jobs.executors import (
    BatchScript,
    LocalScriptExecutor,
    LocalScriptJob,
    SlurmScriptExecutor,
    SubmissionRefused,
    batch_outputs,
)
from orchestrator.rendering import render

HOOKS = {
    "_make_submission_file_text": ["self", "command", "uid"],
    "_make_submission_command": ["self", "submission_file_path"],
    "_num_tasks": ["self"],
    "_get_job_id_from_submission_command": ["string"],
}


def parameters(function) -> list[str]:
    return list(inspect.signature(function).parameters)


def test_the_overridden_hooks_are_exactly_submitits_abstract_ones_with_the_same_shape():
    assert core.PicklingExecutor.__abstractmethods__ == set(HOOKS)
    assert not SlurmScriptExecutor.__abstractmethods__ and not LocalScriptExecutor.__abstractmethods__
    for name, shape in HOOKS.items():
        assert parameters(getattr(core.PicklingExecutor, name)) == shape, name
        for executor in (SlurmScriptExecutor, LocalScriptExecutor):
            assert parameters(getattr(executor, name)) == shape, (executor, name)
            static = isinstance(inspect.getattr_static(core.PicklingExecutor, name), staticmethod)
            assert isinstance(inspect.getattr_static(executor, name), staticmethod) == static, (executor, name)


def test_the_public_submitit_api_bertctl_calls_keeps_its_shape():
    assert parameters(core.Executor.submit) == ["self", "fn", "args", "kwargs"]
    assert parameters(core.Executor.update_parameters) == ["self", "kwargs"]
    assert parameters(core.PicklingExecutor.__init__)[:2] == ["self", "folder"]
    assert parameters(submitit.SlurmJob.__init__) == ["self", "folder", "job_id", "tasks"]
    assert parameters(submitit.SlurmJob.cancel) == ["self", "check"]
    assert parameters(submitit.SlurmJob.watcher.read_info) == ["string"]
    assert parameters(utils.JobPaths.__init__) == ["self", "folder", "job_id", "task_id"]
    # LocalScriptJob overrides these members of submitit's Job
    for name in ("done", "get_info", "cancel"):
        assert parameters(getattr(LocalScriptJob, name)) == parameters(getattr(core.Job, name)), name
    assert isinstance(inspect.getattr_static(core.Job, "state"), property)


def test_the_batch_output_is_named_as_submitit_names_a_jobs_output(tmp_path):
    """sbatch expands %j (%A_%a for an array element) in the rendered --output; submitit's JobPaths
    must find that file, or `Job.stdout()` and the status's error line read nothing."""
    c = render.sbatch_options
    from orchestrator.config.clusters import load_cluster

    config = load_cluster("ci_slurm").config
    plain = next(o for o in c(config, 1) if o.startswith("--output="))
    array = next(o for o in c(config.model_copy(update={"slurm": config.slurm.model_copy(update={"nexp_mode": "array"})}), 3)
                 if o.startswith("--output="))
    assert tmp_path / plain.split("=", 1)[1].replace("%j", "12") == submitit.SlurmJob(tmp_path, "12").paths.stdout
    assert (tmp_path / array.split("=", 1)[1].replace("%A", "12").replace("%a", "3")
            == submitit.SlurmJob(tmp_path, "12_3").paths.stdout)
    assert batch_outputs("slurm", tmp_path, ["12", "13_1"]) == [tmp_path / "12_0_log.out", tmp_path / "13_1_0_log.out"]


def test_parsable_answers_give_the_job_id_and_anything_else_is_refused():
    assert SlurmScriptExecutor._get_job_id_from_submission_command(b"123\n") == "123"
    assert SlurmScriptExecutor._get_job_id_from_submission_command("124;cluster2\n") == "124"
    with pytest.raises(utils.FailedSubmissionError, match="unexpected answer"):
        SlurmScriptExecutor._get_job_id_from_submission_command("Submitted batch job 12")


def test_status_asks_the_scheduler_once_for_every_experiment_and_array_element(bertctl_home, monkeypatch):
    """Three experiments, an array among them: one sacct call names every job, and its table (read by
    submitit's watcher) gives each element its own state."""
    import dataclasses

    from orchestrator import experiments
    from orchestrator.experiments import Experiment
    from orchestrator.jobs import scheduler, status

    def make(job_ids, array=False):
        exp = Experiment(id=experiments.new_id("c"), cluster="c", cluster_source="x.yaml", executor="slurm", nexp=2,
                         seeds=[0, 1], program="train", overrides=[], script="job.sbatch", created=1.0, dir="")
        return experiments.create(dataclasses.replace(exp, job_ids=job_ids, history=job_ids, array=array), {})

    exps = [make(["31"]), make(["32_0", "32_1"], array=True), make(["33"])]
    calls = []

    def sacct(command, ok_codes=(0,)):
        calls.append(command)
        return "JobID|State|NNodes|Elapsed|ExitCode|NodeList|Reason\n31|COMPLETED|2|0:10|0:0|node[1-2]|None\n" \
               "32_0|RUNNING|1|0:03|0:0|node1|None\n32_[1]|PENDING|1|0:00|0:0|None assigned|Priority\n33|FAILED|2|0:01|1:0|node[1-2]|None\n"

    monkeypatch.setattr(scheduler, "_run", sacct)
    views = status.collect(exps)
    assert len(calls) == 1 and calls[0][:2] == ["sacct", "-X"]
    assert [a for a in calls[0] if a.isdigit()] == ["31", "32", "33"]
    assert [v.state.value for v in views] == ["FAILED", "RUNNING", "FAILED"]  # no run wrote an exit: the job ended without it
    assert [r.job_id for r in views[1].runs] == ["32_0", "32_1"] and views[1].runs[1].state.value == "PENDING"


SCRIPT = """#!/bin/bash
# a stand-in for bertctl's local script: it writes job.exit as bertctl's does
EXP_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
trap 'echo $? > "$EXP_DIR/job.exit"' EXIT
echo "python=$BERTCTL_PYTHON dir=$EXP_DIR"
[ -e "$EXP_DIR/hold" ] && sleep 60
exit 3
"""


def submit_local(folder: Path) -> LocalScriptJob:
    (folder / "job.sh").write_text(SCRIPT)
    executor = LocalScriptExecutor(folder, SCRIPT, {"BERTCTL_PYTHON": "/opt/py"})
    return executor.submit_script(folder / "job.sh")


def test_the_local_executor_starts_the_script_detached_and_its_handle_reports_it(tmp_path):
    job = submit_local(tmp_path)
    assert isinstance(job, LocalScriptJob) and job.job_id.isdigit()
    wait(lambda: job.done(), 30, "the script to end")
    assert job.state == "FAILED" and job.get_info()["ExitCode"] == "3"
    assert job.stdout() == f"python=/opt/py dir={tmp_path}\n"  # submitit's Job reads the script's output
    # submitit's records: the batch file (the script, byte for byte) and the submitted callable
    assert (tmp_path / f"{job.job_id}_submission.sh").read_text() == SCRIPT
    assert job.submission().function == BatchScript(tmp_path / "job.sh")


def test_a_local_job_outlives_the_submitting_process_whose_output_is_captured_and_cancel_stops_it(tmp_path):
    """`EXP=$(bertctl submit ...)` must return at once: the job holds none of the caller's pipes."""
    (tmp_path / "hold").touch()
    code = ("import sys; from pathlib import Path; sys.path[:0] = sys.argv[2:]\n"
            "from test_submitit_executor import submit_local\n"
            "print(submit_local(Path(sys.argv[1])).job_id)")
    start = time.time()
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path), str(Path(__file__).parent), *sys.path],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and time.time() - start < 20, out.stderr
    job = LocalScriptJob(tmp_path, out.stdout.strip())  # a later process's handle on it
    wait(lambda: job.state == "RUNNING" and job.stdout(), 20, "the script to start")
    job.cancel()
    wait(lambda: not job.alive(), 20, "the process group to stop")
    assert job.state == "CANCELLED"


def test_a_launcher_answer_without_a_pid_is_a_failed_submission():
    assert LocalScriptExecutor._get_job_id_from_submission_command(b"4242\n") == "4242"
    with pytest.raises(utils.FailedSubmissionError, match="did not start"):
        LocalScriptExecutor._get_job_id_from_submission_command("bash: fork: retry")


# ---- on the CI's real Slurm

def status(exp: str) -> dict:
    return status_now(exp)


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm")
def test_a_refused_submission_is_one_line_without_sbatchs_own_noise(tmp_path, capfd):
    executor = SlurmScriptExecutor(tmp_path, "#!/bin/bash\n#SBATCH --partition=no-such-partition\ntrue\n")
    (tmp_path / "job.sbatch").write_text(executor.parameters["script"])
    with pytest.raises(SubmissionRefused, match="(?i)invalid partition") as refused:
        executor.submit_script(tmp_path / "job.sbatch")
    assert "\n" not in str(refused.value)
    assert capfd.readouterr().err == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.sbatch"]  # submitit's files went with the job


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm")
def test_an_array_submitted_through_submitit_is_what_render_prints_and_status_logs_cancel_resume_reach_it(bertctl_home):
    args = ["--cluster", "ci_slurm", "--probe", "--nexp", "2", "-o", "slurm.nexp_mode=array",
            "-o", "slurm.extra_sbatch=[--begin=now+1hour]"]
    submitted = run_bertctl("submit", *args)
    assert submitted.code == 0, submitted.err
    exp = submitted.out.strip()
    exp_dir = bertctl_home / "experiments" / exp
    jobs = status(exp)["job_ids"]
    base = jobs[0].split("_")[0]
    assert jobs == [f"{base}_0", f"{base}_1"] and status(exp)["state"] == "PENDING"
    # the batch file Slurm holds is bertctl's script, byte for byte what --dry-run prints, and submitit's record of it
    held = subprocess.run(["scontrol", "write", "batch_script", base, "-"], capture_output=True, text=True).stdout
    dry_run = run_bertctl("submit", *args, "--dry-run").out
    assert held == dry_run == (exp_dir / "job.sbatch").read_text() == (exp_dir / f"{base}_submission.sh").read_text()
    assert "submitit" not in held  # a bertctl script: no pickle to run
    cancelled = run_bertctl("cancel", exp)
    assert cancelled.code == 0, cancelled.err
    wait(lambda: status(exp)["state"] == "CANCELLED", 30, "the array to be cancelled", STATUS_EVERY)
    # resume run 1 alone: one new array element, submitted the same way, which runs and logs
    resumed = run_bertctl("resume", exp, "--run", "1")
    assert resumed.code == 0, resumed.err
    view = status(exp)
    new = view["job_ids"][1]
    assert view["job_ids"][0] == f"{base}_0" and new.split("_")[0] != base and new.endswith("_1")
    subprocess.run(["scontrol", "update", f"JobId={new}", "StartTime=now"], check=True, capture_output=True)
    wait(lambda: status(exp)["runs"][1]["state"] in ("COMPLETED", "FAILED"), 120, "run 1 to end", STATUS_EVERY)
    assert status(exp)["runs"][1]["state"] == "COMPLETED"
    assert run_bertctl("logs", exp, "--run", "1").out.count("BERTCTL_PROBE") == 4
    output = submitit.SlurmJob(exp_dir, new).stdout()  # the batch script's own output, where submitit looks
    assert output and "=== run 1 of 2" in output
