"""The BERT model against Hugging Face's: same weights -> same logits and loss, padded and unpadded."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pytest
import torch
import yaml

from trainer.config import ModelConfig
from trainer.data.batch import collate
from trainer.data.layout import Sample
from trainer.model.attention import AttentionUnavailable
from trainer.model.bert import BertForPreTraining, count_parameters, pretraining_loss_sums
from trainer.model.weights import WeightsError, load_pretrained, tf_variable_names

if TYPE_CHECKING:
    from transformers import BertForPreTraining as HFBert

# vocab 1001 is not a multiple of 8: our decoder is padded to 1008 and sliced back
SMALL = dict(num_layers=2, hidden_size=64, num_heads=4, intermediate_size=256, vocab_size=1001, max_position_embeddings=128)


def hf_model(cfg: ModelConfig) -> HFBert:
    # imported here: transformers' BERT costs ~6 CPU-seconds, paid only by the process that runs these tests
    from transformers import BertConfig
    from transformers import BertForPreTraining as HFBert

    torch.manual_seed(0)
    hf_cfg = BertConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
                        num_attention_heads=cfg.num_heads, intermediate_size=cfg.intermediate_size,
                        max_position_embeddings=cfg.max_position_embeddings, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0, attn_implementation="eager")
    return HFBert(hf_cfg).eval()


def random_samples(n: int, vocab: int, max_len: int, seed: int = 0) -> list[Sample]:
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(n):
        length = int(rng.integers(6, max_len + 1))
        ids = rng.integers(5, vocab, length)
        ids[0] = 2
        seg = (np.arange(length) >= length // 2).astype(np.int64)
        k = int(rng.integers(1, max(2, length // 6)))
        pos = np.sort(rng.choice(np.arange(1, length), size=k, replace=False))
        samples.append(Sample(ids, seg, pos, rng.integers(5, vocab, k), int(rng.integers(0, 2))))
    return samples


def hf_outputs(hf: HFBert, samples: list[Sample]):
    batch = collate(samples, unpadded=False)
    labels = torch.full(batch.input_ids.shape, -100)
    labels.view(-1)[batch.mlm_positions] = batch.mlm_labels
    out = hf(input_ids=batch.input_ids, token_type_ids=batch.segment_ids, attention_mask=batch.attention_mask.long(),
             labels=labels, next_sentence_label=batch.nsp_labels)
    return out.prediction_logits.reshape(-1, hf.config.vocab_size)[batch.mlm_positions], out.seq_relationship_logits, out.loss


@pytest.mark.parametrize("unpadded", [False, True], ids=["padded", "unpadded"])
def test_same_logits_and_loss_as_hugging_face(unpadded):
    cfg = ModelConfig(**SMALL, hidden_dropout=0.0, attention_dropout=0.0)
    hf = hf_model(cfg)
    ours = BertForPreTraining(cfg).eval()
    load_pretrained(ours, hf.state_dict(), "hf")
    samples = random_samples(7, cfg.vocab_size, cfg.max_position_embeddings)
    batch = collate(samples, unpadded=unpadded)
    with torch.no_grad():
        mlm, nsp = ours(batch)
        hf_mlm, hf_nsp, hf_loss = hf_outputs(hf, samples)
        mlm_sum, nsp_sum = pretraining_loss_sums(mlm, nsp, batch)
    loss = mlm_sum / batch.num_masked + nsp_sum / batch.num_sequences
    assert mlm.shape == (batch.num_masked, cfg.vocab_size)
    torch.testing.assert_close(mlm, hf_mlm, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(nsp, hf_nsp, rtol=1e-5, atol=1e-5)
    assert abs(loss.item() - hf_loss.item()) / hf_loss.item() < 1e-5


def test_padded_and_unpadded_paths_agree_in_training_mode_gradients():
    cfg = ModelConfig(**SMALL, hidden_dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(1)
    model = BertForPreTraining(cfg)
    samples = random_samples(5, cfg.vocab_size, 100, seed=3)
    grads = []
    for unpadded in (False, True):
        model.zero_grad()
        batch = collate(samples, unpadded=unpadded)
        mlm_sum, nsp_sum = pretraining_loss_sums(*model(batch), batch)
        (mlm_sum + nsp_sum).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-5)


def test_bert_large_shape_and_the_398_mlperf_tensor_names():
    import mlperf_logging

    with torch.device("meta"):  # shapes and names only: no 1.3 GB of weights initialised on the CPU
        large = BertForPreTraining(ModelConfig())
    assert large.bert.embeddings.word_embeddings.weight.shape == (30528, 1024)
    assert 335_000_000 < count_parameters(large) < 336_500_000  # 336.2 M incl. the padded vocabulary rows
    rules = yaml.safe_load(open(f"{mlperf_logging.__path__[0]}/compliance_checker/training_1.1.0/closed_bert.yaml"))
    end_check = next(r["END"]["CHECK"] for r in rules if "END" in r)
    expected = sorted(eval(end_check.split("==", 1)[1].strip()))
    assert len(expected) == 398 and sorted(tf_variable_names(large)) == expected


def test_loading_checks_names_and_shapes_and_pads_the_vocabulary():
    cfg = ModelConfig(**SMALL)
    hf = hf_model(cfg)
    state = {("module." + k): v for k, v in hf.state_dict().items()}  # a DDP-prefixed checkpoint
    ours = BertForPreTraining(cfg)
    load_pretrained(ours, state)
    word = ours.bert.embeddings.word_embeddings.weight
    assert word.shape[0] == 1008 and torch.equal(word[:1001], hf.bert.embeddings.word_embeddings.weight)
    assert torch.count_nonzero(word[1001:]) == 0 and ours.cls.predictions.decoder.weight is word
    bad = dict(hf.state_dict())
    bad["bert.encoder.layer.0.attention.self.query.weight"] = torch.zeros(3, 3)
    with pytest.raises(WeightsError, match=r"bert.encoder.layer.0.attention.self.query.weight has shape \(3, 3\)"):
        load_pretrained(ours, bad, "ckpt.pt")
    extra = dict(hf.state_dict(), **{"bert.encoder.layer.9.output.dense.weight": torch.zeros(1)})
    with pytest.raises(WeightsError, match="layer.9.output.dense.weight does not exist in this model"):
        load_pretrained(ours, extra, "ckpt.pt")


def training_step(model, samples, unpadded=True):
    """Loss and all gradients of one step (no optimizer)."""
    model.zero_grad()
    batch = collate(samples, unpadded=unpadded)
    mlm_sum, nsp_sum = pretraining_loss_sums(*model(batch), batch)
    loss = mlm_sum / batch.num_masked + nsp_sum / batch.num_sequences
    loss.backward()
    return loss.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])


@pytest.mark.parametrize("attention", ["nested", "per_sequence", "auto"])
def test_every_attention_backend_trains_like_the_padded_model(attention):
    cfg = ModelConfig(**SMALL, hidden_dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(1)
    padded = BertForPreTraining(cfg)
    ours = BertForPreTraining(cfg, attention=attention)
    ours.load_state_dict(padded.state_dict())
    samples = random_samples(6, cfg.vocab_size, cfg.max_position_embeddings, seed=4)
    samples[1] = Sample(samples[1].input_ids[:1], samples[1].segment_ids[:1], np.array([0]), samples[1].masked_lm_ids[:1], 0)
    loss, grads = training_step(ours, samples)
    padded_loss, padded_grads = training_step(padded, samples, unpadded=False)
    torch.testing.assert_close(loss, padded_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grads, padded_grads, rtol=1e-4, atol=1e-5)


def test_an_unknown_attention_backend_is_refused_when_the_model_is_built():
    with pytest.raises(AttentionUnavailable, match="^runtime.attention: expected one of auto, flash_attn, nested, per_sequence, got 'sdpa'$"):
        BertForPreTraining(ModelConfig(**SMALL), attention="sdpa")


def test_compiled_pointwise_kernels_train_like_eager_and_still_drop_out():
    cfg = ModelConfig(**SMALL, hidden_dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(2)
    eager = BertForPreTraining(cfg)
    compiled = BertForPreTraining(cfg, compile=True)
    compiled.load_state_dict(eager.state_dict())
    for seed in (0, 1):  # two token counts: one compiled graph with a dynamic length
        samples = random_samples(5, cfg.vocab_size, 100, seed=seed)
        loss, grads = training_step(compiled, samples)
        eager_loss, eager_grads = training_step(eager, samples)
        torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(grads, eager_grads, rtol=1e-4, atol=1e-5)
    assert compiled.bert.encoder.layer[0].output.pointwise.failed is None
    dropping = BertForPreTraining(ModelConfig(**SMALL, hidden_dropout=0.5, attention_dropout=0.0), compile=True)
    dropping.load_state_dict(eager.state_dict())
    batch = collate(samples, unpadded=True)
    with torch.no_grad():
        torch.manual_seed(0)
        first = dropping(batch)[0]
        torch.manual_seed(0)
        again = dropping(batch)[0]
        without = dropping.eval()(batch)[0]
    assert torch.equal(first, again) and not torch.allclose(first, without, atol=1e-3)


def test_a_compiler_failure_falls_back_to_eager_with_one_warning_line_where_the_run_allows_it(monkeypatch, capfd):
    import torch._inductor.config as inductor

    monkeypatch.setattr(inductor.cpp, "cxx", ("/nonexistent/g++",))
    monkeypatch.setattr(inductor, "fx_graph_cache", False)  # a cached kernel would need no compiler
    torch.compiler.reset()
    cfg = ModelConfig(**SMALL, hidden_dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(3)
    eager = BertForPreTraining(cfg)
    compiled = BertForPreTraining(cfg, compile=True, compile_fallback=True)  # runtime.compile_fallback: eager
    compiled.load_state_dict(eager.state_dict())
    samples = random_samples(4, cfg.vocab_size, 60, seed=5)
    for _ in range(2):
        loss, grads = training_step(compiled, samples)
    torch.compiler.reset()
    eager_loss, eager_grads = training_step(eager, samples)
    torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grads, eager_grads, rtol=1e-4, atol=1e-5)
    lines = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
    assert lines == ["warning: torch.compile of the encoder's pointwise tails failed (InvalidCxxCompiler: No working C++ "
                     "compiler found in torch._inductor.config.cpp.cxx: ('/nonexistent/g++',)); runtime.compile_fallback: "
                     "eager runs it eager"]


def test_the_pointwise_tails_keep_the_gemms_half_precision_under_autocast():
    """Under autocast the GEMM output is bf16 and the bias fp32: the tails add the bias in bf16, as
    the eager nn.Linear does, instead of promoting the whole activation to fp32."""
    from trainer.model.bert import bias_dropout_residual_layer_norm, bias_gelu

    x, bias = torch.randn(4, 8, dtype=torch.bfloat16), torch.randn(8)
    assert bias_gelu(x, bias).dtype == torch.bfloat16
    normed = bias_dropout_residual_layer_norm(x, bias, x, torch.ones(8), torch.zeros(8), 1e-12, 0.0, False)
    assert normed.dtype == torch.bfloat16


def test_a_backward_that_fails_to_compile_falls_back_to_eager_too(capfd):
    """torch compiles a backward lazily, at the first .backward(), outside the guarded forward: the
    trial pass must meet the failure inside the guard, or training would crash instead."""
    from torch._dynamo.backends.common import aot_autograd  # torch 2.13 (pinned)

    from trainer.model.bert import Pointwise

    def broken_backward(graph, inputs):
        raise RuntimeError("no backward kernel today")

    torch.compiler.reset()
    pointwise = Pointwise(compile=True, backend=aot_autograd(fw_compiler=lambda graph, inputs: graph, bw_compiler=broken_backward),
                          fallback=True)
    x, bias = torch.randn(6, 8, requires_grad=True), torch.randn(8, requires_grad=True)
    out = pointwise.bias_gelu(x, bias)
    out.sum().backward()  # eager's backward: no compiled one left to fail here
    torch.compiler.reset()
    torch.testing.assert_close(out, torch.nn.functional.gelu(x + bias))
    assert pointwise.failed == "RuntimeError: no backward kernel today"
    assert capfd.readouterr().err.count("warning: torch.compile of the encoder's pointwise tails failed") == 1


def test_a_compiler_failure_ends_the_run_in_one_line_by_default(monkeypatch):
    """runtime.compile_fallback: error (the default): a rank that ran eager would be ~14 % slower and set the
    pace of all, so the failure is an error naming both keys, raised at the first forward (the warm-up's)."""
    import torch._inductor.config as inductor

    from trainer.model.compiled import CompileFailed

    monkeypatch.setattr(inductor.cpp, "cxx", ("/nonexistent/g++",))
    monkeypatch.setattr(inductor, "fx_graph_cache", False)
    torch.compiler.reset()
    cfg = ModelConfig(**SMALL, hidden_dropout=0.0, attention_dropout=0.0)
    model = BertForPreTraining(cfg, compile=True)
    with pytest.raises(CompileFailed) as raised:
        training_step(model, random_samples(2, cfg.vocab_size, 30, seed=6))
    torch.compiler.reset()
    assert str(raised.value) == ("runtime.compile: torch.compile of the encoder's pointwise tails failed (InvalidCxxCompiler: No "
                                 "working C++ compiler found in torch._inductor.config.cpp.cxx: ('/nonexistent/g++',)); set "
                                 "runtime.compile: false, or runtime.compile_fallback: eager to run it eager")


def test_the_compile_trial_builds_the_graph_training_then_uses():
    """The trial's copies keep Parameter-ness and requires_grad, which dynamo guards on: the real
    call reuses the trial's graph (one compilation), so its backward was compiled inside the guard."""
    from trainer.model.bert import Pointwise

    graphs = []

    def counting(graph, inputs):
        graphs.append(graph)
        return graph.forward

    torch.compiler.reset()
    pointwise = Pointwise(compile=True, backend=counting)
    x, bias = torch.randn(6, 8, requires_grad=True), torch.nn.Parameter(torch.randn(8))
    pointwise.bias_gelu(x, bias).sum().backward()
    torch.compiler.reset()
    assert len(graphs) == 1 and pointwise.failed is None


def test_the_fused_decoder_cross_entropy_equals_torchs_with_gradients():
    """LinearCrossEntropySum never forms the logits' gradient: its loss and the gradients of the
    hidden states, the (tied, padded) decoder weight and the bias must still be torch's."""
    from trainer.model.mlm_loss import LinearCrossEntropySum, fused_fits, masked_lm_loss_sum

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(300, 64, generator=gen)
    weight = torch.randn(1008, 64, generator=gen)  # 1001 real rows, padded to 1008; logits up to ~30
    bias = torch.randn(1008, generator=gen)
    labels = torch.randint(0, 1001, (300,), generator=gen)
    labels[:40] = 7  # a label many rows share: its bias and weight rows sum 40 one-hot terms
    results = []
    for fused in (True, False):
        leaves = [t.clone().requires_grad_() for t in (x, weight, bias)]
        if fused:
            assert fused_fits(leaves[0], leaves[1])
            loss = masked_lm_loss_sum(*leaves, 1001, labels)
        else:
            logits = torch.nn.functional.linear(leaves[0], leaves[1][:1001], leaves[2][:1001])
            loss = torch.nn.functional.cross_entropy(logits, labels, reduction="sum")
        results.append((loss, *torch.autograd.grad(loss * 0.37, leaves)))
    (loss, *grads), (reference, *reference_grads) = results
    torch.testing.assert_close(loss, reference, rtol=1e-6, atol=1e-3)
    for name, grad, expected in zip(("x", "weight", "bias"), grads, reference_grads):
        torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}")
    assert torch.count_nonzero(grads[1][1001:]) == 0 and torch.count_nonzero(grads[2][1001:]) == 0
    # only the gradients asked for are computed; the others stay None
    frozen = LinearCrossEntropySum.apply(x.clone().requires_grad_(), weight[:1001], bias[:1001], labels)
    assert frozen.grad_fn is not None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not fused_fits(x, weight)  # autocast changes the GEMM: torch's path runs


def test_the_fused_decoder_reuses_its_logits_buffer_but_never_one_in_flight():
    """A backward gives its logits buffer back and the next forward writes into it; two forwards
    before their backwards each get their own, so both backwards still see their own logits."""
    from trainer.model.mlm_loss import masked_lm_loss_sum

    gen = torch.Generator().manual_seed(1)
    weight, bias = torch.randn(500, 32, generator=gen).requires_grad_(), torch.zeros(500, requires_grad=True)
    inputs = [(torch.randn(rows, 32, generator=gen), torch.randint(0, 500, (rows,), generator=gen)) for rows in (90, 80, 100)]

    def reference(x, labels):
        loss = torch.nn.functional.cross_entropy(x @ weight.t() + bias, labels, reduction="sum")
        return torch.autograd.grad(loss, (weight, bias))

    def buffer_of(loss):
        return loss.grad_fn.buffer.data_ptr()

    first = masked_lm_loss_sum(inputs[0][0], weight, bias, 500, inputs[0][1])
    second = masked_lm_loss_sum(inputs[1][0], weight, bias, 500, inputs[1][1])  # first still in flight
    assert buffer_of(first) != buffer_of(second)
    reused = buffer_of(first)
    for (x, labels), loss in zip(inputs, (first, second)):
        for grad, expected in zip(torch.autograd.grad(loss, (weight, bias)), reference(x, labels)):
            torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-5)
    # both were given back; a forward that fits takes one of them instead of new memory
    third = masked_lm_loss_sum(inputs[0][0][:70], weight, bias, 500, inputs[0][1][:70])
    assert buffer_of(third) in (reused, buffer_of(second))
    for grad, expected in zip(torch.autograd.grad(third, (weight, bias)), reference(inputs[0][0][:70], inputs[0][1][:70])):
        torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-5)


def test_training_loss_sums_equal_the_logits_path_with_gradients():
    """model(batch, loss_sums=True) (fused on the CPU) against cross-entropy of model(batch)'s
    logits, dropout on: the same masks, so the same loss and the same gradients."""
    cfg = ModelConfig(**SMALL)
    torch.manual_seed(2)
    model = BertForPreTraining(cfg).train()
    batch = collate(random_samples(6, cfg.vocab_size, 100, seed=4), unpadded=True)
    results = []
    for fused in (True, False):
        model.zero_grad()
        torch.manual_seed(5)
        sums = model(batch, loss_sums=True) if fused else pretraining_loss_sums(*model(batch), batch)
        (sums[0] / batch.num_masked + sums[1] / batch.num_sequences).backward()
        results.append((torch.stack(sums).detach(), torch.cat([p.grad.flatten() for p in model.parameters()])))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-6, atol=1e-4)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-4, atol=1e-6)
