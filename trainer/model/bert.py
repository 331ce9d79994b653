"""BERT for pretraining (masked LM + next-sentence prediction), with Hugging Face's parameter names.

The module tree mirrors `transformers.BertForPreTraining` (bert.embeddings / bert.encoder.layer.N
/ bert.pooler / cls.predictions / cls.seq_relationship), so its state dicts, NVIDIA's converted
phase-1 checkpoint and ours are interchangeable. What makes it fast where it matters:

- the MLM head (transform + 30k-vocabulary decoder) runs only on the masked positions, gathered
  before the head, instead of on every position;
- given an unpadded batch (a packed token stream with sequence offsets) the embeddings, every
  linear layer and the attention see real tokens only; `attention` picks the variable-length
  kernel (trainer/model/attention.py);
- `compile=True` runs the encoder layers' pointwise tails (bias + GELU; bias + dropout + residual
  + LayerNorm) as torch.compile'd fused kernels; a failure to compile ends the run, or with
  `compile_fallback` the model runs eager after one warning line (trainer/model/compiled.py).

The decoder uses the vocabulary padded to a multiple of 8, sliced back to the real vocabulary
(trainer/model/mlm_loss.py), so the padded rows never take part in the softmax. In training
(`forward(batch, loss_sums=True)`) the CPU runs the decoder and its cross-entropy as one fused
function, and dropout there draws its masks cheaply (trainer/model/dropout.py): on a CPU, those passes
over large tensors cost as much as the GEMMs' remainder.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trainer.config import ModelConfig
from trainer.data.batch import IGNORE, Batch
from trainer.model.apex_kernels import apex_missing
from trainer.model.attention import check_backend_name, padded_attention, varlen_attention
from trainer.model.compiled import Guarded
from trainer.model.dropout import dropout
from trainer.model.flash_varlen import packed_attention
from trainer.model.mlm_loss import masked_lm_loss_sum, vocab_logits


def layer_norm(hidden: int, eps: float, fused: bool) -> nn.Module:
    """apex's FusedLayerNorm when asked for and usable (same parameters), else torch's."""
    if fused and apex_missing() is None:
        from apex.normalization import FusedLayerNorm  # type: ignore

        return FusedLayerNorm(hidden, eps=eps)
    return nn.LayerNorm(hidden, eps=eps)


class BertEmbeddings(nn.Module):
    def __init__(self, cfg: ModelConfig, fused: bool):
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.padded_vocab_size, cfg.hidden_size)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.LayerNorm = layer_norm(cfg.hidden_size, cfg.layer_norm_eps, fused)
        self.dropout = nn.Dropout(cfg.hidden_dropout)

    def forward(self, input_ids, segment_ids, position_ids):
        x = self.word_embeddings(input_ids) + self.position_embeddings(position_ids) + self.token_type_embeddings(segment_ids)
        return dropout(self.LayerNorm(x), self.dropout.p, self.training)


class BertSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: str):
        super().__init__()
        self.backend = backend
        self.heads = cfg.num_heads
        self.head_dim = cfg.hidden_size // cfg.num_heads
        self.dropout_p = cfg.attention_dropout
        self.query = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.key = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.value = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor, batch: Batch) -> torch.Tensor:
        dropout = self.dropout_p if self.training else 0.0
        if batch.static:  # the fast step's fixed-shape stream (trainer/loop/fast_step.py)
            return self.fused_qkv_attention(x, batch, dropout)
        if batch.unpadded:  # x: [T, H]
            q, k, v = (proj(x).view(-1, self.heads, self.head_dim) for proj in (self.query, self.key, self.value))
            out = varlen_attention(q, k, v, batch.cu_seqlens, batch.max_seqlen, dropout, self.backend, batch.seqlens)
            return out.reshape(x.shape)
        b, length, hidden = x.shape  # x: [B, L, H]
        q, k, v = (proj(x).view(b, length, self.heads, self.head_dim).transpose(1, 2) for proj in (self.query, self.key, self.value))
        return padded_attention(q, k, v, batch.attention_mask, dropout).transpose(1, 2).reshape(b, length, hidden)

    def fused_qkv_attention(self, x: torch.Tensor, batch: Batch, dropout: float) -> torch.Tensor:
        """Q, K and V from one GEMM ([T, H] x [H, 3H]) over weights concatenated per call: the
        parameters keep Hugging Face's names and shapes (query, key, value), and the concatenation,
        3H x H, is small beside the [T, 3H] activations it spares two extra reads of x for. Swapped
        layers (FP8: trainer/model/fp8.py) are called one by one, each GEMM theirs."""
        projections = (self.query, self.key, self.value)
        if not all(map(plain, projections)):
            q, k, v = (proj(x).view(-1, self.heads, self.head_dim) for proj in projections)
        else:
            weight = torch.cat([p.weight for p in projections])
            bias = torch.cat([p.bias for p in projections])
            q, k, v = F.linear(x, weight, bias).view(-1, 3, self.heads, self.head_dim).unbind(1)
        return packed_attention(q, k, v, batch.cu_seqlens, batch.max_seqlen, dropout).reshape(x.shape)


def plain(linear: nn.Module) -> bool:
    """Whether a fused path may take this layer's weights and run its GEMM itself: a plain nn.Linear. A
    subclass (torchao's FP8 Linear, runtime.fp8) is called instead, so its GEMM is its own."""
    return type(linear) is nn.Linear


class Pointwise:
    """The encoder layers' pointwise tails, eager or torch.compile'd; one instance per model.

    Compiled, each is one fused kernel forward and one backward instead of 3-4 passes over the
    activations. A failure to compile (no C++ compiler, an unsupported op, ...) follows the run's rule
    (trainer/model/compiled.py: an error, or with `fallback` the whole model eager from then on after one
    warning line). torch compiles a backward only when it first runs, outside any forward, so the first
    call of each function is a trial forward and backward on copies of its inputs (the RNG state restored
    after it): both compilations fail, or not, inside the guard.
    """

    def __init__(self, compile: bool, backend="inductor", fallback: bool = False):
        self.compiled = compile
        self.eager = {f.__name__: f for f in (bias_gelu, bias_dropout_residual_layer_norm)}
        # shapes dynamic: the token count changes every step
        self.functions = {name: torch.compile(f, dynamic=True, backend=backend) for name, f in self.eager.items()} if compile else {}
        self.tried: set[str] = set()  # the compiled functions whose trial passed
        self.guard = Guarded(self._compiled_call, self._eager_call, "the encoder's pointwise tails", fallback)

    @property
    def failed(self) -> str | None:
        """Why compiling failed; None while it has not."""
        return self.guard.failed

    def bias_gelu(self, x, bias):
        return self.guard("bias_gelu", x, bias)

    def bias_dropout_residual_layer_norm(self, x, bias, residual, norm: nn.Module, p: float, training: bool):
        return self.guard("bias_dropout_residual_layer_norm", x, bias, residual, norm.weight, norm.bias, norm.eps, p, training)

    def _compiled_call(self, name: str, *args):
        compiled = self.functions[name]
        if name not in self.tried:
            _trial_forward_backward(compiled, args)
            self.tried.add(name)
        return compiled(*args)

    def _eager_call(self, name: str, *args):
        return self.eager[name](*args)


def _trial_forward_backward(function, args) -> None:
    """Run function and its backward on detached copies of the tensor arguments. The copies keep
    each argument's type (Parameter or not) and requires_grad: dynamo guards on both, and a trial
    graph that differs from the real one would leave the real backward's compilation unguarded."""
    copies = [_copy_like(a) if isinstance(a, torch.Tensor) else a for a in args]
    devices = [a.device for a in copies if isinstance(a, torch.Tensor) and a.device.type == "cuda"][:1]
    with torch.random.fork_rng(devices=devices), torch.enable_grad():
        function(*copies).float().sum().backward()


def _copy_like(tensor: torch.Tensor) -> torch.Tensor:
    copy = tensor.detach().clone()
    if isinstance(tensor, nn.Parameter):
        return nn.Parameter(copy, requires_grad=tensor.requires_grad)
    return copy.requires_grad_(tensor.requires_grad)


# bias.to(x.dtype): under autocast x is the GEMM's bf16/fp16 output and the bias fp32 (the eager
# nn.Linear adds it in the GEMM's dtype); x + bias would promote the whole activation to fp32
def bias_gelu(x, bias):
    return F.gelu(x + bias.to(x.dtype))


def bias_dropout_residual_layer_norm(x, bias, residual, weight, norm_bias, eps: float, p: float, training: bool):
    return F.layer_norm(F.dropout(x + bias.to(x.dtype), p, training) + residual, weight.shape, weight, norm_bias, eps)


class BertSelfOutput(nn.Module):
    """dense -> dropout -> LayerNorm(x + residual); also the shape of BertOutput."""

    def __init__(self, cfg: ModelConfig, fused: bool, width: int, pointwise: Pointwise):
        super().__init__()
        self.dense = nn.Linear(width, cfg.hidden_size)
        self.LayerNorm = layer_norm(cfg.hidden_size, cfg.layer_norm_eps, fused)
        self.dropout = nn.Dropout(cfg.hidden_dropout)
        self.pointwise = pointwise

    def forward(self, x, residual):
        if self.pointwise.compiled and plain(self.dense):
            return self.pointwise.bias_dropout_residual_layer_norm(
                F.linear(x, self.dense.weight), self.dense.bias, residual, self.LayerNorm, self.dropout.p, self.training)
        return self.LayerNorm(dropout(self.dense(x), self.dropout.p, self.training) + residual)


class BertAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, fused: bool, backend: str, pointwise: Pointwise):
        super().__init__()
        self.self = BertSelfAttention(cfg, backend)
        self.output = BertSelfOutput(cfg, fused, cfg.hidden_size, pointwise)

    def forward(self, x, batch):
        return self.output(self.self(x, batch), x)


class BertIntermediate(nn.Module):
    def __init__(self, cfg: ModelConfig, pointwise: Pointwise):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.pointwise = pointwise

    def forward(self, x):
        if self.pointwise.compiled and plain(self.dense):
            return self.pointwise.bias_gelu(F.linear(x, self.dense.weight), self.dense.bias)
        return F.gelu(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, fused: bool, backend: str, pointwise: Pointwise):
        super().__init__()
        self.attention = BertAttention(cfg, fused, backend, pointwise)
        self.intermediate = BertIntermediate(cfg, pointwise)
        self.output = BertSelfOutput(cfg, fused, cfg.intermediate_size, pointwise)

    def forward(self, x, batch):
        x = self.attention(x, batch)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, cfg: ModelConfig, fused: bool, backend: str, pointwise: Pointwise):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(cfg, fused, backend, pointwise) for _ in range(cfg.num_layers))

    def forward(self, x, batch):
        for layer in self.layer:
            x = layer(x, batch)
        return x


class BertPooler(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, first_token_states):
        return torch.tanh(self.dense(first_token_states))


class BertModel(nn.Module):
    def __init__(self, cfg: ModelConfig, fused: bool, backend: str = "auto", pointwise: Pointwise | None = None):
        super().__init__()
        self.embeddings = BertEmbeddings(cfg, fused)
        self.encoder = BertEncoder(cfg, fused, backend, pointwise or Pointwise(compile=False))
        self.pooler = BertPooler(cfg)

    def forward(self, batch: Batch) -> torch.Tensor:
        """Hidden states flattened over tokens: [B * L, H] padded, [T, H] unpadded."""
        if batch.unpadded:
            positions = batch.position_ids
        else:
            positions = torch.arange(batch.input_ids.shape[1], device=batch.input_ids.device).expand_as(batch.input_ids)
        x = self.embeddings(batch.input_ids, batch.segment_ids, positions)
        x = self.encoder(x, batch)
        return x.reshape(-1, x.shape[-1])


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, cfg: ModelConfig, fused: bool):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.LayerNorm = layer_norm(cfg.hidden_size, cfg.layer_norm_eps, fused)

    def forward(self, x):
        return self.LayerNorm(F.gelu(self.dense(x)))


class BertLMPredictionHead(nn.Module):
    def __init__(self, cfg: ModelConfig, fused: bool, word_embeddings: nn.Embedding):
        super().__init__()
        self.transform = BertPredictionHeadTransform(cfg, fused)
        self.decoder = nn.Linear(cfg.hidden_size, cfg.padded_vocab_size, bias=False)
        self.decoder.weight = word_embeddings.weight  # tied, as in BERT
        self.bias = nn.Parameter(torch.zeros(cfg.padded_vocab_size))
        self.vocab_size = cfg.vocab_size

    def forward(self, x):
        return vocab_logits(self.transform(x), self.decoder.weight, self.bias, self.vocab_size)

    def loss_sum(self, x, labels):
        """The summed cross-entropy of the logits forward(x) would give (fused on the CPU)."""
        return masked_lm_loss_sum(self.transform(x), self.decoder.weight, self.bias, self.vocab_size, labels)


class BertPreTrainingHeads(nn.Module):
    def __init__(self, cfg: ModelConfig, fused: bool, word_embeddings: nn.Embedding):
        super().__init__()
        self.predictions = BertLMPredictionHead(cfg, fused, word_embeddings)
        self.seq_relationship = nn.Linear(cfg.hidden_size, 2)


class BertForPreTraining(nn.Module):
    """forward(batch) -> (MLM logits at the masked positions [M, vocab], NSP logits [S, 2]);
    forward(batch, loss_sums=True) -> their summed cross-entropies (what training backpropagates).

    fused_kernels: apex's FusedLayerNorm where importable (runtime.kernels: apex);
    attention: the variable-length attention backend, runtime.attention (auto | flash_attn |
    nested | per_sequence); an unknown name or flash_attn without the package raises
    AttentionUnavailable here, a device/dtype that cannot run the choice at the first forward;
    compile: torch.compile the encoder layers' pointwise tails (runtime.compile); compile_fallback: run them
    eager if that fails (runtime.compile_fallback: eager) instead of raising CompileFailed.
    """

    def __init__(self, cfg: ModelConfig, fused_kernels: bool = False, attention: str = "auto", compile: bool = False,
                 compile_fallback: bool = False):
        super().__init__()
        check_backend_name(attention)
        self.config = cfg
        self.bert = BertModel(cfg, fused_kernels, attention, Pointwise(compile, fallback=compile_fallback))
        self.cls = BertPreTrainingHeads(cfg, fused_kernels, self.bert.embeddings.word_embeddings)
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        """BERT's initialisation: normal(0, 0.02) weights, zero biases, unit LayerNorm."""
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, nn.LayerNorm) or type(module).__name__ == "FusedLayerNorm":
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    def forward(self, batch: Batch, loss_sums: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(MLM logits, NSP logits), or with loss_sums their summed cross-entropies against the
        batch's labels: the form training uses, where the CPU never forms the MLM logits' gradient."""
        hidden = self.bert(batch)
        nsp_logits = self.cls.seq_relationship(self.bert.pooler(hidden[batch.first_tokens]))
        masked = hidden[batch.mlm_positions]
        if loss_sums and batch.static:  # the padding slots' labels are IGNORE
            mlm = F.cross_entropy(self.cls.predictions(masked).float(), batch.mlm_labels, ignore_index=IGNORE, reduction="sum")
            return mlm, nsp_loss_sum(nsp_logits, batch)
        if loss_sums:
            return self.cls.predictions.loss_sum(masked, batch.mlm_labels), nsp_loss_sum(nsp_logits, batch)
        return self.cls.predictions(masked), nsp_logits


def pretraining_loss_sums(mlm_logits, nsp_logits, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed (not averaged) cross-entropies of given logits: the caller divides by the global counts."""
    return F.cross_entropy(mlm_logits.float(), batch.mlm_labels, reduction="sum"), nsp_loss_sum(nsp_logits, batch)


def nsp_loss_sum(nsp_logits, batch: Batch) -> torch.Tensor:
    return F.cross_entropy(nsp_logits.float(), batch.nsp_labels, ignore_index=IGNORE, reduction="sum")


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights are counted once


def training_flops(cfg: ModelConfig, tokens: float, squared_lengths: float, masked: float) -> float:
    """Training FLOPs (forward + backward = 3x forward) of sequences with `tokens` real tokens in all,
    `squared_lengths` the sum of their lengths squared (attention grows with each sequence's length
    squared: from the mean length it would be undercounted) and `masked` masked positions."""
    h, i, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers
    linear = layers * (4 * h * h + 2 * h * i) * tokens
    attention = layers * 2 * h * squared_lengths
    head = masked * (h * h + h * cfg.padded_vocab_size)
    return 3 * 2 * (linear + attention + head)


def flops_per_sequence(cfg: ModelConfig, seq_len: float, masked: float) -> float:
    """Training FLOPs for one sequence of `seq_len` real tokens."""
    return training_flops(cfg, seq_len, seq_len * seq_len, masked)
