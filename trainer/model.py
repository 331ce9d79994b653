"""BERT for pretraining (masked LM + next-sentence prediction), with Hugging Face's parameter names.

The module tree mirrors `transformers.BertForPreTraining` (bert.embeddings / bert.encoder.layer.N
/ bert.pooler / cls.predictions / cls.seq_relationship), so its state dicts, NVIDIA's converted
phase-1 checkpoint and ours are interchangeable. Two things make it fast where it matters:

- the MLM head (transform + 30k-vocabulary decoder) runs only on the masked positions, gathered
  before the head, instead of on every position;
- given an unpadded batch (a packed token stream with sequence offsets) the embeddings, every
  linear layer and the attention see real tokens only.

The decoder uses the vocabulary padded to a multiple of 8; logits are sliced back to the real
vocabulary so the padded rows never take part in the softmax.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trainer.attention import padded_attention, varlen_attention
from trainer.config import ModelConfig
from trainer.data.batch import Batch


def layer_norm(hidden: int, eps: float, fused: bool) -> nn.Module:
    """apex's FusedLayerNorm when asked for and importable (same parameters), else torch's."""
    if fused:
        try:
            from apex.normalization import FusedLayerNorm  # type: ignore

            return FusedLayerNorm(hidden, eps=eps)
        except ImportError:
            pass
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
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.heads = cfg.num_heads
        self.head_dim = cfg.hidden_size // cfg.num_heads
        self.dropout_p = cfg.attention_dropout
        self.query = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.key = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.value = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor, batch: Batch) -> torch.Tensor:
        dropout = self.dropout_p if self.training else 0.0
        if batch.unpadded:  # x: [T, H]
            q, k, v = (proj(x).view(-1, self.heads, self.head_dim) for proj in (self.query, self.key, self.value))
            return varlen_attention(q, k, v, batch.cu_seqlens, batch.max_seqlen, dropout).reshape(x.shape)
        b, length, hidden = x.shape  # x: [B, L, H]
        q, k, v = (proj(x).view(b, length, self.heads, self.head_dim).transpose(1, 2) for proj in (self.query, self.key, self.value))
        return padded_attention(q, k, v, batch.attention_mask, dropout).transpose(1, 2).reshape(b, length, hidden)


class BertSelfOutput(nn.Module):
    """dense -> dropout -> LayerNorm(x + residual); also the shape of BertOutput."""

    def __init__(self, cfg: ModelConfig, fused: bool, width: int):
        super().__init__()
        self.dense = nn.Linear(width, cfg.hidden_size)
        self.LayerNorm = layer_norm(cfg.hidden_size, cfg.layer_norm_eps, fused)
        self.dropout = nn.Dropout(cfg.hidden_dropout)

    def forward(self, x, residual):
        return self.LayerNorm(self.dropout(self.dense(x)) + residual)


class BertAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, fused: bool):
        super().__init__()
        self.self = BertSelfAttention(cfg)
        self.output = BertSelfOutput(cfg, fused, cfg.hidden_size)

    def forward(self, x, batch):
        return self.output(self.self(x, batch), x)


class BertIntermediate(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x):
        return F.gelu(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, fused: bool):
        super().__init__()
        self.attention = BertAttention(cfg, fused)
        self.intermediate = BertIntermediate(cfg)
        self.output = BertSelfOutput(cfg, fused, cfg.intermediate_size)

    def forward(self, x, batch):
        x = self.attention(x, batch)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, cfg: ModelConfig, fused: bool):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(cfg, fused) for _ in range(cfg.num_layers))

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
    def __init__(self, cfg: ModelConfig, fused: bool):
        super().__init__()
        self.embeddings = BertEmbeddings(cfg, fused)
        self.encoder = BertEncoder(cfg, fused)
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
        logits = self.decoder(self.transform(x)) + self.bias
        return logits[:, : self.vocab_size]


class BertPreTrainingHeads(nn.Module):
    def __init__(self, cfg: ModelConfig, fused: bool, word_embeddings: nn.Embedding):
        super().__init__()
        self.predictions = BertLMPredictionHead(cfg, fused, word_embeddings)
        self.seq_relationship = nn.Linear(cfg.hidden_size, 2)


class BertForPreTraining(nn.Module):
    """forward(batch) -> (MLM logits at the masked positions [M, vocab], NSP logits [S, 2])."""

    def __init__(self, cfg: ModelConfig, fused_kernels: bool = False):
        super().__init__()
        self.config = cfg
        self.bert = BertModel(cfg, fused_kernels)
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

    def forward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.bert(batch)
        pooled = self.bert.pooler(hidden[batch.first_tokens])
        mlm_logits = self.cls.predictions(hidden[batch.mlm_positions])
        return mlm_logits, self.cls.seq_relationship(pooled)


def pretraining_loss_sums(mlm_logits, nsp_logits, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed (not averaged) cross-entropies: the caller divides by the global counts."""
    mlm = F.cross_entropy(mlm_logits.float(), batch.mlm_labels, reduction="sum")
    nsp = F.cross_entropy(nsp_logits.float(), batch.nsp_labels, reduction="sum")
    return mlm, nsp


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights are counted once


def flops_per_sequence(cfg: ModelConfig, seq_len: float, masked: float) -> float:
    """Training FLOPs (forward + backward = 3x forward) for one sequence of `seq_len` real tokens."""
    h, i, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers
    linear = layers * (4 * h * h + 2 * h * i) * seq_len
    attention = layers * 2 * h * seq_len * seq_len
    head = masked * (h * h + h * cfg.padded_vocab_size)
    return 3 * 2 * (linear + attention + head)
