"""`bertctl export`: a finished run's weights (or a checkpoint's) as a Hugging Face model folder.

The folder holds config.json and model.safetensors, the tokenizer's files and README.md, a model card
naming the run, its MLPerf result as `compliance-check` judges it (orchestrator/results/verdict.py::assess)
and the recipe. The weights, the model's shape and the vocabulary come from the experiment: a run leaves
its final weights in its checkpoint folder (trainer/config/run.py::FINAL_WEIGHTS), run.yaml says the
shape, and the dataset's prepared.json names the vocabulary its shards were tokenized with. The torch
work runs in `python -m trainer.checkpoints.export` (the control plane never imports torch), writing
into a staging folder beside the target that is renamed into place once everything is written: a
failed export leaves nothing half-written, and `--force` replaces an earlier export only then.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from orchestrator.data.workers import run_worker
from orchestrator.errors import UserError
from trainer.config import FINAL_WEIGHTS, PathError, RunConfig, expand_path, load_run_config
from trainer.config.regular import read_regular_text

WORKER = ["-m", "trainer.checkpoints.export"]
PREPARED = "prepared.json"  # a prepared dataset's record (trainer/data/prepare/stages.py::finish_task)


@dataclass(frozen=True)
class Source:
    """What is exported: a run's final weights (`run` set) or a checkpoint file named on the command line."""

    weights: Path
    run: int | None


@dataclass(frozen=True)
class Vocabulary:
    file: Path
    lower_case: bool
    origin: str  # where it was found, as the card says it
    dataset: str  # the training data, as the card names it


def export(exp, run: int | None = None, checkpoint: str | None = None, to: str = "", force: bool = False,
           vocab: str | None = None, cased: bool = False) -> Path:
    """Write the model folder `to`; its path. Every user mistake is one UserError before anything is written."""
    cfg = run_config(exp)
    target = destination(to, force)
    source = checkpoint_source(checkpoint) if checkpoint else run_source(exp, cfg, run)
    vocabulary = find_vocabulary(cfg, vocab, cased)
    card = model_card(exp, cfg, source, vocabulary, run_result(exp, source.run) if source.run is not None else None)
    return write_folder(exp, source, vocabulary, card, target)


def run_config(exp) -> RunConfig:
    if exp.program != "train":
        raise UserError(f"ran the {exp.program}, not training: it has no weights to export", where=f"experiment {exp.id}")
    path = exp.path / "run.yaml"
    try:
        return load_run_config(str(path))
    except (OSError, ValueError) as e:  # pydantic's ValidationError is a ValueError
        raise UserError(f"cannot read the run configuration: {str(e).splitlines()[0]}", where=str(path)) from None


def destination(to: str, force: bool) -> Path:
    """The folder to write: absent, empty, or with --force an earlier export (a folder holding config.json),
    never anything else: --force replaces a model folder, not whatever a mistyped path names."""
    target = Path(to).expanduser().absolute()
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise UserError(f"{to} exists and is not a folder", where="--to")
    if target.is_dir() and any(target.iterdir()):
        if not force:
            raise UserError(f"{to} is not empty; --force replaces an earlier export there", where="--to")
        if not (target / "config.json").is_file():
            raise UserError(f"{to} holds files but no config.json: not an earlier export, so --force leaves it alone",
                            where="--to")
    return target


def checkpoint_source(checkpoint: str) -> Source:
    path = Path(checkpoint).expanduser().absolute()
    if not path.exists():
        raise UserError(f"{checkpoint}: no such file", where="--checkpoint")
    return Source(path, None)


def run_source(exp, cfg: RunConfig, run: int | None) -> Source:
    """The final weights of run `run`, or by default of the first run that converged, else the first that ended."""
    from orchestrator.results.summary import summarize

    if run is not None and not 0 <= run < exp.nexp:
        raise UserError(f"experiment {exp.id} has runs 0 to {exp.nexp - 1}", where="--run")
    ended = {}  # run -> converged, for the runs whose log holds run_stop
    for i in [run] if run is not None else range(exp.nexp):
        if exp.result_file(i).is_file():
            summary = summarize(exp.result_file(i))
            if summary.finished:
                ended[i] = summary.converged
    if not ended:
        which = f"run {run} has" if run is not None else f"none of its {exp.nexp} run(s) has"
        raise UserError(f"no finished run: {which} logged run_stop (see `bertctl status {exp.id}`)",
                        where=f"experiment {exp.id}")
    chosen = run if run is not None else next((i for i, converged in ended.items() if converged), min(ended))
    weights = final_weights(exp, cfg, chosen)
    if not weights.is_file():
        raise UserError(f"run {chosen} ended but left no final weights ({weights}): a run trained before bertctl kept "
                        "them, or one stopped between run_stop and writing them; export a checkpoint with --checkpoint",
                        where=f"experiment {exp.id}")
    return Source(weights, chosen)


def final_weights(exp, cfg: RunConfig, run: int) -> Path:
    try:
        return cfg.checkpoint.run_folder(exp.path, run) / FINAL_WEIGHTS
    except PathError as e:
        raise UserError(str(e), where="run.yaml checkpoint.dir") from None


def find_vocabulary(cfg: RunConfig, given: str | None, cased: bool = False) -> Vocabulary:
    """--vocab, else the vocabulary the dataset of data.train_dir records in its prepared.json; lower-cased
    as the dataset was, unless --cased (datasets prepared before bertctl recorded it: uncased, as both shipped
    manifests)."""
    record, where = dataset_record(cfg.data.train_dir)
    lower_case = not cased and ((record or {}).get("vocab") or {}).get("lower_case", True)
    dataset = (f"the dataset `{record['dataset']}`" if (record or {}).get("dataset")
               else f"the folder `{Path(cfg.data.train_dir).name}`")
    if given:
        path = Path(given).expanduser().absolute()
        if not path.is_file():
            raise UserError(f"{given}: no such file", where="--vocab")
        return Vocabulary(path, lower_case, "--vocab", dataset)
    if record is None:
        raise UserError(f"no {PREPARED} at or above data.train_dir ({cfg.data.train_dir}): not a dataset bertctl "
                        "prepared; give the vocab.txt its shards were tokenized with", where="--vocab")
    if not record.get("vocab"):
        raise UserError(f"{where} records no vocabulary (a TFRecord source without vocab.file); give the vocab.txt "
                        "its shards were tokenized with", where="--vocab")
    return Vocabulary(Path(record["vocab"]["file"]), lower_case, f"{dataset}'s {PREPARED}", dataset)


def dataset_record(train_dir: str) -> tuple[dict | None, Path | None]:
    """The prepared.json of the dataset that holds train_dir (train_dir itself or a folder above it)."""
    try:
        folder = Path(expand_path(train_dir)).absolute()
    except PathError as e:
        raise UserError(str(e), where="run.yaml data.train_dir") from None
    for candidate in [folder, *folder.parents][:3]:
        path = candidate / PREPARED
        if path.is_file():
            try:
                return json.loads(read_regular_text(path, limit=64 << 20, encoding="utf-8")), path
            except (OSError, ValueError) as e:
                raise UserError(f"unreadable dataset record: {e}", where=str(path)) from None
    return None, None


def run_result(exp, run: int):
    """(the run's verdict as compliance-check gives it, the report it is part of)."""
    from orchestrator.results import resultset, verdict

    report = verdict.assess(resultset.from_run(exp, run), with_score=False)
    return report.runs[0], report


def model_card(exp, cfg: RunConfig, source: Source, vocabulary: Vocabulary, result) -> str:
    """The card's Markdown: what the model is, where it comes from, its MLPerf result, the recipe, its vocabulary.
    The card is written for the Hugging Face Hub: it names files, never where they lie on this machine."""
    m, t, o = cfg.model, cfg.train, cfg.optim
    checkpoint = f"`{card_path(source.weights, exp)}`"
    origin = (f"experiment `{exp.id}`, run {source.run} (seed {exp.seeds[source.run] if source.run < len(exp.seeds) else '-'})"
              if source.run is not None else f"the checkpoint {checkpoint}, with the shape and vocabulary of experiment "
                                             f"`{exp.id}`")
    lines = [f"# BERT pretrained with bertctl: {exp.id}" + (f", run {source.run}" if source.run is not None else ""), "",
             f"A BERT of {m.num_layers} layers, hidden size {m.hidden_size}, {m.num_heads} attention heads and "
             f"intermediate size {m.intermediate_size}, pretrained (masked LM and next-sentence prediction) by bertctl "
             f"the MLPerf way: {origin}, on cluster `{exp.cluster}`.", "", "## MLPerf result", ""]
    lines += result_lines(result, t.target_accuracy) if result else [
        f"None attached: exported from the checkpoint {checkpoint}, not as a finished run's final weights (`--run`); "
        f"the experiment's runs have their own results (`bertctl compliance-check {exp.id}`)."]
    lines += ["", "## Recipe" if result else "## The experiment's recipe", ""]
    if not result:
        taken_in_a_run = Path(source.weights).is_relative_to(exp.path.absolute())
        lines += [f"The recipe of experiment `{exp.id}`, whose model shape and vocabulary the export took. "
                  + ("The checkpoint was taken during one of its runs, so this recipe trained it, up to that point."
                     if taken_in_a_run else "The checkpoint comes from outside the experiment: this is not a record of "
                                            "how it was trained."), ""]
    lines += [f"- data: {vocabulary.dataset}, sequences of up to {cfg.data.max_seq_length} tokens, "
              f"{cfg.data.max_predictions_per_seq} masked positions at most",
              f"- optimizer: {o.name}, learning rate {o.lr:g}, {o.warmup_steps} warm-up steps, schedule {o.schedule}, "
              f"at most {o.max_steps} steps; global batch {t.global_batch_size} sequences",
              f"- stopping: eval masked-LM accuracy {t.target_accuracy} or {t.max_samples_termination:,} samples",
              f"- initial weights: `{card_path(t.init_checkpoint, exp)}`" if t.init_checkpoint else "- initial weights: random",
              f"- precision {cfg.runtime.precision} on {cfg.runtime.device}, {cfg.world_size} rank(s); the whole "
              "configuration is the experiment's run.yaml", "", "## Vocabulary", ""]
    lines.append(vocabulary_text(m, vocabulary))
    lines += ["", "## Use", "", "```python", "from transformers import AutoTokenizer, BertForPreTraining",
              "tokenizer = AutoTokenizer.from_pretrained(FOLDER)",
              "model = BertForPreTraining.from_pretrained(FOLDER)  # or BertForSequenceClassification to fine-tune", "```"]
    return "\n".join(lines) + "\n"


def card_path(path: str | Path, exp) -> str:
    """A path as the card shows it: relative to the experiment's folder where it lies in it, else the file's name."""
    try:
        absolute = Path(expand_path(str(path))).expanduser().absolute()
    except PathError:  # a variable this shell does not set: the name is all the card needs
        return Path(str(path)).name
    return absolute.relative_to(exp.path.absolute()).as_posix() if absolute.is_relative_to(exp.path.absolute()) else absolute.name


def result_lines(result, target: float) -> list[str]:
    run, report = result
    checker = (f"PASS (mlperf-logging {report.checker}, ruleset {report.ruleset})" if run.compliant
               else f"FAIL (mlperf-logging {report.checker}, ruleset {report.ruleset}): {run.message}")
    accuracy = f"{run.accuracy:.4f}" if run.accuracy is not None else "none: no evaluation logged"
    samples = run.samples_to_converge
    return ["| | |", "|---|---|",
            f"| eval masked-LM accuracy | {accuracy} (target {target}) |",
            f"| outcome | {run.status or 'none'}{' (converged)' if run.converged else ''}"
            + (f" in {run.minutes:.2f} minutes |" if run.minutes is not None else " |"),
            f"| samples to converge | {samples:,} |" if samples is not None else "| samples to converge | - (not converged) |",
            f"| division | {report.division or '-'} |",
            f"| official checker | {checker} |"]


def vocabulary_text(m, vocabulary: Vocabulary) -> str:
    case = "lower-cased, accents stripped" if vocabulary.lower_case else "cased"
    text = f"The tokenizer is BERT's WordPiece ({case}) on the vocabulary of the training data (from {vocabulary.origin})."
    if m.padded_vocab_size == m.vocab_size:
        return text + f" config.json's vocab_size, {m.vocab_size:,}, is the model's vocabulary."
    return text + (f" config.json's vocab_size is {m.padded_vocab_size:,}, the model's vocabulary of {m.vocab_size:,} "
                   "padded to a multiple of 8 for tensor-core matrix shapes, as NVIDIA's MLPerf BERT does: ids "
                   f"{m.vocab_size:,} to {m.padded_vocab_size - 1:,} are rows no token maps to, left out of training's "
                   f"softmax (so never trained); take `logits[..., :{m.vocab_size}]` for masked-LM predictions.")


def write_folder(exp, source: Source, vocabulary: Vocabulary, card: str, target: Path) -> Path:
    """The worker writes into a staging folder beside `target`; renamed into place (an earlier export replaced)
    only when it succeeded, removed when it did not."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    except OSError as e:
        raise UserError(f"cannot write there: {e.strerror or e}", where=f"--to {target}") from None
    try:
        (staging / ".card.md").write_text(card, encoding="utf-8")
        args = ["--weights", str(source.weights), "--run-config", str(exp.path / "run.yaml"), "--vocab", str(vocabulary.file),
                "--card", str(staging / ".card.md"), "--out", str(staging / "model")]
        run_worker(args + ([] if vocabulary.lower_case else ["--cased"]), "export", module=WORKER)
        replace(staging / "model", target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def replace(written: Path, target: Path) -> None:
    """`written` becomes `target`; an earlier export there is moved aside first and removed after."""
    if not target.exists() or not any(target.iterdir()):
        os.replace(written, target)  # an empty folder is replaced by the rename itself
        return
    aside = target.with_name(f".{target.name}.replaced")
    shutil.rmtree(aside, ignore_errors=True)
    os.rename(target, aside)
    try:
        os.rename(written, target)
    except OSError:
        os.rename(aside, target)
        raise
    shutil.rmtree(aside, ignore_errors=True)
