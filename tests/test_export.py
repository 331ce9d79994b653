"""`bertctl export`: what it refuses (one line, exit 2, nothing written) and what it writes for a vocabulary
that is padded (1,001 tokens, 1,008 rows), with no training: the weights are a fresh model's. The export of a
run the test suite trained, loaded and fine-tuned by Hugging Face's own classes, is in tests/test_demo.py
(it needs the main job's experiment)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from conftest import run_cli
from mllog_factory import RunSpec, write_log
from registry_records import record

from trainer.config import ModelConfig, RunConfig

SMALL = dict(num_layers=2, hidden_size=32, num_heads=2, intermediate_size=64, vocab_size=1001, max_position_embeddings=64,
             hidden_dropout=0.0, attention_dropout=0.0)


def run_yaml(model: dict, init_checkpoint: str | None = None) -> str:
    return RunConfig.model_validate({
        "model": model, "data": {"train_dir": "$BERTCTL_HOME/datasets/made/train", "max_seq_length": 64,
                                 "max_predictions_per_seq": 10},
        "optim": {"lr": 1e-3, "max_steps": 10}, "train": {"batch_size": 8, "global_batch_size": 8,
                                                           "max_samples_termination": 80, "init_checkpoint": init_checkpoint},
        "mlperf": {"division": "open"}}).to_yaml()


WORDS = ["Hello", "hello", "café", "cafe"]  # how a cased and an uncased tokenizer tell themselves apart


def vocab_file(folder: Path, size: int, lower_case: bool = True, name: str = "vocab.txt") -> Path:
    """A BERT vocabulary of `size` tokens (special tokens first, then WORDS) and the dataset record that names it
    and its casing, as `bertctl data prepare` writes it."""
    folder.mkdir(parents=True, exist_ok=True)
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS + [f"w{i}" for i in range(size - 5 - len(WORDS))]
    (folder / name).write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
    (folder / "prepared.json").write_text(json.dumps({"dataset": "made", "vocab": {
        "file": str(folder / "vocab.txt"), "tokens": size, "lower_case": lower_case}}))
    return folder / name


def experiment(home: Path, finished: bool = True, weights: bool = True) -> tuple[str, Path]:
    """An experiment of one run of the SMALL model, as a job leaves it: the record, run.yaml, the run's log
    (ended with run_stop or not) and its final weights; the dataset's vocabulary and prepared.json."""
    from trainer.checkpoints.run import write_model
    from trainer.model.bert import BertForPreTraining

    exp_dir = home / "experiments" / "local-20261128-000000-0000abcd"
    (exp_dir / "results").mkdir(parents=True)
    (exp_dir / "experiment.json").write_text(json.dumps(record(exp_dir, cluster="local")))
    (exp_dir / "run.yaml").write_text(run_yaml(SMALL))
    vocab_file(home / "datasets" / "made", SMALL["vocab_size"])
    log = write_log(exp_dir / "results" / "result_0.txt", RunSpec(division="open"))
    if not finished:  # the job was killed before run_stop
        log.write_text("".join(line for line in log.read_text().splitlines(keepends=True) if "run_stop" not in line))
    if weights:
        torch.manual_seed(0)
        write_model(exp_dir / "checkpoints" / "run_0" / "final.pt", BertForPreTraining(ModelConfig(**SMALL)))
    return exp_dir.name, exp_dir


def refused(result, *words: str) -> str:
    lines = result.err.strip().splitlines()
    assert result.code == 2 and len(lines) == 1 and "Traceback" not in result.err, result.err
    assert not result.out.strip()
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def no_partial_left(folder: Path) -> None:
    assert not [p.name for p in folder.iterdir() if ".partial" in p.name or ".replaced" in p.name]


def test_an_experiment_without_a_finished_run_is_refused(bertctl_home, tmp_path):
    exp, _ = experiment(bertctl_home, finished=False)
    line = refused(run_cli("export", exp, "--to", str(tmp_path / "out")), "no finished run", "logged run_stop")
    assert "bertctl status" in line and not (tmp_path / "out").exists()
    refused(run_cli("export", exp, "--run", "3", "--to", str(tmp_path / "out")), "--run", "runs 0 to 0")
    no_partial_left(tmp_path)


def test_a_finished_run_without_final_weights_says_where_they_should_be(bertctl_home, tmp_path):
    exp, exp_dir = experiment(bertctl_home, weights=False)
    refused(run_cli("export", exp, "--to", str(tmp_path / "out")), "run 0 ended but left no final weights",
            str(exp_dir / "checkpoints" / "run_0" / "final.pt"), "--checkpoint")


def test_a_folder_that_is_not_empty_is_kept_without_force_and_kept_with_it_unless_an_earlier_export(bertctl_home, tmp_path):
    exp, _ = experiment(bertctl_home)
    target = tmp_path / "mine"
    target.mkdir()
    (target / "notes.txt").write_text("keep me")
    refused(run_cli("export", exp, "--to", str(target)), "--to", "is not empty", "--force")
    refused(run_cli("export", exp, "--to", str(target), "--force"), "no config.json", "leaves it alone")
    assert [p.name for p in target.iterdir()] == ["notes.txt"] and (target / "notes.txt").read_text() == "keep me"
    (tmp_path / "a-file").write_text("x")
    refused(run_cli("export", exp, "--to", str(tmp_path / "a-file")), "is not a folder")


def test_a_missing_checkpoint_and_one_of_another_shape_are_refused_and_nothing_is_written(bertctl_home, tmp_path):
    from trainer.checkpoints.run import write_model
    from trainer.model.bert import BertForPreTraining

    exp, _ = experiment(bertctl_home)
    refused(run_cli("export", exp, "--checkpoint", str(tmp_path / "nope.pt"), "--to", str(tmp_path / "out")),
            "--checkpoint", "nope.pt: no such file")
    wider = write_model(tmp_path / "wider.pt", BertForPreTraining(ModelConfig(**{**SMALL, "hidden_size": 64})))
    line = refused(run_cli("export", exp, "--checkpoint", str(wider), "--to", str(tmp_path / "out")),
                   "wider.pt: does not fit the experiment's model (2 layers, hidden 32,", "has shape (1008, 64)")
    assert "the model needs (1008, 32)" in line
    assert not (tmp_path / "out").exists()
    no_partial_left(tmp_path)


def test_a_padded_vocabulary_is_the_models_and_the_tokenizer_keeps_the_real_one(bertctl_home, tmp_path):
    """config.json says 1,008 rows (1,001 padded to a multiple of 8), the tokenizer 1,001 tokens; the padded rows
    are the model's as they are, Hugging Face's logits over the real vocabulary are bertctl's, and the card explains it."""
    from transformers import AutoTokenizer
    from transformers import BertForPreTraining as HFBert

    from trainer.data.batch import collate
    from trainer.model.bert import BertForPreTraining
    from trainer.model.weights import load_pretrained_file

    exp, exp_dir = experiment(bertctl_home)
    result = run_cli("export", exp, "--to", str(tmp_path / "hf"))
    assert result.code == 0 and result.out.strip() == str(tmp_path / "hf"), result.err
    written = {p.name for p in (tmp_path / "hf").iterdir()}
    needed = {"README.md", "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
    assert needed <= written <= needed | {"special_tokens_map.json", "vocab.txt"}, written  # 4.x's tokenizer: both too
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (config["vocab_size"], config["hidden_size"], config["num_hidden_layers"]) == (1008, 32, 2)
    hf, info = HFBert.from_pretrained(tmp_path / "hf", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert len(AutoTokenizer.from_pretrained(tmp_path / "hf")) == 1001
    ours = BertForPreTraining(ModelConfig(**SMALL)).eval()
    load_pretrained_file(ours, exp_dir / "checkpoints" / "run_0" / "final.pt")
    assert torch.equal(hf.bert.embeddings.word_embeddings.weight, ours.bert.embeddings.word_embeddings.weight)  # all 1,008 rows
    from test_model import random_samples

    samples = random_samples(4, 1001, 64)
    batch = collate(samples, unpadded=False)
    with torch.no_grad():
        mlm, nsp = ours(batch)
        out = hf.eval()(input_ids=batch.input_ids, token_type_ids=batch.segment_ids, attention_mask=batch.attention_mask.long())
    theirs = out.prediction_logits.reshape(-1, 1008)[batch.mlm_positions]
    assert (theirs[:, :1001] - mlm).abs().max() <= 1e-6 * max(1.0, mlm.abs().max().item())
    assert (out.seq_relationship_logits - nsp).abs().max() <= 1e-6
    card = (tmp_path / "hf" / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: transformers\n")
    assert "vocab_size is 1,008, the model's vocabulary of 1,001 padded to a multiple of 8" in card
    assert "`logits[..., :1001]`" in card and "| official checker | PASS" in card and f"experiment `{exp}`, run 0" in card
    assert "\n## Recipe\n" in card and "- data: the dataset `made`," in card and "(from the dataset `made`'s prepared.json)" in card
    assert str(bertctl_home) not in card and "$BERTCTL_HOME" not in card  # a card for the Hub names no path of this machine
    # an earlier export is replaced with --force, and only then
    refused(run_cli("export", exp, "--to", str(tmp_path / "hf")), "is not empty")
    assert run_cli("export", exp, "--to", str(tmp_path / "hf"), "--force").code == 0
    no_partial_left(tmp_path)


def exported_weights_are(folder: Path, state: dict) -> None:
    """transformers' BertForPreTraining loads the folder with no missing, unexpected or mismatched key, and holds `state`."""
    from transformers import BertForPreTraining as HFBert

    hf, info = HFBert.from_pretrained(folder, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    theirs = hf.state_dict()
    assert all(torch.equal(theirs[key], value) for key, value in state.items()), [k for k in state if k not in theirs][:3]


def test_a_checkpoint_file_and_a_run_checkpoint_folder_export_and_the_card_says_they_are_no_finished_runs_result(
        bertctl_home, tmp_path):
    """`--checkpoint`: a `{"model": state_dict}` file as a phase-1 or converted checkpoint is (here the experiment's
    initial weights, outside it), and a run checkpoint `step_<N>/` as the trainer writes it (trainer/checkpoints/run.py's
    RunCheckpoint, with the model, an optimizer's state and the loop state) in the experiment's checkpoint folder.
    Each loads into transformers' class and holds those weights; its card says it is no finished run's result,
    labels the recipe as the experiment's, and names files, not where they lie on this machine."""
    from test_model import random_samples

    from trainer.checkpoints.run import RunCheckpoint, run_checkpoints, write_model
    from trainer.config import CheckpointConfig
    from trainer.data.batch import collate
    from trainer.loop.state import LoopState
    from trainer.model.bert import BertForPreTraining

    exp, exp_dir = experiment(bertctl_home)
    torch.manual_seed(1)
    phase1 = write_model(bertctl_home / "datasets" / "made" / "phase1_checkpoint" / "model.pt",
                         BertForPreTraining(ModelConfig(**SMALL)))
    (exp_dir / "run.yaml").write_text(run_yaml(SMALL, init_checkpoint="$BERTCTL_HOME/datasets/made/phase1_checkpoint/model.pt"))
    torch.manual_seed(2)
    model = BertForPreTraining(ModelConfig(**SMALL))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(collate(random_samples(2, 1001, 64), unpadded=False))[0].sum().backward()
    optimizer.step()  # an optimizer with state, as a run's checkpoint holds it

    class DataPosition:  # stand-in for the training data loader's position (the export reads only the model)
        def state_dict(self):
            return {"epoch": 0, "position": 40}

    saver = RunCheckpoint(run_checkpoints(CheckpointConfig(), exp_dir, 0, rank=0), model, optimizer, None, DataPosition(),
                          {"seed": 0, "run": 0})
    step = saver.save(LoopState(updates=5, samples=40))
    assert step == exp_dir / "checkpoints" / "run_0" / "step_00000005" and (step / "shared.pt").is_file()

    for source, out, shown, state in [
            (phase1, tmp_path / "from-phase1", "model.pt", torch.load(phase1, weights_only=True)["model"]),
            (step, tmp_path / "from-step", "checkpoints/run_0/step_00000005", model.state_dict())]:
        result = run_cli("export", exp, "--checkpoint", str(source), "--to", str(out))
        assert result.code == 0 and result.out.strip() == str(out), result.err
        exported_weights_are(out, state)
        card = (out / "README.md").read_text()
        assert f"# BERT pretrained with bertctl: {exp}\n" in card and f"the checkpoint `{shown}`, with the shape" in card
        assert f"None attached: exported from the checkpoint `{shown}`, not as a finished run's final weights" in card
        assert "| official checker |" not in card and "\n## Recipe\n" not in card and "\n## The experiment's recipe\n" in card
        assert "- initial weights: `model.pt`" in card and "- data: the dataset `made`," in card
        assert str(tmp_path) not in card and "$BERTCTL_HOME" not in card  # no path of this machine
        assert ("taken during one of its runs" in card) == (source == step)
        assert ("comes from outside the experiment" in card) == (source == phase1)
    no_partial_left(tmp_path)


def tokens_of(folder: Path, text: str) -> list[str]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    return tokenizer.convert_ids_to_tokens(tokenizer(text)["input_ids"])


def test_the_tokenizer_keeps_the_case_the_dataset_records_and_cased_keeps_it_for_any(bertctl_home, tmp_path):
    exp, _ = experiment(bertctl_home)
    assert run_cli("export", exp, "--to", str(tmp_path / "uncased")).code == 0
    assert tokens_of(tmp_path / "uncased", "Hello café") == ["[CLS]", "hello", "cafe", "[SEP]"]
    assert "(lower-cased, accents stripped)" in (tmp_path / "uncased" / "README.md").read_text()
    assert run_cli("export", exp, "--cased", "--to", str(tmp_path / "cased")).code == 0
    assert tokens_of(tmp_path / "cased", "Hello café") == ["[CLS]", "Hello", "café", "[SEP]"]
    vocab_file(bertctl_home / "datasets" / "made", SMALL["vocab_size"], lower_case=False)  # a cased dataset's record
    assert run_cli("export", exp, "--to", str(tmp_path / "recorded")).code == 0
    assert tokens_of(tmp_path / "recorded", "Hello café") == ["[CLS]", "Hello", "café", "[SEP]"]
    assert "(cased)" in (tmp_path / "recorded" / "README.md").read_text()


def test_vocab_names_the_vocabulary_and_one_that_does_not_fit_is_refused(bertctl_home, tmp_path):
    from transformers import AutoTokenizer

    exp, _ = experiment(bertctl_home)
    mine = tmp_path / "mine"
    mine.mkdir()
    given = mine / "vocab.txt"
    given.write_text("".join(t + "\n" for t in ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "only", "these"]))
    assert run_cli("export", exp, "--vocab", str(given), "--to", str(tmp_path / "hf")).code == 0
    assert len(AutoTokenizer.from_pretrained(tmp_path / "hf")) == 7 and tokens_of(tmp_path / "hf", "these") == [
        "[CLS]", "these", "[SEP]"]
    assert "(from --vocab)" in (tmp_path / "hf" / "README.md").read_text()
    refused(run_cli("export", exp, "--vocab", str(mine / "nope.txt"), "--to", str(tmp_path / "out")),
            "--vocab", "nope.txt: no such file")
    wide = vocab_file(tmp_path / "wide", 1200, name="wide.txt")
    refused(run_cli("export", exp, "--vocab", str(wide), "--to", str(tmp_path / "out")),
            "wide.txt", "1200 tokens, more than the model's vocab_size 1001")
    assert not (tmp_path / "out").exists()
    no_partial_left(tmp_path)
