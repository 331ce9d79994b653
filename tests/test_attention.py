"""Variable-length attention: every backend against the per-sequence reference, and the selection rules."""


import numpy as np
import pytest
import torch

from trainer.model.attention import (
    AttentionUnavailable,
    check_attention,
    cpu_dropout_attention,
    flash_attn_installed,
    nested_attention,
    padded_attention,
    per_sequence_attention,
    resolve_backend,
    varlen_attention,
)
from trainer.model.dropout import dropout, dropout_noise, dropout_threshold

HEADS, DIM = 4, 16
LENGTHS = [1, 512, 37, 2, 300, 128, 1, 77]  # incl. the shortest and the longest BERT sequence


def packed(lengths, seed=0, requires_grad=True):
    """q, k, v as a packed stream [T, heads, D] and their int32 offsets."""
    gen = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    q, k, v = (torch.randn(total, HEADS, DIM, generator=gen, requires_grad=requires_grad) for _ in range(3))
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return q, k, v, cu_seqlens


def nested(q, k, v, cu_seqlens, dropout_p=0.0):
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    return nested_attention(q, k, v, cu_seqlens, max(lengths), min(lengths), dropout_p)


def test_the_reference_equals_masked_attention_on_the_padded_batch():
    q, k, v, cu = packed(LENGTHS[:5], requires_grad=False)
    width = max(LENGTHS[:5])
    padded = [torch.zeros(len(LENGTHS[:5]), width, HEADS, DIM) for _ in range(3)]
    mask = torch.zeros(len(LENGTHS[:5]), width, dtype=torch.bool)
    for b, (start, end) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        for dst, src in zip(padded, (q, k, v)):
            dst[b, : end - start] = src[start:end]
        mask[b, : end - start] = True
    out = padded_attention(*(x.transpose(1, 2) for x in padded), mask, 0.0).transpose(1, 2)
    torch.testing.assert_close(per_sequence_attention(q, k, v, LENGTHS[:5], 0.0), out[mask], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("lengths", [LENGTHS, [512], [1]], ids=["mixed", "one-long", "one-token"])
def test_nested_forward_and_gradients_equal_the_reference(lengths):
    q, k, v, cu = packed(lengths)
    grad_out = torch.randn(sum(lengths), HEADS, DIM, generator=torch.Generator().manual_seed(9))
    results = []
    for attention in (lambda: per_sequence_attention(q, k, v, lengths, 0.0), lambda: nested(q, k, v, cu)):
        out = attention()
        assert out.shape == q.shape
        results.append((out, *torch.autograd.grad(out, (q, k, v), grad_out)))
    for ours, reference in zip(results[1], results[0]):
        torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-6)


def uniform_attention_inputs(lengths):
    """q = k = 0 makes every attention weight 1/L; v = L makes each output row L * (sum of the
    kept weights) / (1 - p): times (1 - p) it counts the keys that dropout kept."""
    q, k, v, cu = packed(lengths, requires_grad=False)
    q, k = torch.zeros_like(q), torch.zeros_like(k)
    v = torch.cat([torch.full((n, HEADS, DIM), float(n)) for n in lengths])
    return q, k, v, cu


@pytest.mark.parametrize("backend", ["nested", "per_sequence"])
def test_dropout_drops_at_its_rate_and_repeats_under_a_seed(backend):
    p, lengths = 0.25, [300, 200, 1]
    q, k, v, cu = uniform_attention_inputs(lengths)

    def run(seed):
        torch.manual_seed(seed)
        return varlen_attention(q, k, v, cu, max(lengths), p, backend, lengths)

    out = run(0)
    kept = out[..., 0] * (1 - p)  # [T, heads]: keys kept per query row
    torch.testing.assert_close(kept, kept.round(), rtol=0, atol=1e-3)
    assert (kept[:300] < 300).all() and (kept[:300] > 0).all()  # some dropped, some kept in every row
    kept_share = kept[:300].sum() / (300 * 300 * HEADS)
    assert abs(kept_share - (1 - p)) < 0.01
    assert torch.equal(run(0), out) and not torch.equal(run(1), out)


def test_nested_dropout_trains():
    q, k, v, cu = packed(LENGTHS)
    torch.manual_seed(0)
    nested(q, k, v, cu, dropout_p=0.1).square().sum().backward()
    assert all(x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0 for x in (q, k, v))


HALF = (torch.float16, torch.bfloat16)


@pytest.mark.parametrize("flash_attn", [True, False], ids=["flash_attn-installed", "no-flash_attn"])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_auto_takes_the_first_fused_kernel_for_the_device_and_dtype(flash_attn, device, dtype):
    chosen = resolve_backend("auto", device, dtype, 64, flash_attn)
    if device == "cuda" and dtype in HALF:
        assert chosen == ("flash_attn" if flash_attn else "nested")
    elif device == "cuda":  # fp32: flash_attn has no fp32 kernel, torch's memory-efficient one does
        assert chosen == "nested"
    else:  # measured: on the CPU one dense SDPA per sequence beats the nested math fallback
        assert chosen == "per_sequence"


@pytest.mark.parametrize("head_dim", [60, 512])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_auto_skips_nested_where_torchs_kernels_cannot_take_the_head_size(head_dim, dtype):
    assert resolve_backend("auto", "cuda", dtype, head_dim, False) == "per_sequence"


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("requested", ["nested", "per_sequence"])
def test_torch_native_choices_run_everywhere(device, requested):
    assert resolve_backend(requested, device, torch.float32, 64, False) == requested


@pytest.mark.parametrize("flash_attn, device, dtype, message", [
    (False, "cuda", torch.bfloat16, "runtime.attention: flash_attn needs the flash_attn package (pip install flash-attn); or set runtime.attention: auto"),
    (True, "cpu", torch.bfloat16, "runtime.attention: flash_attn needs CUDA in fp16/bf16 (runtime.device: cuda, runtime.precision: bf16 or fp16), not cpu bfloat16"),
    (True, "cuda", torch.float32, "not cuda float32; or set runtime.attention: auto"),
])
def test_an_explicit_flash_attn_that_cannot_run_says_why_in_one_line(flash_attn, device, dtype, message):
    with pytest.raises(AttentionUnavailable, match="^runtime.attention: flash_attn needs ") as raised:
        resolve_backend("flash_attn", device, dtype, 64, flash_attn)
    assert message in str(raised.value) and "\n" not in str(raised.value)
    assert isinstance(raised.value, ValueError)


def test_unknown_backend_and_the_preflight_check():
    with pytest.raises(AttentionUnavailable, match=r"^runtime.attention: expected one of auto, flash_attn, nested, per_sequence, got 'flash'$"):
        check_attention("flash", "cpu", "fp32")
    assert check_attention("auto", "cpu", "fp32") == "per_sequence"
    if not flash_attn_installed():
        with pytest.raises(AttentionUnavailable, match="pip install flash-attn"):
            check_attention("flash_attn", "cuda", "bf16")
    else:
        assert check_attention("flash_attn", "cuda", "bf16") == "flash_attn"


def test_varlen_attention_on_the_cpu_refuses_an_explicit_flash_attn():
    q, k, v, cu = packed([3, 4], requires_grad=False)
    with pytest.raises(AttentionUnavailable, match="^runtime.attention: flash_attn needs"):
        varlen_attention(q, k, v, cu, 4, 0.0, "flash_attn", [3, 4])


def test_the_cpu_dropout_path_is_the_reference_when_nothing_is_dropped():
    q, k, v, cu = packed(LENGTHS)
    lengths = (cu[1:] - cu[:-1]).tolist()
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(2))
    ours = cpu_dropout_attention(q, k, v, lengths, 1e-9)  # rounds to 0 of 65536: keeps everything
    reference = per_sequence_attention(q, k, v, lengths, 0.0)
    torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-6)
    for a, b in zip(torch.autograd.grad(ours, (q, k, v), grad_out), torch.autograd.grad(reference, (q, k, v), grad_out)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def reference_dropout_attention(q, k, v, lengths, p, seed):
    """The maths written out, one sequence after another, sequence i's mask from the stream (seed, i)."""
    outputs = []
    for i, (qs, ks, vs) in enumerate(zip(q.split(lengths), k.split(lengths), v.split(lengths))):
        qs, ks, vs = (x.transpose(0, 1) for x in (qs, ks, vs))
        weights = torch.softmax(qs @ ks.transpose(1, 2) / qs.shape[-1] ** 0.5, dim=-1)
        kept = dropout_noise(weights.numel(), p, seed=(seed, i)).view(weights.shape)
        outputs.append(((weights * kept) @ vs).transpose(0, 1))
    return torch.cat(outputs)


def attention_and_grads(q, k, v, lengths, grad_out, seed=7):
    torch.manual_seed(seed)
    out = cpu_dropout_attention(q, k, v, lengths, 0.1)
    return (out, *torch.autograd.grad(out, (q, k, v), grad_out))


def test_the_cpu_dropout_path_drops_each_sequence_with_its_own_stream_forward_and_backward():
    q, k, v, cu = packed(LENGTHS)
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(2))
    ours = attention_and_grads(q, k, v, LENGTHS, grad_out)
    torch.manual_seed(7)
    seed = int(torch.randint(0, 2**62, (1,)))
    expected = reference_dropout_attention(q, k, v, LENGTHS, 0.1, seed)
    expected = (expected, *torch.autograd.grad(expected, (q, k, v), grad_out))
    for a, b in zip(ours, expected):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    undropped = per_sequence_attention(q, k, v, LENGTHS, 0.0)
    assert (ours[0] - undropped).abs().max() > 0.1  # the masks were applied


def test_the_cpu_dropout_path_under_bf16_autocast_keeps_the_masks_and_follows_fp32():
    """CPU training in bf16: the GEMMs run in bf16, the same masks fall as in fp32."""
    q, k, v, cu = packed([40, 3, 17])
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(2))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = attention_and_grads(q, k, v, [40, 3, 17], grad_out)
    full = attention_and_grads(q, k, v, [40, 3, 17], grad_out)
    assert low[0].dtype == torch.bfloat16 and all(g.dtype == torch.float32 for g in low[1:])
    for a, b in zip(low, full):
        torch.testing.assert_close(a.float(), b, rtol=0.02, atol=0.05)  # bf16 is 0.015 off; another mask, over 1
    assert not torch.equal(low[0].float(), full[0])  # it did run in bf16


def test_the_fast_mask_keeps_the_sixteen_bit_lane_rule():
    """Lanes of the 64-bit draws below the threshold are dropped (the rule written with torch ops)."""
    lanes = torch.from_numpy(np.random.PCG64DXSM(11).random_raw(2500).view(np.int64)).view(torch.int16)[:9999]
    threshold, kept = dropout_threshold(0.1)
    expected = torch.where(lanes < threshold, 0.0, torch.tensor(1 / kept, dtype=torch.float32).item())
    assert torch.equal(dropout_noise(9999, 0.1, seed=11), expected)
    assert torch.equal(dropout_noise(9999, 0.1, torch.bfloat16, seed=11), expected.bfloat16())


def test_the_cheap_mask_rounds_p_to_sixteen_bits_and_keeps_the_expectation():
    assert dropout_threshold(0.1) == (6554 - 32768, 1 - 6554 / 65536)
    assert dropout_threshold(0.0) == (-32768, 1.0)  # nothing is below the smallest int16
    torch.manual_seed(0)
    noise = dropout_noise(4_000_001, 0.1, torch.bfloat16)
    assert noise.dtype == torch.bfloat16 and noise.shape == (4_000_001,)
    assert set(noise.unique().float().tolist()) == {0.0, torch.tensor(65536 / 58982, dtype=torch.bfloat16).item()}
    assert abs((noise == 0).float().mean().item() - 6554 / 65536) < 5e-4
    assert abs(noise.float().mean().item() - 1.0) < 2e-3  # bf16's scale is 1.1111 to 3 digits


def test_bf16_on_the_cpu_runs_every_torch_backend():
    q, k, v, cu = (x.detach().bfloat16() if x.is_floating_point() else x for x in packed([5, 9, 1]))
    reference = per_sequence_attention(q.float(), k.float(), v.float(), [5, 9, 1], 0.0)
    for backend in ("nested", "per_sequence"):
        out = varlen_attention(q, k, v, cu, 9, 0.0, backend, [5, 9, 1])
        assert out.dtype == torch.bfloat16
        torch.testing.assert_close(out.float(), reference, rtol=2e-2, atol=2e-2)
        assert varlen_attention(q, k, v, cu, 9, 0.1, backend, [5, 9, 1]).dtype == torch.bfloat16


def test_cheap_hidden_dropout_drops_scales_and_repeats():
    x = torch.ones(1000, 1000)
    torch.manual_seed(0)
    y = dropout(x, 0.1, training=True)
    kept = 1 - 6554 / 65536
    assert set(y.unique().tolist()) == {0.0, torch.tensor(1 / kept).item()}
    assert abs((y == 0).float().mean().item() - 0.1) < 2e-3 and abs(y.mean().item() - 1.0) < 3e-3
    torch.manual_seed(0)
    assert torch.equal(dropout(x, 0.1, training=True), y)
    assert dropout(x, 0.1, training=False) is x and dropout(x, 0.0, training=True) is x


def test_a_checkpoints_rng_state_repeats_the_dropout_masks_and_successive_masks_differ():
    """The masks' bits come from numpy's generator seeded by torch's: restoring the RNG state a
    checkpoint saves (trainer/checkpoints/run.py) must give the resumed step the same masks."""
    from trainer.checkpoints.run import rng_state, set_rng_state

    x = torch.ones(300, 300)
    torch.manual_seed(3)
    dropout(x, 0.1, training=True)
    saved = rng_state()
    masks = [dropout(x, 0.1, training=True) for _ in range(3)]
    assert not torch.equal(masks[0], masks[1]) and not torch.equal(masks[1], masks[2])
    torch.manual_seed(99)  # whatever ran in between
    set_rng_state(saved)
    assert all(torch.equal(dropout(x, 0.1, training=True), mask) for mask in masks)


def test_a_run_asking_for_flash_attn_on_the_cpu_stops_before_training_naming_the_key():
    from trainer.config import RuntimeConfig
    from trainer.parallel.distributed import LaunchError, check_kernels

    check_kernels(RuntimeConfig(attention="per_sequence", compile=True), torch.device("cpu"))
    with pytest.raises(LaunchError, match="^runtime.attention: flash_attn needs ") as raised:
        check_kernels(RuntimeConfig(attention="flash_attn"), torch.device("cpu"))
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("unpadded", [True, False], ids=["unpadded", "padded"])
def test_a_batch_knows_its_lengths_and_tokens_on_the_host(unpadded):
    """What a step needs to know of a batch (the lengths for attention, the token count for the
    progress line) is a host integer set when the batch is made: reading it back from the device
    would stall the GPU's queue once per layer or per step."""
    from trainer.data.batch import collate
    from trainer.data.layout import Sample

    lengths = [7, 3, 12]
    samples = [Sample(np.arange(5, 5 + n), np.zeros(n, np.int64), np.array([1]), np.array([9]), 0) for n in lengths]
    batch = collate(samples, unpadded=unpadded).to("meta")  # a device that cannot be read back
    assert batch.seqlens == (7, 3, 12) and batch.min_seqlen == 3 and batch.max_seqlen == 12
    assert batch.num_tokens == 22 and batch.num_sequences == 3 and batch.num_masked == 3


def test_given_lengths_spare_the_per_sequence_path_reading_the_offsets():
    q, k, v, cu = packed([5, 9, 1], requires_grad=False)
    unreadable = torch.empty(4, dtype=torch.int32, device="meta")
    out = varlen_attention(q, k, v, unreadable, 9, 0.0, "per_sequence", [5, 9, 1])
    torch.testing.assert_close(out, varlen_attention(q, k, v, cu, 9, 0.0, "per_sequence"))
