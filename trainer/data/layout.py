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
as int16 (the vocabulary is 30,522 < 32,767; `write_shard` refuses what does not fit), masks and
labels as int8, as NVIDIA does. Files are written under a temporary name and renamed when
complete, so a file that exists is whole.

Reading validates: `Shard(path, vocab_size, max_seq_length, max_predictions)` raises ShardError
"<file>: sample <i>: <problem>" for the first malformed sample (ids outside the vocabulary, masked
positions at [CLS] or past the sequence, labels other than 0/1, too long, too many predictions, fields
of different lengths), or "<file>: <problem>" for a file that is not a whole shard. The trainer and
`bertctl data verify` both open shards this way.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Literal, Sequence

import h5py
import numpy as np

from trainer.config.regular import require_regular

Layout = Literal["fixed", "varlen"]
FIELDS = ("input_ids", "segment_ids", "masked_lm_positions", "masked_lm_ids", "next_sentence_labels")
ID_DTYPE = np.int16
FLAG_DTYPE = np.int8


ID_LIMIT = int(np.iinfo(ID_DTYPE).max)  # 32,767: the largest token id a shard (and exchange padding) can hold


class ShardError(Exception):
    """A shard that cannot be read (missing, truncated, not in either layout) or that holds a malformed
    sample; the message names the file (and the sample)."""


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
    _check_ids_fit(samples)
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


def _check_ids_fit(samples: Sequence[Sample]) -> None:
    """Ids and positions are stored as int16: a larger value would wrap around silently, so refuse it."""
    low = int(np.iinfo(ID_DTYPE).min)
    for name in ("input_ids", "masked_lm_positions", "masked_lm_ids"):
        values = [getattr(s, name) for s in samples]
        flat = np.concatenate(values) if values else np.zeros(0, np.int64)
        if flat.size and (flat.max() > ID_LIMIT or flat.min() < low):
            bad = int(np.argmax((flat > ID_LIMIT) | (flat < low)))
            sample = int(np.searchsorted(np.cumsum([len(v) for v in values]), bad, side="right"))
            raise ValueError(f"sample {sample}: {name} holds {flat[bad]}, which does not fit a shard "
                             f"(stored as int16: a vocabulary of at most {ID_LIMIT + 1} tokens)")


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
    """A whole shard in memory, in either layout, with per-sample lengths for the samplers.

    Opening a shard validates it (see `_first_problem`): a ShardError names the file, the sample and
    what is wrong, so no malformed sample reaches a batch. The limits are optional: the trainer
    passes its model's vocabulary and its sequence limits, `data verify` the manifest's.
    """

    def __init__(self, path: str | Path, vocab_size: int | None = None, max_seq_length: int | None = None,
                 max_predictions: int | None = None):
        self.path = Path(path)
        try:
            require_regular(self.path)  # h5py would block on a FIFO until a writer came
            with h5py.File(self.path, "r") as f:
                self.layout: Layout = "fixed" if "input_mask" in f else "varlen"
                _check_datasets(f, self.layout)
                self._load(f)
        except _Malformed as e:
            raise ShardError(f"{self.path}: {e}") from None
        except (OSError, KeyError, ValueError, TypeError, RuntimeError) as e:
            raise ShardError(f"{self.path}: unreadable HDF5 shard ({_one_line(e)})") from None
        found = _first_problem(self, vocab_size, max_seq_length, max_predictions)
        if found is not None:
            raise ShardError(f"{self.path}: sample {found[0]}: {found[1]}")

    def _load(self, f: h5py.File) -> None:
        self.nsp = f["next_sentence_labels"][:].astype(np.int64)
        self._ids, self._seg = f["input_ids"][:], f["segment_ids"][:]
        self._pos, self._mids = f["masked_lm_positions"][:], f["masked_lm_ids"][:]
        if self.layout == "fixed":
            self._mask = f["input_mask"][:]
            self.lengths = self._mask.sum(axis=1, dtype=np.int64)
            self.num_predictions = (self._pos != 0).sum(axis=1, dtype=np.int64)
        else:
            self.lengths = np.fromiter(map(len, self._ids), np.int64, len(self._ids))
            self.num_predictions = np.fromiter(map(len, self._pos), np.int64, len(self._pos))

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

    def columns(self) -> tuple[np.ndarray, ...]:
        """(lengths, ids, segments, predictions, positions, masked ids, nsp): the samples' fields
        concatenated in sample order, without padding, as int64."""
        if self.layout == "fixed":
            tokens = np.arange(self._ids.shape[1]) < self.lengths[:, None]
            predicted = np.arange(self._pos.shape[1]) < self.num_predictions[:, None]
            ids, seg = self._ids[tokens], self._seg[tokens]
            pos, mids = self._pos[predicted], self._mids[predicted]
        else:
            ids, seg, pos, mids = (_concat(x) for x in (self._ids, self._seg, self._pos, self._mids))
        return (self.lengths, *(np.asarray(x, np.int64) for x in (ids, seg)), self.num_predictions,
                *(np.asarray(x, np.int64) for x in (pos, mids)), self.nsp)


class _Malformed(Exception):
    """A fault of the whole file (a dataset missing or of the wrong shape), before any sample is read."""


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _concat(rows: np.ndarray) -> np.ndarray:
    return np.concatenate(list(rows)) if len(rows) else np.zeros(0, np.int64)


SEQUENCE_FIELDS = ("input_ids", "segment_ids", "masked_lm_positions", "masked_lm_ids")


def _check_datasets(f: h5py.File, layout: Layout) -> None:
    """Every field present, integer, and shaped as its layout says, with one count of samples."""
    needed = FIELDS + (("input_mask",) if layout == "fixed" else ())
    missing = [name for name in needed if not isinstance(f.get(name), h5py.Dataset)]
    if missing:
        raise _Malformed(f"not a BERT shard (missing {', '.join(missing)})")
    for name in needed:
        d = f[name]
        base = h5py.check_vlen_dtype(d.dtype) if layout == "varlen" and name in SEQUENCE_FIELDS else d.dtype
        wanted_ndim = 2 if layout == "fixed" and name != "next_sentence_labels" else 1
        if layout == "varlen" and name in SEQUENCE_FIELDS and (base is None or d.ndim != 1):
            raise _Malformed(f"{name} is a {d.ndim}-D {d.dtype} array, not variable-length rows "
                             "(a fixed-layout shard also has input_mask)")
        if not isinstance(base, np.dtype):  # a variable-length string or bytes dataset: h5py names it `str`/`bytes`
            raise _Malformed(f"{name} holds {getattr(base, '__name__', base)} values, expected integers ({layout} layout)")
        if base.kind not in "iu" or d.ndim != wanted_ndim:
            raise _Malformed(f"{name} is a {d.ndim}-D {base} array, expected {wanted_ndim}-D integers ({layout} layout)")
    counts = {name: f[name].shape[0] for name in needed}
    if len(set(counts.values())) > 1:
        raise _Malformed("datasets hold different numbers of samples: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    if layout == "fixed":
        for a, b in (("input_ids", "input_mask"), ("input_ids", "segment_ids"), ("masked_lm_positions", "masked_lm_ids")):
            if f[a].shape != f[b].shape:
                raise _Malformed(f"{a} is {f[a].shape[1]} wide, {b} {f[b].shape[1]}")


def _first_problem(shard: Shard, vocab_size: int | None, max_seq_length: int | None,
                   max_predictions: int | None) -> tuple[int, str] | None:
    """(sample index, what is wrong) for the first check that fails, or None.

    Vectorised over the whole shard and cheap when nothing is wrong: each range check is a min/max
    over the stored (int16) array, and only a failing check looks for the sample it concerns.
    A shard of 10,000 samples of ~256 tokens costs a few milliseconds (benchmarks/shard_validation.py).
    """
    layout_problem = _fixed_layout_problem(shard) if shard.layout == "fixed" else _varlen_problem(shard)
    if layout_problem is not None:
        return layout_problem
    lengths, k, nsp = shard.lengths, shard.num_predictions, shard.nsp
    for bad, describe in (
        (lengths < 1, lambda i: "no tokens"),
        (lengths > max_seq_length if max_seq_length is not None else None,
         lambda i: f"{lengths[i]} tokens, more than max_seq_length {max_seq_length}"),
        (k > max_predictions if max_predictions is not None else None,
         lambda i: f"{k[i]} masked positions, more than max_predictions {max_predictions}"),
        ((nsp != 0) & (nsp != 1), lambda i: f"next_sentence_label {nsp[i]} (must be 0 or 1)"),
    ):
        if bad is not None and bad.any():
            i = int(np.argmax(bad))
            return i, describe(i)
    vocab = f"0-{vocab_size - 1}" if vocab_size is not None else "non-negative"
    top = vocab_size - 1 if vocab_size is not None else None
    tokens, predictions = _Entries(shard, "tokens"), _Entries(shard, "predictions")
    checks = [
        (tokens, "input_ids", 0, top, lambda v: f"token id {v} in input_ids is outside the vocabulary ({vocab})"),
        (tokens, "segment_ids", 0, 1, lambda v: f"segment id {v} (segment_ids must be 0 or 1)"),
        # a fixed row's 0s are its padding (a 0 before a real position was caught above as [CLS])
        (predictions, "masked_lm_positions", 0 if shard.layout == "fixed" else 1, None,
         lambda v: "masked position 0 is the [CLS] token" if v == 0 else f"masked position {v} is negative"),
        (predictions, "masked_lm_ids", 0, top, lambda v: f"token id {v} in masked_lm_ids is outside the vocabulary ({vocab})"),
    ]
    for entries, name, low, high, describe in checks:
        found = entries.first_outside(name, low, high)
        if found is not None:
            return found[0], describe(found[1])
    found = predictions.first_past_end(lengths)
    if found is not None:
        return found[0], f"masked position {found[1]} is past the end of the sequence (length {lengths[found[0]]})"
    return None


class _Entries:
    """The token-level (or prediction-level) fields of a shard as stored: 2-D padded rows (fixed) or
    the rows concatenated (varlen), with how many entries of each sample are real."""

    def __init__(self, shard: Shard, kind: str):
        self.fixed = shard.layout == "fixed"
        self.counts = shard.lengths if kind == "tokens" else shard.num_predictions
        names = ("input_ids", "segment_ids") if kind == "tokens" else ("masked_lm_positions", "masked_lm_ids")
        stored = (shard._ids, shard._seg) if kind == "tokens" else (shard._pos, shard._mids)
        self.fields = {n: (rows if self.fixed else _concat(rows)) for n, rows in zip(names, stored)}

    def first_outside(self, name: str, low: int, high: int | None) -> tuple[int, int] | None:
        """(sample, value) of the first real entry outside [low, high], or None."""
        values = self.fields[name]
        if values.size == 0 or (values.min() >= low and (high is None or values.max() <= high)):
            return None  # the common case: one pass over the array, padding included
        bad = values < low if high is None else (values < low) | (values > high)
        return self._first(bad, values)

    def first_past_end(self, lengths: np.ndarray) -> tuple[int, int] | None:
        positions = self.fields["masked_lm_positions"]
        if positions.size == 0:
            return None
        if self.fixed:  # real positions are the non-zero prefix of a row: its maximum is the one to test
            past = positions.max(axis=1) >= lengths
            return self._first(positions >= lengths[:, None], positions) if past.any() else None
        return self._first(positions >= np.repeat(lengths, self.counts), positions)

    def _first(self, bad: np.ndarray, values: np.ndarray) -> tuple[int, int] | None:
        if self.fixed:  # padding is not data: only the first counts[i] entries of row i
            bad = bad & (np.arange(bad.shape[1]) < self.counts[:, None])
            rows = bad.any(axis=1)
            if not rows.any():
                return None
            i = int(np.argmax(rows))
            return i, int(values[i, int(np.argmax(bad[i]))])
        if not bad.any():
            return None
        j = int(np.argmax(bad))
        return int(np.searchsorted(np.cumsum(self.counts), j, side="right")), int(values[j])


def _fixed_layout_problem(shard: Shard) -> tuple[int, str] | None:
    """The fixed layout's own rules: input_mask is 1s then 0s, masked positions are non-zero then 0-padding."""
    mask, pos = shard._mask, shard._pos
    if mask.size and (mask.min() < 0 or mask.max() > 1):
        return int(np.argmax(((mask != 0) & (mask != 1)).any(axis=1))), "input_mask is not 1s followed by 0s"
    # with `length` 1s in the row, 1s then 0s exactly when the first 0 is at `length` (or there is none)
    ones = mask.view(np.bool_) if mask.dtype.itemsize == 1 else mask != 0  # argmin is fastest on booleans
    first_zero = np.argmin(ones, axis=1)
    holes = (first_zero != shard.lengths) & (shard.lengths < mask.shape[1])
    if holes.any():
        return int(np.argmax(holes)), "input_mask is not 1s followed by 0s"
    gap = ((pos[:, 1:] != 0) & (pos[:, :-1] == 0)).any(axis=1)  # a 0 before a real position: [CLS] masked
    if gap.any():
        return int(np.argmax(gap)), "masked position 0 is the [CLS] token"
    return None


def _varlen_problem(shard: Shard) -> tuple[int, str] | None:
    """The varlen layout's own rule: the fields of a sample agree in length."""
    for a, b, counts, rows in (("input_ids", "segment_ids", shard.lengths, shard._seg),
                               ("masked_lm_positions", "masked_lm_ids", shard.num_predictions, shard._mids)):
        sizes = np.fromiter(map(len, rows), np.int64, len(rows))
        bad = sizes != counts
        if bad.any():
            i = int(np.argmax(bad))
            return i, f"{a} has {counts[i]} entries, {b} {sizes[i]}"
    return None


def sample_count(path: str | Path) -> int:
    """Samples in a shard, from its HDF5 header only (no data is read)."""
    try:
        require_regular(path)
        with h5py.File(path, "r") as f:
            labels = f.get("next_sentence_labels")
            if not isinstance(labels, h5py.Dataset) or labels.ndim != 1:
                raise ShardError(f"{path}: not a BERT shard (no next_sentence_labels)")
            return int(labels.shape[0])
    except (OSError, KeyError, ValueError, TypeError, RuntimeError) as e:
        raise ShardError(f"{path}: unreadable HDF5 shard ({_one_line(e)})") from None


def shard_files(folder: str | Path) -> list[Path]:
    """The shards of a folder, sorted by name (`*.hdf5` / `*.h5`, hidden temporary files excluded)."""
    folder = Path(folder)
    files = [p for p in folder.iterdir() if p.suffix in (".hdf5", ".h5") and not p.name.startswith(".")]
    return sorted(files)
