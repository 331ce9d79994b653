"""The hand-written tf.train.Example parser and encoder bertctl used before protobuf (trainer/data/prepare/
tfrecord.py and protowire.py until the change that replaced them), kept as the reference the protobuf
parser is tested against and as the "before" of benchmarks/data_prepare.py. Also encoders for the
encodings protobuf never writes (unpacked repeated numbers), which TensorFlow must still read.
"""

from __future__ import annotations

import struct
from typing import Iterator

import numpy as np

from trainer.data.layout import Sample
from trainer.data.prepare import protowire as pw
from trainer.data.prepare.errors import BadInput
from trainer.data.prepare.tfrecord import read_records, sample_from_features

# ---- decoding (the old trainer/data/prepare/tfrecord.read_samples and parse_example)

def read_samples(path, max_seq_length: int, max_predictions: int) -> Iterator[Sample]:
    """The samples of a TFRecord file in the MLPerf layout: the same framing, CRCs and checks, hand parsing."""
    for index, payload in enumerate(read_records(path)):
        yield sample_from_payload(payload, path, index, max_seq_length, max_predictions)


def sample_from_payload(payload: bytes, path, index: int, max_seq_length: int, max_predictions: int) -> Sample:
    try:
        features = parse_example(payload)
    except (pw.WireError, UnicodeDecodeError) as e:
        raise BadInput(path, f"record {index}: not a tf.train.Example ({e})") from None
    return sample_from_features(features, path, index, max_seq_length, max_predictions)


def parse_example(payload: bytes) -> dict[str, np.ndarray | list[bytes]]:
    """Feature name -> int64 array, float32 array, or list of byte strings."""
    features: dict[str, np.ndarray | list[bytes]] = {}
    for number, _, value in pw.fields(payload):
        if number != 1:
            continue  # Example.features
        for entry_number, _, entry in pw.fields(value):
            if entry_number != 1:
                continue  # Features.feature (map entry)
            name, feature = "", b""
            for k, _, v in pw.fields(entry):
                if k == 1:
                    name = bytes(v).decode("utf-8")
                elif k == 2:
                    feature = v
            features[name] = _parse_feature(feature)
    return features


def _parse_feature(data: bytes | memoryview) -> np.ndarray | list[bytes]:
    for kind, _, value in pw.fields(data):
        if kind == 1:  # BytesList
            return [bytes(v) for n, _, v in pw.fields(value) if n == 1]
        if kind == 2:  # FloatList: packed, or one fixed32 per value
            chunks = [np.frombuffer(v, "<f4") if w == pw.LENGTH else np.array([v], "<u4").view("<f4")
                      for n, w, v in pw.fields(value) if n == 1]
            return np.concatenate(chunks).astype(np.float32) if chunks else np.zeros(0, np.float32)
        if kind == 3:  # Int64List: packed, or one varint per value
            chunks = [packed_varints(v) if w == pw.LENGTH else np.array([v], np.uint64).view(np.int64)
                      for n, w, v in pw.fields(value) if n == 1]
            return np.concatenate(chunks) if chunks else np.zeros(0, np.int64)
    return np.zeros(0, np.int64)  # an empty Feature


def packed_varints(data: bytes | memoryview) -> np.ndarray:
    """A packed run of varints as int64 (two's complement, as protobuf encodes negative int64)."""
    b = np.frombuffer(data, np.uint8)
    if b.size == 0:
        return np.zeros(0, np.int64)
    last = b < 0x80  # the final byte of each varint
    if not last[-1]:
        raise pw.WireError("truncated packed varints")
    ends = np.flatnonzero(last)
    starts = np.concatenate(([0], ends[:-1] + 1))
    if (ends - starts).max() > 9:
        raise pw.WireError("varint longer than 10 bytes")
    group = np.cumsum(last) - last
    shift = ((np.arange(b.size) - starts[group]) * 7).astype(np.uint64)
    parts = (b & 0x7F).astype(np.uint64) << shift
    return np.add.reduceat(parts, starts).view(np.int64)


# ---- encoding (the old tfrecord.build_example, and the unpacked encodings)

def encode_varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64 as two's complement, ten bytes
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_key(number: int, wire: int) -> bytes:
    return encode_varint((number << 3) | wire)


def encode_bytes(number: int, payload: bytes) -> bytes:
    return encode_key(number, pw.LENGTH) + encode_varint(len(payload)) + payload


def int64_list(values, packed: bool = True) -> bytes:
    if packed:
        return encode_bytes(1, b"".join(encode_varint(int(v)) for v in values))
    return b"".join(encode_key(1, pw.VARINT) + encode_varint(int(v)) for v in values)


def float_list(values, packed: bool = True) -> bytes:
    if packed:
        return encode_bytes(1, struct.pack(f"<{len(values)}f", *values))
    return b"".join(encode_key(1, pw.FIXED32) + struct.pack("<f", v) for v in values)


def bytes_list(values) -> bytes:
    return b"".join(encode_bytes(1, v) for v in values)


def example(features: dict[str, tuple[int, bytes] | None]) -> bytes:
    """An Example from encoded features: name -> (Feature kind number, encoded list), None for an empty Feature."""
    entries = b""
    for name, kind in features.items():
        feature = b"" if kind is None else encode_bytes(*kind)
        entries += encode_bytes(1, encode_bytes(1, name.encode()) + encode_bytes(2, feature))
    return encode_bytes(1, entries)


def build_example(features: dict[str, np.ndarray | list[int] | list[float]]) -> bytes:
    """A tf.train.Example with int64 features (integer arrays) and float features (float arrays), packed."""
    encoded = {}
    for name in sorted(features):
        values = np.asarray(features[name])
        encoded[name] = (2, float_list(values.tolist())) if values.dtype.kind == "f" else (3, int64_list(values.tolist()))
    return example(encoded)
