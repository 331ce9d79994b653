"""Reading TensorFlow checkpoints (the V2 "tensor bundle" format) without TensorFlow.

A checkpoint `PREFIX` is two kinds of file:

  PREFIX.index                    an SSTable (LevelDB's table format): tensor name -> BundleEntryProto
                                  (dtype, shape, which data file, offset, size, CRC-32C of the bytes);
                                  the empty name holds the BundleHeaderProto (number of data files)
  PREFIX.data-0000i-of-0000n      the tensors' raw bytes, little-endian, back to back

The SSTable: a 48-byte footer at the end (two block handles, padding, an 8-byte magic number)
points at the index block, whose entries point at the data blocks. A block is a run of entries,
each key stored as the length it shares with the previous key plus the rest, then a table of
restart offsets; after each block come a compression byte and a masked CRC-32C. TensorFlow writes
the index uncompressed. Protocol buffers are decoded by trainer.data.prepare.protowire.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from trainer.config.regular import open_regular, read_regular_bytes
from trainer.data.prepare import protowire as pw
from trainer.data.prepare.errors import BadInput
from trainer.data.prepare.tfrecord import masked_crc

TABLE_MAGIC = 0xDB4775248B80FB57
FOOTER_BYTES = 48
BLOCK_TRAILER_BYTES = 5

# tensorflow/core/framework/types.proto
DTYPES = {1: np.float32, 2: np.float64, 3: np.int32, 4: np.uint8, 5: np.int16, 6: np.int8, 9: np.int64,
          10: np.bool_, 17: np.uint16, 19: np.float16, 22: np.uint32, 23: np.uint64}
DT_BFLOAT16 = 14


@dataclass(frozen=True)
class Entry:
    name: str
    dtype: int
    shape: tuple[int, ...]
    shard: int
    offset: int
    size: int
    crc32c: int | None


class TFCheckpoint:
    """The variables of a checkpoint: `names()`, `shape(name)`, `read(name)` (a numpy array)."""

    def __init__(self, prefix: str | Path):
        self.prefix = str(prefix)
        if self.prefix.endswith(".index"):  # people pass the .index file; TensorFlow wants the prefix
            self.prefix = self.prefix[: -len(".index")]
        self.index_path = Path(self.prefix + ".index")
        try:
            table = read_regular_bytes(self.index_path)  # a FIFO there is refused, not waited on
        except FileNotFoundError:
            raise BadInput(self.index_path, "checkpoint index not found (give the prefix, e.g. .../model.ckpt-28252)") from None
        except OSError as e:
            raise BadInput(self.index_path, f"cannot read: {e.strerror or e}") from None
        self.num_shards = 1
        self.entries: dict[str, Entry] = {}
        try:
            for key, value in read_table(table):
                if key == b"":
                    self.num_shards, big_endian = _bundle_header(value)
                    if big_endian:
                        raise BadInput(self.index_path, "big-endian checkpoints are not supported")
                else:
                    name = key.decode("utf-8")
                    self.entries[name] = _bundle_entry(name, value)
        except (pw.WireError, TableError, UnicodeDecodeError) as e:
            raise BadInput(self.index_path, f"not a TensorFlow checkpoint index: {e}") from None

    def names(self) -> list[str]:
        return sorted(self.entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.entries[name].shape

    def data_file(self, shard: int) -> Path:
        return Path(f"{self.prefix}.data-{shard:05d}-of-{self.num_shards:05d}")

    def read(self, name: str) -> np.ndarray:
        e = self.entries[name]
        path = self.data_file(e.shard)
        try:
            with open_regular(path, "rb") as f:
                f.seek(e.offset)
                data = f.read(e.size)
        except OSError as err:
            raise BadInput(path, f"variable {name}: cannot read: {err.strerror or err}") from None
        if len(data) != e.size:
            raise BadInput(path, f"variable {name}: truncated ({len(data)} of {e.size} bytes at offset {e.offset})")
        if e.crc32c is not None and masked_crc(data) != e.crc32c:
            raise BadInput(path, f"variable {name}: corrupt (CRC mismatch)")
        return _decode(name, path, e, data)


def _decode(name: str, path: Path, e: Entry, data: bytes) -> np.ndarray:
    if e.dtype == DT_BFLOAT16:
        bits = np.frombuffer(data, "<u2").astype(np.uint32) << 16
        return bits.view(np.float32).reshape(e.shape)
    if e.dtype not in DTYPES:
        raise BadInput(path, f"variable {name}: unsupported dtype {e.dtype} (e.g. strings)")
    dtype = np.dtype(DTYPES[e.dtype]).newbyteorder("<")
    count = int(np.prod(e.shape, dtype=np.int64))
    if count * dtype.itemsize != len(data):
        raise BadInput(path, f"variable {name}: {len(data)} bytes do not hold shape {list(e.shape)}")
    return np.frombuffer(data, dtype).astype(dtype.newbyteorder("=")).reshape(e.shape)


def _bundle_header(value: bytes) -> tuple[int, bool]:
    shards, big_endian = 1, False
    for number, _, v in pw.fields(value):
        if number == 1:
            shards = int(v)
        elif number == 2:
            big_endian = int(v) == 1
    return shards, big_endian


def _bundle_entry(name: str, value: bytes) -> Entry:
    dtype, shape, shard, offset, size, crc, sliced = 0, [], 0, 0, 0, None, False
    for number, _, v in pw.fields(value):
        if number == 1:
            dtype = int(v)
        elif number == 2:
            # TensorShapeProto.dim; a dimension of size 0 has no size field
            dims = [dim for n, _, dim in pw.fields(v) if n == 2]
            shape = [next((int(s) for k, _, s in pw.fields(d) if k == 1), 0) for d in dims]
        elif number == 3:
            shard = int(v)
        elif number == 4:
            offset = int(v)
        elif number == 5:
            size = int(v)
        elif number == 6:
            crc = int(v)
        elif number == 7:
            sliced = True
    if sliced:
        raise pw.WireError(f"variable {name} is saved in slices (partitioned), which is not supported")
    return Entry(name, dtype, tuple(shape), shard, offset, size, crc)


# ---- the SSTable

class TableError(ValueError):
    pass


def read_table(table: bytes) -> Iterator[tuple[bytes, bytes]]:
    """Every (key, value) of an uncompressed LevelDB-format table, in key order."""
    if len(table) < FOOTER_BYTES:
        raise TableError("file too short")
    footer = table[-FOOTER_BYTES:]
    if struct.unpack("<Q", footer[-8:])[0] != TABLE_MAGIC:
        raise TableError("bad magic number (not an SSTable, or truncated)")
    _, pos = pw.read_varint(footer, 0)  # the metaindex block: nothing in it is needed
    _, pos = pw.read_varint(footer, pos)
    index_offset, pos = pw.read_varint(footer, pos)
    index_size, _ = pw.read_varint(footer, pos)
    for _, handle in block_entries(_block(table, index_offset, index_size)):
        offset, p = pw.read_varint(handle, 0)
        size, _ = pw.read_varint(handle, p)
        yield from block_entries(_block(table, offset, size))


def _block(table: bytes, offset: int, size: int) -> bytes:
    end = offset + size
    if end + BLOCK_TRAILER_BYTES > len(table):
        raise TableError(f"block at {offset} runs past the end (truncated file)")
    data, kind = table[offset:end], table[end]
    crc = struct.unpack("<I", table[end + 1:end + BLOCK_TRAILER_BYTES])[0]
    if masked_crc(table[offset:end + 1]) != crc:
        raise TableError(f"block at {offset}: CRC mismatch (corrupt file)")
    if kind != 0:
        raise TableError(f"block at {offset} is compressed (type {kind}): not supported")
    return data


def block_entries(block: bytes) -> Iterator[tuple[bytes, bytes]]:
    if len(block) < 4:
        raise TableError("block too short")
    restarts = struct.unpack("<I", block[-4:])[0]
    end = len(block) - 4 - 4 * restarts
    if end < 0:
        raise TableError("bad restart count")
    pos, key = 0, b""
    while pos < end:
        shared, pos = pw.read_varint(block, pos)
        unshared, pos = pw.read_varint(block, pos)
        value_size, pos = pw.read_varint(block, pos)
        if shared > len(key) or pos + unshared + value_size > end:
            raise TableError("malformed block entry")
        key = key[:shared] + block[pos:pos + unshared]
        pos += unshared
        yield key, block[pos:pos + value_size]
        pos += value_size
