"""WordPiece vocabularies and tokenization, with Hugging Face `tokenizers`.

BERT's uncased tokenization: clean the text, split Chinese characters, lower-case and strip accents,
split on whitespace and punctuation, then greedy longest-match WordPiece with `##` continuations.
A vocabulary file is one token per line, the line number being the id; the special tokens come
first in a trained one ([PAD] = 0, [UNK], [CLS], [SEP], [MASK]), as in Google's uncased vocab.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from trainer.config.regular import open_regular, read_regular_text
from trainer.data.prepare import files
from trainer.data.prepare.errors import BadInput

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _tokenizers():
    # one thread per worker process: the pipeline's parallelism is its processes
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import tokenizers

    return tokenizers


def _bert_pipeline(tokenizer, lower_case: bool) -> None:
    t = _tokenizers()
    tokenizer.normalizer = t.normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=lower_case, lowercase=lower_case)
    tokenizer.pre_tokenizer = t.pre_tokenizers.BertPreTokenizer()


def train_vocab(text_files: Sequence[str | Path], out: str | Path, size: int, min_frequency: int = 2,
                lower_case: bool = True) -> list[str]:
    """Learn a WordPiece vocabulary of at most `size` tokens from the files and write it to `out`.

    Hugging Face's trainers break ties between equally frequent merges by hash-map order, which
    changes from process to process; this learner is deterministic (wordpiece_learner.py), and the
    text is normalised and split into words by the same `tokenizers` pipeline that encodes it.
    """
    from trainer.data.prepare.wordpiece_learner import learn_wordpiece

    words = count_words(text_files, lower_case)
    tokens = learn_wordpiece(words, size - len(SPECIAL_TOKENS), min_frequency)
    tokens = SPECIAL_TOKENS + [tok for tok in tokens if tok not in SPECIAL_TOKENS]
    files.write_text(out, "".join(tok + "\n" for tok in tokens))
    return tokens


def count_words(text_files: Sequence[str | Path], lower_case: bool) -> dict[str, int]:
    """How often each pre-tokenized word occurs in the files (UTF-8 text, any layout)."""
    t = _tokenizers()
    tokenizer = t.Tokenizer(t.models.WordPiece({"[UNK]": 0}, unk_token="[UNK]"))
    _bert_pipeline(tokenizer, lower_case)
    normalize, split = tokenizer.normalizer.normalize_str, tokenizer.pre_tokenizer.pre_tokenize_str
    counts: dict[str, int] = {}
    for path in text_files:
        try:
            with open_regular(path, encoding="utf-8") as f:
                for line in f:
                    for word, _ in split(normalize(line)):
                        counts[word] = counts.get(word, 0) + 1
        except UnicodeDecodeError as e:
            raise BadInput(path, f"not UTF-8 text ({e.reason} at byte {e.start} of a line)") from None
        except OSError as e:
            raise BadInput(path, f"cannot read: {e.strerror or e}") from None
    return counts


def read_vocab(path: str | Path) -> list[str]:
    """The tokens of a vocab file, by id. Missing, unreadable or incomplete files: BadInput."""
    path = Path(path)
    try:
        text = read_regular_text(path, encoding="utf-8")
    except FileNotFoundError:
        raise BadInput(path, "vocab file not found") from None
    except OSError as e:  # a FIFO or device where the vocab belongs is refused, not waited on
        raise BadInput(path, f"cannot read the vocab: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise BadInput(path, f"cannot read the vocab: {e}") from None
    tokens = text.splitlines()
    missing = [tok for tok in SPECIAL_TOKENS if tok not in tokens]
    if missing:
        raise BadInput(path, f"not a BERT vocab: {', '.join(missing)} missing ({len(tokens)} lines)")
    duplicated = len(tokens) - len(set(tokens))
    if duplicated:
        raise BadInput(path, f"not a BERT vocab: {duplicated} duplicated tokens")
    return tokens


class WordPiece:
    """Tokenizes sentences into vocabulary ids (no special tokens added)."""

    def __init__(self, vocab_file: str | Path, lower_case: bool = True):
        t = _tokenizers()
        self.tokens = read_vocab(vocab_file)
        self.ids = {tok: i for i, tok in enumerate(self.tokens)}
        model = t.models.WordPiece(self.ids, unk_token="[UNK]", max_input_chars_per_word=100)
        self._tokenizer = t.Tokenizer(model)
        _bert_pipeline(self._tokenizer, lower_case)

    def __len__(self) -> int:
        return len(self.tokens)

    def special(self, token: str) -> int:
        return self.ids[token]

    def encode(self, sentences: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self._tokenizer.encode_batch(list(sentences), add_special_tokens=False)]
