"""The combine steps on plain HDF5 files, without a manifest (`split-bins`, `pick-eval`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from trainer.config import DatasetOutput
from trainer.data.layout import Shard, ShardError
from trainer.data.prepare import eval_pick
from trainer.data.prepare.bins import bin_names, bin_of, shard_name, shard_spans
from trainer.data.prepare.errors import BadInput
from trainer.data.prepare.stages import save_shard


def _load(path: Path) -> Shard:
    try:
        return Shard(path)
    except ShardError as e:
        raise BadInput(path, str(e).removeprefix(f"{path}: ")) from None


def _shape(shards: list[Shard], layout: str, max_seq_length: int | None = None) -> DatasetOutput:
    longest = max(int(s.lengths.max(initial=1)) for s in shards)
    predictions = max(int(s.num_predictions.max(initial=1)) for s in shards)
    seq = max_seq_length or longest
    return DatasetOutput(split="train", max_seq_length=seq, max_predictions=min(max(predictions, 1), seq), layout=layout)


def split_bins(inputs: list[Path], out_dir: Path, edges: list[int] | None, shards: int, layout: str) -> dict[Path, int]:
    """Every sample of `inputs`, in order, into `shards` balanced shards per bin (subfolders per edge)."""
    loaded = [_load(p) for p in inputs]
    out = _shape(loaded, layout, edges[-1] if edges else None)
    edges = edges or [out.max_seq_length]
    bins = [bin_of(s.lengths, edges) for s in loaded]
    too_long = [p for p, b in zip(inputs, bins) if np.any(b >= len(edges))]
    if too_long:
        raise BadInput(too_long[0], f"has samples longer than the last bin edge {edges[-1]}")
    written = {}
    for b, folder in enumerate(bin_names(edges if len(edges) > 1 else None)):
        counts = [int((x == b).sum()) for x in bins]
        if sum(counts) < shards:
            raise BadInput(out_dir / folder, f"bin {b} has {sum(counts)} samples, fewer than {shards} shards")
        for index, span in enumerate(shard_spans(sum(counts), shards)):
            samples = []
            for part, first, last in span.pieces(counts):
                samples += loaded[part].samples(np.flatnonzero(bins[part] == b)[first:last])
            path = out_dir / folder / shard_name(index, shards)
            save_shard(path, samples, layout, out)
            written[path] = len(samples)
    return written


def pick_eval(inputs: list[Path], output: Path, count: int, layout: str) -> int:
    loaded = [_load(p) for p in inputs]
    counts = [len(s) for s in loaded]
    try:
        picked = eval_pick.pick_indices(sum(counts), count)
    except ValueError as e:
        raise BadInput(inputs[0], str(e)) from None
    samples = []
    for part, indices in eval_pick.split_by_part(picked, counts):
        samples += loaded[part].samples(indices)
    save_shard(output, samples, layout, _shape(loaded, layout))
    return len(samples)
