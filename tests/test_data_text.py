"""The text side of data preparation, piece by piece: sentences, the document format, WordPiece,
sentence pairs, masking, the 4-bin sizing and the eval pick."""

import random
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO

from trainer.data.prepare import bins, eval_pick
from trainer.data.prepare.errors import BadInput
from trainer.data.prepare.instances import document_pairs, trim_pair
from trainer.data.prepare.masking import SpecialIds, build_sample
from trainer.data.prepare.sentences import split_sentences
from trainer.data.prepare.textfile import read_documents, write_documents
from trainer.data.prepare.vocab import SPECIAL_TOKENS, WordPiece, read_vocab, train_vocab
from trainer.data.prepare.wordpiece_learner import learn_wordpiece

TEXT = """The quick brown fox jumps over the lazy dog. It was not amused, e.g. it barked twice!
Dr. Smith measured 3.14 metres. J. R. R. Tolkien wrote books. Why? Nobody knows.
"""


def test_sentences_split_at_ends_but_not_at_abbreviations_initials_or_numbers():
    assert split_sentences(TEXT) == [
        "The quick brown fox jumps over the lazy dog.",
        "It was not amused, e.g. it barked twice!",
        "Dr. Smith measured 3.14 metres.",
        "J. R. R. Tolkien wrote books.",
        "Why?",
        "Nobody knows.",
    ]


def test_documents_are_blank_line_separated_sentence_lines(tmp_path):
    path = tmp_path / "part.txt"
    write_documents(path, [["A one.", "A two."], ["B one."]])
    assert path.read_text() == "A one.\nA two.\n\nB one.\n"
    assert read_documents(path) == [["A one.", "A two."], ["B one."]]
    (tmp_path / "free.txt").write_text("First doc. Two sentences here.\n\n\n\nSecond one! Yes.\n")
    assert read_documents(tmp_path / "free.txt", split=True) == [["First doc.", "Two sentences here."], ["Second one!", "Yes."]]


@pytest.mark.parametrize("content, expected", [
    (b"", "no text (the file is empty or blank)"),
    (b"\n  \n\n", "no text (the file is empty or blank)"),
    (b"fine line\nsecond \xff\xfe line\n", "line 2: not UTF-8 text (byte 0xff at offset 17)"),
])
def test_empty_or_non_utf8_text_is_one_clear_error_naming_the_file(tmp_path, content, expected):
    path = tmp_path / "bad.txt"
    path.write_bytes(content)
    with pytest.raises(BadInput) as e:
        read_documents(path)
    assert str(e.value) == f"{path}: {expected}"


def test_a_missing_or_broken_vocab_names_the_file(tmp_path):
    with pytest.raises(BadInput, match=f"^{tmp_path / 'nope.txt'}: vocab file not found$"):
        read_vocab(tmp_path / "nope.txt")
    (tmp_path / "v.txt").write_text("[PAD]\n[UNK]\nhello\n")
    with pytest.raises(BadInput, match=r"not a BERT vocab: \[CLS\], \[SEP\], \[MASK\] missing"):
        WordPiece(tmp_path / "v.txt")


LEARNER = """
import sys
from trainer.data.prepare.vocab import train_vocab
train_vocab([sys.argv[1]], sys.argv[2], 300, min_frequency=2)
"""


def test_the_learned_vocabulary_is_the_same_in_every_process(tmp_path):
    """Hugging Face's trainers break ties in hash-map order, which changes per process; ours must not."""
    corpus = tmp_path / "corpus.txt"
    rng = random.Random(0)
    words = ["data", "prepare", "token", "sentence", "masking", "shard", "vocabulary", "length", "bins"]
    corpus.write_text("\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(400)))
    outputs = []
    for i, hash_seed in enumerate(("1", "2", "3")):
        out = tmp_path / f"vocab{i}.txt"
        subprocess.run([sys.executable, "-c", LEARNER, str(corpus), str(out)], check=True, cwd=REPO,
                       env={"PYTHONHASHSEED": hash_seed, "PATH": ""})
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1] == outputs[2]
    tokens = outputs[0].decode().splitlines()
    assert tokens[:5] == SPECIAL_TOKENS and len(tokens) == len(set(tokens)) <= 300
    assert {"data", "prepare", "sentence", "##s"} <= set(tokens)  # whole frequent words were learned


def test_learning_merges_the_most_frequent_pair_first_and_breaks_ties_alphabetically():
    # pairs: a+##b 6 times, c+##d 5; after those merges ##a+##b and ab+##a once each: the tie goes to ##a+##b
    vocab = learn_wordpiece({"ab": 5, "cd": 5, "abab": 1}, size=8, min_frequency=1)
    assert vocab == ["##a", "##b", "##d", "a", "c", "ab", "cd", "##ab"]
    assert learn_wordpiece({"ab": 5, "cd": 5, "abab": 1}, size=8, min_frequency=2) == ["##a", "##b", "##d", "a", "c", "ab", "cd"]


def test_wordpiece_encodes_with_the_learned_vocabulary(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("Preparing datasets is preparing data.\n" * 50)
    tokens = train_vocab([corpus], tmp_path / "vocab.txt", 60)
    wp = WordPiece(tmp_path / "vocab.txt")
    ids = wp.encode(["Preparing DATA."])[0]
    assert [tokens[i] for i in ids] == ["preparing", "data", "."]  # lower-cased, punctuation split off


def make_documents(rng, n_docs=30):
    return [[[rng.randrange(10, 500) for _ in range(rng.randrange(3, 40))] for _ in range(rng.randrange(2, 15))]
            for _ in range(n_docs)]


def test_pairs_fit_the_sequence_and_half_of_them_are_random():
    rng = random.Random(5)
    docs = make_documents(rng, 200)
    pairs = [p for _ in range(3) for i in range(len(docs)) for p in document_pairs(docs, i, 128, 0.1, rng)]
    assert all(p.tokens_a and p.tokens_b and len(p.tokens_a) + len(p.tokens_b) <= 125 for p in pairs)
    share = sum(p.is_random_next for p in pairs) / len(pairs)
    assert len(pairs) > 1000 and abs(share - 0.5) < 0.03


def test_a_real_continuation_is_the_text_that_follows():
    # a document of increasing token ids: a real B is later text of the same document, each side a
    # contiguous run (trimming takes tokens off either end of the longer side, as Google's does)
    doc = [[i * 10 + j for j in range(10)] for i in range(40)]
    other = [[9000 + j for j in range(10)] for _ in range(40)]
    pairs = document_pairs([doc, other], 0, 64, 0.0, random.Random(1))
    assert {p.is_random_next for p in pairs} == {True, False}
    for pair in pairs:
        a, b = np.array(pair.tokens_a), np.array(pair.tokens_b)
        assert np.all(np.diff(a) == 1) and a.max() < 400
        if pair.is_random_next:
            assert b.min() >= 9000
        else:
            assert np.all(np.diff(b) == 1) and a.max() < b.min() < 400


def test_trimming_takes_tokens_from_the_longer_side():
    a, b = list(range(100)), list(range(10))
    trim_pair(a, b, 50, random.Random(0))
    assert len(a) == 40 and len(b) == 10 and a == sorted(a)


IDS = SpecialIds(cls=2, sep=3, mask=4, vocab_size=1000, never_random=frozenset({0, 1, 2, 3, 4}))


def test_masking_picks_the_formula_count_and_never_cls_or_sep():
    rng = random.Random(3)
    for length_a, length_b, max_pred in [(60, 60, 76), (250, 259, 76), (3, 2, 20), (62, 63, 20)]:
        a = [rng.randrange(10, 999) for _ in range(length_a)]
        b = [rng.randrange(10, 999) for _ in range(length_b)]
        s = build_sample(a, b, False, IDS, 0.15, max_pred, rng)
        total = length_a + length_b + 3
        assert len(s.masked_lm_positions) == min(max_pred, max(1, round(total * 0.15)))
        assert not set(s.masked_lm_positions.tolist()) & {0, length_a + 1, total - 1}
        assert list(s.masked_lm_positions) == sorted(s.masked_lm_positions)
        original = np.array([2, *a, 3, *b, 3])
        assert np.array_equal(s.masked_lm_ids, original[s.masked_lm_positions])
        unmasked = np.setdiff1d(np.arange(total), s.masked_lm_positions)
        assert np.array_equal(s.input_ids[unmasked], original[unmasked])
        assert list(s.segment_ids) == [0] * (length_a + 2) + [1] * (length_b + 1)


def test_random_replacements_are_never_special_tokens():
    rng = random.Random(4)
    replaced = []
    for _ in range(300):
        a = [rng.randrange(10, 999) for _ in range(50)]
        s = build_sample(a, a[:20], True, IDS, 0.15, 76, rng)
        shown = s.input_ids[s.masked_lm_positions]
        replaced += [int(x) for x, y in zip(shown, s.masked_lm_ids) if x != y and x != IDS.mask]
    assert len(replaced) > 100 and not set(replaced) & IDS.never_random


@pytest.mark.parametrize("n, shards", [(10, 3), (2048 * 7 + 5, 2048), (4, 4), (100, 1)])
def test_shards_are_balanced_to_one_sample(n, shards):
    sizes = bins.shard_sizes(n, shards)
    assert sum(sizes) == n and len(sizes) == shards and max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes)  # the smaller ones first, as NVIDIA and Samsung size them
    spans = bins.shard_spans(n, shards)
    assert spans[0].start == 0 and spans[-1].stop == n and all(a.stop == b.start for a, b in zip(spans, spans[1:]))


def test_bin_edges_are_inclusive_upper_bounds():
    lengths = np.array([1, 128, 129, 256, 257, 384, 385, 512])
    assert bins.bin_of(lengths, [128, 256, 384, 512]).tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    hist = np.bincount(lengths, minlength=513)
    assert bins.bin_counts(hist, [128, 256, 384, 512]) == [2, 2, 2, 2]


def test_spans_take_their_samples_from_consecutive_parts():
    span = bins.Span(5, 12)
    assert span.pieces([3, 4, 0, 10]) == [(1, 2, 4), (3, 0, 5)]


def test_eval_pick_takes_int_i_n_over_k():
    assert eval_pick.pick_indices(25, 10).tolist() == [int(i * 25 / 10) for i in range(10)]
    picked = eval_pick.pick_indices(10_000 * 3 + 7, 10_000)
    assert picked[0] == 0 and picked[-1] == int(9999 * 30007 / 10000) and len(set(picked.tolist())) == 10_000
    assert [(p, i.tolist()) for p, i in eval_pick.split_by_part(np.array([0, 2, 5, 9]), [3, 0, 4, 3])] == \
        [(0, [0, 2]), (2, [2]), (3, [2])]
    with pytest.raises(ValueError, match="only 9 samples to pick 10 from"):
        eval_pick.pick_indices(9, 10)
