"""Optimizers and LR schedules against the formulas and tables of the MLPerf references."""

import pytest
import torch

from orchestrator.clusters import load_cluster
from trainer.config import OptimConfig
from trainer.gradients import clip_, global_norm
from trainer.optim import Lamb, learning_rate, parameter_groups


def reference_lamb(params, grads_per_step, lr, wds, betas=(0.9, 0.999), eps=1e-6):
    """Per-element LAMB as written in the reference (apex's multi_tensor_distopt_lamb kernel)."""
    params = [p.clone() for p in params]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    for t, grads in enumerate(grads_per_step, start=1):
        for i, (p, g) in enumerate(zip(params, grads)):
            m[i] = betas[0] * m[i] + (1 - betas[0]) * g
            v[i] = betas[1] * v[i] + (1 - betas[1]) * g * g
            u = (m[i] / (1 - betas[0] ** t)) / ((v[i] / (1 - betas[1] ** t)).sqrt() + eps) + wds[i] * p
            ratio = p.norm() / u.norm() if wds[i] != 0 and p.norm() > 0 and u.norm() > 0 else 1.0
            params[i] = p - lr * ratio * u
    return params


def test_lamb_matches_the_reference_formula():
    torch.manual_seed(0)
    params = [torch.randn(8, 4), torch.randn(4), torch.zeros(3)]
    steps = [[torch.randn_like(p) for p in params] for _ in range(5)]
    live = [p.clone().requires_grad_() for p in params]
    opt = Lamb([{"params": live[:1], "weight_decay": 0.01}, {"params": live[1:], "weight_decay": 0.0}], lr=0.05)
    for grads in steps:
        for p, g in zip(live, grads):
            p.grad = g.clone()
        opt.step()
    expected = reference_lamb(params, steps, 0.05, [0.01, 0.0, 0.0])
    for got, want in zip(live, expected):
        torch.testing.assert_close(got.detach(), want, rtol=1e-6, atol=1e-7)


def test_no_weight_decay_for_biases_and_layernorm():
    from trainer.config import ModelConfig
    from trainer.model import BertForPreTraining

    model = BertForPreTraining(ModelConfig(num_layers=1, hidden_size=16, num_heads=2, intermediate_size=32, vocab_size=64))
    decay, no_decay = parameter_groups(model, 0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    assert all("bias" in names[id(p)] or "LayerNorm" in names[id(p)] for p in no_decay["params"])
    assert all("bias" not in names[id(p)] and "LayerNorm" not in names[id(p)] for p in decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def recipe(cluster: str) -> OptimConfig:
    return load_cluster(cluster).config.run.optim


@pytest.mark.parametrize("update,lr", [(1, 8.63e-5), (2, 8.63e-5), (10, 1.25e-4), (50, 3.16e-4), (65, 3.88e-4),
                                       (66, 4.50e-4), (100, 3.29e-4), (150, 1.52e-4), (179, 4.95e-5), (250, 4.95e-5)])
def test_samsung_schedule_reproduces_the_reference_table(update, lr):
    # the reference table gives three significant digits
    assert float(f"{learning_rate(update, recipe('samsung_dgxa100')):.2e}") == lr


def test_samsung_schedule_peaks_above_base_at_update_66():
    cfg = recipe("samsung_dgxa100")
    lrs = [learning_rate(k, cfg) for k in range(1, 300)]
    assert lrs.index(max(lrs)) + 1 == 66 and max(lrs) / cfg.lr == pytest.approx(1.144, abs=1e-3)


def test_nvidia_schedules():
    one = recipe("nvidia_dgxa100_1x8")  # no warmup: 3.5e-4 * (1 - (t - 1) / 7100)
    assert learning_rate(1, one) == pytest.approx(3.5e-4)
    assert learning_rate(7101, one) == pytest.approx(0.0)
    assert learning_rate(3551, one) == pytest.approx(3.5e-4 * 0.5)
    eight = recipe("nvidia_dgxa100_8x8")  # warmup 100 from step -25, then 1.5e-3 * (1 - t / 1271)
    assert learning_rate(1, eight) == pytest.approx(1.5e-3 * 26 / 100, rel=1e-5)
    assert learning_rate(74, eight) == pytest.approx(1.5e-3 * 99 / 100, rel=1e-5)
    assert learning_rate(75, eight) == pytest.approx(1.5e-3 * (1 - 75 / 1271))  # the jump the reference has
    assert learning_rate(1271, eight) == 0.0


def test_clipping_by_global_norm_and_overflow_poisoning():
    grads = [torch.full((4,), 3.0), torch.full((9,), 4.0)]
    norm = global_norm(grads)
    assert norm.item() == pytest.approx((4 * 9 + 9 * 16) ** 0.5)
    clip_(grads, 1.0, norm)
    assert global_norm(grads).item() == pytest.approx(1.0, rel=1e-5)
    small = [torch.full((2,), 0.1)]
    clip_(small, 1.0, global_norm(small))
    assert torch.equal(small[0], torch.full((2,), 0.1))  # never scaled up
    overflow = [torch.tensor([1.0, float("inf")]), torch.ones(2)]
    clip_(overflow, 1.0, global_norm(overflow))
    assert all(torch.isnan(g).all() for g in overflow)  # the scaler then skips the step on every rank


def test_overflowing_fp16_steps_are_skipped_and_the_scale_drops():
    from trainer.optim import take_step

    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([p], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale(torch.ones(()))  # a training step scales its loss first
    p.grad = torch.tensor([1.0, float("inf"), 1.0])
    assert take_step(opt, scaler) is True
    assert torch.equal(p.detach(), torch.ones(3)) and scaler.get_scale() == 512.0
    p.grad = torch.full((3,), 512.0)  # a scaled gradient of 1.0
    assert take_step(opt, scaler) is False
    torch.testing.assert_close(p.detach(), torch.full((3,), 0.9))
