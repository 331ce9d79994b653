"""Integration tests against the real local Slurm (slurmctld, two slurmd, slurmdbd on MariaDB).

They submit through bertctl exactly as a user would, and read state back through sacct.
The `slurm` fixture starts the cluster (as root) or fails saying how to start it.
"""

import json
import subprocess
import time
from pathlib import Path

import pytest
from conftest import STATUS_EVERY, run_bertctl, status_now

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm")]


def status(exp_id: str) -> dict:
    return status_now(exp_id)


def wait_until_finished(exp_id: str, timeout: float = 90) -> tuple[dict, list[str]]:
    seen, end = [], time.time() + timeout
    while time.time() < end:
        view = status(exp_id)
        if not seen or seen[-1] != view["state"]:
            seen.append(view["state"])
        if view["state"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            return view, seen
        time.sleep(STATUS_EVERY)
    pytest.fail(f"{exp_id} did not finish in {timeout}s; states seen: {seen}")


def submit(*args: str) -> str:
    result = run_bertctl("submit", "--cluster", "ci_slurm", *args)
    assert result.code == 0, result.err
    exp_id = result.out.strip()
    assert exp_id.startswith("ci_slurm-") and "\n" not in exp_id  # stdout: only the id
    return exp_id


def probe_reports(log: Path) -> list[dict]:
    return [json.loads(line.split("BERTCTL_PROBE ", 1)[1]) for line in log.read_text().splitlines() if "BERTCTL_PROBE " in line]


def test_two_nodes_times_two_tasks_report_their_ranks_and_nodes(bertctl_home):
    exp_id = submit("--probe")
    view, _ = wait_until_finished(exp_id)
    assert view["state"] == "COMPLETED" and view["runs"][0]["nodes"] == 2
    reports = sorted(probe_reports(bertctl_home / "experiments" / exp_id / "logs" / "run_0.log"), key=lambda r: r["rank"])
    assert [r["rank"] for r in reports] == [0, 1, 2, 3]
    assert [r["node"] for r in reports] == ["node1", "node1", "node2", "node2"]  # block distribution
    assert [r["local_rank"] for r in reports] == [0, 1, 0, 1]
    assert {r["world_size"] for r in reports} == {4} and {r["master_addr"] for r in reports} == {"node1"}
    assert {r["launcher"] for r in reports} == {"slurm"}


def test_nexp3_goes_from_pending_or_running_to_completed_with_distinct_seeds(bertctl_home):
    exp_id = submit("--probe", "--nexp", "3")
    view, seen = wait_until_finished(exp_id)
    assert seen[0] in ("PENDING", "RUNNING") and seen[-1] == "COMPLETED", seen
    assert [r["state"] for r in view["runs"]] == ["COMPLETED"] * 3
    assert [r["seed"] for r in view["runs"]] == [0, 1, 2]
    exp_dir = bertctl_home / "experiments" / exp_id
    for run in range(3):
        assert {r["seed"] for r in probe_reports(exp_dir / "logs" / f"run_{run}.log")} == {run}
        assert (exp_dir / "results" / f"result_{run}.txt").read_text().count('"key": "cache_clear"') == 2  # one per node
    # what sbatch ran is what --dry-run prints, byte for byte
    job = json.loads(run_bertctl("status", exp_id, "--json").out)["experiments"][0]["job_ids"][0]
    submitted = subprocess.run(["scontrol", "write", "batch_script", job, "-"], capture_output=True, text=True).stdout
    dry_run = run_bertctl("submit", "--cluster", "ci_slurm", "--probe", "--nexp", "3", "--dry-run").out
    assert submitted == dry_run == (exp_dir / "job.sbatch").read_text()
    # logs -f of a finished run prints it and returns
    logs = run_bertctl("logs", exp_id, "--run", "2", "-f", timeout=30)
    assert logs.code == 0 and logs.out.count("BERTCTL_PROBE") == 4
    assert run_bertctl("logs", exp_id, "--run", "2", "--rank", "3").out.count("BERTCTL_PROBE") == 1


def test_a_failing_job_shows_failed_with_its_error():
    exp_id = submit("--probe", "-o", "container.venv=/nonexistent/venv")
    view, _ = wait_until_finished(exp_id)
    assert view["state"] == "FAILED"
    run = view["runs"][0]
    assert run["state"] == "FAILED"
    assert "/nonexistent/venv/bin/activate: No such file or directory" in run["error"]


def test_a_cancelled_job_shows_cancelled():
    exp_id = submit("--probe", "-o", "slurm.extra_sbatch=[--begin=now+1hour]")
    assert status(exp_id)["state"] == "PENDING"
    result = run_bertctl("cancel", exp_id)
    assert result.code == 0 and result.out.strip() == exp_id
    view, _ = wait_until_finished(exp_id, timeout=30)
    assert view["state"] == "CANCELLED" and view["runs"][0]["state"] == "CANCELLED"


def test_follow_streams_until_the_experiment_ends_then_judges_it():
    """This home has no prepared dataset: the launch itself is sound, and the verdict says what is missing."""
    result = run_bertctl("submit", "--cluster", "ci_slurm", "--probe", "--nexp", "2", "--follow", timeout=120)
    assert result.err.count("BERTCTL_PROBE") == 8 and "--- run 1 ---" in result.err
    assert result.code == 1 and "verified 0 of 8 rank report(s): FAILED" in result.err, result.err
    assert "run 1: every shard read once" in result.err and "training data folder not found" in result.err
    assert "run 1: one rendezvous" in result.err and result.err.count("FAIL ") == 2


def test_test_only_asks_slurm_and_oversized_jobs_are_refused(bertctl_home):
    ok = run_bertctl("submit", "--cluster", "ci_slurm", "--test-only")
    assert ok.code == 0 and "to start at" in ok.err, ok.err
    too_big = run_bertctl("submit", "--cluster", "ci_slurm", "-o", "resources.nodes=3", "-o", "run.train.global_batch_size=24")
    assert too_big.code == 2
    assert "resources.nodes: asks for 3 nodes but partition debug has 2" in too_big.err
    wrong_partition = run_bertctl("submit", "--cluster", "ci_slurm", "-o", "slurm.partition=gpu-a100")
    assert wrong_partition.code == 2 and "no partition 'gpu-a100'" in wrong_partition.err
    assert not (bertctl_home / "experiments").exists()


def test_hostile_paths_and_values_survive_a_real_submission(tmp_path):
    home = tmp_path / "home with space; $(touch PWNED) 'q'"
    comment = "it's; $(touch PWNED) `x` \"y\""
    result = run_bertctl("submit", "--cluster", "ci_slurm", "--probe", "-o", "slurm.extra_sbatch=" + json.dumps([f"--comment={comment}"]),
                         env={"BERTCTL_HOME": str(home)})
    assert result.code == 0, result.err
    exp_id = result.out.strip()
    end = time.time() + 60
    while time.time() < end:
        view = status_now(exp_id, home)
        if view["state"] in ("COMPLETED", "FAILED"):
            break
        time.sleep(STATUS_EVERY)
    assert view["state"] == "COMPLETED"
    job = subprocess.run(["scontrol", "show", "job", "-o", view["job_ids"][0]], capture_output=True, text=True).stdout
    assert f" Comment={comment} " in job  # sbatch parsed the quoted directive back to the exact value
    assert not list(tmp_path.rglob("PWNED")) and not Path("PWNED").exists()


def unanswering_slurm_conf(folder: Path) -> Path:
    """The cluster's slurm.conf with the controller's and the accounting daemon's ports moved where nothing listens:
    the real sacct and squeue, asked through it, fail as they do when slurmctld and slurmdbd are down."""
    lines = [line for line in Path("/etc/slurm/slurm.conf").read_text().splitlines()
             if not line.startswith(("SlurmctldPort=", "AccountingStoragePort=", "MessageTimeout=", "TCPTimeout="))]
    conf = folder / "slurm.conf"
    conf.write_text("\n".join([*lines, "SlurmctldPort=1", "AccountingStoragePort=2", "MessageTimeout=2", "TCPTimeout=2"]) + "\n")
    return conf


def test_a_running_job_whose_scheduler_does_not_answer_is_unknown_and_not_resumed(bertctl_home, tmp_path, monkeypatch):
    """squeue exiting 1 ("Unable to contact slurm controller") was read as an empty queue: once accounting had no
    record either, a running job was declared over and `resume` submitted a second one beside it."""
    from registry_records import record

    from orchestrator import experiments
    from orchestrator.errors import UserError
    from orchestrator.jobs import lifecycle, scheduler
    from orchestrator.jobs import status as jobs_status

    exp_dir = bertctl_home / "experiments" / "c-20260101-000000-aaaaaaaa"
    (exp_dir / "runs").mkdir(parents=True)
    (exp_dir / "runs" / "0.started").touch()
    job = subprocess.run(["sbatch", "--parsable", "--job-name=bert-c", f"--chdir={exp_dir}", "--output=/dev/null",
                          "--wrap=sleep 300"], capture_output=True, text=True, check=True).stdout.strip()
    (exp_dir / "experiment.json").write_text(json.dumps(record(exp_dir, executor="slurm", job_ids=[job], program="probe")))
    exp = experiments.find(exp_dir.name)
    try:
        end = time.time() + 60
        while jobs_status.collect([exp])[0].state.value != "RUNNING" and time.time() < end:
            time.sleep(STATUS_EVERY)
        assert jobs_status.collect([exp])[0].state.value == "RUNNING"
        monkeypatch.setattr(scheduler, "ACCOUNTING_GRACE_S", 0)  # long past the grace a new job gets
        monkeypatch.setenv("SLURM_CONF", str(unanswering_slurm_conf(tmp_path)))
        view = jobs_status.collect([exp])[0]
        assert view.state.value == "UNKNOWN" and "Unable to contact slurm controller" in view.runs[0].error, view
        with pytest.raises(UserError, match="its state is unknown .* add --force"):
            lifecycle.resume(exp)
        monkeypatch.delenv("SLURM_CONF")
        assert jobs_status.collect([exp])[0].state.value == "RUNNING"  # it ran all along
    finally:
        subprocess.run(["scancel", job], check=False)
