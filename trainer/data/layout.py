"""The HDF5 sample layouts, defined once: the data pipeline writes through `write_shard`, the trainer
reads through `Shard`.

Two layouts, both as used in the MLPerf BERT submissions:

fixed    (NVIDIA v1.0, Samsung): every field padded to a fixed width
         input_ids (N, L), input_mask (N, L), segment_ids (N, L),
         masked_lm_positions (N, P), masked_lm_ids (N, P)   -- 0-padded, position 0 ([CLS]) is never masked
         next_sentence_labels (N,)
varlen   (NVIDIA v1.1): h5py variable-length arrays, no padding and no input_mask
         input_ids, segment_ids (length L_i); masked_lm_positions, masked_lm_ids (length k_i);
         next_sentence_labels (N,)

A file's layout is recognised by whether it has `input_mask`. Token ids and positions are stored
as int16 (the vocabulary is 30,522 < 32,767), masks and labels as int8, as NVIDIA does. Files are
written under a temporary name and renamed when complete, so a file that exists is whole.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Literal, Sequence

import h5py
import numpy as np

Layout = Literal["fixed", "varlen"]
FIELDS = ("input_ids", "segment_ids", "masked_lm_positions", "masked_lm_ids", "next_sentence_labels")
ID_DTYPE = np.int16
FLAG_DTYPE = np.int8


class ShardError(Exception):
    """A shard that cannot be read: missing, truncated, or not in either layout."""


@dataclass
class Sample:
    """One pretraining example, unpadded: what a pipeline produces and what `Shard.sample` returns."""

    input_ids: np.ndarray  # (L,) token ids, [CLS] first
    segment_ids: np.ndarray  # (L,) 0 for sentence A, 1 for sentence B
    masked_lm_positions: np.ndarray  # (k,) positions that were masked, ascending
    masked_lm_ids: np.ndarray  # (k,) the original token ids at those positions
    next_sentence_label: int  # 1: B is a random sentence, 0: B follows A

    def __len__(self) -> int:
        return len(self.input_ids)


def write_shard(
    path: str | Path, samples: Sequence[Sample], layout: Layout = "varlen",
    max_seq_length: int = 512, max_predictions: int = 76,
) -> Path:
    """Write `samples` to `path` in `layout`; atomically (temporary name, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with h5py.File(tmp, "w") as f:
            if layout == "fixed":
                _write_fixed(f, samples, max_seq_length, max_predictions)
            else:
                _write_varlen(f, samples)
            f.attrs["layout"] = layout
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _write_fixed(f: h5py.File, samples: Sequence[Sample], seq_len: int, max_pred: int) -> None:
    n = len(samples)
    ids = np.zeros((n, seq_len), ID_DTYPE)
    mask = np.zeros((n, seq_len), FLAG_DTYPE)
    seg = np.zeros((n, seq_len), FLAG_DTYPE)
    pos = np.zeros((n, max_pred), ID_DTYPE)
    mids = np.zeros((n, max_pred), ID_DTYPE)
    nsp = np.zeros((n,), FLAG_DTYPE)
    for i, s in enumerate(samples):
        length, k = len(s.input_ids), len(s.masked_lm_positions)
        if length > seq_len or k > max_pred:
            raise ValueError(f"sample {i}: length {length} > {seq_len} or {k} predictions > {max_pred}")
        ids[i, :length], seg[i, :length], mask[i, :length] = s.input_ids, s.segment_ids, 1
        pos[i, :k], mids[i, :k] = s.masked_lm_positions, s.masked_lm_ids
        nsp[i] = s.next_sentence_label
    for name, data in (("input_ids", ids), ("input_mask", mask), ("segment_ids", seg),
                       ("masked_lm_positions", pos), ("masked_lm_ids", mids), ("next_sentence_labels", nsp)):
        f.create_dataset(name, data=data)


def _write_varlen(f: h5py.File, samples: Sequence[Sample]) -> None:
    n = len(samples)
    for name, dtype in (("input_ids", ID_DTYPE), ("segment_ids", FLAG_DTYPE),
                        ("masked_lm_positions", ID_DTYPE), ("masked_lm_ids", ID_DTYPE)):
        # one write of an object array: ~25x faster than a write per sample, same bytes on disk.
        # (create_dataset(data=...), not column[...] = ...: the latter mistakes equal-length rows for 2-D)
        values = np.empty(n, dtype=object)
        for i, s in enumerate(samples):
            values[i] = np.asarray(getattr(s, name), dtype)
        f.create_dataset(name, data=values, dtype=h5py.vlen_dtype(np.dtype(dtype)))
    f.create_dataset("next_sentence_labels", data=np.array([s.next_sentence_label for s in samples], FLAG_DTYPE))


class Shard:
    """A whole shard in memory, in either layout, with per-sample lengths for the samplers."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            with h5py.File(self.path, "r") as f:
                missing = [name for name in FIELDS if name not in f]
                if missing:
                    raise ShardError(f"{self.path}: not a BERT shard (missing {', '.join(missing)})")
                self.layout: Layout = "fixed" if "input_mask" in f else "varlen"
                self._load(f)
        except ShardError:
            raise
        except (OSError, KeyError, ValueError) as e:
            raise ShardError(f"{self.path}: unreadable HDF5 shard ({e})") from None

    def _load(self, f: h5py.File) -> None:
        self.nsp = f["next_sentence_labels"][:].astype(np.int64)
        if self.layout == "fixed":
            mask = f["input_mask"][:]
            self.lengths = mask.sum(axis=1).astype(np.int64)
            self._ids, self._seg = f["input_ids"][:], f["segment_ids"][:]
            self._pos, self._mids = f["masked_lm_positions"][:], f["masked_lm_ids"][:]
            self.num_predictions = (self._pos != 0).sum(axis=1)
        else:
            self._ids, self._seg = f["input_ids"][:], f["segment_ids"][:]
            self._pos, self._mids = f["masked_lm_positions"][:], f["masked_lm_ids"][:]
            self.lengths = np.array([len(x) for x in self._ids], np.int64)
            self.num_predictions = np.array([len(x) for x in self._pos], np.int64)
        if not len(self.nsp) == len(self.lengths) == len(self._pos):
            raise ShardError(f"{self.path}: fields have different sample counts")

    def __len__(self) -> int:
        return len(self.nsp)

    def sample(self, i: int) -> Sample:
        length, k = int(self.lengths[i]), int(self.num_predictions[i])
        return Sample(
            input_ids=np.asarray(self._ids[i][:length], np.int64),
            segment_ids=np.asarray(self._seg[i][:length], np.int64),
            masked_lm_positions=np.asarray(self._pos[i][:k], np.int64),
            masked_lm_ids=np.asarray(self._mids[i][:k], np.int64),
            next_sentence_label=int(self.nsp[i]),
        )

    def samples(self, indices: Iterable[int]) -> list[Sample]:
        return [self.sample(int(i)) for i in indices]


def shard_files(folder: str | Path) -> list[Path]:
    """The shards of a folder, sorted by name (`*.hdf5` / `*.h5`, hidden temporary files excluded)."""
    folder = Path(folder)
    files = [p for p in folder.iterdir() if p.suffix in (".hdf5", ".h5") and not p.name.startswith(".")]
    return sorted(files)
