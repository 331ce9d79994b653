"""Mixed precision, as `runtime.precision` asks: the autocast the forward passes run under, and for
fp16 the gradient scaler (its loss scale feeds the step: trainer/optim.py::loss_scale, take_step).
"""

from __future__ import annotations

import contextlib

import torch

from trainer.config import RuntimeConfig


def autocast(precision: str, device_type: str):
    """The context the forward runs in: none in fp32, else torch's autocast to bf16 or fp16."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


def grad_scaler(runtime: RuntimeConfig, device: torch.device) -> torch.amp.GradScaler | None:
    """fp16's dynamic loss scaler, from `runtime.init_loss_scale`; None in the other precisions."""
    if runtime.precision != "fp16":
        return None
    return torch.amp.GradScaler(device.type, init_scale=runtime.init_loss_scale)
