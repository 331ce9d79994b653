"""Documents -> sentence pairs for next-sentence prediction, as BERT's create_pretraining_data does.

For each document, sentences are gathered into a chunk until the chunk reaches a target length
(max_seq_length - 3 for [CLS] A [SEP] B [SEP], or with probability `short_seq_prob` a random
shorter length, so the model also sees short sequences). A fair coin decides the label. Label 1
("random next"): A is the chunk's first sentences up to a random boundary and B comes from a random
other document; the chunk's unused sentences go back into the document. Label 0: the chunk is cut at
a random sentence boundary into A and its real continuation B. The pair is then trimmed to fit, one
token at a time from the longer side, at its front or back at random.

One difference from Google's script: there, a chunk of a single sentence always gets a random B,
which pushes the share of random next sentences above one half on corpora of short documents (54 %
on the sample corpus). Here such a chunk borrows the document's next (or previous) sentence when
the coin asks for a real continuation, so the labels stay 50/50; only a one-sentence document
always gets a random B.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

Sentence = list[int]  # token ids
TokenDocument = list[Sentence]

RANDOM_DOCUMENT_TRIES = 10


@dataclass
class Pair:
    tokens_a: list[int]
    tokens_b: list[int]
    is_random_next: bool


def document_pairs(documents: list[TokenDocument], index: int, max_seq_length: int, short_seq_prob: float,
                   rng: random.Random) -> list[Pair]:
    """The sentence pairs of documents[index]; random next sentences come from the other documents."""
    document = documents[index]
    max_tokens = max_seq_length - 3
    target = rng.randint(2, max_tokens) if rng.random() < short_seq_prob else max_tokens
    pairs: list[Pair] = []
    chunk: list[Sentence] = []
    chunk_length = 0
    i = 0
    while i < len(document):
        chunk.append(document[i])
        chunk_length += len(document[i])
        if i == len(document) - 1 or chunk_length >= target:
            is_random_next = rng.random() < 0.5
            if not is_random_next and len(chunk) == 1:
                if i + 1 < len(document):  # borrow the next sentence (it is used up here)
                    i += 1
                    chunk.append(document[i])
                elif i > 0:  # the last sentence: pair it with the one before
                    chunk.insert(0, document[i - 1])
                else:  # a one-sentence document has no continuation
                    is_random_next = True
            a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
            tokens_a = [t for s in chunk[:a_end] for t in s]
            if is_random_next:
                tokens_b = random_continuation(documents, index, target - len(tokens_a), rng)
                i -= len(chunk) - a_end  # the sentences after A were not used: put them back
            else:
                tokens_b = [t for s in chunk[a_end:] for t in s]
            trim_pair(tokens_a, tokens_b, max_tokens, rng)
            if tokens_a and tokens_b:
                pairs.append(Pair(tokens_a, tokens_b, is_random_next))
            chunk, chunk_length = [], 0
            target = rng.randint(2, max_tokens) if rng.random() < short_seq_prob else max_tokens
        i += 1
    return pairs


def random_continuation(documents: list[TokenDocument], index: int, length: int, rng: random.Random) -> list[int]:
    """At least `length` tokens of consecutive sentences from a random start in another document."""
    other = index
    for _ in range(RANDOM_DOCUMENT_TRIES):
        other = rng.randint(0, len(documents) - 1)
        if other != index:
            break
    document = documents[other]
    tokens: list[int] = []
    for sentence in document[rng.randint(0, len(document) - 1):]:
        tokens.extend(sentence)
        if len(tokens) >= length:
            break
    return tokens


def trim_pair(tokens_a: list[int], tokens_b: list[int], max_tokens: int, rng: random.Random) -> None:
    """Shorten the longer of A and B, at its front or back at random, until both fit (in place)."""
    while len(tokens_a) + len(tokens_b) > max_tokens:
        longer = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()
