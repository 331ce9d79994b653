"""Attention on the fixed-shape packed stream, as one operator torch.compile does not look into.

`packed_attention(q, k, v, cu_seqlens, max_seqlen, dropout_p)` takes q, k, v as [T, heads, D]
and the sequence offsets; every row of the stream must belong to a segment (trainer/data/batch.py::
fixed_shape gives padding tokens segments of their own), zero-length segments are allowed.

- On CUDA in fp16/bf16 it calls PyTorch's own flash kernel through its variable-length entry point
  (`aten._flash_attention_forward` / `_backward`): the kernels the nested path ran, without the
  NestedTensor dispatch that made that path CPU-bound (466 ms of CPU per step on an H100). Dropout
  runs inside the kernel from a philox seed and offset it returns as a device tensor, which the
  backward replays, so it is CUDA-graph safe.
- Elsewhere (the CPU, fp32) the same operator runs a reference: dense attention within each segment,
  one at a time, dropout from a seed it draws from torch's generator and keeps for the backward,
  which recomputes the forward from it. For tests and the CPU rehearsal, not for speed.

Both the forward and the backward are `torch.library.custom_op`s with fake (shape-only) kernels, so
a compiled model keeps them as single calls, and the autograd formula is registered on the forward.
"""

from __future__ import annotations

import torch

HALF = (torch.float16, torch.bfloat16)


def flash_fits(q: torch.Tensor) -> bool:
    """Whether the flash kernel takes q: CUDA, fp16/bf16, a head size it supports."""
    return q.is_cuda and q.dtype in HALF and q.shape[-1] % 8 == 0 and q.shape[-1] <= 256


def packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                     dropout_p: float) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v within each segment of cu_seqlens, dropout_p on the weights; [T, heads, D]."""
    out, *_ = torch.ops.bertctl.packed_attention(q, k, v, cu_seqlens, max_seqlen, dropout_p, q.shape[-1] ** -0.5)
    return out


@torch.library.custom_op("bertctl::packed_attention", mutates_args=())
def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
             dropout_p: float, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(output, log-sum-exp, rng state, unused): the flash kernel's, or the reference's (its seed as rng state)."""
    if flash_fits(q):
        out, lse, rng_state, unused, _ = torch.ops.aten._flash_attention_forward(
            q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, False, False, scale=scale)
        return out, lse, rng_state, unused
    seed = torch.randint(0, 2**62, (1,), dtype=torch.int64)  # torch's generator: seeded runs repeat
    with torch.no_grad():
        out = reference_attention(q, k, v, cu_seqlens, dropout_p, scale, int(seed))
    return out, q.new_empty(0), seed, q.new_empty(0)


@_forward.register_fake
def _(q, k, v, cu_seqlens, max_seqlen, dropout_p, scale):
    if flash_fits(q):  # the aten op's own meta kernel gives the flash shapes
        out, lse, rng_state, unused, _ = torch.ops.aten._flash_attention_forward(
            q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, False, False, scale=scale)
        return torch.empty_like(out), torch.empty_like(lse), torch.empty_like(rng_state), torch.empty_like(unused)
    return q.new_empty(q.shape), q.new_empty(0), torch.empty(1, dtype=torch.int64), q.new_empty(0)


@torch.library.custom_op("bertctl::packed_attention_backward", mutates_args=())
def _backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
              out: torch.Tensor, lse: torch.Tensor, rng_state: torch.Tensor, unused: torch.Tensor, max_seqlen: int,
              dropout_p: float, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if flash_fits(q):
        return torch.ops.aten._flash_attention_backward(
            grad_out.contiguous(), q, k, v, out, lse, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, False,
            rng_state, unused, scale=scale)
    return reference_attention_backward(grad_out, q, k, v, cu_seqlens, dropout_p, scale, int(rng_state))


@_backward.register_fake
def _(grad_out, q, k, v, cu_seqlens, out, lse, rng_state, unused, max_seqlen, dropout_p, scale):
    if flash_fits(q):  # the aten op's meta kernel: its gradients' layouts
        return tuple(torch.empty_like(g) for g in torch.ops.aten._flash_attention_backward(
            grad_out.contiguous(), q, k, v, out, lse, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, False,
            rng_state, unused, scale=scale))
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens, ctx.max_seqlen, ctx.dropout_p, ctx.scale = inputs
    out, lse, rng_state, unused = output
    ctx.save_for_backward(q, k, v, cu_seqlens, out, lse, rng_state, unused)


def _autograd_backward(ctx, grad_out, *_unused_grads):
    q, k, v, cu_seqlens, out, lse, rng_state, unused = ctx.saved_tensors
    dq, dk, dv = torch.ops.bertctl.packed_attention_backward(
        grad_out, q, k, v, cu_seqlens, out, lse, rng_state, unused, ctx.max_seqlen, ctx.dropout_p, ctx.scale)
    return dq, dk, dv, None, None, None, None


_forward.register_autograd(_autograd_backward, setup_context=_setup_context)


def reference_attention(q, k, v, cu_seqlens, dropout_p: float, scale: float, seed: int) -> torch.Tensor:
    """Attention within each segment of [T, heads, D], dropout's keep masks drawn, segment after segment, from
    a generator seeded with `seed`. In fp32, returned in q's dtype."""
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    for (start, end), dropped in zip(segments(cu_seqlens), _dropout_scales(q, cu_seqlens, dropout_p, seed)):
        weights = _softmax_weights(q[start:end], k[start:end], scale) * dropped
        out[start:end] = torch.einsum("hts,shd->thd", weights, v[start:end].float())
    return out.to(q.dtype).contiguous()  # the layout the fake kernel promises


def reference_attention_backward(grad_out, q, k, v, cu_seqlens, dropout_p: float, scale: float, seed: int):
    """The gradients of reference_attention, written out (an operator's kernel runs below autograd), segment by
    segment: with P the softmax weights and Z the dropout scale (keep / (1 - p), or 1),
    dV = (P Z)^T dO, dP = (dO V^T) Z, dS = P (dP - rowsum(dP P)), dQ = scale dS K, dK = scale dS^T Q."""
    grads = [torch.zeros(x.shape, dtype=torch.float32, device=x.device) for x in (q, k, v)]
    for (start, end), dropped in zip(segments(cu_seqlens), _dropout_scales(q, cu_seqlens, dropout_p, seed)):
        rows = slice(start, end)
        weights = _softmax_weights(q[rows], k[rows], scale)
        grad = grad_out[rows].float()
        grads[2][rows] = torch.einsum("hts,thd->shd", weights * dropped, grad)
        grad_weights = torch.einsum("thd,shd->hts", grad, v[rows].float()) * dropped
        grad_scores = weights * (grad_weights - (grad_weights * weights).sum(-1, keepdim=True))
        grads[0][rows] = torch.einsum("hts,shd->thd", grad_scores, k[rows].float()) * scale
        grads[1][rows] = torch.einsum("hts,thd->shd", grad_scores, q[rows].float()) * scale
    return tuple(g.to(x.dtype).contiguous() for g, x in zip(grads, (q, k, v)))


def segments(cu_seqlens: torch.Tensor) -> list[tuple[int, int]]:
    """(start, end) of every non-empty segment: the reference reads the offsets on the host (it runs on the CPU,
    or in fp32, which the fast step refuses on CUDA), and so holds one segment's weights at a time."""
    offsets = cu_seqlens.tolist()
    return [(start, end) for start, end in zip(offsets, offsets[1:]) if end > start]


def _softmax_weights(q, k, scale: float) -> torch.Tensor:
    """[heads, L, L] fp32 softmax of one segment's scaled scores."""
    return torch.softmax(torch.einsum("thd,shd->hts", q.float(), k.float()) * scale, dim=-1)


def _dropout_scales(q, cu_seqlens, dropout_p: float, seed: int):
    """keep / (1 - p) for every attention weight of each segment in turn (1.0 without dropout), the keep masks
    drawn in segment order from one generator seeded with `seed`: the backward draws the forward's masks again."""
    generator = torch.Generator(device=q.device).manual_seed(seed) if dropout_p else None
    for start, end in segments(cu_seqlens):
        if generator is None:
            yield 1.0
        else:
            keep = torch.rand((q.shape[1], end - start, end - start), generator=generator, device=q.device) >= dropout_p
            yield keep / (1.0 - dropout_p)
