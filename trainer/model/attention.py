"""Attention kernels: padded (SDPA with a key mask) and variable-length (real tokens only).

The variable-length form takes a packed token stream [T, heads, head_dim] and `cu_seqlens`, the
sequence offsets, so no work is spent on padding. Three implementations, chosen by
`runtime.attention` (see `resolve_backend`):

- `flash_attn`: the flash-attention package's varlen kernel (CUDA, fp16/bf16, dropout included);
- `nested`: SDPA on a jagged NestedTensor built as a view of the packed stream. On CUDA PyTorch
  runs its own fused kernel on it, dropout and backward included, with no extra package: flash in
  fp16/bf16, memory-efficient in fp32. On the CPU it falls back to its math kernel through a
  strided copy of every sequence: correct, but slower than `per_sequence`;
- `per_sequence`: one dense SDPA call per sequence, the reference. On the CPU it is the fastest
  (see benchmarks/attention_backends.py): the dense CPU SDPA is a fused flash kernel; with
  dropout, where CPU SDPA falls back to its math path, `cpu_dropout_attention` does the same
  maths with a cheaper dropout mask.

`auto` takes the first that has a fused kernel for the device and dtype, in that order.
"""

from __future__ import annotations

import functools
import warnings
from typing import Sequence

import torch
import torch.nn.functional as F

from trainer.model.dropout import draw_seed, dropout_noise

# The nested math fallback (CPU, CUDA fp32) converts our jagged tensors to the strided layout
# internally, and torch then recommends the jagged layout we already use: noise in a training log.
warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors is in prototype stage", category=UserWarning)

try:  # optional fast path
    from flash_attn import flash_attn_varlen_func as _flash_varlen  # type: ignore
except ImportError:  # pragma: no cover - depends on the machine
    _flash_varlen = None

BACKENDS = ("auto", "flash_attn", "nested", "per_sequence")
HALF_DTYPES = (torch.float16, torch.bfloat16)
PRECISION_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


_FIX = "or set runtime.attention: auto (or nested / per_sequence)"


class AttentionUnavailable(ValueError):
    """An attention backend was asked for (runtime.attention) that cannot run here."""


def flash_attn_installed() -> bool:
    return _flash_varlen is not None


def torch_kernel_fits(device_type: str, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether one of PyTorch's fused CUDA kernels takes jagged q/k/v of this kind, training and
    dropout included: flash in fp16/bf16, memory-efficient in fp32 (its dtypes on sm80 and later).
    Were neither to take them after all, SDPA would run its math kernel: slower, the same result."""
    return (device_type == "cuda" and dtype in (*HALF_DTYPES, torch.float32)
            and head_dim % 8 == 0 and head_dim <= 256)


@functools.lru_cache(maxsize=64)
def resolve_backend(requested: str, device_type: str, dtype: torch.dtype, head_dim: int, flash_attn: bool | None = None) -> str:
    """The implementation that runs for `runtime.attention: requested` on this device and dtype.

    `flash_attn` says whether the package is importable (None: look); the parameter lets the
    selection be tested on machines either way.
    """
    if requested not in BACKENDS:
        raise AttentionUnavailable(f"runtime.attention: expected one of {', '.join(BACKENDS)}, got {requested!r}")
    flash_attn = flash_attn_installed() if flash_attn is None else flash_attn
    flash_attn_fits = flash_attn and device_type == "cuda" and dtype in HALF_DTYPES
    if requested == "auto":
        if flash_attn_fits:
            return "flash_attn"
        if torch_kernel_fits(device_type, dtype, head_dim):
            return "nested"
        return "per_sequence"
    if requested == "flash_attn" and not flash_attn_fits:
        if not flash_attn:
            raise AttentionUnavailable(f"runtime.attention: flash_attn needs the flash_attn package (pip install flash-attn); {_FIX}")
        raise AttentionUnavailable(f"runtime.attention: flash_attn needs CUDA in fp16/bf16 (runtime.device: cuda, runtime.precision: "
                                   f"bf16 or fp16), not {device_type} {str(dtype).removeprefix('torch.')}; {_FIX}")
    return requested


def check_backend_name(requested: str) -> None:
    """What can be checked before the device is known: the name, and flash_attn's package."""
    if requested not in BACKENDS:
        raise AttentionUnavailable(f"runtime.attention: expected one of {', '.join(BACKENDS)}, got {requested!r}")
    if requested == "flash_attn" and not flash_attn_installed():
        raise AttentionUnavailable(f"runtime.attention: flash_attn needs the flash_attn package (pip install flash-attn); {_FIX}")


def check_attention(requested: str, device: str, precision: str, head_dim: int = 64) -> str:
    """Pre-flight check for a run's config (before any rank trains): the backend that will run."""
    return resolve_backend(requested, device, PRECISION_DTYPES[precision], head_dim)


def padded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor, dropout_p: float) -> torch.Tensor:
    """q, k, v: [B, heads, L, D]; key_mask: [B, L] bool (True = real token)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask[:, None, None, :], dropout_p=dropout_p)


def varlen_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, dropout_p: float,
    backend: str = "auto", seqlens: Sequence[int] = (),
) -> torch.Tensor:
    """q, k, v: [T, heads, D] for sequences at offsets `cu_seqlens`; returns [T, heads, D].

    `seqlens`, the lengths as host integers (Batch.seqlens), spare the nested and per-sequence
    paths a device->host copy (a GPU stall) to find them; without them the lengths are read back.
    """
    chosen = resolve_backend(backend, q.device.type, q.dtype, q.shape[-1])
    if chosen == "flash_attn":
        return _flash_varlen(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p=dropout_p)
    seqlens = seqlens or (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    if chosen == "nested":
        return nested_attention(q, k, v, cu_seqlens, max_seqlen, min(seqlens), dropout_p)
    return per_sequence_attention(q, k, v, seqlens, dropout_p)


def nested_attention(q, k, v, cu_seqlens, max_seqlen, min_seqlen, dropout_p):
    """SDPA on jagged views of the packed stream: [T, h, D] -> [B, j, h, D] -> [B, h, j, D] and back.

    q, k and v share the offsets tensor, so they share one ragged dimension, as SDPA requires.
    """
    def jagged(x):
        return torch.nested.nested_tensor_from_jagged(x, cu_seqlens, max_seqlen=max_seqlen, min_seqlen=min_seqlen).transpose(1, 2)

    out = F.scaled_dot_product_attention(jagged(q), jagged(k), jagged(v), dropout_p=dropout_p)
    return out.transpose(1, 2).values()  # the kernel's [T, h, D] output buffer, no copy


def per_sequence_attention(q, k, v, lengths: Sequence[int], dropout_p):
    """One dense SDPA per sequence. `split` (not slicing) keeps the backward to one concatenation
    per input instead of a zero-filled full-size gradient per sequence."""
    lengths = list(lengths)
    if dropout_p > 0.0 and q.device.type == "cpu":
        return cpu_dropout_attention(q, k, v, lengths, dropout_p)
    outputs = []
    for qs, ks, vs in zip(q.split(lengths), k.split(lengths), v.split(lengths)):
        # [L, heads, D] -> [1, heads, L, D]
        qs, ks, vs = (x.transpose(0, 1).unsqueeze(0) for x in (qs, ks, vs))
        outputs.append(F.scaled_dot_product_attention(qs, ks, vs, dropout_p=dropout_p)[0].transpose(0, 1))
    return torch.cat(outputs)


def cpu_dropout_attention(q, k, v, lengths: Sequence[int], dropout_p: float) -> torch.Tensor:
    """Per-sequence attention with dropout on the CPU, where SDPA leaves its fused kernel for a
    math path that draws one random number per attention weight with bernoulli_ (most of
    attention's time there). The same maths here takes its masks from trainer/model/dropout.py: one seed
    per call from torch's generator, sequence i's mask from the stream (seed, i).

    The sequences run one after another, each op on all intra-op threads. (A pool of one-thread
    workers, one sequence each, trained 6 % faster on a quiet 2-core machine and no faster beside a
    busy process; it was taken out: it ran autograd on threads of its own inside the backward, and
    a CI run hung beside it.)"""
    seed, scale = draw_seed(), q.shape[-1] ** -0.5
    outputs = []
    for i, (qs, ks, vs) in enumerate(zip(q.split(lengths), k.split(lengths), v.split(lengths))):
        qs, ks, vs = (x.transpose(0, 1) for x in (qs, ks, vs))  # [heads, L, D]
        weights = torch.softmax(torch.bmm(qs * scale, ks.transpose(1, 2)), dim=-1)
        kept = dropout_noise(weights.numel(), dropout_p, weights.dtype, seed=(seed, i)).view(weights.shape)
        outputs.append(torch.bmm(weights * kept, vs).transpose(0, 1))
    return torch.cat(outputs)
