"""FP8 GEMMs for the encoder's Linear layers (`runtime.fp8: true`), through PyTorch's own FP8 training,
`torchao.float8` (the one torchtitan uses).

`to_fp8_training(model)` swaps each encoder layer's six Linear layers (query, key, value, the attention output,
FC1, FC2) for torchao's FP8 Linear (`convert_to_float8_training`, its public entry point): each GEMM casts its
operands to FP8 (e4m3 for activations and weights, e5m2 for the gradients), each tensor scaled by its own
amax, computed at every call ("current" or dynamic scaling, per tensor), and runs `torch._scaled_mm`; the output
and every other op stay in bf16. torchao 0.18 has no other scaling for training: delayed scaling with an
amax history (NVIDIA's Transformer Engine recipe) was removed from torchao.float8 (its `ScalingType` holds
DYNAMIC and DISABLED only). So the layers keep no state: they hold the same parameters under the same
names, a checkpoint of an FP8 run is a bf16 run's and the reverse, and a resumed run continues exactly.
The MLM head, the pooler, the NSP classifier and the embeddings stay in bf16.

What torchao does with an amax that is not finite: an inf in the tensor makes its scale 0 and the whole GEMM's
output NaN (loud, never a finite wrong value); a finite outlier scales the rest of the tensor down with it
(values under amax / 2^17 flush to zero). tests/test_fp8.py holds both.

The fused paths of trainer/model/bert.py (one QKV GEMM over concatenated weights; the pointwise tails'
bias-less GEMM) read a Linear's weights only while it is a plain nn.Linear; a swapped layer is called, so its
GEMM is FP8 and the bf16 path's numerics are untouched.

torchao's compiled extensions are not needed here (the FP8 GEMM is torch's `_scaled_mm`) and are not loaded
(TORCHAO_FORCE_SKIP_LOADING_SO_FILES): a torchao wheel built for another torch release then still imports.
Whether it works with the installed torch is what `fp8_problem` finds out, before training.
"""

from __future__ import annotations

import logging
import os
from importlib import metadata

import torch
from torch import nn

from trainer.model.compiled import root_cause

# the Linear layers of each encoder layer that run in FP8, by their Hugging Face names under bert.encoder.layer.N
ENCODER_LINEARS = ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
                   "intermediate.dense", "output.dense")
# FP8 tensor cores: Ada (8.9) and Hopper (9.0) onwards
MIN_CAPABILITY = (8, 9)
# torch._scaled_mm needs both dimensions of every operand to be multiples of 16
GEMM_MULTIPLE = 16
FIX = "or set runtime.fp8: false"


def float8():
    """torchao.float8, imported without torchao's compiled extensions (and without its line saying so)."""
    os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")
    logging.getLogger("torchao").setLevel(logging.ERROR)
    import torchao.float8

    return torchao.float8


def is_encoder_linear(module: nn.Module, name: str) -> bool:
    """Whether `name` (a path under the model) is one of an encoder layer's six Linear layers."""
    return isinstance(module, nn.Linear) and ".encoder.layer." in f".{name}" and name.endswith(ENCODER_LINEARS)


def to_fp8_training(model: nn.Module) -> int:
    """Swap the encoder's Linear layers for torchao's FP8 Linear, in place (their parameters kept); how many.
    ValueError when a layer's shape is no multiple of 16 (torch._scaled_mm's rule): hidden_size and
    intermediate_size must be."""
    chosen = [name for name, module in model.named_modules() if is_encoder_linear(module, name)]
    for name in chosen:
        weight = model.get_submodule(name).weight
        if any(size % GEMM_MULTIPLE for size in weight.shape):
            raise ValueError(f"runtime.fp8: {name} is {tuple(weight.shape)}; FP8 GEMMs need model.hidden_size and "
                             f"model.intermediate_size to be multiples of {GEMM_MULTIPLE}, {FIX}")
    float8().convert_to_float8_training(model, module_filter_fn=is_encoder_linear)
    return len(chosen)


def fp8_problem(device: torch.device) -> str | None:
    """Why `runtime.fp8: true` cannot run on `device`, in one line naming the key and the fix; None when it can."""
    if device.type != "cuda":
        return f"runtime.fp8: FP8 GEMMs need a CUDA GPU of compute capability 8.9 or newer (L40S, H100, H200), {FIX}"
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CAPABILITY:
        return (f"runtime.fp8: {torch.cuda.get_device_name(device)} has compute capability {capability[0]}.{capability[1]}; "
                f"FP8 GEMMs need 8.9 or newer (L40S, H100, H200): run on such a GPU, {FIX}")
    return torchao_problem(device)


def torchao_problem(device: torch.device) -> str | None:
    """Whether torchao is installed and runs with this torch on `device`: one FP8 Linear's forward and backward
    in bf16, finite and within FP8's error of bf16's. The one-line reason, or None."""
    try:
        version = metadata.version("torchao")
    except metadata.PackageNotFoundError:
        return f"runtime.fp8: torchao is not installed: pip install 'bertctl[fp8]' (torchao 0.18) where the trainer runs, {FIX}"
    try:
        error = smoke_test(device)
    except Exception as e:  # noqa: BLE001 - whatever a mismatched torchao raises, the line says it
        error = root_cause(e)
    if error is None:
        return None
    return (f"runtime.fp8: torchao {version} does not work with torch {torch.__version__} ({error}): install the torchao "
            f"release made for this torch, {FIX}")


def smoke_test(device: torch.device) -> str | None:
    """A 64 x 64 FP8 Linear, forward and backward on 128 rows in bf16 against the bf16 Linear it was made from;
    what went wrong, or None."""
    generator = torch.Generator().manual_seed(0)
    plain = nn.Linear(64, 64).to(device)
    with torch.no_grad():
        plain.weight.copy_(torch.randn(64, 64, generator=generator))
    swapped = float8().convert_to_float8_training(nn.Sequential(nn.Linear(64, 64)).to(device))
    swapped[0].load_state_dict(plain.state_dict())
    x = torch.randn(128, 64, generator=generator).to(device)
    outputs = []
    for layer in (plain, swapped):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            out = layer(x)
        out.float().sum().backward()
        outputs.append(out.float())
    error = ((outputs[1] - outputs[0]).norm() / outputs[0].norm()).item()
    if not (error < 0.1 and torch.isfinite(swapped[0].weight.grad).all()):  # FP8's error is ~4 %
        return f"an FP8 Linear is {error:.3g} of its norm off bf16's (expected about 0.04)"
    return None
