"""The closed division holds to MLPerf's BERT rules (trainer/config/closed_rules.py): refused at render and
submit and by the trainer at start, one line naming the rule; every shipped closed recipe accepted."""

from pathlib import Path

import pytest
import yaml
from conftest import REPO, run_bertctl, run_cli
from pydantic import ValidationError

from trainer.config import RunConfig, first_problem
from trainer.config.base import model_at
from trainer.config.closed_rules import BERT_ROUNDS, CLOSED_RULES, closed_problems, eval_interval_rule, shown

CLUSTER = "nvidia_dgxh100_1x8"  # NVIDIA's H100 recipe: global batch 768, evaluations every 150,000 samples

# A value each rule refuses, keyed by the rule's key: a rule added without a case here fails the table test.
REFUSED = {
    "model.num_layers": 2, "model.hidden_size": 768, "model.num_heads": 8, "model.intermediate_size": 3072,
    "model.vocab_size": 8192, "data.max_seq_length": 128, "data.max_predictions_per_seq": 20,
    "data.eval_samples": 500, "data.eval_dir": None, "train.eval_every_samples": 1_000_000,
    "train.eval_start_samples": 75_000, "train.init_checkpoint": None, "train.target_accuracy": 0.5,
    "optim.name": "adam", "optim.schedule": "samsung", "optim.lr_max_steps": 100, "optim.clip": "bucket",
    "optim.max_grad_norm": 2.0,
}

# The issue's six: what a user typed that the closed division accepted before these rules.
SIX = [
    ("run.model.num_layers=2", "run.model.num_layers: 2 ", "'BERT-large model', since v0.7", "allows 24 only"),
    ("run.data.max_seq_length=128", "run.data.max_seq_length: 128 ", "'sequence length 512', since v0.7", "allows 512 only"),
    ("run.data.eval_samples=500", "run.data.eval_samples: 500 ", "'10,000-sample evaluation set', since v0.7",
     "allows 10000 only"),
    ("run.train.eval_every_samples=1000000", "run.train.eval_every_samples: 1000000 ", "'evaluation cadence', since v1.0",
     "allows null or 150000 (the rules' interval at global batch 768"),
    ("run.optim.clip=none", "run.optim.clip: none ", "'gradient clipping', since v1.0", "allows local or after_allreduce only"),
    ("run.train.init_checkpoint=null", "run.train.init_checkpoint: null ", "'initial checkpoint', since v0.7",
     "allows a path to the phase-1 checkpoint"),
]


def cluster_run() -> dict:
    """The H100 recipe's run as run.yaml holds it (what the trainer reads)."""
    from orchestrator.config.clusters import load_cluster

    return load_cluster(CLUSTER).config.run.model_dump(mode="json")


def with_value(run: dict, key: str, value) -> dict:
    section, field = key.split(".")
    return {**run, section: {**run[section], field: value}}


@pytest.mark.parametrize("rule", CLOSED_RULES, ids=lambda r: r.key)
def test_each_rule_has_a_round_a_source_and_a_key_of_the_schema(rule):
    assert rule.since in BERT_ROUNDS
    assert "mlcommons/" in rule.source and len(rule.source) > 40  # the document, and the words it enforces
    section, field = rule.key.split(".")
    assert field in model_at(RunConfig, [section]).model_fields
    assert rule.key in REFUSED, f"add a value {rule.key} refuses to REFUSED"


@pytest.mark.parametrize("rule", CLOSED_RULES, ids=lambda r: r.key)
def test_each_rule_refuses_its_value_naming_itself_and_the_waiver_covers_only_the_rules_of_scale(rule):
    bad = with_value(cluster_run(), rule.key, REFUSED[rule.key])
    with pytest.raises(ValidationError) as caught:
        RunConfig.model_validate(bad)
    key, message = first_problem(caught.value, RunConfig)
    assert key == rule.key
    assert message.startswith(f"{shown(REFUSED[rule.key])} is not allowed in mlperf.division closed, which allows ")
    assert message.endswith(f"only (MLPerf BERT rule '{rule.rule}', since {rule.since}): set mlperf.division=open")
    assert "\n" not in message
    assert RunConfig.model_validate({**bad, "mlperf": {**bad["mlperf"], "division": "open"}})
    waived = {**bad, "mlperf": {**bad["mlperf"], "waive_scale_rules": True}}
    if rule.scale:
        assert RunConfig.model_validate(waived).mlperf.waive_scale_rules
    else:
        with pytest.raises(ValidationError, match=f"'{rule.rule}'"):
            RunConfig.model_validate(waived)


@pytest.mark.parametrize("gbs,interval", [(448, 150_000), (768, 150_000), (3072, 175_000), (8192, 225_000),
                                          (13888, 300_000), (16384, 325_000)])
def test_the_cadence_is_the_rules_formula(gbs, interval):
    """The references' table (REF README; NVIDIA's v3.1 max-scale config evaluates every 300,000 at 13,888)."""
    assert eval_interval_rule(gbs) == interval


def shipped_closed() -> list[str]:
    return sorted(p.stem for p in (REPO / "clusters").glob("*.yaml")
                  if (yaml.safe_load(p.read_text())["run"].get("mlperf") or {}).get("division", "closed") == "closed")


def test_every_shipped_closed_recipe_is_accepted():
    from orchestrator.config.clusters import load_cluster

    names = shipped_closed()
    assert set(names) >= {"local_1x8gpu", "nvidia_dgxa100_1x8", "nvidia_dgxa100_8x8", "nvidia_dgxa100_128x8", CLUSTER}
    for name in names:
        run = load_cluster(name).config.run
        assert run.mlperf.division == "closed" and not run.mlperf.waive_scale_rules, name
        assert closed_problems(run) == [], name


@pytest.mark.parametrize("override,key,rule,allows", SIX, ids=[s[0] for s in SIX])
def test_render_refuses_each_setting_the_rules_fix(override, key, rule, allows):
    result = run_cli("render", "--cluster", CLUSTER, "-o", override)
    assert result.code == 2 and result.out == "", result
    assert result.err.count("\n") == 1 and result.err.startswith("bertctl: error: "), result.err
    assert key in result.err and rule in result.err and allows in result.err, result.err


def test_submit_refuses_as_the_user_types_it_and_writes_nothing(bertctl_home):
    result = run_bertctl("submit", "--cluster", CLUSTER, "--nexp", "10", "--dry-run", "-o", "run.model.num_layers=2")
    assert result.code == 2 and result.out == "" and result.err.count("\n") == 1, result
    assert "run.model.num_layers: 2 " in result.err and "'BERT-large model'" in result.err
    assert not (bertctl_home / "experiments").exists() or not any((bertctl_home / "experiments").iterdir())


@pytest.mark.parametrize("override,key,rule,allows", SIX, ids=[s[0] for s in SIX])
def test_the_trainer_refuses_a_hand_edited_run_yaml_before_training(tmp_path: Path, capsys, override, key, rule, allows):
    from trainer.loop.entry import main

    dotted, _, raw = override.removeprefix("run.").partition("=")
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(with_value(cluster_run(), dotted, yaml.safe_load(raw))))
    assert main(["--config", str(config), "--out", str(tmp_path / "out")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured.err
    assert captured.err.startswith(f"error: {config}: {key.removeprefix('run.')}") and rule in captured.err and allows in captured.err
    assert not (tmp_path / "out").exists()


def test_the_recipe_as_rendered_passes_the_trainers_start_check(tmp_path: Path):
    from trainer.config import load_run_config

    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(cluster_run()))
    assert load_run_config(str(config)).mlperf.division == "closed"


def test_the_waiver_is_written_to_run_yaml_only_when_set():
    run = cluster_run()
    assert "waive_scale_rules" not in run["mlperf"]  # the rendered scripts (goldens) carry run.yaml unchanged
    tiny = RunConfig.model_validate(with_value(with_value(run, "model.num_layers", 2), "mlperf.waive_scale_rules", True))
    assert tiny.model_dump()["mlperf"]["waive_scale_rules"] is True
    assert RunConfig.model_validate(yaml.safe_load(tiny.to_yaml())) == tiny
