"""Load-balancing algorithms (numpy only): who trains which sequence in a step.

With unpadded kernels a rank's step time follows its token count, and the slowest rank sets the
step time. These are the seeds' remedies, written once and used both by the trainer (through
trainer/parallel/exchange.py) and by the simulator behind `bertctl balance`:

- stratified quotas (Samsung): every rank's batch takes fixed counts from the 4 length bins;
- sort and deal (exchange padding): a group's sequences sorted by length and dealt out
  round-robin, or in snake order (odd rounds reversed) so no rank always gets the longest;
- packing: sequences packed into rows of at most `capacity` tokens and `max_per_pack` sequences
  (`pack_plan`: histogram strategies, longest first), then whole packs dealt out, so every rank gets
  the same number of nearly full rows.
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
    """Whole sequences packed into rows of at most `capacity` tokens and `max_per_pack` sequences.

    The packs follow `pack_plan` on the lengths' histogram; the sequences of each length are taken in
    index order, so the result depends on the lengths alone. Returns the packs as lists of indices
    into `lengths`. Efficiency is sum(lengths) / (packs x capacity).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    check_packable(lengths, capacity, max_per_pack)
    counts = np.bincount(lengths, minlength=capacity + 1)
    by_length = np.split(np.argsort(lengths, kind="stable"), np.cumsum(counts)[:-1])
    taken = np.zeros(capacity + 1, dtype=np.int64)
    packs: list[list[int]] = []
    for pattern, times in pack_plan(counts, capacity, max_per_pack):
        columns = []
        for length in pattern:  # the pattern's sequences of one length, `times` of them, as one column
            columns.append(by_length[length][taken[length]:taken[length] + times])
            taken[length] += times
        packs.extend(np.stack(columns, axis=1).tolist())
    return packs


def check_packable(lengths: np.ndarray, capacity: int, max_per_pack: int | None) -> None:
    if max_per_pack is not None and max_per_pack < 1:
        raise ValueError(f"at most {max_per_pack} sequences per pack: needs at least 1")
    if len(lengths) and (lengths.min() < 1 or lengths.max() > capacity):
        raise ValueError(f"a sequence of {int(lengths.max() if lengths.max() > capacity else lengths.min())} tokens "
                         f"cannot go into a pack of {capacity}")


def pack_plan(counts: np.ndarray, capacity: int = 512, max_per_pack: int | None = None) -> list[tuple[tuple[int, ...], int]]:
    """Packing strategies for a length histogram (counts[l]: sequences of length l, counts[0] unused):
    a list of (the lengths in one pack, how many such packs), which together hold every sequence once.

    Longest first: the longest sequence left anchors a pack, and the rest of the pack is the fullest
    choice of at most max_per_pack - 1 sequences left that fits beside it (`best_companions`). Each
    strategy is repeated for as long as its lengths last (availability only shrinks, so the fullest
    choice stays the fullest while it lasts; only the tie-break among equally full ones could have
    turned earlier), so the work grows with the number of distinct lengths, not of sequences: 16 M
    sequences' histogram packs in well under a second. The idea is Graphcore's (Krell et al., histogram packing with
    strategies, LPFHP); the search for the companions is this module's own. With at most 3 per pack
    it fills 99.80 % of the tokens of the Wikipedia histogram at 1.997 sequences per pack.
    """
    left = np.zeros(capacity + 1, dtype=np.int64)
    left[:len(counts)] = np.asarray(counts, dtype=np.int64)[:capacity + 1]
    left[0] = 0
    companions = (max_per_pack or capacity) - 1
    plan: list[tuple[tuple[int, ...], int]] = []
    for anchor in range(capacity, 0, -1):
        while left[anchor]:
            left[anchor] -= 1
            pattern = (anchor, *best_companions(left, capacity - anchor, companions))
            left[anchor] += 1
            lengths, need = np.unique(pattern, return_counts=True)
            times = int((left[lengths] // need).min())
            left[lengths] -= need * times
            plan.append((pattern, times))
    return plan


def best_companions(left: np.ndarray, room: int, most: int) -> tuple[int, ...]:
    """The lengths of at most `most` sequences (from the counts `left`) that fill `room` the fullest.

    One: the longest that fits. Two: every available length a against the longest b <= min(a, room - a);
    of the fullest pairs, the one whose a has the most sequences left (it keeps the lengths in balance:
    taking the first or the most even of them ran short of short sequences and left the last packs
    of middle-length ones two to a pack, 99.26 % full). More: the longest that fits, then the best of the rest (greedy before the last
    two), unless a pair alone fills more. Ties go to fewer sequences, which leaves short ones for later."""
    if most < 1 or room < 1:
        return ()
    window = left[:room + 1]
    longest_up_to = np.maximum.accumulate(np.where(window > 0, np.arange(room + 1), 0))
    single = int(longest_up_to[room])
    if single == 0:
        return ()
    best: tuple[int, ...] = (single,)
    if most >= 2:
        a = np.flatnonzero(window[1:]) + 1
        b = longest_up_to[np.minimum(a, room - a)]
        alone = (b == a) & (window[a] < 2)  # a pair of one length needs two of them
        b[alone] = longest_up_to[a[alone] - 1]
        fill = np.where(b > 0, a + b, 0)
        fullest = np.flatnonzero(fill == fill.max())
        i = fullest[np.argmax(window[a[fullest]])]  # of the fullest pairs, the one whose a is most plentiful
        if fill[i] >= single:
            best = (int(a[i]), int(b[i]))
    if most >= 3:
        left[single] -= 1
        greedy = (single, *best_companions(left, room - single, most - 1))
        left[single] += 1
        if sum(greedy) >= sum(best):
            best = greedy
    return best


def pack_histogram(counts: np.ndarray, capacity: int = 512, max_per_pack: int | None = None) -> tuple[int, float]:
    """`pack_plan` on a length histogram (counts[l - 1] sequences of length l, as the CSV has them):
    (number of packs, share of real tokens)."""
    plan = pack_plan(np.concatenate([[0], np.asarray(counts)[:capacity]]), capacity, max_per_pack)
    packs = sum(times for _, times in plan)
    tokens = sum(sum(pattern) * times for pattern, times in plan)
    return packs, tokens / (packs * capacity)


