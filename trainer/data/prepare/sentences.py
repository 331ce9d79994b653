"""Sentence segmentation for English prose, without a trained model.

A sentence ends at `.`, `!` or `?` (optionally followed by closing quotes or brackets) when the
next word starts like a sentence: an upper-case letter, a digit, or an opening quote/bracket. Dots
that do not end sentences are recognised first: common abbreviations ("e.g.", "Dr."), single
initials ("J. Smith"), dotted names ("os.path.join"), numbers ("3.14") and ellipses. Good enough for
documentation and encyclopedic text; wrong on some edge cases, like every rule-based splitter.
"""

from __future__ import annotations

import re

ABBREVIATIONS = frozenset(
    "e.g i.e etc vs cf al approx resp viz ca fig figs eq eqs no nos vol vols pp p ch sec secs"
    " mr mrs ms dr prof sr jr st mt inc ltd co corp dept univ jan feb mar apr jun jul aug sep sept"
    " oct nov dec".split()
)

# a candidate boundary: terminal punctuation, optional closers, whitespace, then a plausible start
BOUNDARY = re.compile(r"""([.!?]+)(["')\]]*)\s+(?=["'(\[]?[A-Z0-9])""")


def split_sentences(text: str) -> list[str]:
    """The sentences of one paragraph of text, whitespace-normalised, in order."""
    text = " ".join(text.split())
    sentences, start = [], 0
    for match in BOUNDARY.finditer(text):
        if match.group(1) == "." and not _ends_sentence(text[start:match.start()]):
            continue
        end = match.end(2)
        sentences.append(text[start:end].strip())
        start = match.end()
    tail = text[start:].strip()
    if tail:
        sentences.append(tail)
    return [s for s in sentences if s]


def _ends_sentence(before: str) -> bool:
    """Whether the word before a '.' can end a sentence (it is no abbreviation or initial)."""
    word = before.rsplit(None, 1)[-1] if before.strip() else ""
    word = word.lstrip("\"'([")
    if not word:
        return False
    if len(word) == 1 and word.isalpha():
        return False  # an initial: "J. Smith", or a list marker "a. ..."
    if word.lower().rstrip(".") in ABBREVIATIONS:
        return False
    return True
