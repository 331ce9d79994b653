"""tf.train.Example through protobuf (message classes built at run time) against the hand parser it
replaced (tests/tfrecord_hand_parser.py): the same features from TensorFlow's records and from every
encoding TensorFlow accepts, the same bytes written, the same one-line errors for corrupt payloads."""

import importlib.util
import os
import random
import re
import sys

import numpy as np
import pytest
import tfrecord_hand_parser as hand
from conftest import REPO
from data_helpers import worker
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_data_tfrecord import random_samples

from trainer.data.prepare import tfrecord
from trainer.data.prepare.errors import BadInput

sys.path.insert(0, str(REPO / "tests" / "data"))
import make_tf_fixtures  # noqa: E402

FIXTURE = REPO / "tests" / "data" / "mlperf_layout_tf.tfrecord"
HAS_TF = importlib.util.find_spec("tensorflow") is not None


def same_values(a, b) -> bool:
    if isinstance(a, list):
        return isinstance(b, list) and a == b
    return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")


def same_features(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(same_values(a[k], b[k]) for k in a)


# ---- the same features

def test_both_parsers_read_tensorflows_records_alike():
    payloads = list(tfrecord.read_records(FIXTURE))
    assert len(payloads) == 4
    for payload, given_to_tf in zip(payloads, make_tf_fixtures.mlperf_samples()):
        ours = tfrecord.parse_example(payload)
        assert same_features(ours, hand.parse_example(payload))
        assert same_features(ours, {k: np.asarray(v, np.float32 if k == "masked_lm_weights" else np.int64)
                                    for k, v in given_to_tf.items()})
    samples = list(tfrecord.read_samples(FIXTURE, 512, 76))
    old = list(hand.read_samples(FIXTURE, 512, 76))
    assert [len(s) for s in samples] == [20, 200, 400, 512]
    assert all(np.array_equal(getattr(a, f), getattr(b, f)) for a, b in zip(samples, old)
               for f in ("input_ids", "segment_ids", "masked_lm_positions", "masked_lm_ids", "next_sentence_label"))


def numbers(kind: int, values, encode):
    """A number list as 1 to 3 runs, each packed or one field per value (TensorFlow reads both, mixed)."""
    return st.lists(st.tuples(st.lists(values, max_size=12), st.booleans()), min_size=1, max_size=3).map(
        lambda runs: (kind, b"".join(encode(run, packed) for run, packed in runs)))


encoded_feature = st.one_of(
    st.none(),  # a Feature with no list at all
    numbers(3, st.integers(-2**63, 2**63 - 1), hand.int64_list),
    numbers(2, st.floats(width=32), hand.float_list),
    st.lists(st.binary(max_size=8), max_size=4).map(lambda v: (1, hand.bytes_list(v))),
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.text(max_size=6), encoded_feature, max_size=6))
def test_both_parsers_agree_on_every_encoding(features):
    payload = hand.example(features)
    parsed = tfrecord.parse_example(payload)
    assert same_features(parsed, hand.parse_example(payload))
    assert {name: type(v).__name__ for name, v in parsed.items()} == {
        name: "list" if kind is not None and kind[0] == 1 else "ndarray" for name, kind in features.items()}


def test_packed_unpacked_negative_and_empty_features_read_as_tensorflow_means_them():
    payload = hand.example({
        "packed": (3, hand.int64_list([1, -1, 2**63 - 1, -2**63])),
        "unpacked": (3, hand.int64_list([5, -7, 300], packed=False)),
        "mixed": (3, hand.int64_list([1, 2], packed=False) + hand.int64_list([3, -4])),
        "floats": (2, hand.float_list([0.5], packed=False) + hand.float_list([-1.25, 3.0])),
        "no_ints": (3, b""), "no_floats": (2, b""), "no_bytes": (1, b""), "nothing": None,
        "bytes": (1, hand.bytes_list([b"", b"\x00\xff"])),
    })
    got = tfrecord.parse_example(payload)
    expected = {"packed": np.array([1, -1, 2**63 - 1, -2**63]), "unpacked": np.array([5, -7, 300]),
                "mixed": np.array([1, 2, 3, -4]), "floats": np.array([0.5, -1.25, 3.0], np.float32),
                "no_ints": np.zeros(0, np.int64), "no_floats": np.zeros(0, np.float32), "no_bytes": [],
                "nothing": np.zeros(0, np.int64), "bytes": [b"", b"\x00\xff"]}
    assert same_features(got, expected) and same_features(hand.parse_example(payload), expected)


def test_a_feature_given_twice_or_with_two_kinds_reads_as_protobuf_and_tensorflow_merge_it():
    ints = hand.encode_bytes(3, hand.int64_list([1, 2])) + hand.encode_bytes(3, hand.int64_list([3], packed=False))
    two_kinds = hand.encode_bytes(3, hand.int64_list([7])) + hand.encode_bytes(2, hand.float_list([0.5]))
    entries = [hand.encode_bytes(1, hand.encode_bytes(1, name) + hand.encode_bytes(2, feature))
               for name, feature in ((b"twice", ints), (b"kinds", two_kinds))]
    got = tfrecord.parse_example(hand.encode_bytes(1, b"".join(entries)))
    assert same_features(got, {"twice": np.array([1, 2, 3]), "kinds": np.array([0.5], np.float32)})


# ---- the same bytes written

def test_protobuf_writes_the_bytes_the_hand_encoder_wrote():
    for sample in random_samples(random.Random(7), 20):
        features = tfrecord.features_from_sample(sample, 512, 76)
        assert tfrecord.build_example(features) == hand.build_example(features)
    flags = {"flags": np.array([True, False, True])}
    assert tfrecord.build_example(flags) == hand.build_example(flags)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.text(max_size=6), st.one_of(
    st.lists(st.integers(-2**63, 2**63 - 1), max_size=10).map(lambda v: np.array(v, np.int64)),
    st.lists(st.floats(width=32), max_size=10).map(lambda v: np.array(v, np.float32))), max_size=5))
def test_what_protobuf_writes_reads_back(features):
    payload = tfrecord.build_example(features)
    assert same_features(tfrecord.parse_example(payload), features)
    assert same_features(hand.parse_example(payload), features)


@pytest.mark.skipif(not HAS_TF, reason="TensorFlow is a test-only extra: pip install '.[tf]'")
def test_the_descriptor_is_tensorflows():
    import tensorflow as tf
    from google.protobuf import descriptor_pb2

    theirs = {}
    for message in (tf.train.Example, tf.train.Feature):
        proto = descriptor_pb2.FileDescriptorProto()
        message.DESCRIPTOR.file.CopyToProto(proto)
        theirs |= {m.name: m for m in proto.message_type}

    def fields(message):
        return [(f.name, f.number, f.type, f.label, f.type_name, f.HasField("oneof_index") and f.oneof_index)
                for f in message.field] + [fields(nested) for nested in message.nested_type]

    ours = tfrecord.example_file_descriptor().message_type
    assert sorted(m.name for m in ours) == ["BytesList", "Example", "Feature", "Features", "FloatList", "Int64List"]
    for message in ours:
        assert fields(message) == fields(theirs[message.name]), message.name


# ---- the same one-line errors

def outcome(reader, payload: bytes, path="part-00000"):
    """A sample's fields, or the BadInput message with the parser's own reason in parentheses cut off."""
    try:
        s = reader(payload, path, 0, 64, 10)
    except BadInput as e:
        message = str(e)
        assert "\n" not in message and message.startswith(f"{path}: record 0: ")
        return message.split(" (", 1)[0] if "not a tf.train.Example (" in message else message
    return [s.input_ids.tolist(), s.segment_ids.tolist(), s.masked_lm_positions.tolist(), s.masked_lm_ids.tolist(),
            s.next_sentence_label]


def small_record() -> bytes:
    sample = random_samples(random.Random(8), 1, 64, 10)[0]
    return tfrecord.build_example(tfrecord.features_from_sample(sample, 64, 10))


def test_truncated_payloads_give_the_same_one_line_errors():
    payload = small_record()
    for n in range(len(payload)):
        new, old = outcome(tfrecord.sample_from_payload, payload[:n]), outcome(hand.sample_from_payload, payload[:n])
        assert new == old
        assert new == ("part-00000: record 0: not a tf.train.Example" if n else
                       "part-00000: record 0: not in the MLPerf feature layout (missing input_ids, input_mask, "
                       "segment_ids, masked_lm_positions, masked_lm_ids, next_sentence_labels)")


def test_flipped_bits_give_one_line_errors_and_never_pass_what_the_hand_parser_refused():
    payload, rng = small_record(), random.Random(9)
    hand_crashed = 0
    for i in range(len(payload)):
        for bit in rng.sample(range(8), 2):  # (all 8: 4x as long, the same findings)
            damaged = bytearray(payload)
            damaged[i] ^= 1 << bit
            new = outcome(tfrecord.sample_from_payload, bytes(damaged))  # a sample or a one-line BadInput
            try:
                old = outcome(hand.sample_from_payload, bytes(damaged))
            except (TypeError, ValueError):  # a traceback: the hand parser took a field of the wrong wire type
                hand_crashed += 1                       # for a message, or a FloatList's length for a packed run
                continue
            if old == "part-00000: record 0: not a tf.train.Example":
                assert new == old, (i, bit)
    assert hand_crashed > 0  # (protobuf reads those as unknown fields or refuses them, in one line)


def test_an_mlperf_feature_of_another_kind_is_named():
    features = tfrecord.features_from_sample(random_samples(random.Random(10), 1, 64, 10)[0], 64, 10)
    features["next_sentence_labels"] = np.array([1.0], np.float32)
    with pytest.raises(BadInput) as e:
        tfrecord.sample_from_payload(tfrecord.build_example(features), "part-00000", 5, 64, 10)
    assert str(e.value) == "part-00000: record 5: not in the MLPerf feature layout (next_sentence_labels not an Int64List)"


@pytest.mark.parametrize("backend", ["upb", "python"])
@pytest.mark.parametrize("payload", [
    b"\xff\xff\xff",
    hand.encode_bytes(1, hand.encode_bytes(1, hand.encode_bytes(1, b"\xff"))),  # a feature name that is not UTF-8
])
def test_a_payload_that_is_no_example_is_one_line_naming_the_record(tmp_path, backend, payload):
    path = tfrecord.write_records(tmp_path / "part-00003", [small_record(), payload])
    out = tmp_path / "out.hdf5"
    env = {**os.environ, "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": backend}
    result = worker("tfrecord-to-hdf5", "--input", str(path), "--output", str(out), env=env)
    # protobuf's reason (its wording depends on the version and backend), without its "with type ..." prefix
    assert result.returncode == 2
    assert re.fullmatch(rf"error: {re.escape(str(path))}: record 1: not a tf\.train\.Example \([^\n]+\)\n", result.stderr)
    assert "with type" not in result.stderr and not out.exists()
