"""Learning a WordPiece vocabulary from word counts, deterministically.

Start from single characters: a word's first character as itself, every later one as a
continuation `##c`. Then repeatedly merge the adjacent pair of symbols that occurs most often in
the corpus (counting each word with its frequency) into one new symbol (`th` + `##e` -> `the`,
`##i` + `##ng` -> `##ing`), until the vocabulary is full or no pair occurs `min_frequency` times.
Ties go to the alphabetically smallest pair, so the same counts always give the same vocabulary.
Encoding with the result is BERT's greedy longest-match WordPiece (vocab.py).

Pair counts are kept up to date incrementally: a merge only touches the words that contain the
pair, and a heap with lazy deletion finds the next most frequent pair.
"""

from __future__ import annotations

import heapq
from collections import defaultdict

Pair = tuple[str, str]


def learn_wordpiece(word_counts: dict[str, int], size: int, min_frequency: int = 2) -> list[str]:
    """At most `size` tokens: the alphabet (sorted), then merged symbols in the order they were learned."""
    words = sorted(word_counts)
    freqs = [word_counts[w] for w in words]
    symbols = [[w[0]] + ["##" + c for c in w[1:]] for w in words]
    alphabet = sorted({s for word in symbols for s in word})
    if len(alphabet) > size:
        raise ValueError(f"the corpus has {len(alphabet)} distinct characters, more than the vocabulary size {size}")
    vocab, known = list(alphabet), set(alphabet)

    pair_counts: dict[Pair, int] = defaultdict(int)
    where: dict[Pair, set[int]] = defaultdict(set)
    for i, word in enumerate(symbols):
        for pair in zip(word, word[1:]):
            pair_counts[pair] += freqs[i]
            where[pair].add(i)
    heap = [(-count, pair) for pair, count in pair_counts.items()]
    heapq.heapify(heap)

    while len(vocab) < size and heap:
        negative, pair = heapq.heappop(heap)
        if pair_counts.get(pair, 0) != -negative:
            continue  # a stale entry: the count changed since it was pushed
        if -negative < min_frequency:
            break
        merged = pair[0] + pair[1][2:]
        if merged not in known:
            known.add(merged)
            vocab.append(merged)
        changed = _merge_everywhere(pair, merged, symbols, freqs, pair_counts, where)
        for p in changed:
            if pair_counts.get(p, 0) > 0:
                heapq.heappush(heap, (-pair_counts[p], p))
    return vocab


def _merge_everywhere(pair: Pair, merged: str, symbols: list[list[str]], freqs: list[int],
                      pair_counts: dict[Pair, int], where: dict[Pair, set[int]]) -> set[Pair]:
    """Replace `pair` by `merged` in every word that has it; return the pairs whose counts changed."""
    changed: set[Pair] = set()
    for i in sorted(where.pop(pair, ())):
        word, freq = symbols[i], freqs[i]
        for p in zip(word, word[1:]):  # forget this word's pairs, then count them again after merging
            pair_counts[p] -= freq
            changed.add(p)
        out, j = [], 0
        while j < len(word):
            if j + 1 < len(word) and word[j] == pair[0] and word[j + 1] == pair[1]:
                out.append(merged)
                j += 2
            else:
                out.append(word[j])
                j += 1
        symbols[i] = out
        for p in zip(out, out[1:]):
            pair_counts[p] += freq
            where[p].add(i)
            changed.add(p)
    pair_counts.pop(pair, None)
    return changed
