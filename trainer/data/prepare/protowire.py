"""The protocol-buffer wire format, as far as TFRecords and TensorFlow checkpoints need it.

A message is a sequence of fields, each a key `(field_number << 3) | wire_type` (a varint)
followed by its value: a varint (type 0), 8 bytes (type 1), a length-prefixed byte string (type 2,
also used for packed repeated numbers and nested messages) or 4 bytes (type 5). Varints are
little-endian groups of 7 bits, the high bit set on every byte but the last. Packed varints are
decoded with numpy, because a MLPerf sample holds ~1,700 of them.
"""

from __future__ import annotations

import struct
from typing import Iterator

import numpy as np

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5


class WireError(ValueError):
    """Bytes that are not a well-formed protocol buffer."""


def read_varint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    """(value, position after it)."""
    value = shift = 0
    while True:
        if pos >= len(data):
            raise WireError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise WireError("varint longer than 10 bytes")


def fields(data: bytes | memoryview) -> Iterator[tuple[int, int, int | memoryview]]:
    """(field number, wire type, value) of each field; length-delimited values as memoryviews."""
    view = memoryview(data)
    pos = 0
    while pos < len(view):
        key, pos = read_varint(view, pos)
        number, wire = key >> 3, key & 7
        if wire == VARINT:
            value, pos = read_varint(view, pos)
        elif wire == LENGTH:
            size, pos = read_varint(view, pos)
            if pos + size > len(view):
                raise WireError(f"field {number}: length {size} runs past the end")
            value, pos = view[pos:pos + size], pos + size
        elif wire == FIXED32:
            if pos + 4 > len(view):
                raise WireError(f"field {number}: truncated fixed32")
            value, pos = int.from_bytes(view[pos:pos + 4], "little"), pos + 4
        elif wire == FIXED64:
            if pos + 8 > len(view):
                raise WireError(f"field {number}: truncated fixed64")
            value, pos = int.from_bytes(view[pos:pos + 8], "little"), pos + 8
        else:
            raise WireError(f"field {number}: unsupported wire type {wire}")
        yield number, wire, value


def packed_varints(data: bytes | memoryview) -> np.ndarray:
    """A packed run of varints as int64 (two's complement, as protobuf encodes negative int64)."""
    b = np.frombuffer(data, np.uint8)
    if b.size == 0:
        return np.zeros(0, np.int64)
    last = b < 0x80  # the final byte of each varint
    if not last[-1]:
        raise WireError("truncated packed varints")
    ends = np.flatnonzero(last)
    starts = np.concatenate(([0], ends[:-1] + 1))
    if (ends - starts).max() > 9:
        raise WireError("varint longer than 10 bytes")
    group = np.cumsum(last) - last
    shift = ((np.arange(b.size) - starts[group]) * 7).astype(np.uint64)
    parts = (b & 0x7F).astype(np.uint64) << shift
    return np.add.reduceat(parts, starts).view(np.int64)


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
    return encode_key(number, LENGTH) + encode_varint(len(payload)) + payload


def encode_packed_varints(number: int, values) -> bytes:
    return encode_bytes(number, b"".join(encode_varint(int(v)) for v in values))


def encode_packed_floats(number: int, values) -> bytes:
    return encode_bytes(number, struct.pack(f"<{len(values)}f", *values))
