"""Optimizers and learning-rate schedules as the MLPerf BERT submissions use them.

- Parameter groups: no weight decay for biases and LayerNorm parameters (names containing `bias`,
  `gamma`, `beta` or `LayerNorm`), `weight_decay` for the rest.
- LAMB (NVIDIA, closed division): Adam moments with bias correction and decoupled weight decay,
  then a per-tensor trust ratio ||p|| / ||update|| applied only to tensors that are decayed.
  Multi-tensor (`torch._foreach_*`); apex's FusedLAMB when asked for and importable.
- Adam (Samsung, open division): AdamW semantics (decoupled decay); torch's fused/foreach kernels,
  apex's FusedAdam when asked for and importable.
- Schedules: `nvidia_lr` (warmup then linear decay measured from step 0, as the reference) and
  `samsung_lr` (decay measured from the end of warmup over lr_max_steps, clamped to end_lr).
  Both are functions of the 1-based index of the update, which does not advance on skipped steps.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from trainer.config import OptimConfig

NO_DECAY = ("bias", "gamma", "beta", "LayerNorm")


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if any(k in name for k in NO_DECAY) else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


class Lamb(torch.optim.Optimizer):
    """LAMB with MLPerf's conventions (no clipping inside; see trainer/gradients.py for that)."""

    def __init__(self, params, lr: float, betas=(0.9, 0.999), eps: float = 1e-6, weight_decay: float = 0.01):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            beta1, beta2 = group["betas"]
            grads = [p.grad for p in params]
            states = [self._state(p) for p in params]
            for s in states:
                s["step"] += 1
            step = states[0]["step"]
            exp_avg = [s["exp_avg"] for s in states]
            exp_avg_sq = [s["exp_avg_sq"] for s in states]
            torch._foreach_lerp_(exp_avg, grads, 1 - beta1)  # m = b1 m + (1 - b1) g
            torch._foreach_mul_(exp_avg_sq, beta2)
            torch._foreach_addcmul_(exp_avg_sq, grads, grads, 1 - beta2)  # v = b2 v + (1 - b2) g^2
            denom = torch._foreach_sqrt(exp_avg_sq)
            torch._foreach_div_(denom, math.sqrt(1 - beta2**step))
            torch._foreach_add_(denom, group["eps"])
            update = torch._foreach_div(exp_avg, denom)
            torch._foreach_div_(update, 1 - beta1**step)  # m_hat / (sqrt(v_hat) + eps)
            wd = group["weight_decay"]
            if wd != 0:
                torch._foreach_add_(update, params, alpha=wd)
                ratios = self._trust_ratios(params, update)
                torch._foreach_mul_(update, ratios)
            torch._foreach_add_(params, update, alpha=-group["lr"])

    @staticmethod
    def _trust_ratios(params, update) -> list[torch.Tensor]:
        """||p|| / ||u|| per tensor, 1 where either norm is zero."""
        p_norms = torch._foreach_norm(params)
        u_norms = torch._foreach_norm(update)
        return [torch.where((pn > 0) & (un > 0), pn / un, torch.ones_like(pn)) for pn, un in zip(p_norms, u_norms)]

    def _state(self, p):
        state = self.state[p]
        if not state:
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return state


def build_optimizer(model: nn.Module, cfg: OptimConfig, use_apex: bool, device_type: str) -> torch.optim.Optimizer:
    groups = parameter_groups(model, cfg.weight_decay)
    if use_apex:
        fused = _apex_optimizer(cfg, groups)
        if fused is not None:
            return fused
    if cfg.name == "lamb":
        return Lamb(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.epsilon, weight_decay=cfg.weight_decay)
    fused = device_type == "cuda"
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.epsilon, weight_decay=cfg.weight_decay,
                             fused=fused or None, foreach=None if fused else True)


def _apex_optimizer(cfg: OptimConfig, groups):
    try:
        from apex.optimizers import FusedAdam, FusedLAMB  # type: ignore
    except ImportError:
        return None
    if cfg.name == "lamb":
        # max_grad_norm=0: clipping happens before the allreduce (trainer/gradients.py), not in LAMB
        return FusedLAMB(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.epsilon, weight_decay=cfg.weight_decay,
                         max_grad_norm=0.0, use_nvlamb=False)
    return FusedAdam(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.epsilon, weight_decay=cfg.weight_decay, adam_w_mode=True)


def nvidia_lr(update: int, cfg: OptimConfig) -> float:
    """NVIDIA / reference: t = update; linear warmup from start_warmup_step, then 1 - t/T decay from 0."""
    base, total = cfg.lr, cfg.schedule_horizon
    warmup, start = cfg.warmup_steps, cfg.start_warmup_step
    if warmup == 0:
        warmup, start = int(total * cfg.warmup_proportion), 0
    offset = 1 if start == 0 else 0
    m = update - offset - start
    if m < warmup:
        return base * m / (warmup + 1e-6)
    return base * (1.0 - min((update - offset) / total, 1.0))


def samsung_lr(update: int, cfg: OptimConfig) -> float:
    """Samsung v1.1: warmup from start_warmup_step; decay measured from the end of warmup, clamped.

    Its scheduler was stepped once at start-up and again before each update, so the first two
    updates both use t = 2; the decay progress is negative right after warmup, which makes the LR
    peak above the base LR (about 1.144x at update 66 for the 128x8 recipe).
    """
    t = max(update, 2)
    base, end = cfg.lr, cfg.end_lr
    total, warmup, start = cfg.schedule_horizon, cfg.warmup_steps, cfg.start_warmup_step
    if t > total:
        return end
    if t - start < warmup:
        return base * (t - start) / warmup
    progress = min((t - warmup) / (total - warmup), 1.0)
    return (base - end) * (1.0 - progress) + end


def learning_rate(update: int, cfg: OptimConfig) -> float:
    return samsung_lr(update, cfg) if cfg.schedule == "samsung" else nvidia_lr(update, cfg)


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def take_step(optimizer: torch.optim.Optimizer, scaler: "torch.amp.GradScaler | None") -> bool:
    """Step, or skip when loss-scaled gradients overflowed (the scale then drops). True if skipped.

    Skipped steps do not advance the update counter, so the LR schedule repeats that update's LR.
    """
    if scaler is None:
        optimizer.step()
        return False
    before = scaler.get_scale()
    scaler.step(optimizer)
    scaler.update()
    return scaler.get_scale() < before
