"""Synthetic pretraining data for trainer tests: learnable in seconds by a tiny BERT.

Sentence A repeats one token, sentence B another; for "is next" pairs B's token is A's token + 1.
A masked token is therefore its neighbours' token (MLM accuracy climbs to ~1.0 within a few
dozen updates) and NSP is decidable from the two tokens. Lengths follow a spread like the real
data's (short and full-length sequences) so padding and exchange padding have work to do.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

from trainer.data.layout import Sample, write_shard

CLS, SEP, MASK = 2, 3, 4
FIRST_WORD = 10


def make_sample(rng: np.random.Generator, vocab: int, max_len: int, max_pred: int) -> Sample:
    length = int(rng.choice([rng.integers(8, max_len // 4), rng.integers(max_len // 4, max_len), max_len]))
    a_len = max(1, (length - 3) // 2)
    b_len = length - 3 - a_len
    a = int(rng.integers(FIRST_WORD, vocab - 1))
    is_random = int(rng.integers(0, 2))
    b = int(rng.integers(FIRST_WORD, vocab)) if is_random else a + 1
    ids = np.array([CLS] + [a] * a_len + [SEP] + [b] * b_len + [SEP], np.int64)
    seg = np.array([0] * (a_len + 2) + [1] * (b_len + 1), np.int64)
    candidates = [i for i in range(1, length) if ids[i] not in (CLS, SEP)]
    k = min(max_pred, max(1, round(0.15 * length)))
    positions = np.sort(rng.choice(candidates, size=k, replace=False))
    original = ids[positions].copy()
    ids[positions] = MASK
    return Sample(ids, seg, positions, original, is_random)


def write_dataset(folder: Path, shards: int, per_shard: int, seed: int = 0, vocab: int = 64,
                  max_len: int = 64, max_pred: int = 10, layout: str = "varlen") -> Path:
    rng = np.random.default_rng(seed)
    for i in range(shards):
        samples = [make_sample(rng, vocab, max_len, max_pred) for _ in range(per_shard)]
        write_shard(folder / f"part_{i:05d}.hdf5", samples, layout, max_len, max_pred)
    return folder


# A closed-division run of the tiny model: LAMB (the only closed optimizer), at a rate that reaches
# the 0.720 target in about 1,700 samples (seed 0). Its model and data are far below the closed division's
# BERT-large, 512-token, 10,000-sample problem, so it waives those rules (trainer/config/closed_rules.py).
CLOSED = {"optim": {"name": "lamb", "lr": 2e-2}, "mlperf": {"division": "closed", "waive_scale_rules": True}}


def tiny_run_config(tmp: Path, world_size: int = 1, batch_size: int = 8, **changes) -> Path:
    """A run.yaml for a 2-layer, 64-hidden BERT on the synthetic data; `changes` are section.key=value."""
    train = write_dataset(tmp / "train", shards=4, per_shard=256, seed=1)
    evald = write_dataset(tmp / "eval", shards=1, per_shard=200, seed=2)
    cfg = {
        "world_size": world_size,
        "model": {"num_layers": 2, "hidden_size": 64, "num_heads": 2, "intermediate_size": 128,
                  "vocab_size": 64, "max_position_embeddings": 64},
        "data": {"train_dir": str(train), "eval_dir": str(evald), "max_seq_length": 64,
                 "max_predictions_per_seq": 10, "num_workers": 0, "eval_samples": 200},
        "optim": {"name": "adam", "lr": 3e-3, "warmup_steps": 5, "max_steps": 300},
        "train": {"batch_size": batch_size, "global_batch_size": batch_size * world_size,
                  "max_samples_termination": 300 * batch_size * world_size, "eval_every_samples": 16 * batch_size * world_size,
                  "eval_batch_size": 50, "log_every_steps": 1},
        # open: ADAM is not a closed-division optimizer (a closed run sets CLOSED below)
        "mlperf": {"org": "bertctl-tests", "platform": "1xCPU", "division": "open"},
    }
    for key, value in changes.items():  # optim={"lr": 1e-3} merges a section; optim__lr=1e-3 sets one key
        section, _, field = key.partition("__")
        if field:
            cfg.setdefault(section, {})[field] = value
        else:
            cfg.setdefault(section, {}).update(value)
    path = tmp / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def train_data(folder, rank: int = 0, world_size: int = 1, batch_size: int = 8, seed: int = 0,
               streams: int | None = None, workers: int = 0, max_seq_length: int = 512, max_predictions: int = 76,
               vocab_size: int | None = None, **balance):
    """`TrainData` over a folder of shards, its sections built from plain values (`balance`: BalanceConfig keys)."""
    from trainer.config import BalanceConfig, DataConfig
    from trainer.data.dataset import TrainData

    data = DataConfig(train_dir=str(folder), streams=streams, num_workers=workers, max_seq_length=max_seq_length,
                      max_predictions_per_seq=max_predictions)
    return TrainData(data, BalanceConfig(**balance), batch_size, rank, world_size, seed, vocab_size=vocab_size)


def ci_slurm_on_shards(shards: Path) -> list[str]:
    """`-o` words for ci_slurm's recipe on synthetic shards (the preflight and straggler tests, the preflight
    rehearsal): no dataset to prepare, no phase-1 checkpoint, no eval."""
    items = ["prepare.phase1=null", "prepare.dataset=null", f"run.data.train_dir={shards}", "run.data.eval_dir=null",
             "run.balance.stratified=false", "run.train.init_checkpoint=null", "run.data.max_seq_length=128",
             "run.data.max_predictions_per_seq=20", "run.model.vocab_size=64",
             # the page cache is dropped per shard by the measure itself; a global drop would make the
             # throttled node read its Python libraries from the device
             "node.clear_caches=log_only"]
    return [a for item in items for a in ("-o", item)]
