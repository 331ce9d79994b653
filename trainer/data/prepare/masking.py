"""Masked-language-model targets: which tokens the model must predict, and what it sees instead.

Of a sequence of L tokens, min(max_predictions, max(1, round(L * masked_lm_prob))) positions are
chosen at random among the real tokens ([CLS] and [SEP] never). At each chosen position the model
sees [MASK] 80 % of the time, a random token 10 % of the time (any token but the five special
ones), and the original token 10 % of the time; the original token is the label.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from trainer.data.layout import Sample


@dataclass(frozen=True)
class SpecialIds:
    cls: int
    sep: int
    mask: int
    vocab_size: int
    never_random: frozenset[int]  # the special tokens: not drawn as random replacements


def build_sample(tokens_a: list[int], tokens_b: list[int], is_random_next: bool, ids: SpecialIds,
                 masked_lm_prob: float, max_predictions: int, rng: random.Random) -> Sample:
    """[CLS] A [SEP] B [SEP], masked, as one unpadded sample."""
    tokens = [ids.cls, *tokens_a, ids.sep, *tokens_b, ids.sep]
    segments = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
    never = (0, len(tokens_a) + 1, len(tokens) - 1)  # [CLS] and the two [SEP]
    positions, labels = mask_in_place(tokens, never, ids, masked_lm_prob, max_predictions, rng)
    return Sample(
        input_ids=np.asarray(tokens, np.int64),
        segment_ids=np.asarray(segments, np.int64),
        masked_lm_positions=np.asarray(positions, np.int64),
        masked_lm_ids=np.asarray(labels, np.int64),
        next_sentence_label=int(is_random_next),
    )


def mask_in_place(tokens: list[int], never: tuple[int, ...], ids: SpecialIds, masked_lm_prob: float,
                  max_predictions: int, rng: random.Random) -> tuple[list[int], list[int]]:
    """Mask `tokens` in place, except at the positions `never`; return the masked positions
    (ascending) and their original tokens."""
    candidates = [i for i in range(len(tokens)) if i not in never]
    count = min(max_predictions, max(1, int(round(len(tokens) * masked_lm_prob))), len(candidates))
    positions = sorted(rng.sample(candidates, count))
    labels = [tokens[p] for p in positions]
    for p in positions:
        roll = rng.random()
        if roll < 0.8:
            tokens[p] = ids.mask
        elif roll < 0.9:
            tokens[p] = random_token(ids, rng)
        # else: keep the original token
    return positions, labels


def random_token(ids: SpecialIds, rng: random.Random) -> int:
    while True:
        token = rng.randrange(ids.vocab_size)
        if token not in ids.never_random:
            return token
