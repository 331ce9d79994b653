"""Training data streams: seeded order, every sample once per epoch, rank-count invariance, resume."""

import numpy as np
import pytest
from synthetic import train_data, write_dataset

from trainer.data.dataset import DataError, training_files
from trainer.data.layout import Shard, write_shard


def key(sample) -> tuple:
    return tuple(sample.input_ids.tolist()) + (sample.next_sentence_label,)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("data"), shards=5, per_shard=37, seed=4)


def test_one_epoch_hands_out_every_sample_exactly_once(shards):
    data = train_data(shards, rank=0, world_size=1, batch_size=5, seed=7)
    everything = [key(Shard(f).sample(i)) for f in training_files(shards) for i in range(len(Shard(f)))]
    assert len(everything) == 185
    seen = [key(s) for _ in range(37) for s in data.next_samples()[0]]  # 37 x 5 = one epoch
    assert sorted(seen) == sorted(everything)
    assert data.streams[0].position.epoch == 1 and data.streams[0].position.offset == 0
    assert sorted(key(s) for s in data.next_samples()[0]) != sorted(seen[:5])  # epoch 2 is reshuffled


def test_same_seed_same_order_other_seed_other_order(shards):
    first = [key(s) for s in train_data(shards, 0, 1, 8, seed=1).next_samples()[0]]
    again = [key(s) for s in train_data(shards, 0, 1, 8, seed=1).next_samples()[0]]
    other = [key(s) for s in train_data(shards, 0, 1, 8, seed=2).next_samples()[0]]
    assert first == again and first != other


def test_global_batches_do_not_depend_on_the_rank_count(shards):
    one = train_data(shards, rank=0, world_size=1, batch_size=8, seed=3, streams=2)
    ranks = [train_data(shards, rank=r, world_size=2, batch_size=4, seed=3, streams=2) for r in (0, 1)]
    for _ in range(20):
        assert [key(s) for s in one.next_samples()[0]] == [key(s) for r in ranks for s in r.next_samples()[0]]


def test_ranks_read_disjoint_shards_and_positions_resume(shards):
    a = train_data(shards, rank=0, world_size=2, batch_size=3, seed=5)
    b = train_data(shards, rank=1, world_size=2, batch_size=3, seed=5)
    assert not set(map(str, a.streams[0].my_files(0))) & set(map(str, b.streams[0].my_files(0)))
    for _ in range(13):
        a.next_samples()[0]
    state = a.state_dict()
    expected = [key(s) for _ in range(30) for s in a.next_samples()[0]]
    fresh = train_data(shards, rank=0, world_size=2, batch_size=3, seed=5)
    fresh.load_state_dict(state)
    assert [key(s) for _ in range(30) for s in fresh.next_samples()[0]] == expected


def test_prefetching_in_worker_processes_changes_nothing(shards):
    plain = train_data(shards, 0, 1, 16, seed=9, workers=0)
    prefetched = train_data(shards, 0, 1, 16, seed=9, workers=1)
    try:
        for _ in range(30):
            assert [key(s) for s in plain.next_samples()[0]] == [key(s) for s in prefetched.next_samples()[0]]
    finally:
        prefetched.close()


def test_four_bin_folders_are_read_whole(tmp_path, shards):
    for edge in (128, 256, 384, 512):
        write_dataset(tmp_path / str(edge), shards=1, per_shard=3, seed=edge)
    assert [f.parent.name for f in training_files(tmp_path)] == ["128", "256", "384", "512"]


def test_too_few_shards_or_none_is_a_clear_error(tmp_path, shards):
    with pytest.raises(DataError, match="5 shard.s. for 8 readers"):
        train_data(shards, rank=0, world_size=8, batch_size=1, seed=0)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no .hdf5 shards found"):
        train_data(tmp_path / "empty", 0, 1, 1, seed=0)


def test_fixed_and_varlen_layouts_read_back_identically(tmp_path):
    from synthetic import make_sample

    rng = np.random.default_rng(0)
    samples = [make_sample(rng, 64, 64, 10) for _ in range(20)]
    for layout in ("fixed", "varlen"):
        path = write_shard(tmp_path / f"{layout}.hdf5", samples, layout, 64, 10)
        shard = Shard(path)
        assert shard.layout == layout and len(shard) == 20
        assert [key(s) for s in shard.samples(range(20))] == [key(s) for s in samples]
        assert shard.lengths.tolist() == [len(s) for s in samples]
        back = shard.sample(3)
        assert back.masked_lm_positions.tolist() == samples[3].masked_lm_positions.tolist()
    assert not list(tmp_path.glob(".*"))  # no temporary files left
