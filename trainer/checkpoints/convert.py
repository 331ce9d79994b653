"""The MLPerf phase-1 TensorFlow checkpoint -> a PyTorch checkpoint for phase 2.

`python -m trainer.checkpoints.convert --tf-checkpoint PREFIX --bert-config bert_config.json --output model.pt`
(what `bertctl convert-checkpoint` runs). TensorFlow is not needed: trainer.checkpoints.tf_checkpoint reads the files.

The output is `torch.save({"model": state_dict})` with Hugging Face `BertForPreTraining` names:

  bert/embeddings/word_embeddings                  bert.embeddings.word_embeddings.weight  (vocab padded)
  bert/encoder/layer_N/attention/self/query/kernel bert.encoder.layer.N.attention.self.query.weight  (transposed)
  .../LayerNorm/gamma, .../LayerNorm/beta          ....LayerNorm.weight, ....LayerNorm.bias
  cls/predictions/output_bias                      cls.predictions.bias  (vocab padded)
  cls/seq_relationship/output_weights              cls.seq_relationship.weight  (already [2, hidden])

Every `kernel` is transposed (TF stores [in, out], torch.nn.Linear [out, in]). The vocabulary is
padded with zeros to a multiple of 8 (30,522 -> 30,528) for the word embeddings and the MLM output
bias, as NVIDIA and Samsung do. The MLM decoder is tied to the word embeddings in BERT: the state
dict also holds `cls.predictions.decoder.weight` (equal to the word embeddings) and
`cls.predictions.decoder.bias` (equal to `cls.predictions.bias`), as Hugging Face's own state dict
does, so that it loads with strict=True. Optimizer slots and counters (adam_m, adam_v, LAMB,
LAMB_1, AdamWeightDecayOptimizer(_1), Adam(_1), Momentum, global_step, beta1_power, beta2_power, ...)
are skipped; any other variable that maps to nothing, and any model weight the checkpoint lacks, is
an error naming the variable.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

import numpy as np

from trainer.checkpoints.tf_checkpoint import TFCheckpoint
from trainer.config.regular import read_regular_text
from trainer.data.prepare.errors import BadInput, PrepareError, StepFailed, report_failure

# optimizer state and bookkeeping in the MLPerf checkpoint (LAMB) and in Google's: its
# AdamWeightDecayOptimizer names the slots adam_m/adam_v, or, built through TF2's v1 slot
# machinery, after the optimizer (var/AdamWeightDecayOptimizer, var/AdamWeightDecayOptimizer_1),
# as tf.train.AdamOptimizer does (var/Adam, var/Adam_1)
SKIPPED_PARTS = {"adam_m", "adam_v", "LAMB", "LAMB_1", "Momentum", "AdamWeightDecayOptimizer",
                 "AdamWeightDecayOptimizer_1", "Adam", "Adam_1"}
SKIPPED_NAMES = {"global_step", "beta1_power", "beta2_power", "good_steps", "loss_scale", "current_loss_scale"}

# TF name (with layer_N) -> (torch name with {n}, transpose)
LAYER = r"bert/encoder/layer_(\d+)/"
RULES: list[tuple[re.Pattern, str, bool]] = [
    (re.compile(p), t, transpose) for p, t, transpose in [
        (r"bert/embeddings/(word|position|token_type)_embeddings", "bert.embeddings.{0}_embeddings.weight", False),
        (r"bert/embeddings/LayerNorm/gamma", "bert.embeddings.LayerNorm.weight", False),
        (r"bert/embeddings/LayerNorm/beta", "bert.embeddings.LayerNorm.bias", False),
        (LAYER + r"attention/self/(query|key|value)/kernel", "bert.encoder.layer.{0}.attention.self.{1}.weight", True),
        (LAYER + r"attention/self/(query|key|value)/bias", "bert.encoder.layer.{0}.attention.self.{1}.bias", False),
        (LAYER + r"(attention/output|intermediate|output)/dense/kernel", "bert.encoder.layer.{0}.{1}.dense.weight", True),
        (LAYER + r"(attention/output|intermediate|output)/dense/bias", "bert.encoder.layer.{0}.{1}.dense.bias", False),
        (LAYER + r"(attention/output|output)/LayerNorm/gamma", "bert.encoder.layer.{0}.{1}.LayerNorm.weight", False),
        (LAYER + r"(attention/output|output)/LayerNorm/beta", "bert.encoder.layer.{0}.{1}.LayerNorm.bias", False),
        (r"bert/pooler/dense/kernel", "bert.pooler.dense.weight", True),
        (r"bert/pooler/dense/bias", "bert.pooler.dense.bias", False),
        (r"cls/predictions/transform/dense/kernel", "cls.predictions.transform.dense.weight", True),
        (r"cls/predictions/transform/dense/bias", "cls.predictions.transform.dense.bias", False),
        (r"cls/predictions/transform/LayerNorm/gamma", "cls.predictions.transform.LayerNorm.weight", False),
        (r"cls/predictions/transform/LayerNorm/beta", "cls.predictions.transform.LayerNorm.bias", False),
        (r"cls/predictions/output_bias", "cls.predictions.bias", False),
        (r"cls/seq_relationship/output_weights", "cls.seq_relationship.weight", False),
        (r"cls/seq_relationship/output_bias", "cls.seq_relationship.bias", False),
    ]
]
PADDED = {"bert.embeddings.word_embeddings.weight", "cls.predictions.bias"}  # vocab rows


def is_optimizer_state(name: str) -> bool:
    parts = name.split("/")
    return name in SKIPPED_NAMES or parts[-1] in SKIPPED_NAMES or any(p in SKIPPED_PARTS for p in parts)


def torch_name(tf_name: str) -> tuple[str, bool] | None:
    """The Hugging Face name of a TF variable and whether it is transposed; None if unknown."""
    for pattern, template, transpose in RULES:
        m = pattern.fullmatch(tf_name)
        if m:
            return template.format(*(g.replace("/", ".") for g in m.groups())), transpose
    return None


def read_bert_config(path: str | Path) -> dict:
    path = Path(path)
    try:
        config = json.loads(read_regular_text(path, limit=1 << 20, encoding="utf-8"))
    except FileNotFoundError:
        raise BadInput(path, "bert config not found") from None
    except OSError as e:  # a FIFO, a device, a directory, a huge file
        raise BadInput(path, f"cannot read the bert config: {e.strerror or e}") from None
    except (ValueError, RecursionError) as e:
        raise BadInput(path, f"not a JSON bert config: {e}") from None
    needed = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
              "max_position_embeddings", "type_vocab_size"]
    if not isinstance(config, dict):
        raise BadInput(path, f"not a JSON bert config: holds {type(config).__name__}, not an object")
    missing = [k for k in needed if not isinstance(config.get(k), int)]
    if missing:
        raise BadInput(path, f"bert config lacks {', '.join(missing)}")
    return config


def padded_vocab(vocab_size: int) -> int:
    return 8 * math.ceil(vocab_size / 8)


def expected_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Every parameter of BertForPreTraining (with the padded vocabulary) and its shape."""
    h, i, v = config["hidden_size"], config["intermediate_size"], padded_vocab(config["vocab_size"])
    shapes = {
        "bert.embeddings.word_embeddings.weight": (v, h),
        "bert.embeddings.position_embeddings.weight": (config["max_position_embeddings"], h),
        "bert.embeddings.token_type_embeddings.weight": (config["type_vocab_size"], h),
        "bert.embeddings.LayerNorm.weight": (h,), "bert.embeddings.LayerNorm.bias": (h,),
        "bert.pooler.dense.weight": (h, h), "bert.pooler.dense.bias": (h,),
        "cls.predictions.bias": (v,),
        "cls.predictions.transform.dense.weight": (h, h), "cls.predictions.transform.dense.bias": (h,),
        "cls.predictions.transform.LayerNorm.weight": (h,), "cls.predictions.transform.LayerNorm.bias": (h,),
        "cls.seq_relationship.weight": (2, h), "cls.seq_relationship.bias": (2,),
    }
    for n in range(config["num_hidden_layers"]):
        p = f"bert.encoder.layer.{n}."
        for proj in ("query", "key", "value"):
            shapes[p + f"attention.self.{proj}.weight"], shapes[p + f"attention.self.{proj}.bias"] = (h, h), (h,)
        shapes[p + "attention.output.dense.weight"], shapes[p + "attention.output.dense.bias"] = (h, h), (h,)
        shapes[p + "intermediate.dense.weight"], shapes[p + "intermediate.dense.bias"] = (i, h), (i,)
        shapes[p + "output.dense.weight"], shapes[p + "output.dense.bias"] = (h, i), (h,)
        for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
            shapes[p + ln + ".weight"], shapes[p + ln + ".bias"] = (h,), (h,)
    return shapes


def convert(tf_checkpoint: str | Path, bert_config: str | Path) -> dict[str, np.ndarray]:
    """The state dict (numpy arrays, float32) of the checkpoint, named, transposed and padded."""
    config = read_bert_config(bert_config)
    ckpt = TFCheckpoint(tf_checkpoint)
    shapes = expected_shapes(config)
    state: dict[str, np.ndarray] = {}
    for name in ckpt.names():
        if is_optimizer_state(name):
            continue
        mapped = torch_name(name)
        if mapped is None or mapped[0] not in shapes:
            raise BadInput(ckpt.index_path, f"variable {name}: unexpected name (not a BERT pretraining weight "
                                            f"or optimizer slot), shape {list(ckpt.shape(name))}")
        target, transpose = mapped
        array = ckpt.read(name).astype(np.float32)
        state[target] = fit(array.T if transpose else array, shapes[target], name, target, ckpt)
    missing = [n for n in shapes if n not in state]
    if missing:
        raise BadInput(ckpt.index_path, f"no variable for {missing[0]} ({len(missing)} model weights missing; "
                                        f"does {bert_config} describe this checkpoint?)")
    state["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"]
    state["cls.predictions.decoder.bias"] = state["cls.predictions.bias"]
    return state


def fit(array: np.ndarray, shape: tuple[int, ...], name: str, target: str, ckpt: TFCheckpoint) -> np.ndarray:
    """The array in the model's shape: as is, or zero-padded along the vocabulary."""
    if array.shape == shape:
        return np.ascontiguousarray(array)
    if target in PADDED and array.shape[1:] == shape[1:] and array.shape[0] <= shape[0]:
        out = np.zeros(shape, np.float32)
        out[: array.shape[0]] = array
        return out
    raise BadInput(ckpt.index_path, f"variable {name}: shape {list(array.shape)} does not fit {target} "
                                    f"{list(shape)} of the bert config")


def save(state: dict[str, np.ndarray], output: str | Path) -> Path:
    """torch.save({"model": state_dict}) atomically; tied entries share storage in the file."""
    import torch

    from trainer.checkpoints.run import OutputError, save_file
    from trainer.data.prepare.files import atomic_path

    tensors = {k: torch.from_numpy(v) for k, v in state.items() if not k.startswith("cls.predictions.decoder.")}
    tensors["cls.predictions.decoder.weight"] = tensors["bert.embeddings.word_embeddings.weight"]
    tensors["cls.predictions.decoder.bias"] = tensors["cls.predictions.bias"]
    try:
        with atomic_path(output) as tmp:
            save_file({"model": tensors}, tmp)
    except OutputError as e:
        raise BadInput(output, e.reason) from None
    except StepFailed as e:
        raise BadInput(output, e.what) from None
    return Path(output)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.checkpoints.convert", description=__doc__.split("\n")[0])
    p.add_argument("--tf-checkpoint", required=True, help="the checkpoint prefix, e.g. .../model.ckpt-28252")
    p.add_argument("--bert-config", required=True, help="bert_config.json")
    p.add_argument("--output", required=True, help="the PyTorch file to write")
    args = p.parse_args(argv)
    try:
        state = convert(args.tf_checkpoint, args.bert_config)
        save(state, args.output)
    except PrepareError as e:
        return report_failure(e.exit_code, e.path, e.what)
    print(json.dumps({"output": args.output, "tensors": len(state)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
