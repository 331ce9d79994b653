"""Load-balancing algorithms, stratified and packed batches, and the simulator behind `bertctl balance`."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from synthetic import make_sample, train_data, write_dataset

from trainer.balance.algorithms import bin_of, deal_order, pack_histogram, pack_sequences, quotas_from_counts
from trainer.balance.simulate import simulate
from trainer.data.batch import collate
from trainer.data.histogram import wikipedia_histogram


def test_quotas_from_the_real_histogram_are_samsungs_6_3_2_5():
    lengths, counts = wikipedia_histogram()
    per_bin = np.bincount(bin_of(lengths), weights=counts, minlength=4)
    assert np.round(per_bin / per_bin.sum() * 100, 1).tolist() == [36.9, 19.7, 11.7, 31.6]
    assert quotas_from_counts(per_bin, 16) == [6, 3, 2, 5]
    assert sum(quotas_from_counts(per_bin, 3)) == 3 and min(quotas_from_counts(per_bin, 4)) >= 1


def test_snake_deal_alternates_direction():
    members = deal_order(np.array([10, 9, 8, 7, 6, 5, 4, 3]), group=4, snake=True)
    assert [m.tolist() for m in members] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    plain = deal_order(np.array([10, 9, 8, 7, 6, 5, 4, 3]), group=4, snake=False)
    assert [m.tolist() for m in plain] == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_packing_is_over_99_percent_efficient_on_the_real_histogram():
    _, counts = wikipedia_histogram()
    packs, efficiency = pack_histogram(counts)
    assert efficiency >= 0.99 and packs < counts.sum() / 1.95  # about two sequences per pack
    lengths = np.random.default_rng(0).choice(np.arange(1, 513), size=2048, p=counts / counts.sum())
    groups = pack_sequences(lengths, 512)
    assert sorted(i for g in groups for i in g) == list(range(2048))  # every sequence once
    assert all(lengths[g].sum() <= 512 for g in groups)
    assert lengths.sum() / (len(groups) * 512) >= 0.99


@pytest.mark.parametrize("strategy,expected,tolerance", [
    ("random", 1.60, 0.03), ("stratified", 1.10, 0.02), ("global-exchange", 1.004, 0.002)])
def test_simulator_reproduces_the_published_imbalance_at_1024_x_16(strategy, expected, tolerance):
    _, counts = wikipedia_histogram()
    result = simulate(strategy, ranks=1024, batch=16, group=8, steps=20, seed=1, counts=counts)
    assert result.max_over_mean_tokens == pytest.approx(expected, abs=tolerance)


def test_group_local_presort_with_packing_meets_the_goal_at_1024_ranks():
    _, counts = wikipedia_histogram()
    result = simulate("packed", ranks=1024, batch=16, group=8, steps=20, seed=2, counts=counts)
    assert result.max_over_mean_tokens <= 1.01 and result.padding_share <= 0.01
    assert 0 < result.exchange_bytes_per_step < 1_000_000  # inside a node only: a few hundred KB


def test_balance_json_output_contract():
    from conftest import run_bertctl

    result = run_bertctl("balance", "--ranks", "64", "--batch", "16", "--group", "8", "--strategy", "group-exchange",
                         "--json", "--seed", "3")
    assert result.code == 0, result.err
    data = json.loads(result.out)
    assert data["steps"] >= 50
    for field in ("max_over_mean_tokens", "max_over_mean_attention", "padding_share", "exchange_bytes_per_step"):
        assert field in data
    assert 0.0 <= data["padding_share"] <= 1.0 and data["exchange_bytes_per_step"] == 7 * 16 * 2 * (4 + 1024 + 152)
    again = subprocess.run([sys.executable, "-m", "trainer.balance.simulate", "--ranks", "64", "--batch", "16",
                            "--strategy", "group-exchange", "--json", "--seed", "3"], capture_output=True, text=True).stdout
    assert json.loads(again) == data  # --seed makes it reproducible


def test_bad_balance_input_is_one_line():
    proc = subprocess.run([sys.executable, "-m", "trainer.balance.simulate", "--ranks", "10", "--batch", "16", "--group", "4"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.strip() == "bertctl balance: error: --group 4 must divide --ranks 10"


@pytest.fixture()
def four_bins(tmp_path):
    rng = np.random.default_rng(0)
    for edge, lo in ((128, 8), (256, 129), (384, 257), (512, 385)):
        from trainer.data.layout import write_shard

        samples = []
        while len(samples) < 60:
            s = make_sample(rng, vocab=60, max_len=512, max_pred=20)
            if lo <= len(s) <= edge:
                samples.append(s)
        for part in range(2):
            write_shard(tmp_path / str(edge) / f"part_{part}_of_2.hdf5", samples[part * 30:(part + 1) * 30], "varlen", 512, 20)
    return tmp_path


def test_stratified_batches_take_fixed_quotas_from_every_bin_and_use_each_sample_once(four_bins):
    data = train_data(four_bins, rank=0, world_size=1, batch_size=6, seed=0, stratified=True, bin_quotas=[3, 1, 1, 1])
    seen = []
    for _ in range(20):  # bin 0 (3 per batch, 60 samples) is exactly one epoch; bins 1-3 a third of one
        samples, packs = data.next_samples()
        assert packs is None
        assert np.bincount(bin_of(np.array([len(s) for s in samples])), minlength=4).tolist() == [3, 1, 1, 1]
        seen.extend(tuple(s.input_ids.tolist()) for s in samples)
    bins = bin_of(np.array([len(s) for s in seen]))
    for b, n in enumerate([60, 20, 20, 20]):  # bin 0 gives 3 per batch: its 60 samples are one epoch
        in_bin = [s for s, x in zip(seen, bins) if x == b]
        assert len(in_bin) == n and len(set(in_bin)) == n
    again = train_data(four_bins, rank=0, world_size=1, batch_size=6, seed=0, stratified=True, bin_quotas=[3, 1, 1, 1])
    assert [tuple(s.input_ids.tolist()) for s in again.next_samples()[0]] == seen[:6]


def test_packed_batches_give_the_same_per_sequence_losses_as_unpacked(tmp_path):
    from trainer.config import ModelConfig
    from trainer.model.bert import BertForPreTraining

    shards = write_dataset(tmp_path / "data", shards=2, per_shard=40, seed=5, max_len=64)
    data = train_data(shards, 0, 1, batch_size=6, seed=0, packing=True, pack_window=40, max_seq_length=64)
    samples, packs = data.next_samples()
    assert len(packs) == 6 and max(len(p) for p in packs) > 1  # several sequences per row
    assert all(sum(len(samples[i]) for i in p) <= 64 for p in packs)
    torch.manual_seed(0)
    model = BertForPreTraining(ModelConfig(num_layers=2, hidden_size=32, num_heads=2, intermediate_size=64, vocab_size=64,
                                           max_position_embeddings=64, hidden_dropout=0.0, attention_dropout=0.0)).eval()
    packed = collate(samples, unpadded=True)  # the packs' sequences back to back, one token stream
    starts = packed.cu_seqlens[:-1].long()
    assert torch.all(packed.position_ids[starts] == 0)  # positions restart at every sequence
    per_sequence = []
    for batch in (packed, collate(samples, unpadded=False)):
        with torch.no_grad():
            mlm, nsp = model(batch)
        token_ce = torch.nn.functional.cross_entropy(mlm, batch.mlm_labels, reduction="none")
        counts = [len(s.masked_lm_positions) for s in samples]
        mlm_per_seq = torch.stack([chunk.mean() for chunk in token_ce.split(counts)])
        nsp_per_seq = torch.nn.functional.cross_entropy(nsp, batch.nsp_labels, reduction="none")
        per_sequence.append((mlm_per_seq, nsp_per_seq))
    torch.testing.assert_close(per_sequence[0][0], per_sequence[1][0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(per_sequence[0][1], per_sequence[1][1], rtol=1e-5, atol=1e-6)


def test_the_simulator_honours_snake_false_as_the_trainer_does():
    """balance.snake: false deals round-robin in the trainer; the simulator used to deal snake always."""
    _, counts = wikipedia_histogram()
    snake = simulate("group-exchange", ranks=64, batch=16, group=8, steps=10, seed=4, counts=counts, snake=True)
    plain = simulate("group-exchange", ranks=64, batch=16, group=8, steps=10, seed=4, counts=counts, snake=False)
    assert not plain.snake and plain.max_over_mean_tokens > snake.max_over_mean_tokens  # round-robin favours member 0
    proc = subprocess.run([sys.executable, "-m", "trainer.balance.simulate", "--ranks", "64", "--batch", "16",
                           "--strategy", "group-exchange", "--steps", "10", "--seed", "4", "--no-snake", "--json"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["snake"] is False and data["max_over_mean_tokens"] == plain.max_over_mean_tokens


def test_balance_simulates_a_clusters_own_settings_with_its_packs_and_sequences_per_step():
    from conftest import run_bertctl

    result = run_bertctl("balance", "--cluster", "nvidia_dgxh100_1x8", "--json", "--steps", "20")
    assert result.code == 0, result.err
    data = json.loads(result.out)
    assert (data["strategy"], data["ranks"], data["batch"], data["group"], data["snake"]) == ("packed", 8, 48, 1, True)
    assert data["pack_sequences"] == 3 and data["nominal_sequences_per_step"] == 768
    assert 1.99 <= data["sequences_per_pack"] <= 2.0
    assert data["sequences_per_step"] == pytest.approx(768, rel=0.01) and data["padding_share"] < 0.005
    changed = run_bertctl("balance", "--cluster", "nvidia_dgxh100_1x8", "-o", "run.balance.snake=false",
                          "-o", "run.balance.pack_sequences=2", "--json", "--steps", "20")
    assert changed.code == 0, changed.err
    two = json.loads(changed.out)
    assert two["snake"] is False and two["pack_sequences"] == 2 and two["sequences_per_pack"] < 1.65  # 23 % fill a pack alone
    unknown = run_bertctl("balance", "--cluster", "nosuch")
    assert unknown.code == 2 and len(unknown.err.strip().splitlines()) == 1 and "nosuch" in unknown.err
