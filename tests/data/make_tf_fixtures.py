"""Writes the TensorFlow-made test fixtures in this folder (needs TensorFlow: `pip install '.[tf]'`).

    python tests/data/make_tf_fixtures.py

  tf_bert/model.ckpt-5.{index,data-00000-of-00001}, tf_bert/bert_config.json
      a tiny BERT pretraining checkpoint saved by tf.compat.v1.train.Saver, with the real vocabulary
      size (30,522, so the converter pads it to 30,528) and LAMB slots and a global step to skip
  tf_unexpected/model.ckpt-1.*
      a checkpoint with a variable no BERT has (bert/encoder/layer_0/attention/self/rotary/kernel)
  mlperf_layout_tf.tfrecord
      four tf.train.Examples in the MLPerf feature layout, written by tf.io.TFRecordWriter

The values come from `checkpoint_arrays()` and `mlperf_samples()` (numpy only, fixed seeds), which
the tests import to know what TensorFlow was given; this script checks that TensorFlow reads back
exactly that before it finishes. CI does not install TensorFlow (1.6 GB): the files are committed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
CHECKPOINT = HERE / "tf_bert" / "model.ckpt-5"
UNEXPECTED = HERE / "tf_unexpected" / "model.ckpt-1"
TFRECORD = HERE / "mlperf_layout_tf.tfrecord"
BERT_CONFIG = {"vocab_size": 30522, "hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
               "intermediate_size": 16, "max_position_embeddings": 32, "type_vocab_size": 2,
               "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
               "initializer_range": 0.02}
SEQ, PRED = 512, 76


def checkpoint_arrays() -> dict[str, np.ndarray]:
    """TF variable name -> value, in TF's layout (kernels [in, out])."""
    c, rng = BERT_CONFIG, np.random.RandomState(1234)
    h, i, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]

    def w(*shape):
        return rng.normal(0.0, 0.5, shape).astype(np.float32)

    arrays = {
        "bert/embeddings/word_embeddings": w(v, h),
        "bert/embeddings/position_embeddings": w(c["max_position_embeddings"], h),
        "bert/embeddings/token_type_embeddings": w(c["type_vocab_size"], h),
        "bert/embeddings/LayerNorm/gamma": 1 + w(h), "bert/embeddings/LayerNorm/beta": w(h),
        "bert/pooler/dense/kernel": w(h, h), "bert/pooler/dense/bias": w(h),
        "cls/predictions/transform/dense/kernel": w(h, h), "cls/predictions/transform/dense/bias": w(h),
        "cls/predictions/transform/LayerNorm/gamma": 1 + w(h), "cls/predictions/transform/LayerNorm/beta": w(h),
        "cls/predictions/output_bias": w(v),
        "cls/seq_relationship/output_weights": w(2, h), "cls/seq_relationship/output_bias": w(2),
    }
    for n in range(c["num_hidden_layers"]):
        p = f"bert/encoder/layer_{n}/"
        for proj in ("query", "key", "value"):
            arrays[p + f"attention/self/{proj}/kernel"], arrays[p + f"attention/self/{proj}/bias"] = w(h, h), w(h)
        arrays[p + "attention/output/dense/kernel"], arrays[p + "attention/output/dense/bias"] = w(h, h), w(h)
        arrays[p + "attention/output/LayerNorm/gamma"], arrays[p + "attention/output/LayerNorm/beta"] = 1 + w(h), w(h)
        arrays[p + "intermediate/dense/kernel"], arrays[p + "intermediate/dense/bias"] = w(h, i), w(i)
        arrays[p + "output/dense/kernel"], arrays[p + "output/dense/bias"] = w(i, h), w(h)
        arrays[p + "output/LayerNorm/gamma"], arrays[p + "output/LayerNorm/beta"] = 1 + w(h), w(h)
    # LAMB's two slots for the encoder's variables (the MLPerf checkpoint has them for all)
    for name in [k for k in arrays if k.startswith("bert/encoder/")]:
        arrays[name + "/LAMB"], arrays[name + "/LAMB_1"] = w(*arrays[name].shape), w(*arrays[name].shape)
    return arrays


def mlperf_samples() -> list[dict[str, np.ndarray]]:
    """Four records' features, 0-padded to 512 tokens and 76 predictions, lengths 20 to 512."""
    rng = np.random.RandomState(99)
    out = []
    for length in (20, 200, 400, 512):
        ids = rng.randint(5, 30522, length)
        ids[0], ids[length // 2], ids[-1] = 101, 102, 102
        k = min(76, round(length * 0.15))
        positions = np.sort(rng.choice(np.arange(1, length - 1), k, replace=False))
        features = {
            "input_ids": np.pad(ids, (0, SEQ - length)),
            "input_mask": np.pad(np.ones(length, np.int64), (0, SEQ - length)),
            "segment_ids": np.pad((np.arange(length) > length // 2).astype(np.int64), (0, SEQ - length)),
            "masked_lm_positions": np.pad(positions, (0, PRED - k)),
            "masked_lm_ids": np.pad(rng.randint(5, 30522, k), (0, PRED - k)),
            "masked_lm_weights": np.pad(np.ones(k, np.float32), (0, PRED - k)),
            "next_sentence_labels": np.array([length % 2]),
        }
        out.append(features)
    return out


def unexpected_arrays() -> dict[str, np.ndarray]:
    rng = np.random.RandomState(7)
    return {"bert/embeddings/word_embeddings": rng.normal(size=(8, 8)).astype(np.float32),
            "bert/encoder/layer_0/attention/self/rotary/kernel": rng.normal(size=(8, 8)).astype(np.float32)}


def save_checkpoint(tf, path: Path, arrays: dict[str, np.ndarray], step: int) -> None:
    with tf.Graph().as_default():
        for name, value in arrays.items():
            tf.compat.v1.get_variable(name, initializer=value)
        tf.compat.v1.train.create_global_step()
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(tf.compat.v1.assign(tf.compat.v1.train.get_global_step(), step))
            path.parent.mkdir(exist_ok=True)
            saver.save(session, str(path), write_meta_graph=False, write_state=False)
    for name, value in arrays.items():
        assert np.array_equal(tf.train.load_variable(str(path), name), value), name


def write_checkpoints(tf) -> None:
    tf.compat.v1.disable_eager_execution()
    save_checkpoint(tf, CHECKPOINT, checkpoint_arrays(), 5)
    (CHECKPOINT.parent / "bert_config.json").write_text(json.dumps(BERT_CONFIG, indent=2) + "\n")
    save_checkpoint(tf, UNEXPECTED, unexpected_arrays(), 1)


def write_tfrecord(tf) -> None:
    def feature(values):
        if values.dtype.kind == "f":
            return tf.train.Feature(float_list=tf.train.FloatList(value=values.tolist()))
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values.tolist()))

    with tf.io.TFRecordWriter(str(TFRECORD)) as writer:
        for features in mlperf_samples():
            example = tf.train.Example(features=tf.train.Features(feature={k: feature(v) for k, v in features.items()}))
            writer.write(example.SerializeToString())


def main() -> int:
    import tensorflow as tf

    write_checkpoints(tf)
    write_tfrecord(tf)
    print(f"wrote {CHECKPOINT}.* and {TFRECORD} with TensorFlow {tf.__version__}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
