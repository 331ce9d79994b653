"""The tasks of each stage (see plan.py for the files they read and write).

A task checks whether its result exists first and returns at once if so; results are written
atomically, so a killed task leaves either its whole result or nothing (temporary files are
removed when the next build starts).
"""

from __future__ import annotations

import platform
import random
import shutil
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from trainer.config import DatasetOutput, expand_path
from trainer.data.layout import Sample, Shard, write_shard
from trainer.data.prepare import eval_pick, files, tfrecord
from trainer.data.prepare.bins import bin_counts, bin_of, shard_name, shard_spans
from trainer.data.prepare.errors import BadInput, StepFailed
from trainer.data.prepare.instances import document_pairs
from trainer.data.prepare.masking import SpecialIds, build_sample
from trainer.data.prepare.plan import CombineTask, ExamplesTask, Plan
from trainer.data.prepare.stats import ShardStats, columns_stats, shard_stats
from trainer.data.prepare.textfile import Document, read_documents, write_documents
from trainer.data.prepare.verify import input_file_problems
from trainer.data.prepare.vocab import SPECIAL_TOKENS, WordPiece, read_vocab, train_vocab


def run_task(plan: Plan, stage: str, index: int) -> dict:
    """Run one task; returns a small summary (what it did, how much, how long)."""
    t0 = time.perf_counter()
    if stage == "corpus":
        info = corpus_task(plan)
    elif stage == "examples":
        info = examples_task(plan, plan.examples_tasks[index])
    elif stage == "combine":
        info = combine_task(plan, plan.combine_tasks[index])
    elif stage == "checkpoint":
        info = checkpoint_task(plan)
    elif stage == "finish":
        info = finish_task(plan)
    else:
        raise ValueError(f"unknown stage {stage!r}")
    return {"stage": stage, "task": index, "seconds": round(time.perf_counter() - t0, 3), **info}


# ---- corpus: the python_stdlib text and a trained vocabulary

def corpus_task(plan: Plan) -> dict:
    if plan.corpus_stamp.exists():
        return {"skipped": True}
    m = plan.manifest
    info: dict = {}
    if m.source.kind == "python_stdlib":
        info.update(write_stdlib_corpus(plan))
    if plan.learns_vocab:
        tokens = train_vocab(plan.inputs["train"], plan.vocab_file, m.vocab.size, m.vocab.min_frequency, m.vocab.lower_case)
        info["vocab_size"] = len(tokens)
    files.write_json(plan.corpus_stamp, info)
    return info


def write_stdlib_corpus(plan: Plan) -> dict:
    from trainer.data.prepare.stdlib_corpus import stdlib_dir, stdlib_documents

    src = plan.manifest.source
    docs = stdlib_documents(src.max_documents)
    train = [d.sentences for d in docs if not d.is_eval(src.eval_percent)]
    held_out = [d.sentences for d in docs if d.is_eval(src.eval_percent)]
    if len(train) < src.parts or not held_out:
        raise BadInput(stdlib_dir(), f"only {len(train)} training and {len(held_out)} eval documents "
                                        f"for {src.parts} parts: use more documents or fewer parts")
    for i, part in enumerate(split_evenly(train, src.parts)):
        write_documents(plan.text_part(i), part)
    write_documents(plan.eval_text, held_out)
    chars = sum(len(s) + 1 for d in docs for s in d.sentences)
    return {"documents": len(docs), "eval_documents": len(held_out), "corpus_bytes": chars,
            "python": platform.python_version()}


def split_evenly(documents: list[Document], parts: int) -> list[list[Document]]:
    """Consecutive groups of documents with about the same amount of text each (all non-empty)."""
    sizes = np.array([sum(len(s) for s in d) for d in documents], np.float64)
    cuts = np.searchsorted(np.cumsum(sizes), np.arange(1, parts) * sizes.sum() / parts)
    cuts = np.maximum(cuts, np.arange(1, parts))  # at least one document per group
    cuts = np.minimum(cuts, len(documents) - parts + np.arange(1, parts))
    bounds = [0, *cuts.tolist(), len(documents)]
    return [documents[a:b] for a, b in zip(bounds, bounds[1:])]


# ---- examples: one input part -> samples, per output of its split

def examples_task(plan: Plan, task: ExamplesTask) -> dict:
    outputs = plan.outputs_of(task.split)
    todo = {n: o for n, o in outputs.items() if not plan.examples_stats(n, task.part).exists()}
    if not todo:
        return {"skipped": True}
    source = plan.inputs[task.split][task.part]
    if plan.manifest.source.kind == "tfrecord":
        produced = {n: tfrecord_samples(source, o) for n, o in todo.items()}
        tokens_in = 0
    else:
        produced, tokens_in = text_samples(plan, source, todo)
    mask_id = mask_token_id(plan)
    written = 0
    for name, samples in produced.items():
        out = plan.examples_file(name, task.part)
        save_shard(out, samples, "varlen", todo[name])
        stats = columns_stats(*sample_columns(samples), mask_id=mask_id)
        files.write_json(plan.examples_stats(name, task.part), {"source": str(source), **stats.as_json()})
        written += stats.tokens
    return {"input": str(source), "input_tokens": tokens_in, "output_tokens": written}


def tfrecord_samples(path: Path, out: DatasetOutput) -> list[Sample]:
    return list(tfrecord.read_samples(path, out.max_seq_length, out.max_predictions))


def text_samples(plan: Plan, path: Path, outputs: dict[str, DatasetOutput]) -> tuple[dict[str, list[Sample]], int]:
    m = plan.manifest
    wordpiece = load_wordpiece(plan)
    documents = tokenize_documents(read_documents(path, m.source.split_sentences), wordpiece)
    ids = special_ids(wordpiece)
    produced = {}
    for name, out in outputs.items():
        rng = random.Random(f"{m.prepare.random_seed}/{name}/{path.name}")
        produced[name] = create_samples(documents, out, ids, rng, m.prepare.masked_lm_prob,
                                        m.prepare.dupe_factor, m.prepare.short_seq_prob)
    return produced, sum(len(s) for d in documents for s in d)


def load_wordpiece(plan: Plan) -> WordPiece:
    return WordPiece(plan.vocab_file, lower_case=plan.manifest.vocab.lower_case)  # the manifest guarantees a file


def tokenize_documents(documents: list[Document], wordpiece: WordPiece) -> list[list[list[int]]]:
    """Documents of token-id sentences; sentences and documents that tokenize to nothing are dropped."""
    flat = wordpiece.encode([s for d in documents for s in d])
    out, i = [], 0
    for d in documents:
        sentences = [ids for ids in flat[i:i + len(d)] if ids]
        i += len(d)
        if sentences:
            out.append(sentences)
    return out


def special_ids(wordpiece: WordPiece) -> SpecialIds:
    return SpecialIds(cls=wordpiece.special("[CLS]"), sep=wordpiece.special("[SEP]"), mask=wordpiece.special("[MASK]"),
                      vocab_size=len(wordpiece), never_random=frozenset(wordpiece.special(t) for t in SPECIAL_TOKENS))


def create_samples(documents: list[list[list[int]]], out: DatasetOutput, ids: SpecialIds, rng: random.Random,
                   masked_lm_prob: float, dupe_factor: int, short_seq_prob: float) -> list[Sample]:
    """create_pretraining_data for one part: shuffled documents, `dupe_factor` passes, shuffled samples."""
    documents = list(documents)
    rng.shuffle(documents)
    samples = []
    for _ in range(dupe_factor):
        for index in range(len(documents)):
            for pair in document_pairs(documents, index, out.max_seq_length, short_seq_prob, rng):
                samples.append(build_sample(pair.tokens_a, pair.tokens_b, pair.is_random_next, ids,
                                            masked_lm_prob, out.max_predictions, rng))
    rng.shuffle(samples)
    return samples


def mask_token_id(plan: Plan) -> int | None:
    vocab = plan.vocab_file
    if vocab is None or not vocab.exists():
        return None
    return read_vocab(vocab).index("[MASK]")


# ---- combine: balanced shards per bin, or the eval pick

class PartCache:
    """The most recently loaded intermediate part (consecutive shards mostly read the same part)."""

    def __init__(self, paths: Sequence[Path]):
        self.paths = paths
        self._key: int | None = None
        self._shard: Shard | None = None

    def get(self, part: int) -> Shard:
        if self._key != part:
            self._shard, self._key = Shard(self.paths[part]), part
        return self._shard


def combine_task(plan: Plan, task: CombineTask) -> dict:
    stamp = plan.combine_stamp(task)
    if stamp.exists():
        return {"skipped": True}
    out = plan.manifest.outputs[task.output]
    parts = len(plan.inputs[out.split])
    part_files = [plan.examples_file(task.output, p) for p in range(parts)]
    part_stats = [ShardStats.from_json(files.read_json(plan.examples_stats(task.output, p))) for p in range(parts)]
    mask_id = mask_token_id(plan)
    if out.pick is not None:
        written = write_pick(plan, task.output, out, part_files, [s.samples for s in part_stats], mask_id)
    else:
        written = write_bin_shards(plan, task, out, part_files, part_stats, mask_id)
    files.write_json(stamp, {str(path.relative_to(plan.root)): st.as_json() for path, st in written.items()})
    return {"files": len(written), "samples": sum(st.samples for st in written.values())}


def write_bin_shards(plan: Plan, task: CombineTask, out: DatasetOutput, part_files: list[Path],
                     part_stats: list[ShardStats], mask_id: int | None) -> dict[Path, ShardStats]:
    edges = out.bins or [out.max_seq_length]
    lo = 1 if task.bin == 0 else edges[task.bin - 1] + 1
    hi = edges[task.bin]
    counts = [bin_counts(st.length_histogram, edges)[task.bin] for st in part_stats]
    total = sum(counts)
    label = f"bin {lo}-{hi}" if out.bins else "the output"
    if total < out.shards:
        raise BadInput(plan.output_dir(task.output, task.bin), f"{label} has {total} samples, fewer than "
                                                               f"{out.shards} shards: use fewer shards or more data")
    cache = PartCache(part_files)
    written = {}
    for index, span in list(enumerate(shard_spans(total, out.shards)))[task.first:task.stop]:
        samples = []
        for part, first, last in span.pieces(counts):
            shard = cache.get(part)
            in_bin = np.flatnonzero(bin_of(shard.lengths, edges) == task.bin)
            samples += shard.samples(in_bin[first:last])
        path = plan.output_dir(task.output, task.bin) / shard_name(index, out.shards)
        save_shard(path, samples, out.layout, out)
        written[path] = shard_stats(path, mask_id, (lo, hi))
    return written


def write_pick(plan: Plan, name: str, out: DatasetOutput, part_files: list[Path], counts: list[int],
               mask_id: int | None) -> dict[Path, ShardStats]:
    path = plan.root / name / out.pick_file
    try:
        picked = eval_pick.pick_indices(sum(counts), out.pick)
    except ValueError as e:
        raise BadInput(path, f"{e}: make the eval source larger or pick fewer") from None
    samples = []
    for part, indices in eval_pick.split_by_part(picked, counts):
        samples += Shard(part_files[part]).samples(indices)
    save_shard(path, samples, out.layout, out)
    return {path: shard_stats(path, mask_id, (1, out.max_seq_length))}


def save_shard(path: Path, samples: list[Sample], layout: str, out: DatasetOutput) -> None:
    """write_shard (atomic), with a full disk or any other write failure reported on the file."""
    try:
        write_shard(path, samples, layout, max_seq_length=out.max_seq_length, max_predictions=out.max_predictions)
    except (OSError, RuntimeError) as e:  # HDF5 reports a failed write on close as RuntimeError
        raise files.write_error(path, e) from None


def sample_columns(samples: list[Sample]):
    """The columns stats.columns_stats takes, from samples in memory."""
    def cat(name):
        arrays = [getattr(s, name) for s in samples]
        return np.concatenate(arrays).astype(np.int64) if arrays else np.zeros(0, np.int64)
    lengths = np.array([len(s.input_ids) for s in samples], np.int64)
    k = np.array([len(s.masked_lm_positions) for s in samples], np.int64)
    nsp = np.array([s.next_sentence_label for s in samples], np.int64)
    return lengths, cat("input_ids"), cat("segment_ids"), k, cat("masked_lm_positions"), cat("masked_lm_ids"), nsp


# ---- checkpoint: the phase-1 TensorFlow checkpoint -> PyTorch

def checkpoint_task(plan: Plan) -> dict:
    from trainer.checkpoints import convert as convert_checkpoint  # imports torch: only the checkpoint stage needs it

    output = plan.checkpoint_output
    if output is None or output.exists():
        return {"skipped": True}
    ck = plan.manifest.checkpoint  # the manifest guarantees bert_config with a tf_checkpoint
    problems = input_file_problems(plan)
    if problems:
        path, what = problems[0]
        raise BadInput(path, f"{what} (is this the MLPerf phase-1 checkpoint?)")
    state = convert_checkpoint.convert(expand_path(ck.tf_checkpoint), expand_path(ck.bert_config))
    convert_checkpoint.save(state, output)
    return {"output": str(output), "tensors": len(state)}


# ---- finish: the record of what was built

def finish_task(plan: Plan) -> dict:
    if plan.prepared.exists():
        return {"skipped": True}
    m = plan.manifest
    outputs = {}
    for name in m.outputs:
        record: dict = {}
        for task in (t for t in plan.combine_tasks if t.output == name):
            record.update(files.read_json(plan.combine_stamp(task)))
        expected = [str(p.relative_to(plan.root)) for p in plan.output_files(name)]
        missing = [p for p in expected if p not in record]
        if missing:
            raise StepFailed(plan.root / missing[0], "was not written by the combine stage")
        total = ShardStats()
        for rel in expected:
            total.add(ShardStats.from_json(record[rel]))
        outputs[name] = {"samples": total.samples,
                         "files": {rel: {"samples": record[rel]["samples"], "digest": record[rel]["digest"]} for rel in expected},
                         "stats": {k: v for k, v in total.as_json().items() if k != "digest"}}
    vocab = plan.vocab_file
    corpus = files.read_json(plan.corpus_stamp) if plan.corpus_stamp.exists() else {}
    files.write_json(plan.prepared, {
        "dataset": m.name, "params": m.params_digest(), "python": platform.python_version(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "corpus": corpus,
        # the casing goes with the file: export builds the tokenizer that splits text as these shards were split
        "vocab": ({"file": str(vocab), "tokens": len(read_vocab(vocab)), "lower_case": m.vocab.lower_case}
                  if vocab and vocab.exists() else None),
        "outputs": outputs,
    })
    if not m.prepare.keep_work:
        shutil.rmtree(plan.work, ignore_errors=True)
    return {"samples": {n: o["samples"] for n, o in outputs.items()}}
