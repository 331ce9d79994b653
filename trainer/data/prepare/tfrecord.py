"""TFRecord files and `tf.train.Example`s in the MLPerf feature layout, without TensorFlow.

Framing of each record: length (uint64, little-endian), masked CRC-32C of those 8 bytes (uint32),
the payload, masked CRC-32C of the payload (uint32). "Masked" is TensorFlow's rotation of the CRC
by 15 bits plus the constant 0xa282ead8, so that a CRC of data containing CRCs stays strong.
A short read is a truncated file and a CRC mismatch a corrupt one: both name the record index.

The payload is a `tf.train.Example`: Features{ map<string, Feature> }, each Feature a BytesList,
FloatList or Int64List. protobuf parses and writes it, through message classes built at run time from a
descriptor written here (TensorFlow's example.proto and feature.proto; no TensorFlow, no generated code).
MLPerf's records (create_pretraining_data.py) hold input_ids, input_mask, segment_ids (max_seq_length
each), masked_lm_positions, masked_lm_ids, masked_lm_weights (max_predictions each, 0-padded) and
next_sentence_labels (one).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator

import google_crc32c
import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from trainer.config.regular import open_regular
from trainer.data.layout import Sample
from trainer.data.prepare import files
from trainer.data.prepare.errors import BadInput

MASK_DELTA = 0xA282EAD8
MLPERF_INT_FEATURES = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
                       "next_sentence_labels")


def masked_crc(data: bytes | memoryview) -> int:
    crc = google_crc32c.value(bytes(data))
    return (((crc >> 15) | (crc << 17)) + MASK_DELTA) & 0xFFFFFFFF


# ---- framing

def read_records(path: str | Path) -> Iterator[bytes]:
    """The payloads of a TFRecord file, each checked against its CRCs."""
    path = Path(path)
    try:
        f = open_regular(path, "rb")
    except OSError as e:
        raise BadInput(path, f"cannot open: {e.strerror or e}") from None
    with f:
        index = 0
        while True:
            payload = _read_record(f, path, index)
            if payload is None:
                return
            yield payload
            index += 1


def _read_record(f: BinaryIO, path: Path, index: int) -> bytes | None:
    header = f.read(12)
    if not header:
        return None
    if len(header) < 12:
        raise BadInput(path, f"record {index}: truncated (file ends inside the length header)")
    length_bytes, length_crc = header[:8], struct.unpack("<I", header[8:])[0]
    if masked_crc(length_bytes) != length_crc:
        raise BadInput(path, f"record {index}: corrupt (CRC mismatch in the length header)")
    (length,) = struct.unpack("<Q", length_bytes)
    body = f.read(length + 4)
    if len(body) < length + 4:
        raise BadInput(path, f"record {index}: truncated (needs {length + 4} bytes, the file has {len(body)} left)")
    payload, data_crc = body[:length], struct.unpack("<I", body[length:])[0]
    if masked_crc(payload) != data_crc:
        raise BadInput(path, f"record {index}: corrupt (CRC mismatch in the data)")
    return payload


def frame(payload: bytes) -> bytes:
    length = struct.pack("<Q", len(payload))
    return length + struct.pack("<I", masked_crc(length)) + payload + struct.pack("<I", masked_crc(payload))


def write_records(path: str | Path, payloads: Iterable[bytes]) -> Path:
    with files.atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            for payload in payloads:
                f.write(frame(payload))
    return Path(path)


# ---- tf.train.Example, through protobuf message classes built at run time

def example_file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    """TensorFlow's tensorflow/core/example/{feature,example}.proto (proto3, package tensorflow) as a descriptor:
    BytesList/FloatList/Int64List{repeated value = 1} (numbers packed, proto3's default),
    Feature{oneof kind {bytes_list = 1; float_list = 2; int64_list = 3}}, Features{map<string, Feature>
    feature = 1} and Example{features = 1}. Field numbers and types are the wire format; names are ours to pick."""
    F = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="bertctl/tf_example.proto", package="tensorflow", syntax="proto3")
    for name, value_type in (("BytesList", F.TYPE_BYTES), ("FloatList", F.TYPE_FLOAT), ("Int64List", F.TYPE_INT64)):
        proto.message_type.add(name=name).field.add(name="value", number=1, type=value_type, label=F.LABEL_REPEATED)
    feature = proto.message_type.add(name="Feature")
    feature.oneof_decl.add(name="kind")
    for number, (kind, list_type) in enumerate((("bytes_list", "BytesList"), ("float_list", "FloatList"),
                                                ("int64_list", "Int64List")), start=1):
        feature.field.add(name=kind, number=number, type=F.TYPE_MESSAGE, type_name=f".tensorflow.{list_type}",
                          label=F.LABEL_OPTIONAL, oneof_index=0)
    features = proto.message_type.add(name="Features")
    entry = features.nested_type.add(name="FeatureEntry", options=descriptor_pb2.MessageOptions(map_entry=True))
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=F.TYPE_MESSAGE, type_name=".tensorflow.Feature", label=F.LABEL_OPTIONAL)
    features.field.add(name="feature", number=1, type=F.TYPE_MESSAGE, type_name=".tensorflow.Features.FeatureEntry",
                       label=F.LABEL_REPEATED)
    proto.message_type.add(name="Example").field.add(name="features", number=1, type=F.TYPE_MESSAGE,
                                                     type_name=".tensorflow.Features", label=F.LABEL_OPTIONAL)
    return proto


# A pool of our own, so that TensorFlow's generated tensorflow.Example (in the default pool, when TensorFlow is
# imported in the same process) never conflicts with this one; a module global, alive as long as the classes.
_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(example_file_descriptor())
Example = message_factory.GetMessageClass(_POOL.FindMessageTypeByName("tensorflow.Example"))


def parse_example(payload: bytes) -> dict[str, np.ndarray | list[bytes]]:
    """Feature name -> int64 array, float32 array, or list of byte strings; DecodeError (or, with protobuf's
    pure-Python backend, UnicodeDecodeError for a name that is not UTF-8) if the payload is no tf.train.Example.
    Odd encodings follow protobuf's rules, as TensorFlow does: a list given twice in a Feature is concatenated,
    and of two kinds in one Feature the last wins."""
    return {name: feature_values(feature) for name, feature in Example.FromString(payload).features.feature.items()}


def feature_values(feature) -> np.ndarray | list[bytes]:
    kind = feature.WhichOneof("kind")
    # np.array(container, dtype) is the fastest conversion measured (~15 ns a value; np.fromiter and
    # list() go through one Python int per value and take 5 to 10 times as long)
    if kind == "int64_list":
        return np.array(feature.int64_list.value, np.int64)
    if kind == "float_list":
        return np.array(feature.float_list.value, np.float32)
    if kind == "bytes_list":
        return list(feature.bytes_list.value)
    return np.zeros(0, np.int64)  # an empty Feature


def build_example(features: dict[str, np.ndarray | list[int] | list[float]]) -> bytes:
    """A tf.train.Example with int64 features (integer arrays) and float features (float arrays)."""
    example = Example()
    for name, values in features.items():
        values = np.asarray(values)
        feature = example.features.feature[name]
        floats = values.dtype.kind == "f"
        numbers = feature.float_list if floats else feature.int64_list
        numbers.SetInParent()  # an empty list is still a list of that kind
        numbers.value.extend(values.tolist() if floats else values.astype(np.int64).tolist())  # (bools too)
    return example.SerializeToString(deterministic=True)  # deterministic: map entries in name order


def not_an_example(e: Exception) -> str:
    """The reason in protobuf's message, without its 'Error parsing message with type ...: ' prefix."""
    return str(e).split("': ", 1)[-1] if str(e).startswith("Error parsing message") else str(e)


# ---- the MLPerf feature layout

def sample_from_features(features: dict, path: str | Path, index: int, max_seq_length: int,
                         max_predictions: int) -> Sample:
    """An unpadded sample from one MLPerf record; anything inconsistent is BadInput naming the record."""
    def bad(what: str) -> BadInput:
        return BadInput(path, f"record {index}: {what}")

    missing = [name for name in MLPERF_INT_FEATURES if name not in features]
    if missing:
        raise bad(f"not in the MLPerf feature layout (missing {', '.join(missing)})")
    not_int = [name for name in MLPERF_INT_FEATURES if np.asarray(features[name]).dtype.kind not in "iu"]
    if not_int:
        raise bad(f"not in the MLPerf feature layout ({', '.join(not_int)} not an Int64List)")
    ids, mask, seg = (np.asarray(features[k]) for k in ("input_ids", "input_mask", "segment_ids"))
    pos, mids = np.asarray(features["masked_lm_positions"]), np.asarray(features["masked_lm_ids"])
    if not (len(ids) == len(mask) == len(seg)) or len(pos) != len(mids):
        raise bad("input_ids/input_mask/segment_ids or masked_lm_positions/masked_lm_ids differ in length")
    length = int(mask.sum())
    if not np.array_equal(mask, np.arange(len(mask)) < length):
        raise bad("input_mask is not ones followed by zeros")
    if length > max_seq_length:
        raise bad(f"sequence of {length} tokens is longer than max_seq_length {max_seq_length}")
    weights = features.get("masked_lm_weights")
    k = int((np.asarray(weights) > 0).sum()) if weights is not None else int((pos != 0).sum())
    if k > max_predictions or np.any(pos[:k] >= length) or np.any(pos[:k] <= 0):
        raise bad(f"masked_lm_positions {pos[:k].tolist()} do not fit a sequence of {length} tokens "
                  f"(at most {max_predictions} predictions, never position 0)")
    nsp = np.asarray(features["next_sentence_labels"])
    if nsp.size != 1 or int(nsp[0]) not in (0, 1):
        raise bad(f"next_sentence_labels must be one 0 or 1, got {nsp.tolist()}")
    return Sample(ids[:length], seg[:length], pos[:k], mids[:k], int(nsp[0]))


def features_from_sample(sample: Sample, max_seq_length: int, max_predictions: int) -> dict[str, np.ndarray]:
    """The MLPerf features of a sample, 0-padded as create_pretraining_data writes them."""
    def padded(values, width, dtype=np.int64):
        out = np.zeros(width, dtype)
        out[: len(values)] = values
        return out

    length, k = len(sample.input_ids), len(sample.masked_lm_positions)
    return {
        "input_ids": padded(sample.input_ids, max_seq_length),
        "input_mask": padded(np.ones(length, np.int64), max_seq_length),
        "segment_ids": padded(sample.segment_ids, max_seq_length),
        "masked_lm_positions": padded(sample.masked_lm_positions, max_predictions),
        "masked_lm_ids": padded(sample.masked_lm_ids, max_predictions),
        "masked_lm_weights": padded(np.ones(k, np.float32), max_predictions, np.float32),
        "next_sentence_labels": np.array([sample.next_sentence_label], np.int64),
    }


def read_samples(path: str | Path, max_seq_length: int, max_predictions: int) -> Iterator[Sample]:
    """The samples of a TFRecord file in the MLPerf layout."""
    for index, payload in enumerate(read_records(path)):
        yield sample_from_payload(payload, path, index, max_seq_length, max_predictions)


def sample_from_payload(payload: bytes, path: str | Path, index: int, max_seq_length: int, max_predictions: int) -> Sample:
    try:
        features = parse_example(payload)
    except (DecodeError, UnicodeDecodeError) as e:  # UnicodeDecodeError: protobuf's pure-Python backend
        raise BadInput(path, f"record {index}: not a tf.train.Example ({not_an_example(e)})") from None
    return sample_from_features(features, path, index, max_seq_length, max_predictions)


def write_samples(path: str | Path, samples: Iterable[Sample], max_seq_length: int, max_predictions: int) -> Path:
    return write_records(path, (build_example(features_from_sample(s, max_seq_length, max_predictions))
                                for s in samples))
