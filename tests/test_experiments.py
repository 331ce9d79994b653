"""The experiment registry: atomic creation and updates, lookup by id, prefix or `last`."""

import dataclasses
import os

import pytest

from orchestrator import experiments
from orchestrator.errors import UserError
from orchestrator.experiments import Experiment


def make(cluster="c", created=1.0) -> Experiment:
    return Experiment(id=experiments.new_id(cluster), cluster=cluster, cluster_source="x.yaml", executor="slurm",
                      nexp=2, seeds=[0, 1], program="train", overrides=[], script="job.sbatch", created=created, dir="")


def test_create_writes_everything_then_appears_at_once(bertctl_home):
    exp = experiments.create(make(), {"job.sbatch": "#!/bin/bash\n", "run.yaml": "a: 1\n"})
    assert exp.path == bertctl_home / "experiments" / exp.id
    assert sorted(p.name for p in exp.path.iterdir()) == ["experiment.json", "job.sbatch", "run.yaml"]
    assert experiments.find(exp.id) == exp


def test_an_interrupted_create_leaves_nothing(bertctl_home, monkeypatch):
    def crash(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "rename", crash)
    with pytest.raises(KeyboardInterrupt):
        experiments.create(make(), {"job.sbatch": "x"})
    assert list((bertctl_home / "experiments").iterdir()) == []
    assert experiments.load_all() == []


def test_save_replaces_the_record_atomically(bertctl_home, monkeypatch):
    exp = experiments.create(make(), {})
    updated = dataclasses.replace(exp, job_ids=["17"], submitted=True)
    experiments.save(updated)
    assert experiments.find(exp.id).job_ids == ["17"]

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(UserError, match="cannot write the experiment directory: disk full"):
        experiments.save(dataclasses.replace(updated, job_ids=["18"]))
    assert experiments.find(exp.id).job_ids == ["17"]  # the old record is intact
    assert [p.name for p in exp.path.iterdir() if p.name.startswith(".")] == []  # no temp file left


def test_experiments_dir_of_a_cluster_is_linked_into_the_registry(bertctl_home, tmp_path):
    shared = tmp_path / "lustre"
    exp = experiments.create(make(), {"job.sbatch": "x"}, home=shared)
    assert exp.path.parent == shared
    assert (bertctl_home / "experiments" / exp.id).resolve() == exp.path.resolve()
    assert experiments.find(exp.id).id == exp.id
    experiments.remove(exp)
    assert not exp.path.exists() and not (bertctl_home / "experiments" / exp.id).is_symlink()


def test_find_by_prefix_last_and_errors():
    first = experiments.create(make("alpha", created=1.0), {})
    second = experiments.create(make("beta", created=2.0), {})
    assert experiments.find("last").id == second.id
    assert experiments.find("alpha").id == first.id
    with pytest.raises(UserError, match="no such experiment"):
        experiments.find("gamma")
    experiments.create(make("alpha", created=3.0), {})
    with pytest.raises(UserError, match="ambiguous: 2 experiments"):
        experiments.find("alpha")


def test_empty_registry_says_how_to_fill_it():
    with pytest.raises(UserError, match="bertctl submit creates them"):
        experiments.find("last")


def test_cancelling_a_finished_local_experiment_keeps_its_outcome(bertctl_home):
    from conftest import run_cli

    exp = experiments.create(dataclasses.replace(make(), executor="local", job_ids=["999999999"]),
                             {"job.sbatch": "#!/bin/bash\n", "job.exit": "0\n"})
    result = run_cli("cancel", exp.id)
    assert result.code == 0 and "has already ended: nothing to cancel" in result.err
    assert not (exp.path / "job.cancelled").exists()


@pytest.mark.parametrize("value, message", [
    ("relative/dir", "experiments_dir: must be an absolute path (after ~ and $VARS), got 'relative/dir'"),
    ("/shared/$BERTCTL_TEST_UNSET/x", "uses $BERTCTL_TEST_UNSET, which is not set"),
])
def test_a_bad_experiments_dir_is_refused_before_anything_is_written(bertctl_home, monkeypatch, value, message):
    from conftest import run_cli

    monkeypatch.delenv("BERTCTL_TEST_UNSET", raising=False)
    result = run_cli("submit", "--cluster", "local", "--nexp", "1", "-o", f"experiments_dir={value}")
    assert result.code == 2 and result.out == "" and message in result.err and result.err.count("\n") == 1, result.err
    assert not (bertctl_home / "experiments").exists() or experiments.load_all() == []


def test_diff_shows_real_differences_and_no_phantom_ones(bertctl_home):
    """An older experiment's cluster.yaml lacks the keys added since. One that is null in the newer
    experiment (unset, default None) is no difference; one with a value shows as (absent)."""
    import json

    import yaml
    from conftest import run_cli
    from mllog_factory import make_experiment, tiny_closed_specs

    old = make_experiment(tiny_closed_specs(2), cluster="local")
    new = make_experiment(tiny_closed_specs(2), cluster="local", overrides=("run.optim.lr=0.04",))
    raw = yaml.safe_load((old.path / "cluster.yaml").read_text())
    assert raw["run"]["data"]["streams"] is None and raw["run"]["checkpoint"]["keep"] == 3
    del raw["run"]["data"]["streams"], raw["run"]["checkpoint"]["keep"]  # keys the older bertctl did not have
    (old.path / "cluster.yaml").write_text(yaml.safe_dump(raw))
    result = run_cli("diff", old.id, new.id, "--json")
    assert result.code == 0, result.err
    rows = {row["key"]: (row[old.id], row[new.id]) for row in json.loads(result.out)["config"]}
    assert rows == {"run.optim.lr": (0.02, 0.04), "run.checkpoint.keep": ("(absent)", 3)}
    table = run_cli("diff", old.id, new.id)
    assert "run.data.streams" not in table.out and "(absent)" in table.out and "None" not in table.out
