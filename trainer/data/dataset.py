"""Training data: shards assigned to readers, shuffled with a seed, resumable at any step.

The global batch of every step is made of one micro-batch from each of `num_streams` readers
("streams"). Stream s reads the files s, s + V, s + 2V, ... of the epoch's shuffled file list
(V = number of streams), each file in its own seeded permutation, and hands out consecutive
chunks across file boundaries. Each rank owns V / W streams and concatenates their chunks, so:

- with V = W (the default) every rank reads only its own shards, as NVIDIA's loader does;
- the samples of each global step depend on the seed and V only, not on the rank count: a 1-rank
  run with V = 2 sees exactly what a 2-rank run sees (that is how the tests compare them);
- a stream's position is three integers (epoch, file, offset): the checkpoint stores them.

The next file of a stream is read in a worker process while the current one is consumed.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import threading
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import numpy as np

from trainer.balance.algorithms import pack_sequences, quotas_from_counts
from trainer.config import BIN_EDGES, BalanceConfig, DataConfig, expand_path
from trainer.data.layout import Sample, Shard, ShardError, sample_count, shard_files


class DataError(Exception):
    """The training data cannot serve this run (missing folder, too few shards)."""


def training_files(train_dir: str | Path) -> list[Path]:
    """All shards of a flat folder, or of every bin of a 4-bin folder (subfolders 128/256/384/512)."""
    folder = Path(train_dir)
    if not folder.is_dir():
        raise DataError(f"{folder}: training data folder not found")
    bins = bin_folders(folder)
    files = [f for b in bins for f in shard_files(b)] if bins else shard_files(folder)
    if not files:
        raise DataError(f"{folder}: no .hdf5 shards found")
    return files


def bin_folders(folder: Path) -> list[Path]:
    """The 4-bin layout's subfolders in bin order, or [] for a flat folder."""
    subs = [folder / str(edge) for edge in BIN_EDGES]
    return subs if all(s.is_dir() for s in subs) else []


@dataclass
class StreamPosition:
    epoch: int = 0
    file: int = 0  # index into this stream's files of the epoch
    offset: int = 0  # samples of that file already handed out


class ShardStream:
    """One reader: a resumable, seeded sequence of samples over its share of the shards."""

    def __init__(self, files: list[Path], stream: int, num_streams: int, seed: int, loader: "ShardLoader", salt: int = 0):
        if len(files) < num_streams:
            raise DataError(
                f"{files[0].parent}: {len(files)} shard(s) for {num_streams} readers; each reader needs at least one "
                "(prepare more shards, or set data streams lower)"
            )
        self.files, self.stream, self.num_streams, self.seed, self.salt = files, stream, num_streams, seed, salt
        self.loader = loader
        self.position = StreamPosition()
        self._shard: Shard | None = None
        self._order: np.ndarray | None = None

    def my_files(self, epoch: int) -> list[Path]:
        return stream_files(self.files, self.stream, self.num_streams, self.seed, self.salt, epoch)

    def take(self, n: int) -> list[Sample]:
        out: list[Sample] = []
        while len(out) < n:
            shard, order = self._current()
            chunk = order[self.position.offset:self.position.offset + n - len(out)]
            out.extend(shard.samples(chunk))
            self.position.offset += len(chunk)
            if self.position.offset >= len(order):
                self._advance()
        return out

    def _current(self) -> tuple[Shard, np.ndarray]:
        if self._shard is None:
            files = self.my_files(self.position.epoch)
            path = files[self.position.file]
            self._shard = self.loader.get(path)
            key = [self.seed, self.salt, self.position.epoch, self.stream, self.position.file]
            self._order = np.random.default_rng(key).permutation(len(self._shard))
            following = files[self.position.file + 1] if self.position.file + 1 < len(files) else self.my_files(self.position.epoch + 1)[0]
            self.loader.prefetch(following)
        return self._shard, self._order

    def _advance(self) -> None:
        self._shard, self._order = None, None
        self.position.offset = 0
        self.position.file += 1
        if self.position.file >= len(self.my_files(self.position.epoch)):
            self.position = StreamPosition(epoch=self.position.epoch + 1)


def stream_files(files: list[Path], stream: int, num_streams: int, seed: int, salt: int, epoch: int) -> list[Path]:
    """The files stream `stream` of `num_streams` reads in `epoch`: its share of a seeded shuffle."""
    order = np.random.default_rng([seed, salt, epoch]).permutation(len(files))
    return [files[i] for i in order[stream::num_streams]]


def shard_groups(train_dir: str, stratified: bool) -> list[list[Path]]:
    """The shards the streams shuffle: one group per length bin for stratified batches, else one."""
    folder = Path(expand_path(train_dir))
    if not folder.is_dir():
        raise DataError(f"{folder}: training data folder not found")
    if not stratified:
        return [training_files(folder)]
    groups = [shard_files(b) for b in bin_folders(folder)]
    if not groups:
        raise DataError(f"{folder}: stratified batches need the 4-bin layout (subfolders 128/256/384/512)")
    return groups


def files_by_rank(data: DataConfig, balance: BalanceConfig, world_size: int, seed: int) -> list[list[Path]]:
    """Every rank's shards for the first epoch, by rank, without opening any (the launch probe's plan):
    the folder is listed once for all ranks, and each rank's streams are the trainer's (`stream_files`)."""
    num_streams = data.streams or world_size
    per_rank = num_streams // world_size
    groups = shard_groups(data.train_dir, balance.stratified)
    for files in groups:
        if len(files) < num_streams:
            raise DataError(f"{files[0].parent if files else data.train_dir}: {len(files)} shard(s) for {num_streams} readers; "
                            "each reader needs at least one")
    salts = range(1, len(groups) + 1) if balance.stratified else [0]
    by_stream = [[stream_files(files, s, num_streams, seed, salt, 0) for s in range(num_streams)]
                 for files, salt in zip(groups, salts)]
    return [[f for streams in by_stream for s in range(rank * per_rank, (rank + 1) * per_rank) for f in streams[s]]
            for rank in range(world_size)]


class ShardLoader:
    """Reads shards, the next one in a worker process while the current one is in use. Each shard is
    validated as it is read (against the run's vocabulary and sequence limits where given), so a
    malformed one stops the run, naming the file and sample, before any of it is trained on."""

    def __init__(self, workers: int, vocab_size: int | None = None, max_seq_length: int | None = None,
                 max_predictions: int | None = None):
        # spawn: the trainer process holds torch threads; a forked child of it is not safe
        self._pool = cf.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=die_with_parent,
                                            initargs=(os.getpid(),)) if workers else None
        self._pending: dict[Path, cf.Future] = {}
        self._open = partial(open_training_shard, vocab_size=vocab_size, max_seq_length=max_seq_length,
                             max_predictions=max_predictions)

    def prefetch(self, path: Path) -> None:
        if self._pool is not None and path not in self._pending:
            self._pending[path] = self._pool.submit(self._open, path)

    def get(self, path: Path) -> Shard:
        future = self._pending.pop(path, None)
        return future.result() if future is not None else self._open(path)

    def close(self) -> None:
        """Cancel queued reads and wait for the one in flight (at most one shard per worker).

        Not waiting let the pool's manager thread close its wake-up pipe while Python 3.11's exit
        hook for process pools was writing to it: a run ending on a shard error then printed an
        'OSError: Bad file descriptor' traceback after its one-line error, now and then."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


def die_with_parent(parent: int, every_s: float = 1.0) -> None:
    """A shard worker ends when the trainer that started it is gone. A SIGKILLed trainer (the OOM killer)
    never shuts its pool down, and the worker, waiting on a queue whose writing end it holds itself,
    would live on, holding the job's output pipe open: the job script's `| tee` never ends, nor the job.
    (A watch, not PR_SET_PDEATHSIG: that signal follows the thread that started the worker, and the
    packing thread starts some, which would kill them when it ends, not when the trainer does.)"""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every_s)
        os._exit(1)

    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()


def open_training_shard(path: Path, **limits) -> Shard:
    """A validated shard with samples in it (a reader whose files were all empty would never advance)."""
    shard = Shard(path, **limits)
    if len(shard) == 0:
        raise ShardError(f"{path}: no samples")
    return shard


class StratifiedStream:
    """Samsung's stratified batches: quotas[i] samples from bin i's own stream in every micro-batch."""

    def __init__(self, bins: list[list[Path]], stream: int, num_streams: int, seed: int, loader: ShardLoader,
                 quotas: list[int]):
        self.quotas = quotas
        self.bins = [ShardStream(files, stream, num_streams, seed, loader, salt=b + 1) for b, files in enumerate(bins)]

    def take(self, n: int) -> list[Sample]:
        if n != sum(self.quotas):
            raise DataError(f"bin quotas {self.quotas} add up to {sum(self.quotas)}, a stream's batch is {n}")
        return [s for stream, q in zip(self.bins, self.quotas) for s in stream.take(q)]

    @property
    def position(self) -> list[StreamPosition]:
        return [b.position for b in self.bins]

    def restore(self, positions: list[dict]) -> None:
        for b, pos in zip(self.bins, positions):
            b.position = StreamPosition(**pos)
            b._shard = b._order = None


class PackedStream:
    """Packs of whole sequences (at most `capacity` tokens and `max_per_pack` sequences each) made from
    windows of the inner stream.

    Each window of `window` samples is packed with `pack_sequences` (at up to 3 per pack on the
    Wikipedia length mix, windows of 65,536: 1.994 sequences and 99.8 % real tokens per pack) and its packs are
    handed out in a seeded order. The next window is read and packed in a background thread while
    this one trains, so the step never waits for packing. The position is the inner stream's
    position at the window's start plus the number of packs already handed out.
    """

    def __init__(self, inner: ShardStream, window: int, capacity: int, seed: int, max_per_pack: int | None = None):
        self.inner, self.window, self.capacity, self.seed = inner, window, capacity, seed
        self.max_per_pack = max_per_pack
        self.start = StreamPosition()
        self.next_pack = 0
        self._packs: list[list[Sample]] | None = None
        self._end = StreamPosition()  # the inner stream's position after this window
        self._ahead = cf.ThreadPoolExecutor(1, thread_name_prefix="packing")
        self._next: tuple[StreamPosition, cf.Future] | None = None  # the next window, being packed

    def take_packs(self, n: int) -> list[list[Sample]]:
        out: list[list[Sample]] = []
        while len(out) < n:
            packs = self._current()
            chunk = packs[self.next_pack:self.next_pack + n - len(out)]
            out.extend(chunk)
            self.next_pack += len(chunk)
            if self.next_pack >= len(packs):
                self.start, self.next_pack, self._packs = self._end, 0, None
        return out

    def _current(self) -> list[list[Sample]]:
        if self._packs is None:
            ready = self._next[1] if self._next is not None and self._next[0] == self.start else None
            if ready is None:
                self._settle_ahead()
                ready = self._ahead.submit(self._pack_window, self.start)
            self._packs, self._end = ready.result()
            self._next = (self._end, self._ahead.submit(self._pack_window, self._end))
        return self._packs

    def _pack_window(self, start: StreamPosition) -> tuple[list[list[Sample]], StreamPosition]:
        """The packs of the window that starts at `start`, in their seeded order, and where it ends.
        The inner stream reads on from where the last window ended, reopening a shard only after a restore."""
        if self.inner.position != start:
            self.inner.position = StreamPosition(**asdict(start))
            self.inner._shard = self.inner._order = None
        samples = self.inner.take(self.window)
        groups = pack_sequences(np.array([len(x) for x in samples]), self.capacity, self.max_per_pack)
        key = [self.seed, start.epoch, start.file, start.offset]
        order = np.random.default_rng(key).permutation(len(groups))
        return [[samples[i] for i in groups[g]] for g in order], StreamPosition(**asdict(self.inner.position))

    def _settle_ahead(self) -> None:
        """Wait for a window being packed ahead (its error, if any, belongs to a window not wanted now)."""
        if self._next is not None:
            cf.wait([self._next[1]])
            self._next = None

    @property
    def position(self) -> dict:
        return {"start": asdict(self.start), "next_pack": self.next_pack}

    def restore(self, state: dict) -> None:
        self._settle_ahead()
        self.start, self.next_pack, self._packs = StreamPosition(**state["start"]), state["next_pack"], None

    def close(self) -> None:
        self._settle_ahead()
        self._ahead.shutdown(wait=True)


class TrainData:
    """The micro-batches of one rank: its streams' chunks, concatenated in stream order.

    Plain: `batch_size` samples. Stratified: the same, taken by bin quotas. Packed: `batch_size`
    packs, returned with the pack each sample belongs to (exchange padding moves whole packs).
    """

    def __init__(self, data: DataConfig, balance: BalanceConfig, batch_size: int, rank: int, world_size: int, seed: int,
                 vocab_size: int | None = None):
        """`vocab_size`: the model's; every shard is checked against it and the data section's limits when opened."""
        num_streams = data.streams or world_size
        if num_streams % world_size or (batch_size * world_size) % num_streams:
            raise DataError(
                f"{num_streams} data streams cannot be split evenly over {world_size} ranks x {batch_size} samples"
            )
        per_rank = num_streams // world_size
        self.per_stream = batch_size * world_size // num_streams
        self.loader = ShardLoader(data.num_workers, vocab_size, data.max_seq_length, data.max_predictions_per_seq)
        mine = range(rank * per_rank, (rank + 1) * per_rank)
        if balance.stratified:
            bins = shard_groups(data.train_dir, stratified=True)
            self.quotas = balance.bin_quotas or quotas_from_counts(
                np.array([count_samples(files) for files in bins]), self.per_stream)
            self.streams = [StratifiedStream(bins, s, num_streams, seed, self.loader, self.quotas) for s in mine]
        else:
            [files] = shard_groups(data.train_dir, stratified=False)
            self.streams = [ShardStream(files, s, num_streams, seed, self.loader) for s in mine]
        self.packed = [PackedStream(s, balance.pack_window, data.max_seq_length, seed, balance.pack_sequences)
                       for s in self.streams] \
            if balance.packing else None

    def next_samples(self) -> tuple[list[Sample], list[list[int]] | None]:
        """This rank's samples for one micro-step, and (when packing) which of them form each pack."""
        if self.packed is None:
            return [x for stream in self.streams for x in stream.take(self.per_stream)], None
        samples, packs = [], []
        for stream in self.packed:
            for pack in stream.take_packs(self.per_stream):
                packs.append(list(range(len(samples), len(samples) + len(pack))))
                samples.extend(pack)
        return samples, packs

    def state_dict(self) -> dict:
        if self.packed is not None:
            return {"packed": [s.position for s in self.packed]}
        return {"streams": [_position_state(s.position) for s in self.streams]}

    def load_state_dict(self, state: dict) -> None:
        if self.packed is not None:
            for stream, pos in zip(self.packed, state["packed"]):
                stream.restore(pos)
            return
        for stream, position in zip(self.streams, state["streams"]):
            if isinstance(stream, StratifiedStream):
                stream.restore(position)
            else:
                stream.position = StreamPosition(**position)
                stream._shard = stream._order = None

    def close(self) -> None:
        for stream in self.packed or []:
            stream.close()
        self.loader.close()


def _position_state(position) -> dict | list[dict]:
    return [asdict(p) for p in position] if isinstance(position, list) else asdict(position)


def count_samples(files: list[Path]) -> int:
    """Samples in these shards, from the HDF5 headers only (no data is read)."""
    return sum(sample_count(f) for f in files)
