"""The protocol-buffer wire format, as far as TensorFlow checkpoints need it (their index is an SSTable of
varint-framed entries whose values are small BundleEntryProtos; TFRecords' Examples go through protobuf).

A message is a sequence of fields, each a key `(field_number << 3) | wire_type` (a varint)
followed by its value: a varint (type 0), 8 bytes (type 1), a length-prefixed byte string (type 2,
also used for packed repeated numbers and nested messages) or 4 bytes (type 5). Varints are
little-endian groups of 7 bits, the high bit set on every byte but the last.
"""

from __future__ import annotations

from typing import Iterator

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
