"""A run's weights -> a Hugging Face model folder: what `bertctl export` runs (orchestrator/export.py).

    python -m trainer.checkpoints.export --weights FILE --run-config run.yaml --vocab vocab.txt \\
        [--cased] [--card CARD.md] --out DIR

FILE is `{"model": state_dict}` (a run's final weights, a phase-1 checkpoint, a converted TensorFlow
checkpoint), a bare state dict, or a run checkpoint (`step_<N>/`, or its shared.pt). The weights are loaded
into bertctl's model of run.yaml's shape first (trainer/model/weights.py::load_pretrained: a tensor of another
shape, a missing or an unknown one is bad input naming it), then into transformers' own `BertForPreTraining`,
whose `save_pretrained` writes config.json (its `BertConfig`) and model.safetensors (the `safetensors`
library); the tokenizer's files are transformers' `BertTokenizerFast` on the vocabulary, saved by it; the
model card (README.md) is huggingface_hub's `ModelCard` around the text in CARD.md. Nothing here writes a
format by hand.

config.json's vocab_size is the model's: the vocabulary padded to a multiple of 8 (30,522 -> 30,528), the
rows bertctl trains with. No token id reaches the padded rows and bertctl's softmax leaves them out (they
keep their initial values, zeros in a converted TensorFlow checkpoint); the tokenizer keeps the real
vocabulary. DIR must be absent or empty: `bertctl export` passes a staging folder and renames it into
place when this exits 0. Exit codes: 0 written, 2 bad input (one line, also as the JSON record of
$BERTCTL_ERROR_FILE), 1 the writing failed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from trainer.config import ModelConfig, load_run_config
from trainer.config.regular import read_regular_text
from trainer.data.prepare.errors import BadInput, PrepareError, StepFailed, report_failure
from trainer.data.prepare.vocab import read_vocab
from trainer.model.bert import BertForPreTraining
from trainer.model.weights import WeightsError, load_pretrained_file

RUN_CHECKPOINT = "shared.pt"  # a run checkpoint's model, optimizer and loop state (trainer/checkpoints/run.py)
CARD_TAGS = ["bert", "pretraining", "mlperf", "bertctl"]


def hugging_face():
    """transformers and huggingface_hub, or one line saying how to install them (an optional extra)."""
    try:
        import huggingface_hub
        import transformers
    except ImportError as e:
        raise BadInput("transformers", f"not installed ({e.name} is missing): `bertctl export` writes with it; "
                                       "pip install 'bertctl[export]'") from None
    return transformers, huggingface_hub


def weights_file(path: Path) -> Path:
    """The file holding the weights: FILE itself, or a run checkpoint folder's shared.pt."""
    if path.is_dir():
        if not (path / RUN_CHECKPOINT).is_file():
            raise BadInput(path, f"a folder without {RUN_CHECKPOINT}: not a run checkpoint (step_<N>/)")
        return path / RUN_CHECKPOINT
    if not path.exists():
        raise BadInput(path, "checkpoint not found")
    return path


def trained_model(cfg: ModelConfig, weights: Path) -> BertForPreTraining:
    """bertctl's model of the run's shape with the weights loaded: what they are checked against."""
    model = BertForPreTraining(cfg).eval()
    try:
        load_pretrained_file(model, weights_file(weights))
    except WeightsError as e:
        raise BadInput(weights, f"does not fit the experiment's model ({describe(cfg)}): "
                                f"{str(e).removeprefix(str(weights_file(weights)) + ': ')}") from None
    return model


def describe(cfg: ModelConfig) -> str:
    return (f"{cfg.num_layers} layers, hidden {cfg.hidden_size}, {cfg.num_heads} heads, intermediate "
            f"{cfg.intermediate_size}, vocabulary {cfg.vocab_size} padded to {cfg.padded_vocab_size}")


def bert_config(transformers, cfg: ModelConfig, pad_token_id: int):
    """transformers' BertConfig of bertctl's model: its shape, GELU (erf), the padded vocabulary."""
    return transformers.BertConfig(
        vocab_size=cfg.padded_vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, intermediate_size=cfg.intermediate_size, hidden_act="gelu",
        hidden_dropout_prob=cfg.hidden_dropout, attention_probs_dropout_prob=cfg.attention_dropout,
        max_position_embeddings=cfg.max_position_embeddings, type_vocab_size=cfg.type_vocab_size,
        initializer_range=cfg.initializer_range, layer_norm_eps=cfg.layer_norm_eps, pad_token_id=pad_token_id,
        architectures=["BertForPreTraining"])


def hugging_face_model(transformers, config, model: BertForPreTraining):
    """transformers' BertForPreTraining holding bertctl's weights; every one of its tensors comes from them
    (a tensor left out would be saved at its random initial value: a defect here, not the user's input)."""
    hf = transformers.BertForPreTraining(config).eval()
    state = model.state_dict()
    loaded = hf.load_state_dict(state, strict=False)
    own = hf.state_dict()
    loaded_storage = {own[k].data_ptr() for k in state if k in own}
    untouched = [k for k in loaded.missing_keys if own[k].data_ptr() not in loaded_storage]  # tied ones are loaded
    if untouched or loaded.unexpected_keys:
        raise StepFailed("transformers.BertForPreTraining", f"does not take bertctl's weights: missing {untouched[:3]}, "
                                                            f"unexpected {loaded.unexpected_keys[:3]}")
    return hf


def tokenizer(transformers, vocab: Path, lower_case: bool, max_length: int):
    """BERT's WordPiece tokenizer on the vocabulary, with the normalisation the dataset was tokenized with
    (trainer/data/prepare/vocab.py: lower-case and strip accents, or neither)."""
    # transformers 5 takes the vocabulary as `vocab` (a file or a dict) and ignores 4's `vocab_file`
    file_argument = "vocab" if int(transformers.__version__.split(".")[0]) >= 5 else "vocab_file"
    return transformers.BertTokenizerFast(**{file_argument: str(vocab)}, do_lower_case=lower_case, strip_accents=lower_case,
                                          tokenize_chinese_chars=True, model_max_length=max_length)


def model_card(huggingface_hub, body: str):
    data = huggingface_hub.ModelCardData(library_name="transformers", pipeline_tag="fill-mask", tags=CARD_TAGS)
    return huggingface_hub.ModelCard.from_template(data, template_str="---\n{{ card_data }}\n---\n\n{{ body }}\n", body=body)


def export(weights: Path, run_config: Path, vocab: Path, lower_case: bool, out: Path, card: str = "") -> dict:
    """Write the model folder into `out` (absent or empty); what was written, as a dict."""
    transformers, huggingface_hub = hugging_face()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BadInput(out, "not an empty folder")
    cfg = load_run_config(str(run_config)).model
    tokens = read_vocab(vocab)
    if len(tokens) > cfg.vocab_size:
        raise BadInput(vocab, f"{len(tokens)} tokens, more than the model's vocab_size {cfg.vocab_size}: "
                              "not the vocabulary this model was trained with")
    model = trained_model(cfg, weights)
    hf = hugging_face_model(transformers, bert_config(transformers, cfg, pad_token_id=tokens.index("[PAD]")), model)
    del model
    try:
        out.mkdir(parents=True, exist_ok=True)
        hf.save_pretrained(out)
        tokenizer(transformers, vocab, lower_case, cfg.max_position_embeddings).save_pretrained(out)
        model_card(huggingface_hub, card).save(out / "README.md")
    except OSError as e:
        raise StepFailed(getattr(e, "filename", None) or out, f"cannot write: {e.strerror or e}") from None
    return {"out": str(out), "files": sorted(p.name for p in out.iterdir()), "tensors": len(hf.state_dict()),
            "vocab": len(tokens), "padded_vocab": cfg.padded_vocab_size}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.checkpoints.export", description=__doc__.split("\n")[0])
    p.add_argument("--weights", required=True, help="{'model': state_dict}, a state dict, or a run checkpoint step_<N>/")
    p.add_argument("--run-config", required=True, help="run.yaml: the model's shape")
    p.add_argument("--vocab", required=True, help="vocab.txt the data was tokenized with")
    p.add_argument("--cased", action="store_true", help="the vocabulary is cased (no lower-casing, accents kept)")
    p.add_argument("--card", help="the model card's text (Markdown)")
    p.add_argument("--out", required=True, help="the folder to write (absent or empty)")
    args = p.parse_args(argv)
    try:
        card = read_regular_text(args.card, encoding="utf-8") if args.card else ""
        written = export(Path(args.weights), Path(args.run_config), Path(args.vocab), not args.cased, Path(args.out), card)
    except PrepareError as e:
        return report_failure(e.exit_code, e.path, e.what)
    print(json.dumps(written))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
