"""Exchange padding, bucket-wise clipping and the warm-up, on real multi-process gloo groups."""

import numpy as np
import pytest
import torch
import torch.distributed as dist
from gloo import run_ranks
from synthetic import make_sample

from trainer.config import BalanceConfig, DataConfig, OptimConfig
from trainer.data.layout import Sample
from trainer.parallel.exchange import Exchange


def key(s: Sample) -> tuple:
    return (tuple(s.input_ids.tolist()), tuple(s.segment_ids.tolist()), tuple(s.masked_lm_positions.tolist()),
            tuple(s.masked_lm_ids.tolist()), s.next_sentence_label)


def local_samples(rank: int, n: int) -> list[Sample]:
    rng = np.random.default_rng(100 + rank)
    return [make_sample(rng, vocab=60, max_len=64, max_pred=10) for _ in range(n)]


def exchange_on_rank(rank, world, mode, group_size, packed, device="cpu"):
    mine = local_samples(rank, 6)
    packs = [[0, 1], [2], [3, 4, 5]] if packed else None
    balance = BalanceConfig(exchange_padding=mode, group_size=group_size, snake=True)
    data = DataConfig(train_dir="unused", max_seq_length=64, max_predictions_per_seq=10)
    got = Exchange(balance, data, device=device)(mine, packs)
    return [key(s) for s in mine], [key(s) for s in got]


@pytest.mark.parametrize("world,mode,group_size,packed", [
    (2, "global", 2, False), (4, "global", 4, False), (4, "group", 2, False), (4, "group", 2, True)])
def test_exchange_moves_samples_without_losing_or_duplicating_any(world, mode, group_size, packed):
    results = run_ranks(exchange_on_rank, world, mode, group_size, packed)
    sent = [k for before, _ in results for k in before]
    received = [k for _, after in results for k in after]
    assert sorted(received) == sorted(sent)
    if mode == "group":  # nothing leaves its group
        for g in range(0, world, group_size):
            members = results[g:g + group_size]
            assert sorted(k for _, a in members for k in a) == sorted(k for b, _ in members for k in b)
    tokens = [sum(len(k[0]) for k in after) for _, after in results]
    before = [sum(len(k[0]) for k in b) for b, _ in results]
    if not packed:
        assert max(tokens) - min(tokens) <= max(before) - min(before)  # never worse balanced
        assert all(len(after) == 6 for _, after in results)  # sequences are dealt, counts stay equal


def exchange_setup_on_rank(rank, world, mode, device):
    balance = BalanceConfig(exchange_padding=mode, group_size=2)
    data = DataConfig(train_dir="unused", max_seq_length=64, max_predictions_per_seq=10)
    exchange = Exchange(balance, data, device=device)
    return exchange.device.type, dist.get_backend(exchange.group), dist.get_process_group_ranks(exchange.group)


def test_group_exchange_runs_over_gloo_in_host_memory_and_global_on_the_run_device():
    """Group mode: gloo groups of the node's ranks, rows in host memory, whatever the run's device
    (an NCCL all-gather would queue behind the GPU's work and stall the loop every step). Given CUDA,
    it even runs on a machine without it. Global mode: the run's process group and device."""
    assert run_ranks(exchange_setup_on_rank, 4, "group", "cuda") == [
        ("cpu", "gloo", [0, 1]), ("cpu", "gloo", [0, 1]), ("cpu", "gloo", [2, 3]), ("cpu", "gloo", [2, 3])]
    assert run_ranks(exchange_setup_on_rank, 2, "global", "cuda") == [("cuda", "gloo", [0, 1])] * 2
    results = run_ranks(exchange_on_rank, 4, "group", 2, False, "cuda")
    assert sorted(k for _, after in results for k in after) == sorted(k for before, _ in results for k in before)


def bucket_clip_on_rank(rank, world, bucket_cap_mb, max_norm):
    from torch.nn.parallel import DistributedDataParallel

    from trainer.parallel.gradients import GradientSync, clip_, global_norm

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(6)])
    ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb, gradient_as_bucket_view=True)
    sync = GradientSync(model, ddp, OptimConfig(lr=1e-3, max_steps=1, clip="bucket", max_grad_norm=max_norm))
    x = torch.randn(8, 64) * (rank + 1) * 50  # large, different gradients on every rank
    for _ in range(2):  # the trainer's warm-up passes: the hook learns the bucket count
        ddp(x).pow(2).sum().backward()
        model.zero_grad(set_to_none=True)
    ddp(x).pow(2).sum().backward()
    reduced = [p.grad.clone() for p in model.parameters()]
    buckets = sync.bucket_clip.buckets
    # what whole-model local clipping would give: clip this rank's own gradient, then average
    model.zero_grad(set_to_none=True)
    with ddp.no_sync():
        ddp(x).pow(2).sum().backward()
    local = [p.grad.clone() for p in model.parameters()]
    clip_(local, max_norm, global_norm(local))
    for g in local:
        dist.all_reduce(g)
        g.div_(world)
    return global_norm(reduced).item(), buckets, [g.numpy() for g in reduced], [g.numpy() for g in local]


def test_bucket_clipping_bounds_the_reduced_gradient_and_counts_buckets_at_run_time():
    norm, buckets, _, _ = run_ranks(bucket_clip_on_rank, 2, 0.01, 1.0)[0]
    assert buckets > 3  # 6 layers of 16.6 KB each in 10 KB buckets
    assert norm <= 1.0 + 1e-5


def test_bucket_clipping_with_one_bucket_equals_whole_model_local_clipping():
    norm, buckets, reduced, local = run_ranks(bucket_clip_on_rank, 2, 100.0, 1.0)[0]
    assert buckets == 1
    for r, mine in zip(reduced, local):
        np.testing.assert_allclose(r, mine, rtol=1e-5, atol=1e-7)


def trainer_losses(tmp_path, world, exchange, group_size=2):
    import json
    import os
    import subprocess
    import sys

    from synthetic import tiny_run_config

    folder = tmp_path / f"w{world}-{exchange}"
    config = tiny_run_config(
        folder, world_size=world, batch_size=8 // world, data={"streams": 4},
        optim={"max_steps": 12, "clip": "after_allreduce"}, train={"target_accuracy": 0.99},
        mlperf={"division": "open"}, model={"hidden_dropout": 0.0, "attention_dropout": 0.0},
        balance={"exchange_padding": exchange, "group_size": group_size}, runtime={"num_threads": 1, "unpad": True})
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}"] if world > 1 else [sys.executable]
    proc = subprocess.run([*launcher, "-m", "trainer", "--config", str(config), "--out", str(folder / "out")],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [json.loads(line)["loss"] for line in (folder / "out" / "metrics" / "run_0.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_exchange_padding_leaves_the_loss_unchanged_on_1_2_and_4_ranks(tmp_path):
    """Same samples per step whatever the rank count and the exchange: the same normalised losses.
    (Ranks without an exchange match one rank too: tests/test_train.py::test_two_gloo_ranks_give_the_same_losses_as_one.)"""
    reference = trainer_losses(tmp_path, 1, "none")
    assert len(reference) == 12
    for world, exchange in ((2, "group"), (4, "global"), (4, "group")):
        got = trainer_losses(tmp_path, world, exchange)
        assert got == pytest.approx(reference, rel=1e-5), (world, exchange)


def test_warm_up_leaves_model_optimizer_data_and_rng_untouched(tmp_path, monkeypatch):
    import copy
    import gc
    import weakref

    from gloo import free_port
    from synthetic import tiny_run_config

    from trainer.checkpoints.run import rng_state
    from trainer.config import load_run_config
    from trainer.loop.entry import RunArgs
    from trainer.loop.train import Trainer
    from trainer.parallel import distributed

    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    config = tiny_run_config(tmp_path, optim={"clip": "bucket"}, runtime={"nccl_warmup_steps": 3, "unpad": True})
    trainer = Trainer(load_run_config(str(config)), RunArgs(config=str(config), out=str(tmp_path / "out")))
    try:
        trainer.next_batch()  # move the data off its start so "untouched" means something
        before = (copy.deepcopy(trainer.model.state_dict()), copy.deepcopy(trainer.optimizer.state_dict()),
                  copy.deepcopy(trainer.data.state_dict()), rng_state()["torch"].clone())
        trainer.warm_up()
        assert trainer.grads.bucket_clip.buckets >= 1  # it learned the bucket count
        after = (trainer.model.state_dict(), trainer.optimizer.state_dict(), trainer.data.state_dict(), rng_state()["torch"])
        for name, tensor in before[0].items():
            assert torch.equal(tensor, after[0][name]), name
        assert before[1] == after[1] and before[2] == after[2] and torch.equal(before[3], after[3])
        assert all(p.grad is None for p in trainer.model.parameters())
    finally:
        trainer.close()
        distributed.close()
    kept = weakref.ref(trainer.ddp)
    del trainer
    gc.collect()
    assert kept() is not None  # freeing DDP in-process can deadlock: distributed.keep_until_exit


PACKS = [[0, 1], [2], [3, 4, 5]]  # each rank's six samples in three packs


def packed_exchange_on_rank(rank, world, snake):
    balance = BalanceConfig(exchange_padding="global", snake=snake)
    data = DataConfig(train_dir="unused", max_seq_length=64, max_predictions_per_seq=10)
    got = Exchange(balance, data, device="cpu")(local_samples(rank, 6), PACKS)
    return [key(s) for s in got]


def expected_packs(world: int, snake: bool) -> list[list[tuple]]:
    """Each rank's samples when the group's packs are dealt by token count, in the order asked for."""
    from trainer.balance.algorithms import deal_order

    units = [[key(local_samples(r, 6)[i]) for i in pack] for r in range(world) for pack in PACKS]
    tokens = np.array([sum(len(k[0]) for k in unit) for unit in units])
    return [[k for u in mine for k in units[u]] for mine in deal_order(tokens, world, snake)]


@pytest.mark.parametrize("snake", [False, True])
def test_packed_exchange_deals_packs_in_the_order_balance_snake_asks_for(snake):
    """Issue 16: with packing the exchange dealt in snake order whatever balance.snake said."""
    assert expected_packs(2, False) != expected_packs(2, True)  # the two orders differ on these packs
    assert run_ranks(packed_exchange_on_rank, 2, snake) == expected_packs(2, snake)


def test_a_vocabulary_beyond_int16_is_refused_and_the_largest_id_that_fits_survives_the_wire():
    """Issue 16: token ids travel as int16; a vocabulary of more than 32,768 tokens would wrap silently."""
    from pydantic import ValidationError

    from trainer.config import ModelConfig
    from trainer.parallel.exchange import decode, encode

    with pytest.raises(ValidationError, match="less than or equal to 32768"):
        ModelConfig(vocab_size=32769)
    sample = local_samples(0, 1)[0]
    sample.input_ids[1] = sample.masked_lm_ids[0] = 32767  # vocabulary of 32,768: the last id
    (back,), _ = decode(encode([sample], np.zeros(1, np.int64), 64, 10), 64, 10)
    assert key(back) == key(sample)
