"""Load-balancing algorithms (numpy only): who trains which sequence in a step.

With unpadded kernels a rank's step time follows its token count, and the slowest rank sets the
step time. These are the seeds' remedies, written once and used both by the trainer (through
trainer/exchange.py) and by the simulator behind `bertctl balance`:

- stratified quotas (Samsung): every rank's batch takes fixed counts from the 4 length bins;
- sort and deal (exchange padding): a group's sequences sorted by length and dealt out
  round-robin, or in snake order (odd rounds reversed) so no rank always gets the longest;
- packing: sequences packed into rows of at most `capacity` tokens (best fit, longest first),
  then whole packs dealt out, so every rank gets the same number of nearly full rows.
"""

from __future__ import annotations

import numpy as np

from trainer.config import BIN_EDGES


def bin_of(lengths: np.ndarray, edges=BIN_EDGES) -> np.ndarray:
    """Bin index of each length: 0 for 1-128, 1 for 129-256, ..."""
    return np.searchsorted(np.asarray(edges), lengths, side="left")


def quotas_from_counts(counts: np.ndarray, batch: int) -> list[int]:
    """Per-bin samples per batch, proportional to the bins' sizes (largest remainder, >= 1 when non-empty).

    On the Wikipedia histogram (36.9 / 19.7 / 11.7 / 31.6 %) this gives Samsung's 6/3/2/5 of 16.
    """
    share = counts / counts.sum() * batch
    quotas = np.floor(share).astype(int)
    quotas[(quotas == 0) & (counts > 0)] = 1
    while quotas.sum() > batch:
        quotas[np.argmax(quotas - share)] -= 1
    while quotas.sum() < batch:
        quotas[np.argmax(share - quotas)] += 1
    return quotas.tolist()


def deal_members(lengths: np.ndarray, group: int, snake: bool) -> np.ndarray:
    """For rows of sequences [..., n], the group member (0..group-1) each sequence is dealt to.

    Each row is sorted longest first and cut into rounds of `group`; in round k member g takes
    the g-th, or with snake the (group - 1 - g)-th of every odd round. Ties go by position, so
    every rank computes the same deal. Works on a batch of rows at once (the simulator's groups).
    """
    lengths = np.asarray(lengths)
    order = np.argsort(-lengths, axis=-1, kind="stable")
    rank_in_sorted = np.empty_like(order)
    np.put_along_axis(rank_in_sorted, order, np.arange(lengths.shape[-1]), axis=-1)
    rounds, column = np.divmod(rank_in_sorted, group)
    return np.where(snake & (rounds % 2 == 1), group - 1 - column, column)


def deal_order(lengths: np.ndarray, group: int, snake: bool) -> list[np.ndarray]:
    """Each member's indices (in sorted order, longest first) after `deal_members`."""
    lengths = np.asarray(lengths)
    members = deal_members(lengths, group, snake)
    order = np.argsort(-lengths, kind="stable")
    return [order[members[order] == g] for g in range(group)]


def pack_sequences(lengths: np.ndarray, capacity: int = 512, max_per_pack: int | None = None) -> list[list[int]]:
    """Best-fit decreasing: each sequence, longest first, goes into the fullest pack it still fits.

    Returns the packs as lists of indices into `lengths`. Efficiency is sum(lengths) / (packs x capacity).
    """
    order = np.lexsort((np.arange(len(lengths)), -np.asarray(lengths)))
    packs: list[list[int]] = []
    room: list[int] = []
    by_room: dict[int, list[int]] = {}  # free tokens -> packs with exactly that much room
    for i in order:
        need = int(lengths[i])
        best = next((r for r in range(need, capacity + 1) if by_room.get(r)), None)
        if best is None:
            p = len(packs)
            packs.append([int(i)])
            room.append(capacity - need)
        else:
            p = by_room[best].pop()
            packs[p].append(int(i))
            room[p] = best - need
        if max_per_pack is None or len(packs[p]) < max_per_pack:
            by_room.setdefault(room[p], []).append(p)
    return packs


def pack_histogram(counts: np.ndarray, capacity: int = 512) -> tuple[int, float]:
    """Best-fit decreasing on a length histogram (counts[l - 1] sequences of length l), in bulk.

    Works on counts, not sequences, so 16 M sequences pack in well under a second.
    Returns (number of packs, efficiency).
    """
    packs_with_room = np.zeros(capacity + 1, dtype=np.int64)  # packs_with_room[r]: packs with r free tokens
    for length in range(capacity, 0, -1):
        left = int(counts[length - 1])
        for r in range(length, capacity + 1):
            if left == 0:
                break
            moved = min(left, int(packs_with_room[r]))
            if moved:
                packs_with_room[r] -= moved
                packs_with_room[r - length] += moved
                left -= moved
        packs_with_room[capacity - length] += left  # new packs
    packs = int(packs_with_room.sum())
    tokens = int((np.arange(1, capacity + 1) * counts[:capacity]).sum())
    return packs, tokens / (packs * capacity)


def deal_packs(pack_tokens: np.ndarray, group: int) -> list[np.ndarray]:
    """Packs dealt like sequences (fullest first, snake), so members get equal counts and near-equal tokens."""
    return deal_order(pack_tokens, group, snake=True)
