"""The fast step's parts on the CPU: fixed-shape packed batches, the packed attention operator (its
reference kernel here; the flash kernel on a GPU, where one is present), and the fast step against
the reference step."""

import json

import numpy as np
import pytest
import torch

from trainer.config import ModelConfig
from trainer.data.batch import IGNORE, Capacity, CapacityError, collate, fixed_shape
from trainer.data.layout import Sample
from trainer.loop.fast_step import CompiledForward
from trainer.model.attention import per_sequence_attention
from trainer.model.bert import BertForPreTraining
from trainer.model.flash_varlen import packed_attention

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def sample(length: int, masked: int, rng: np.random.Generator, nsp: int = 0) -> Sample:
    ids = rng.integers(5, 500, length)
    positions = np.sort(rng.choice(np.arange(1, length), masked, replace=False))
    return Sample(input_ids=ids, segment_ids=(np.arange(length) >= length // 2).astype(np.int64),
                  masked_lm_positions=positions, masked_lm_ids=ids[positions], next_sentence_label=nsp)


def packed_samples(rng, lengths=(100, 20, 60, 128, 50)):
    return [sample(n, max(1, n // 7), rng, i % 2) for i, n in enumerate(lengths)]


# ---- fixed shapes ---------------------------------------------------------------------------------

def test_a_fixed_shape_batch_has_the_same_sizes_whatever_its_samples():
    rng = np.random.default_rng(0)
    cap = Capacity.of_packs(packs=3, max_seq_length=128, per_pack=3, max_predictions=20)
    shapes = set()
    for lengths in [(100, 20, 60, 128, 50), (128, 128, 7), (9,)]:
        batch = fixed_shape(collate(packed_samples(rng, lengths), unpadded=True), cap)
        shapes.add(tuple((name, tuple(getattr(batch, name).shape)) for name in (
            "input_ids", "segment_ids", "position_ids", "cu_seqlens", "mlm_positions", "mlm_labels", "nsp_labels",
            "first_tokens")))
        assert batch.max_seqlen == 128 and batch.static
    assert len(shapes) == 1
    assert dict(shapes.pop())["cu_seqlens"] == (cap.sequences + 3 + 1,)


def test_padding_tokens_form_segments_of_at_most_max_seqlen_and_every_row_is_covered():
    rng = np.random.default_rng(1)
    cap = Capacity.of_packs(packs=3, max_seq_length=128, per_pack=3, max_predictions=20)
    plain = collate(packed_samples(rng, (30, 9)), unpadded=True)  # 39 real tokens, 345 padding
    batch = fixed_shape(plain, cap)
    cu = batch.cu_seqlens.tolist()
    assert cu[:3] == [0, 30, 39] and cu[-1] == cap.tokens == 384
    segments = np.diff(cu)
    assert segments.min() >= 0 and segments.max() <= 128
    assert segments[2:5].tolist() == [128, 128, 89] and not segments[5:].any()  # the padding, then empty ones
    assert batch.position_ids.max() < 128 and batch.position_ids[39:167].tolist() == list(range(128))
    # the real part is the plain batch's, and the real counts stay on the host
    assert torch.equal(batch.input_ids[:39], plain.input_ids) and not batch.input_ids[39:].any()
    assert batch.num_sequences == 2 and batch.num_masked == plain.num_masked and batch.num_tokens == 39
    real = batch.mlm_labels != IGNORE
    assert real.sum() == plain.num_masked and torch.equal(batch.mlm_positions[real], plain.mlm_positions)
    assert (batch.nsp_labels != IGNORE).sum() == 2


@pytest.mark.parametrize("field,lengths,key", [
    ("sequences", (10,) * 10, "balance.pack_sequences"),
    ("tokens", (128,) * 4, "train.batch_size"),
])
def test_a_batch_past_a_bound_is_refused_naming_the_key(field, lengths, key):
    cap = Capacity.of_packs(packs=3, max_seq_length=128, per_pack=3, max_predictions=20)
    batch = collate(packed_samples(np.random.default_rng(2), lengths), unpadded=True)
    with pytest.raises(CapacityError, match=key) as raised:
        fixed_shape(batch, cap)
    assert field in str(raised.value) and "\n" not in str(raised.value)


# ---- the packed attention operator -----------------------------------------------------------------

def stream(device, dtype, lengths, heads=2, dim=16, seed=0):
    generator = torch.Generator().manual_seed(seed)
    tokens = sum(lengths)
    q, k, v = (torch.randn(tokens, heads, dim, generator=generator).to(device, dtype).requires_grad_() for _ in range(3))
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32, device=device)
    return q, k, v, cu


@pytest.mark.parametrize("device", DEVICES)
def test_packed_attention_equals_the_per_sequence_reference_forward_and_backward_empty_segments_included(device):
    dtype = torch.bfloat16 if device == "cuda" else torch.float32  # cuda: the flash kernel itself
    lengths = [37, 0, 64, 5, 0, 0, 22, 0]
    q, k, v, cu = stream(device, dtype, lengths)
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(9)).to(device, dtype)
    out = packed_attention(q, k, v, cu, 64, 0.0)
    got = torch.autograd.grad(out, (q, k, v), grad)
    real = [n for n in lengths if n]
    q32, k32, v32 = (x.detach().float().requires_grad_() for x in (q, k, v))
    ref = per_sequence_attention(q32, k32, v32, real, 0.0)
    want = torch.autograd.grad(ref, (q32, k32, v32), grad.float())
    tolerance = 2e-2 if dtype == torch.bfloat16 else 1e-5
    assert torch.isfinite(out).all()
    assert (out.float() - ref).abs().max() < tolerance
    for g, w in zip(got, want):
        assert (g.float() - w).abs().max() < tolerance


@pytest.mark.parametrize("device", DEVICES)
def test_attention_dropout_keeps_nine_in_ten_weights_and_its_backward_uses_the_forwards_mask(device):
    """Equal scores (q = 0) and v = 1: each output is the kept fraction of its row over 1 - p, so
    its mean is 1 and its variance p / ((1 - p) L); the gradient of sum(out) wrt v sums the same
    dropped weights, so it must add up to sum(out) exactly."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    length, p = 256, 0.1
    q = torch.zeros(2 * length, 2, 16, device=device, dtype=dtype, requires_grad=True)
    k = torch.zeros_like(q, requires_grad=True)
    v = torch.ones_like(q, requires_grad=True)
    cu = torch.tensor([0, length, 2 * length, 2 * length], dtype=torch.int32, device=device)
    out = packed_attention(q, k, v, cu, length, p)
    row = out[..., 0].float()
    assert abs(row.mean().item() - 1.0) < 0.01
    assert abs(row.var().item() / (p / ((1 - p) * length)) - 1.0) < 0.2
    out.sum().backward()
    assert torch.allclose(v.grad.float().sum(), out.float().sum(), rtol=1e-3)
    assert not torch.equal(out, packed_attention(q, k, v, cu, length, p))  # a fresh mask per call


# ---- the model on the fast step's batches --------------------------------------------------------

TINY = ModelConfig(num_layers=2, hidden_size=32, num_heads=2, intermediate_size=64, vocab_size=512,
                   max_position_embeddings=128, hidden_dropout=0.0, attention_dropout=0.0)


def loss_and_grads(forward, batch, model=None):
    """forward: the model (called with loss_sums=True) or a batch -> loss sums function of `model`."""
    model = model or forward
    model.zero_grad()
    mlm, nsp = forward(batch) if model is not forward else model(batch, loss_sums=True)
    (mlm / batch.num_masked + nsp / batch.num_sequences).backward()
    return mlm.item(), nsp.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("compiled", [False, True])
def test_the_fast_batch_gives_the_reference_steps_loss_and_gradients(compiled):
    """Eager, and compiled whole (aot_eager: AOT autograd's forward and backward graphs, run as traced)."""
    torch.manual_seed(0)
    model = BertForPreTraining(TINY, attention="per_sequence").train()
    samples = packed_samples(np.random.default_rng(3))
    plain = collate(samples, unpadded=True)
    fast = fixed_shape(plain, Capacity.of_packs(packs=4, max_seq_length=128, per_pack=3, max_predictions=20))
    forward = CompiledForward(model, backend="aot_eager") if compiled else (lambda batch: model(batch, loss_sums=True))
    reference, got = loss_and_grads(model, plain), loss_and_grads(forward, fast, model)
    assert got[0] == pytest.approx(reference[0], rel=1e-5) and got[1] == pytest.approx(reference[1], rel=1e-5)
    assert got[2].keys() == reference[2].keys()
    for name, grad in reference[2].items():
        assert (got[2][name] - grad).abs().max() <= 1e-5 * max(1.0, grad.abs().max().item()), name
    assert not compiled or forward.failed is None


def test_the_attention_operators_fake_kernels_and_autograd_agree_with_its_kernels():
    """torch.library.opcheck: schema, fake (shape) kernel against the real one, autograd registration."""
    q, k, v, cu = stream("cpu", torch.float32, [5, 0, 7, 4])
    torch.library.opcheck(torch.ops.bertctl.packed_attention.default, (q, k, v, cu, 7, 0.0, 0.25))


def test_one_compilation_serves_every_fast_batch():
    """Batches of different sequence counts, lengths and masked counts, trained under bf16 autocast with
    attention dropout: dynamo compiles the model once, forward and backward (AOT autograd with a
    backend that counts its graphs; the CPU's inductor is not needed for that)."""
    from torch._dynamo.backends.common import aot_autograd

    forwards, backwards = [], []

    def counting(into):
        return lambda graph, inputs: into.append(graph) or graph

    torch.manual_seed(0)
    model = BertForPreTraining(TINY.model_copy(update={"attention_dropout": 0.1})).train()
    forward = CompiledForward(model, backend=aot_autograd(fw_compiler=counting(forwards), bw_compiler=counting(backwards)))
    cap = Capacity.of_packs(packs=3, max_seq_length=128, per_pack=3, max_predictions=20)
    rng = np.random.default_rng(4)
    for lengths in [(100, 20, 60, 128, 50), (128, 128, 7), (9,), (64, 64, 64, 64, 30)]:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            mlm, nsp = forward(fixed_shape(collate(packed_samples(rng, lengths), unpadded=True), cap))
        (mlm + nsp).backward()
        assert torch.isfinite(mlm) and torch.isfinite(nsp)
    assert forward.failed is None and len(forwards) == len(backwards) == 1
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


# ---- the trainer -----------------------------------------------------------------------------------

def trained_losses(tmp_path, monkeypatch, step: str) -> list[float]:
    """Losses of 4 packed steps of the tiny synthetic run (dropout off) after a warm-up pass, in-process."""
    from gloo import free_port
    from synthetic import tiny_run_config

    from trainer.config import load_run_config
    from trainer.loop.entry import RunArgs
    from trainer.loop.train import Trainer
    from trainer.parallel import distributed

    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    config = tiny_run_config(tmp_path / step, balance={"packing": True, "pack_sequences": 3, "pack_average": 2,
                                                       "pack_window": 64},
                             model={"hidden_dropout": 0.0, "attention_dropout": 0.0},
                             runtime={"unpad": True, "step": step, "nccl_warmup_steps": 1},  # the warm-up's batch too
                             optim={"max_steps": 4}, train={"global_batch_size": 16, "eval_every_samples": 10**6,
                                                            "target_accuracy": 0.99})
    cfg = load_run_config(str(config))
    assert cfg.fast_step == (step == "fast")
    trainer = Trainer(cfg, RunArgs(config=str(config), out=str(tmp_path / step / "out")))
    try:
        assert trainer.run() == 0
    finally:
        trainer.close()
        distributed.close()
    metrics = (tmp_path / step / "out" / "metrics" / "run_0.jsonl").read_text().splitlines()
    return [json.loads(line)["loss"] for line in metrics]


def test_the_trainers_fast_step_trains_like_its_reference_step(tmp_path, monkeypatch):
    reference = trained_losses(tmp_path, monkeypatch, "reference")
    fast = trained_losses(tmp_path, monkeypatch, "fast")
    assert len(fast) == len(reference) == 4
    assert fast == pytest.approx(reference, rel=1e-4)


# ---- configuration -------------------------------------------------------------------------------

def run_config(**runtime):
    from trainer.config import RunConfig

    raw = {"world_size": 1, "data": {"train_dir": "/data"}, "optim": {"lr": 1e-3, "max_steps": 100},
           "train": {"batch_size": 4, "global_batch_size": 8, "max_samples_termination": 1000},
           "balance": {"packing": True, "pack_sequences": 3, "pack_average": 2}, "runtime": {"unpad": True, **runtime},
           "mlperf": {"division": "open"}}  # a tiny model: the closed division's BERT-large rules do not apply
    return RunConfig.model_validate(raw)


@pytest.mark.parametrize("runtime,fast", [
    ({"device": "cuda", "precision": "bf16"}, True),  # auto: CUDA, half precision, packed with a bound
    ({"device": "cuda", "precision": "fp16"}, True),
    ({"device": "cuda", "precision": "fp32"}, False),  # no flash kernel in fp32
    ({}, False),  # the CPU
    ({"step": "fast"}, True),  # asked for: the CPU runs its reference kernels (the tests above)
    ({"device": "cuda", "precision": "bf16", "step": "reference"}, False),
])
def test_auto_takes_the_fast_step_where_it_can_run(runtime, fast):
    assert run_config(**runtime).fast_step is fast


@pytest.mark.parametrize("runtime,message", [
    ({"cuda_graph": True}, "runtime.cuda_graph: CUDA graphs need runtime.device: cuda; set runtime.cuda_graph: false"),
    ({"device": "cuda", "precision": "bf16", "step": "reference", "cuda_graph": True},
     "runtime.cuda_graph: graphs replay the fast step only"),
    ({"device": "cuda", "precision": "fp16", "cuda_graph": True}, "runtime.cuda_graph: fp16's loss scaling decides on the host"),
    ({"device": "cuda", "precision": "fp32", "step": "fast"},
     "runtime.precision: fp32 cannot run the flash kernel of runtime.step: fast on CUDA: set bf16 (or fp16), or set "
     "runtime.step: reference"),
])
def test_a_fast_step_setting_the_device_cannot_run_is_refused_naming_the_key_and_the_fix(runtime, message):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        run_config(**runtime)


def test_the_fast_step_without_packing_is_one_line_from_bertctl():
    from orchestrator.config.clusters import load_cluster
    from orchestrator.errors import UserError

    with pytest.raises(UserError) as raised:
        load_cluster("local", ["run.runtime.step=fast", "run.balance.stratified=false", "run.balance.bin_quotas=null"])
    assert str(raised.value).endswith("run.runtime.step: fast runs fixed-shape packed micro-batches: set balance.packing: "
                                      "true, or set runtime.step: reference")
    assert "\n" not in str(raised.value)


def test_a_pack_bound_is_needed():
    from pydantic import ValidationError

    from trainer.config import RunConfig

    raw = run_config().model_dump(mode="json")
    raw["balance"]["pack_sequences"] = None
    raw["runtime"]["step"] = "fast"
    with pytest.raises(ValidationError, match="balance.pack_sequences: the fast step needs a bound on sequences per pack"):
        RunConfig.model_validate(raw)
