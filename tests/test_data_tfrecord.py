"""TFRecords in the MLPerf feature layout -> HDF5, without TensorFlow: framing, CRCs, tf.train.Example
parsing, both HDF5 layouts, and the whole pipeline (4-bin split, eval pick) from TFRecord parts."""

import importlib.util
import random
import sys

import numpy as np
import pytest
import yaml
from conftest import REPO
from data_helpers import all_samples, as_key, bertctl, same_samples, worker

from trainer.data.layout import Sample, Shard, shard_files
from trainer.data.prepare import tfrecord
from trainer.data.prepare.errors import BadInput

sys.path.insert(0, str(REPO / "tests" / "data"))
import make_tf_fixtures  # noqa: E402  (numpy only: what TensorFlow was given)

HAS_TF = importlib.util.find_spec("tensorflow") is not None


def random_samples(rng: random.Random, n: int, max_len: int = 512, max_pred: int = 76) -> list[Sample]:
    out = []
    for _ in range(n):
        length = rng.choice([rng.randrange(5, 129), rng.randrange(129, 513)]) if max_len == 512 else rng.randrange(5, max_len + 1)
        k = min(max_pred, max(1, round(length * 0.15)))
        ids = np.array([2] + [rng.randrange(5, 30522) for _ in range(length - 2)] + [3])
        positions = np.array(sorted(rng.sample(range(1, length - 1), k)))
        seg = (np.arange(length) > length // 2).astype(np.int64)
        out.append(Sample(ids, seg, positions, np.array([rng.randrange(5, 30522) for _ in range(k)]), rng.randrange(2)))
    return out


def test_samples_survive_the_mlperf_tfrecord_layout(tmp_path):
    samples = random_samples(random.Random(0), 40)
    path = tfrecord.write_samples(tmp_path / "part-00000", samples, 512, 76)
    assert same_samples(list(tfrecord.read_samples(path, 512, 76)), samples)
    features = tfrecord.parse_example(next(tfrecord.read_records(path)))
    assert {k: (len(v), np.asarray(v).dtype.kind) for k, v in features.items()} == {
        "input_ids": (512, "i"), "input_mask": (512, "i"), "segment_ids": (512, "i"),
        "masked_lm_positions": (76, "i"), "masked_lm_ids": (76, "i"), "masked_lm_weights": (76, "f"),
        "next_sentence_labels": (1, "i")}


def test_records_written_by_tensorflow_read_back_exactly():
    expected = make_tf_fixtures.mlperf_samples()
    got = [tfrecord.parse_example(p) for p in tfrecord.read_records(REPO / "tests" / "data" / "mlperf_layout_tf.tfrecord")]
    assert len(got) == len(expected) == 4
    for g, e in zip(got, expected):
        assert g.keys() == e.keys() and all(np.array_equal(g[k], e[k]) for k in e)
    samples = list(tfrecord.read_samples(REPO / "tests" / "data" / "mlperf_layout_tf.tfrecord", 512, 76))
    assert [len(s) for s in samples] == [20, 200, 400, 512] and [len(s.masked_lm_positions) for s in samples] == [3, 30, 60, 76]


@pytest.mark.skipif(not HAS_TF, reason="TensorFlow is a test-only extra: pip install '.[tf]'")
def test_tensorflow_reads_what_we_write(tmp_path):
    import tensorflow as tf

    samples = random_samples(random.Random(1), 5)
    path = tfrecord.write_samples(tmp_path / "x.tfrecord", samples, 512, 76)
    spec = {k: tf.io.FixedLenFeature([512], tf.int64) for k in ("input_ids", "input_mask", "segment_ids")}
    spec |= {k: tf.io.FixedLenFeature([76], tf.int64) for k in ("masked_lm_positions", "masked_lm_ids")}
    spec |= {"masked_lm_weights": tf.io.FixedLenFeature([76], tf.float32), "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64)}
    for record, sample in zip(tf.data.TFRecordDataset(str(path)), samples):
        parsed = tf.io.parse_single_example(record, spec)
        assert np.array_equal(parsed["input_ids"].numpy()[: len(sample)], sample.input_ids)
        assert int(parsed["input_mask"].numpy().sum()) == len(sample)


@pytest.mark.parametrize("layout", ["fixed", "varlen"])
def test_tfrecord_to_hdf5_in_both_layouts(tmp_path, layout):
    samples = random_samples(random.Random(2), 30)
    tfrecord.write_samples(tmp_path / "in.tfrecord", samples, 512, 76)
    result = worker("tfrecord-to-hdf5", "--input", str(tmp_path / "in.tfrecord"), "--output", str(tmp_path / "out.hdf5"),
                    "--layout", layout)
    assert result.returncode == 0, result.stderr
    shard = Shard(tmp_path / "out.hdf5")
    assert shard.layout == layout and same_samples(shard.samples(range(len(shard))), samples)


def corrupt(path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


def record_offsets(path) -> list[int]:
    offsets, pos, data = [], 0, path.read_bytes()
    while pos < len(data):
        offsets.append(pos)
        pos += 12 + int.from_bytes(data[pos:pos + 8], "little") + 4
    return offsets


@pytest.mark.parametrize("damage, message", [
    ("truncate_data", "record 2: truncated (needs"),
    ("truncate_header", "record 3: truncated (file ends inside the length header)"),
    ("flip_data", "record 2: corrupt (CRC mismatch in the data)"),
    ("flip_length", "record 1: corrupt (CRC mismatch in the length header)"),
])
def test_truncated_or_corrupt_tfrecords_name_the_record_and_leave_no_output(tmp_path, damage, message):
    path = tfrecord.write_samples(tmp_path / "part-00007", random_samples(random.Random(3), 3), 512, 76)
    offsets = record_offsets(path)
    data = path.read_bytes()
    if damage == "truncate_data":
        path.write_bytes(data[: offsets[2] + 100])
    elif damage == "truncate_header":
        path.write_bytes(data + data[:5])
    elif damage == "flip_data":
        corrupt(path, offsets[2] + 12 + 50)
    else:
        corrupt(path, offsets[1] + 1)
    with pytest.raises(BadInput) as e:
        list(tfrecord.read_samples(path, 512, 76))
    assert str(e.value).startswith(f"{path}: {message}")
    out = tmp_path / "out.hdf5"
    result = worker("tfrecord-to-hdf5", "--input", str(path), "--output", str(out))
    assert result.returncode == 2 and result.stderr.startswith(f"error: {path}: {message}") and result.stderr.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["part-00007"]  # no output, no temporary file


def test_records_that_are_not_mlperf_samples_are_named(tmp_path):
    bad = tfrecord.build_example({"input_ids": np.arange(8), "input_mask": np.array([1, 1, 0, 1, 0, 0, 0, 0])})
    path = tfrecord.write_records(tmp_path / "x", [tfrecord.build_example(tfrecord.features_from_sample(
        random_samples(random.Random(4), 1, 8, 2)[0], 8, 2)), bad])
    with pytest.raises(BadInput, match=r"record 1: not in the MLPerf feature layout \(missing segment_ids"):
        list(tfrecord.read_samples(path, 8, 2))
    path = tfrecord.write_records(tmp_path / "y", [b"\xff\xff\xff"])
    with pytest.raises(BadInput, match=r"record 0: not a tf.train.Example"):
        list(tfrecord.read_samples(path, 8, 2))


def tfrecord_dataset(tmp_path, **checkpoint) -> tuple[list[list[Sample]], list[Sample]]:
    """Three TFRecord parts and an eval file in the MLPerf layout, and m.yaml: mlperf_wiki pointed at them."""
    rng = random.Random(5)
    parts = [random_samples(rng, n) for n in (70, 55, 81)]
    for i, part in enumerate(parts):
        tfrecord.write_samples(tmp_path / "tfrecords" / f"part-{i:05d}-of-00003", part, 512, 76)
    eval_samples = random_samples(rng, 57)
    tfrecord.write_samples(tmp_path / "eval_intermediate", eval_samples, 512, 76)
    manifest = yaml.safe_load((REPO / "datasets" / "mlperf_wiki.yaml").read_text())
    manifest["root"] = str(tmp_path / "out")
    manifest["source"].update(train=str(tmp_path / "tfrecords"), eval=str(tmp_path / "eval_intermediate"))
    manifest["outputs"]["train"]["shards"] = 3
    manifest["outputs"]["eval"]["pick"] = 20
    manifest["outputs"]["eval"]["layout"] = "fixed"
    manifest["expect"] = {"outputs": {"eval": {"samples": 20}}, "nsp_tolerance": 0.5, "masking_tolerance": 0.5}
    manifest["checkpoint"].update(checkpoint)
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(manifest))
    return parts, eval_samples


def test_the_pipeline_from_tfrecord_parts_bins_every_sample_and_picks_the_eval_set(tmp_path):
    parts, eval_samples = tfrecord_dataset(tmp_path)
    result = bertctl("data", "prepare", "--dataset", str(tmp_path / "m.yaml"), "--workers", "2", home=tmp_path / "home")
    assert result.returncode == 0, result.stderr
    root = tmp_path / "out"
    everything = [s for part in parts for s in part]
    for b, (lo, hi) in {"128": (1, 128), "256": (129, 256), "384": (257, 384), "512": (385, 512)}.items():
        files = shard_files(root / "train" / b)
        assert [f.name for f in files] == [f"part_{i}_of_3.hdf5" for i in range(3)]
        sizes = [len(Shard(f)) for f in files]
        in_bin = [s for s in everything if lo <= len(s) <= hi]
        assert sum(sizes) == len(in_bin) and max(sizes) - min(sizes) <= 1
        # each bin keeps the input order: parts in name order, records in file order
        assert same_samples(all_samples(files), in_bin)
    picked = all_samples([root / "eval" / "part_eval_10k.hdf5"])
    assert Shard(root / "eval" / "part_eval_10k.hdf5").layout == "fixed"
    assert same_samples(picked, [eval_samples[int(i * 57 / 20)] for i in range(20)])
    verify = bertctl("data", "verify", "--dataset", str(tmp_path / "m.yaml"), home=tmp_path / "home")
    assert "FAIL" not in verify.stderr.replace("FAIL  checkpoint", "")
    assert "SKIP  train: 80/10/10: no vocabulary to tell the [MASK] id" in verify.stderr
    assert "SKIP  checkpoint: TF files: checkpoint.tf_checkpoint is not set" in verify.stderr
    assert "FAIL  checkpoint: converted" in verify.stderr and verify.returncode == 1  # the phase-1 checkpoint is part of it
    assert len({as_key(s) for s in everything}) == len(everything)  # (the check above was not vacuous)


@pytest.mark.slow
def test_prepare_converts_the_phase1_checkpoint_after_checking_its_files(tmp_path):
    prefix = REPO / "tests" / "data" / "tf_bert" / "model.ckpt-5"
    index_bytes = (REPO / "tests" / "data" / "tf_bert" / "model.ckpt-5.index").stat().st_size
    ckpt = {"tf_checkpoint": str(prefix), "bert_config": str(prefix.parent / "bert_config.json"),
            "files": {".index": {"bytes": index_bytes + 1}}, "bert_config_file": None}
    tfrecord_dataset(tmp_path, **ckpt)
    wrong = bertctl("data", "prepare", "--dataset", str(tmp_path / "m.yaml"), home=tmp_path / "home")
    assert wrong.returncode == 2
    assert wrong.stderr.strip().splitlines()[-1] == (
        f"bertctl: error: {prefix}.index: {index_bytes} bytes, expected {index_bytes + 1} (is this the MLPerf phase-1 checkpoint?)")
    assert not (tmp_path / "out").exists()  # checked before anything was built
    ckpt["files"] = {".index": {"bytes": index_bytes}, ".data-00000-of-00001": {"md5": "0" * 8}}
    (tmp_path / "m.yaml").write_text(yaml.safe_dump({**yaml.safe_load((tmp_path / "m.yaml").read_text()), "checkpoint": ckpt}))
    wrong_md5 = bertctl("data", "prepare", "--dataset", str(tmp_path / "m.yaml"), home=tmp_path / "home")
    assert wrong_md5.returncode == 2 and "model.ckpt-5.data-00000-of-00001: md5 is not 00000000" in wrong_md5.stderr
    ckpt["files"] = {".index": {"bytes": index_bytes}}
    (tmp_path / "m.yaml").write_text(yaml.safe_dump({**yaml.safe_load((tmp_path / "m.yaml").read_text()), "checkpoint": ckpt}))
    ok = bertctl("data", "prepare", "--dataset", str(tmp_path / "m.yaml"), home=tmp_path / "home")
    assert ok.returncode == 0, ok.stderr
    converted = tmp_path / "out" / "phase1" / "model.ckpt-28252.pt"
    assert converted.is_file()
    verify = bertctl("data", "verify", "--dataset", str(tmp_path / "m.yaml"), home=tmp_path / "home")
    assert "PASS  checkpoint: TF files: 1 files as expected" in verify.stderr
    assert f"PASS  checkpoint: converted: {converted}" in verify.stderr
