"""The run configuration schema (trainer/config.py): defaults, cross-field checks, the MLPerf formula."""

import pytest
from pydantic import ValidationError

from trainer.config import RunConfig, mlperf_eval_interval


def minimal(**changes):
    raw = {
        "world_size": 8,
        "data": {"train_dir": "/data", "eval_dir": "/eval"},
        "optim": {"lr": 1e-3, "max_steps": 100},
        "train": {"batch_size": 4, "global_batch_size": 32, "max_samples_termination": 1000, "init_checkpoint": "/ckpt.pt"},
    }
    for key, value in changes.items():
        section, _, field = key.partition("__")
        if field:
            raw.setdefault(section, {})[field] = value
        else:
            raw[section] = value
    return raw


def test_defaults_are_bert_large_and_vocab_pads_to_a_multiple_of_8():
    cfg = RunConfig.model_validate(minimal())
    assert (cfg.model.num_layers, cfg.model.hidden_size, cfg.model.num_heads, cfg.model.intermediate_size) == (24, 1024, 16, 4096)
    assert cfg.model.padded_vocab_size == 30528


@pytest.mark.parametrize("gbs,interval", [(448, 150_000), (3072, 175_000), (8192, 225_000), (16384, 325_000), (4608, 200_000)])
def test_eval_interval_follows_the_mlperf_formula(gbs, interval):
    assert mlperf_eval_interval(gbs) == interval


def test_eval_interval_from_config_wins_over_the_formula():
    """In the open division: the closed one fixes the interval to the formula's."""
    cfg = RunConfig.model_validate(minimal(train__eval_every_samples=1234, mlperf={"division": "open"}))
    assert cfg.train.eval_interval == 1234
    assert RunConfig.model_validate(minimal()).train.eval_interval == mlperf_eval_interval(32)


def test_global_batch_must_equal_ranks_times_batch_times_accumulation():
    with pytest.raises(ValidationError, match=r"train.global_batch_size: is 64 but .* = 8 x 4 x 1 = 32"):
        RunConfig.model_validate(minimal(train__global_batch_size=64))
    ok = RunConfig.model_validate(minimal(train__global_batch_size=64, train__gradient_accumulation_steps=2))
    assert ok.train.global_batch_size == 64


@pytest.mark.parametrize("key,value", [("backend", "nccl"), ("precision", "fp16"), ("precision", "bf16"), ("kernels", "apex")])
def test_cuda_only_features_are_rejected_on_cpu(key, value):
    with pytest.raises(ValidationError, match=f"runtime.{key}: {value} needs runtime.device=cuda"):
        RunConfig.model_validate(minimal(runtime={key: value}))
    RunConfig.model_validate(minimal(runtime={key: value, "device": "cuda"}))


def test_closed_division_needs_the_mlperf_target():
    with pytest.raises(ValidationError, match="train.target_accuracy: 0.5 is not allowed in mlperf.division closed, which allows 0.72 only"):
        RunConfig.model_validate(minimal(train__target_accuracy=0.5))
    assert RunConfig.model_validate(minimal(train__target_accuracy=0.5, mlperf={"division": "open"}))


@pytest.mark.parametrize("name", ["adam", "madgrad", "acclip"])
def test_closed_division_admits_lamb_only(name):
    """MLPerf's closed division fixes BERT's optimizer to LAMB (closed_bert.yaml requires its keys)."""
    with pytest.raises(ValidationError, match=f"optim.name: {name} is not allowed in mlperf.division closed, "
                                              r"which allows lamb only \(MLPerf BERT rule 'LAMB optimizer', since v0.7\): "
                                              "set mlperf.division=open"):
        RunConfig.model_validate(minimal(optim={"name": name, "lr": 1e-3, "max_steps": 100}))
    assert RunConfig.model_validate(minimal(optim={"name": name, "lr": 1e-3, "max_steps": 100}, mlperf={"division": "open"}))
    assert RunConfig.model_validate(minimal(optim={"name": "lamb", "lr": 1e-3, "max_steps": 100})).optim.name == "lamb"


@pytest.mark.parametrize("optim,key", [({"schedule": "samsung"}, "optim.schedule"), ({"lr_max_steps": 79}, "optim.lr_max_steps")])
def test_closed_division_takes_the_reference_schedule_over_the_logged_steps(optim, key):
    """Samsung's schedule and a decay horizon other than the logged opt_learning_rate_training_steps are open choices."""
    raw = {"name": "lamb", "lr": 1e-3, "max_steps": 100, **optim}
    with pytest.raises(ValidationError, match=f"{key}: .*mlperf.division"):
        RunConfig.model_validate(minimal(optim=raw))
    assert RunConfig.model_validate(minimal(optim=raw, mlperf={"division": "open"}))
    assert RunConfig.model_validate(minimal(optim={**raw, "lr_max_steps": 100, "schedule": "nvidia"}))


def test_bin_quotas_must_fill_the_batch():
    with pytest.raises(ValidationError, match=r"bin_quotas: \[1, 1, 1, 2\] add up to 5, .* must add up to 4"):
        RunConfig.model_validate(minimal(balance={"stratified": True, "bin_quotas": [1, 1, 1, 2]}))
    cfg = RunConfig.model_validate(minimal(balance={"stratified": True, "bin_quotas": [1, 1, 1, 1]}))
    assert sum(cfg.balance.bin_quotas) == cfg.train.batch_size


@pytest.mark.parametrize("streams,batch,quotas", [(16, 4, [1, 0, 0, 1]), (32, 4, [0, 0, 0, 1]), (None, 4, [1, 1, 1, 1])])
def test_bin_quotas_fill_one_streams_batch(streams, batch, quotas):
    """A stream's micro-batch is batch_size x ranks / streams (trainer/data/dataset.py): 8 ranks x 4
    over 16 streams is 2 per stream, over 32 streams 1. Quotas that add up to batch_size
    instead validated and then failed on every rank at the first batch."""
    good = RunConfig.model_validate(minimal(data={"train_dir": "/data", "eval_dir": "/eval", "streams": streams},
                                            balance={"stratified": True, "bin_quotas": quotas}))
    assert sum(good.balance.bin_quotas) == batch * 8 // (streams or 8)
    wrong = [batch, 0, 0, 0] if sum(quotas) != batch else [batch + 1, 0, 0, 0]
    needed = batch * 8 // (streams or 8)
    with pytest.raises(ValidationError, match=rf"balance.bin_quotas: .* each of the {streams or 8} data stream\(s\) "
                                              rf"takes .* the quotas must add up to {needed}"):
        RunConfig.model_validate(minimal(data={"train_dir": "/data", "eval_dir": "/eval", "streams": streams},
                                         balance={"stratified": True, "bin_quotas": wrong}))


def test_streams_must_split_evenly_over_ranks_and_samples():
    with pytest.raises(ValidationError, match="data.streams: 12 data streams cannot be split evenly over 8 rank"):
        RunConfig.model_validate(minimal(data={"train_dir": "/data", "eval_dir": "/eval", "streams": 12}))
    with pytest.raises(ValidationError, match="data.streams: 64 data streams cannot be split evenly"):
        RunConfig.model_validate(minimal(data={"train_dir": "/data", "eval_dir": "/eval", "streams": 64}))  # 32 samples for 64 streams


def test_unknown_keys_are_rejected_and_values_are_frozen():
    with pytest.raises(ValidationError, match="extra"):
        RunConfig.model_validate(minimal(optim={"lr": 1e-3, "max_steps": 1, "lrr": 2}))
    cfg = RunConfig.model_validate(minimal())
    with pytest.raises(ValidationError):
        cfg.optim.lr = 5.0


def test_yaml_round_trip_is_exact():
    import yaml

    cfg = RunConfig.model_validate(minimal(optim={"lr": 0.00039299421615882676, "max_steps": 299, "betas": [0.8003575444254268, 0.8174653681457493]}))
    assert RunConfig.model_validate(yaml.safe_load(cfg.to_yaml())) == cfg
