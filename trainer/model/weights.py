"""Loading pretrained weights (a phase-1 checkpoint, an HF state dict) into `BertForPreTraining`.

Accepted: `{"model": state_dict}` (NVIDIA's converted phase-1 checkpoint, and ours), a bare state
dict (Hugging Face `pytorch_model.bin`), with old TF-style `gamma`/`beta` LayerNorm names, a
`module.` (DDP) prefix or NVIDIA's segmented-model prefixes. Vocabulary tensors shorter than the
model's padded vocabulary (30522 -> 30528) are zero-padded, as NVIDIA's converter does; any other
shape mismatch, a missing tensor or an unknown one is an error naming the key.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import nn

VOCAB_ROWS = ("bert.embeddings.word_embeddings.weight", "cls.predictions.bias", "cls.predictions.decoder.weight")
PREFIXES = ("module.", "bert_model_segment.", "heads_only_segment.", "model.")


class WeightsError(Exception):
    """A checkpoint that does not fit the model; the message names the file and the tensor."""


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise WeightsError(f"{path}: checkpoint not found") from None
    except Exception as e:  # torch raises many types for a corrupt file
        raise WeightsError(f"{path}: not a readable PyTorch checkpoint ({type(e).__name__}: {e})") from None
    if isinstance(data, dict) and isinstance(data.get("model"), dict):
        data = data["model"]
    if not isinstance(data, dict) or not all(isinstance(v, torch.Tensor) for v in data.values()):
        raise WeightsError(f"{path}: expected a state dict (or {{'model': state_dict}})")
    return data


def normalize_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for key, value in state.items():
        for prefix in PREFIXES:
            if key.startswith(prefix):
                key = key[len(prefix):]
        key = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", key)
        key = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", key)
        out[key] = value
    return out


def load_pretrained(model: nn.Module, state: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
    """Copy `state` into `model`; every model tensor must be covered (the tied decoder may be absent)."""
    state = normalize_names(state)
    # Hugging Face stores the decoder bias twice (tied to cls.predictions.bias); position_ids is a buffer
    state.pop("cls.predictions.decoder.bias", None)
    state.pop("bert.embeddings.position_ids", None)
    own = model.state_dict()
    unknown = sorted(set(state) - set(own))
    if unknown:
        raise WeightsError(f"{source}: tensor {unknown[0]} does not exist in this model ({len(unknown)} unknown)")
    if "cls.predictions.decoder.weight" not in state and "bert.embeddings.word_embeddings.weight" in state:
        state["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"]
    missing = sorted(set(own) - set(state))
    if missing:
        raise WeightsError(f"{source}: tensor {missing[0]} is missing ({len(missing)} missing)")
    with torch.no_grad():
        for key, target in own.items():
            value = state[key]
            if value.shape != target.shape:
                value = _pad_vocab(key, value, target, source)
            target.copy_(value)


def _pad_vocab(key: str, value: torch.Tensor, target: torch.Tensor, source: str) -> torch.Tensor:
    if key in VOCAB_ROWS and value.shape[1:] == target.shape[1:] and value.shape[0] < target.shape[0]:
        padded = torch.zeros_like(target)
        padded[: value.shape[0]] = value
        return padded
    raise WeightsError(f"{source}: tensor {key} has shape {tuple(value.shape)}, the model needs {tuple(target.shape)}")


def load_pretrained_file(model: nn.Module, path: str | Path) -> None:
    load_pretrained(model, read_state_dict(path), source=str(path))


def tf_variable_names(model: nn.Module) -> list[str]:
    """The TensorFlow names of the model's tensors, as the MLPerf `weights_initialization` events list them.

    For BERT-large these are exactly the 398 names the 1.1.0-2.1.0 rulesets check.
    """
    names = []
    for key in model.state_dict():
        if key == "cls.predictions.decoder.weight":
            continue  # tied to the word embeddings: not a separate TF variable
        names.append(_tf_name(key))
    return names


def _tf_name(key: str) -> str:
    special = {
        "cls.predictions.bias": "cls/predictions/output_bias",
        "cls.seq_relationship.weight": "cls/seq_relationship/output_weights",
        "cls.seq_relationship.bias": "cls/seq_relationship/output_bias",
    }
    if key in special:
        return special[key]
    parts = key.split(".")
    leaf = parts.pop()
    path = "/".join(_join_layer_index(parts))
    if path.endswith("_embeddings"):
        return path
    if parts[-1] == "LayerNorm":
        return f"{path}/{'gamma' if leaf == 'weight' else 'beta'}"
    return f"{path}/{'kernel' if leaf == 'weight' else 'bias'}"


def _join_layer_index(parts: list[str]) -> list[str]:
    """['encoder', 'layer', '3', ...] -> ['encoder', 'layer_3', ...]"""
    out: list[str] = []
    for part in parts:
        if part.isdigit() and out and out[-1] == "layer":
            out[-1] = f"layer_{part}"
        else:
            out.append(part)
    return out
