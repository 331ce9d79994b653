"""Optimizers and learning-rate schedules as the MLPerf BERT submissions use them.

- Parameter groups: no weight decay for biases and LayerNorm parameters (names containing `bias`,
  `gamma`, `beta` or `LayerNorm`), `weight_decay` for the rest.
- `optim.name` picks a builder from one table (`BUILDERS`); apex variants exist only for the names in
  `APEX_BUILDERS`, and a name in neither is an error, never a silent fallback to another optimizer.
- LAMB (NVIDIA, closed division): Adam moments with bias correction and decoupled weight decay,
  then a per-tensor trust ratio ||p|| / ||update|| applied only to tensors that are decayed.
  Multi-tensor (`torch._foreach_*`) with no host sync, fused by torch.compile with runtime.compile
  (`Lamb.compile_update`); apex's FusedLAMB when asked for and importable.
- Adam (Samsung, open division): AdamW semantics (decoupled decay); torch's fused kernel on CUDA and
  the CPU, foreach elsewhere; apex's FusedAdam when asked for and importable.
- MADGRAD and ACClip: the trial optimizers of Samsung's v1.1 `optim/` folder (open division only, as is
  Adam: trainer/config/closed_rules.py::CLOSED_OPTIMIZERS).
  MADGRAD comes from its authors' `madgrad` package; ACClip is written here from its paper (`ACClip`).
- Clipping is never done inside an optimizer (trainer/parallel/gradients.py clips before the step), and every
  optimizer reads `group["lr"]` at each step, which `set_learning_rate` writes before each update.
- Schedules: `nvidia_lr` (warmup then linear decay measured from step 0, as the reference) and
  `samsung_lr` (decay measured from the end of warmup over lr_max_steps, clamped to end_lr).
  Both are functions of the 1-based index of the update, which does not advance on skipped steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from mlperf_logging.mllog import constants as K
from torch import nn

from trainer.config import OptimConfig
from trainer.model.apex_kernels import apex_missing
from trainer.model.compiled import Guarded

NO_DECAY = ("bias", "gamma", "beta", "LayerNorm")


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if any(k in name for k in NO_DECAY) else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


class Lamb(torch.optim.Optimizer):
    """LAMB with MLPerf's conventions (no clipping inside; see trainer/parallel/gradients.py for that).

    Eager, the update is a chain of multi-tensor (`torch._foreach_*`) kernels, each a pass over every
    parameter (~13 passes over BERT-large's 335 M fp32 values, 11 ms a step on an H200). `compile_update`
    (runtime.compile) runs the same function (`lamb_update_`) through torch.compile, which fuses the chain
    into a few kernels; its step count and learning rate are then 0-d device tensors, so the schedule
    changes no compiled constant (one compilation per parameter group for the whole run) and nothing is
    read back to the host: the update can be captured in a CUDA graph. Both keep `state["step"]` per
    parameter, an int eager and a float64 device tensor compiled, and either takes the other's state.
    """

    def __init__(self, params, lr: float, betas=(0.9, 0.999), eps: float = 1e-6, weight_decay: float = 0.01):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.compiled = False
        self.update: Callable = lamb_update_
        self._lr: dict[int, torch.Tensor] = {}  # compiled: each group's learning rate on its device

    def compile_update(self, fallback: bool = False, backend: str | Callable = "inductor") -> "Lamb":
        """From the next step on, the update runs compiled (trainer/model/compiled.py's rule on a failure:
        an error, or with `fallback` eager)."""
        self.compiled = True
        # fullgraph: a graph break would mean a host value in the update (a sync per step)
        compiled = torch.compile(lamb_update_, dynamic=False, fullgraph=True, backend=backend)
        self.update = Guarded(compiled, lamb_update_, "LAMB's update", fallback)
        return self

    @torch.no_grad()
    def step(self, closure=None):
        for index, group in enumerate(self.param_groups):
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            states = [self._state(p) for p in params]
            if self.compiled:  # the step tensors advance inside the compiled update
                step, lr = [s["step"] for s in states], self._device_lr(index, group["lr"], params[0].device)
            else:
                for s in states:
                    s["step"] += 1
                step, lr = states[0]["step"], group["lr"]
            self.update(params, [p.grad for p in params], [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
                        step, lr, *group["betas"], group["eps"], group["weight_decay"])

    def _device_lr(self, index: int, lr: float, device: torch.device) -> torch.Tensor:
        """Group `index`'s learning rate as a 0-d float64 tensor on `device`, set to `lr`: fill_ passes the value
        as a kernel argument (no copy, no sync), outside any captured graph."""
        return self._lr.setdefault(index, torch.zeros((), dtype=torch.float64, device=device)).fill_(lr)

    def _state(self, p):
        state = self.state[p]
        if not state:
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        # a checkpoint of the other form: read once (an eager run's first step after a compiled run's checkpoint)
        if self.compiled and not torch.is_tensor(state["step"]):
            state["step"] = torch.tensor(float(state["step"]), dtype=torch.float64, device=p.device)
        elif not self.compiled and torch.is_tensor(state["step"]):
            state["step"] = int(state["step"].item())
        return state


def lamb_update_(params, grads, exp_avgs, exp_avg_sqs, step, lr, beta1: float, beta2: float, eps: float,
                 weight_decay: float) -> None:
    """One LAMB update of a parameter group, in place. Eager: `step` is the update's 1-based index and `lr`
    the learning rate, as Python numbers. Compiled: `step` is the list of the parameters' float64 step
    tensors (advanced here) and `lr` a 0-d float64 device tensor: the bias corrections are computed on the
    device in float64, as Python computes them eagerly."""
    if isinstance(step, list):
        torch._foreach_add_(step, 1.0)
        step = step[0]
    torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)  # m = b1 m + (1 - b1) g
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)  # v = b2 v + (1 - b2) g^2
    denom = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_div_(denom, (1 - beta2**step) ** 0.5)
    torch._foreach_add_(denom, eps)
    update = torch._foreach_div(exp_avgs, denom)
    torch._foreach_div_(update, 1 - beta1**step)  # m_hat / (sqrt(v_hat) + eps)
    if weight_decay != 0:
        torch._foreach_add_(update, params, alpha=weight_decay)
        torch._foreach_mul_(update, trust_ratios(params, update))
    if torch.is_tensor(lr):
        torch._foreach_mul_(update, lr)
        torch._foreach_sub_(params, update)
    else:
        torch._foreach_add_(params, update, alpha=-lr)


def trust_ratios(params, update) -> list[torch.Tensor]:
    """||p|| / ||u|| per tensor, 1 where either norm is zero.

    The norms are stacked so the ratios take a handful of kernels for the whole group rather
    than several per tensor; nothing is read back to the host.
    """
    p_norms = torch.stack(torch._foreach_norm(params))
    u_norms = torch.stack(torch._foreach_norm(update))
    ratios = torch.where((p_norms > 0) & (u_norms > 0), p_norms / u_norms, torch.ones_like(p_norms))
    return list(ratios.unbind())


class ACClip(torch.optim.Optimizer):
    """ACClip: momentum with adaptive coordinate-wise clipping (Zhang et al., "Why are Adaptive
    Methods Good for Attention Models?", NeurIPS 2020, Algorithm 1), multi-tensor.

    Per coordinate, with g the gradient at step k:

        m_k     = beta1 m_{k-1} + (1 - beta1) g_k                 (momentum)
        tau_k^a = beta2 tau_{k-1}^a + (1 - beta2) |g_k|^a         (running a-moment of the gradient)
        u_k     = min(tau_k / (|m_k| + eps), 1) m_k               (m clipped to [-tau_k, tau_k])
        x_k     = x_{k-1} - lr u_k

    m_0 = tau_0^a = 0 and there is no bias correction, as in the paper's algorithm. The paper sets
    a = 1 by default (a conservative estimate of the bound on the noise's a-moment when the true
    a in (1, 2] is unknown); a = 2 tracks a root mean square instead.

    Hyperparameters: lr; betas = (beta1, beta2) (bertctl passes `optim.betas`); eps (`optim.epsilon`);
    weight_decay; alpha (1 <= a <= 2; runs use the paper's 1: there is no config key for it, so
    rendered run files stay as they are). The paper has no weight decay: here it is decoupled, as
    in AdamW and bertctl's LAMB (x <- x - lr wd x, with the x before the update), so the no-decay
    group of `parameter_groups` works as for the other optimizers. The moving averages are computed
    as lerps (m + (1 - beta1)(g - m)), equal to the equations up to rounding.

    The update is not normalised (its size is the gradient's, as in SGD with momentum), so its
    learning rate is on SGD's scale, not Adam's.
    """

    def __init__(self, params, lr: float, betas=(0.9, 0.999), eps: float = 1e-6, weight_decay: float = 0.0,
                 alpha: float = 1.0):
        if not 1.0 <= alpha <= 2.0:
            raise ValueError(f"ACClip alpha must be in [1, 2], got {alpha}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, alpha=alpha))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            beta1, beta2 = group["betas"]
            alpha = group["alpha"]
            grads = [p.grad for p in params]
            states = [self._state(p) for p in params]
            momentum = [s["momentum"] for s in states]
            tau_pow = [s["tau_pow"] for s in states]  # tau^alpha
            torch._foreach_lerp_(momentum, grads, 1 - beta1)
            moment = torch._foreach_abs(grads)
            if alpha != 1.0:
                torch._foreach_pow_(moment, alpha)
            torch._foreach_lerp_(tau_pow, moment, 1 - beta2)
            tau = torch._foreach_pow(tau_pow, 1.0 / alpha) if alpha != 1.0 else tau_pow
            denom = torch._foreach_abs(momentum)
            torch._foreach_add_(denom, group["eps"])
            update = torch._foreach_div(tau, denom)
            torch._foreach_clamp_max_(update, 1.0)
            torch._foreach_mul_(update, momentum)
            if group["weight_decay"] != 0:
                torch._foreach_mul_(params, 1 - group["lr"] * group["weight_decay"])
            torch._foreach_add_(params, update, alpha=-group["lr"])
        return loss

    def _state(self, p):
        state = self.state[p]
        if not state:
            state["momentum"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["tau_pow"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return state


Builder = Callable[[list[dict], OptimConfig, str], torch.optim.Optimizer]
# an optimizer's MLPerf hyperparameter events, (key, value) in log order: mllog's names where it has
# them, `opt_<name>_*` otherwise, never LAMB's `opt_lamb_*` (the closed checker reads those as a LAMB run)
MLPerfKeys = Callable[[OptimConfig], list[tuple[str, object]]]


@dataclass(frozen=True)
class OptimizerEntry:
    """One optimizer: how to build it and what it logs. Both are required, so an optimizer cannot
    exist without declaring its MLPerf keys (and never logs keys invented from its name)."""

    build: Builder
    mlperf_keys: MLPerfKeys


def _lamb(groups: list[dict], cfg: OptimConfig, device_type: str) -> torch.optim.Optimizer:
    return Lamb(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.epsilon, weight_decay=cfg.weight_decay)


def _lamb_keys(cfg: OptimConfig) -> list[tuple[str, object]]:
    """Required by the closed division's closed_bert.yaml (so a closed run is LAMB:
    RunConfig.closed_division_problems)."""
    (beta1, beta2), eps, wd = cfg.betas, cfg.epsilon, cfg.weight_decay
    return [(K.OPT_LAMB_WEIGHT_DECAY, wd), (K.OPT_LAMB_BETA_1, beta1), (K.OPT_LAMB_BETA_2, beta2),
            (K.OPT_LAMB_LR_DECAY_POLY_POWER, 1.0), (K.OPT_LAMB_EPSILON, eps)]


def _adamw(groups: list[dict], cfg: OptimConfig, device_type: str) -> torch.optim.Optimizer:
    # torch's fused kernel where it has one (on the CPU 4.5x faster than the multi-tensor form for
    # BERT's parameters); the multi-tensor one elsewhere
    fused = device_type in ("cuda", "cpu")
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.epsilon, weight_decay=cfg.weight_decay,
                             fused=fused or None, foreach=None if fused else True)


def _adamw_keys(cfg: OptimConfig) -> list[tuple[str, object]]:
    """mllog's AdamW names (decoupled weight decay, as built above)."""
    (beta1, beta2), eps, wd = cfg.betas, cfg.epsilon, cfg.weight_decay
    return [(K.OPT_ADAMW_WEIGHT_DECAY, wd), (K.OPT_ADAMW_BETA_1, beta1), (K.OPT_ADAMW_BETA_2, beta2),
            (K.OPT_ADAMW_EPSILON, eps)]


def _madgrad(groups: list[dict], cfg: OptimConfig, device_type: str) -> torch.optim.Optimizer:
    """The authors' MADGRAD (package `madgrad` 1.3): momentum = optim.betas[0] (beta2 is unused),
    eps = optim.epsilon, weight decay as the package does it by default (an L2 term added to the
    gradient, in place on `p.grad`, which the step's zero_grad discards).

    What to know with torch 2.13 (checked): the dense path, checkpoints through `state_dict()` and
    the fp16 GradScaler skip all work (tests/test_optim.py). It loops over tensors in Python (no
    multi-tensor kernels), and reads its step counter with `.item()` from a CPU tensor (no GPU sync).
    That counter lives under the key "k" of `optimizer.state`, which is not a parameter, so
    torch.distributed.checkpoint's `get_optimizer_state_dict` fails on it with KeyError: 'k'
    (bertctl saves `optimizer.state_dict()`, which keeps it). Its `_params_t` type import no longer
    exists in torch (ParamsT now); it is only imported for type checkers, so nothing fails at run time.
    """
    from madgrad import MADGRAD

    return MADGRAD(groups, lr=cfg.lr, momentum=cfg.betas[0], weight_decay=cfg.weight_decay, eps=cfg.epsilon)


def _madgrad_keys(cfg: OptimConfig) -> list[tuple[str, object]]:
    """betas[0] is its momentum; betas[1] is unused, so it is not logged."""
    return [(K.OPT_WEIGHT_DECAY, cfg.weight_decay), ("opt_madgrad_momentum", cfg.betas[0]),
            ("opt_madgrad_epsilon", cfg.epsilon)]


def _acclip(groups: list[dict], cfg: OptimConfig, device_type: str) -> torch.optim.Optimizer:
    return ACClip(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.epsilon, weight_decay=cfg.weight_decay)


def _acclip_keys(cfg: OptimConfig) -> list[tuple[str, object]]:
    (beta1, beta2), eps, wd = cfg.betas, cfg.epsilon, cfg.weight_decay
    return [(K.OPT_WEIGHT_DECAY, wd), ("opt_acclip_beta_1", beta1), ("opt_acclip_beta_2", beta2),
            ("opt_acclip_epsilon", eps)]


def _apex_lamb(groups: list[dict], cfg: OptimConfig) -> torch.optim.Optimizer:
    from apex.optimizers import FusedLAMB  # type: ignore

    # No clipping inside LAMB: it happens before the allreduce (trainer/parallel/gradients.py). apex scales the
    # gradients by norm / max_grad_norm when the norm exceeds it: with 0 that divides them by
    # infinity (every update would be weight decay alone); with infinity the factor is always 1.
    return FusedLAMB(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.epsilon, weight_decay=cfg.weight_decay,
                     max_grad_norm=float("inf"), use_nvlamb=False)


def _apex_adam(groups: list[dict], cfg: OptimConfig) -> torch.optim.Optimizer:
    from apex.optimizers import FusedAdam  # type: ignore

    return FusedAdam(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.epsilon, weight_decay=cfg.weight_decay, adam_w_mode=True)


# optim.name -> its builder and its MLPerf keys. A new optimizer is one entry here and one in OptimConfig.name.
OPTIMIZERS: dict[str, OptimizerEntry] = {
    "lamb": OptimizerEntry(_lamb, _lamb_keys),
    "adam": OptimizerEntry(_adamw, _adamw_keys),
    "madgrad": OptimizerEntry(_madgrad, _madgrad_keys),
    "acclip": OptimizerEntry(_acclip, _acclip_keys),
}
BUILDERS: dict[str, Builder] = {name: entry.build for name, entry in OPTIMIZERS.items()}
# the names apex has a fused kernel for (runtime.kernels=apex); other names ignore that setting
APEX_BUILDERS: dict[str, Callable[[list[dict], OptimConfig], torch.optim.Optimizer]] = {
    "lamb": _apex_lamb, "adam": _apex_adam,
}


def build_optimizer(model: nn.Module, cfg: OptimConfig, use_apex: bool, device_type: str, compiled: bool = False,
                    compile_fallback: bool = False) -> torch.optim.Optimizer:
    """`compiled` (runtime.compile): LAMB's update torch.compile'd (Lamb.compile_update); torch's AdamW is
    already one fused kernel, and the trial optimizers stay as their authors wrote them."""
    if cfg.name not in BUILDERS:
        raise ValueError(f"optim.name: no optimizer named {cfg.name!r}; expected one of {', '.join(BUILDERS)}")
    groups = parameter_groups(model, cfg.weight_decay)
    if use_apex and cfg.name in APEX_BUILDERS and apex_missing() is None:
        return APEX_BUILDERS[cfg.name](groups, cfg)
    optimizer = BUILDERS[cfg.name](groups, cfg, device_type)
    if compiled and isinstance(optimizer, Lamb):
        optimizer.compile_update(compile_fallback)
    return optimizer


def mlperf_keys(cfg: OptimConfig) -> list[tuple[str, object]]:
    """The MLPerf hyperparameter events of the optimizer in use (trainer/mlperf.py::RunLogger.hyperparameters
    logs them): only those its entry in `OPTIMIZERS` declares."""
    if cfg.name not in OPTIMIZERS:
        raise ValueError(f"optim.name: no optimizer named {cfg.name!r}; expected one of {', '.join(OPTIMIZERS)}")
    return OPTIMIZERS[cfg.name].mlperf_keys(cfg)


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
    before = loss_scale(scaler, next(p.device for g in optimizer.param_groups for p in g["params"]))
    scaler.step(optimizer)
    scaler.update()
    # fp16 only: the schedule must know whether the update happened, so the step reads the device
    # here (and GradScaler.step reads its overflow flag for optimizers that do not take the scale)
    return bool(loss_scale(scaler, before.device) < before)


def loss_scale(scaler: "torch.amp.GradScaler", device: torch.device) -> torch.Tensor:
    """The current loss scale as a device tensor; get_scale() would copy it to the host (a GPU stall)."""
    return scaler.scale(torch.ones((), device=device))
