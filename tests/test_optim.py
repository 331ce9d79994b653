"""Optimizers and LR schedules against the formulas and tables of the MLPerf references."""

import io
import json
import math
import sys
import types
import typing

import pytest
import test_train as launched  # the trainer as the launcher runs it, and the official checker
import torch
import yaml
from madgrad import MADGRAD
from synthetic import tiny_run_config
from torch.utils._python_dispatch import TorchDispatchMode

from orchestrator.config.clusters import load_cluster
from trainer.checkpoints.run import write_model
from trainer.config import ModelConfig, OptimConfig
from trainer.mlperf import log_cache_clear
from trainer.model.bert import BertForPreTraining
from trainer.optim import (
    OPTIMIZERS,
    ACClip,
    Lamb,
    build_optimizer,
    learning_rate,
    mlperf_keys,
    parameter_groups,
    set_learning_rate,
    take_step,
)
from trainer.parallel.gradients import clip_, global_norm


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


# ---- ACClip against steps computed by hand ----------------------------------------------------

def test_acclip_three_steps_match_hand_computed_values():
    # alpha = 1, beta1 = 0.5, beta2 = 0.75, eps = 0, no decay; the LR changes each step as a schedule's would.
    # m_k = 0.5 m_{k-1} + 0.5 g_k;  tau_k = 0.75 tau_{k-1} + 0.25 |g_k|;  u_k = min(tau_k / |m_k|, 1) m_k
    p = torch.nn.Parameter(torch.tensor([1.0, 1.0, 1.0]))
    opt = ACClip([p], lr=0.1, betas=(0.5, 0.75), eps=0.0)
    steps = [  # (lr, g, m, tau, u, p after)
        # m = [2, -1, 0.5], tau = [1, 0.5, 0.25]: tau/|m| = 0.5 everywhere, so u = m / 2
        (0.1, [4.0, -2.0, 1.0], [2.0, -1.0, 0.5], [1.0, 0.5, 0.25], [1.0, -0.5, 0.25], [0.9, 1.05, 0.975]),
        # m = [1 + 2, -0.5 + 1, 0.25 - 4] = [3, 0.5, -3.75]; tau = [0.75 + 1, 0.375 + 0.5, 0.1875 + 2]
        # tau/|m| = [7/12, 1.75, 7/12]: coordinates 0 and 2 clipped to tau (with m's sign), 1 passes as m
        (0.2, [4.0, 2.0, -8.0], [3.0, 0.5, -3.75], [1.75, 0.875, 2.1875], [1.75, 0.5, -2.1875],
         [0.9 - 0.35, 1.05 - 0.1, 0.975 + 0.4375]),
        # a zero gradient: m and tau decay (m halves, tau x 0.75); tau/|m| = [0.875, 2.625, 0.875]
        (0.4, [0.0, 0.0, 0.0], [1.5, 0.25, -1.875], [1.3125, 0.65625, 1.640625], [1.3125, 0.25, -1.640625],
         [0.55 - 0.525, 0.95 - 0.1, 1.4125 + 0.65625]),
    ]
    for lr, g, m, tau, u, after in steps:
        set_learning_rate(opt, lr)
        before = p.detach().clone()
        p.grad = torch.tensor(g)
        opt.step()
        state = opt.state[p]
        torch.testing.assert_close(state["momentum"], torch.tensor(m))
        torch.testing.assert_close(state["tau_pow"], torch.tensor(tau))
        torch.testing.assert_close((before - p.detach()) / lr, torch.tensor(u))
        torch.testing.assert_close(p.detach(), torch.tensor(after))
    torch.testing.assert_close(p.detach(), torch.tensor([0.025, 0.85, 2.06875]))


def test_acclip_with_alpha_2_epsilon_and_decoupled_weight_decay():
    # alpha = 2, beta1 = 0.5, beta2 = 0.75, eps = 1, lr = 0.1; w decays at 0.5, b (no-decay group) does not.
    # step 1, g_w = [4, 2]: m = [2, 1]; tau^2 = 0.25 [16, 4] = [4, 1], tau = [2, 1];
    #   u = min(tau / (|m| + 1), 1) m = [2/3 * 2, 1/2 * 1] = [4/3, 0.5]
    #   w = w (1 - 0.1 * 0.5) - 0.1 u = [2 * 0.95 - 0.4/3, -1 * 0.95 - 0.05] = [1.9 - 0.1333.., -1.0]
    # step 2, g_w = [0, -6]: m = [1, 0.5 - 3] = [1, -2.5]; tau^2 = 0.75 [4, 1] + 0.25 [0, 36] = [3, 9.75]
    #   u = [sqrt(3) / 2 * 1, sqrt(9.75) / 3.5 * -2.5]   (both clipped: sqrt(3) < 2, sqrt(9.75) < 3.5)
    #   w = 0.95 w - 0.1 u
    # b, g_b = [1] then [1]: m = 0.5, tau^2 = 0.25, tau = 0.5, u = 0.5 / 1.5 * 0.5 = 1/6;
    #   then m = 0.75, tau^2 = 0.4375, u = sqrt(0.4375) / 1.75 * 0.75; b = 3 - 0.1 (u1 + u2)
    w = torch.nn.Parameter(torch.tensor([2.0, -1.0]))
    b = torch.nn.Parameter(torch.tensor([3.0]))
    opt = ACClip([{"params": [w], "weight_decay": 0.5}, {"params": [b], "weight_decay": 0.0}],
                 lr=0.1, betas=(0.5, 0.75), eps=1.0, alpha=2.0)
    for g_w in ([4.0, 2.0], [0.0, -6.0]):
        w.grad, b.grad = torch.tensor(g_w), torch.tensor([1.0])
        opt.step()
    w1 = [1.9 - 0.4 / 3, -1.0]
    u2 = [3**0.5 / 2, 9.75**0.5 / 3.5 * -2.5]
    torch.testing.assert_close(w.detach(), torch.tensor([0.95 * w1[0] - 0.1 * u2[0], 0.95 * w1[1] - 0.1 * u2[1]]))
    torch.testing.assert_close(opt.state[w]["tau_pow"], torch.tensor([3.0, 9.75]))
    torch.testing.assert_close(b.detach(), torch.tensor([3 - 0.1 * (1 / 6 + 0.4375**0.5 / 1.75 * 0.75)]))


def test_acclip_refuses_an_alpha_outside_1_to_2():
    with pytest.raises(ValueError, match="alpha must be in"):
        ACClip([torch.nn.Parameter(torch.ones(1))], lr=0.1, alpha=3.0)


# ---- one table of optimizers: every name builds its own, an unknown name is an error ----------

EXPECTED = {"lamb": Lamb, "adam": torch.optim.AdamW, "madgrad": MADGRAD, "acclip": ACClip}
CONFIG_NAMES = typing.get_args(OptimConfig.model_fields["name"].annotation)


def tiny_model(seed: int = 0) -> BertForPreTraining:
    torch.manual_seed(seed)
    return BertForPreTraining(ModelConfig(num_layers=1, hidden_size=16, num_heads=2, intermediate_size=32,
                                          vocab_size=32, max_position_embeddings=16))


def optim_config(name: str, **changes) -> OptimConfig:
    return OptimConfig(name=name, lr=changes.pop("lr", 1e-2), max_steps=20, warmup_steps=3, **changes)


def test_the_configurable_names_are_exactly_the_built_ones():
    assert set(CONFIG_NAMES) == set(EXPECTED)


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_each_name_builds_its_own_optimizer_with_the_configured_hyperparameters(name):
    cfg = optim_config(name, betas=(0.8, 0.95), epsilon=1e-8, weight_decay=0.02)
    opt = build_optimizer(tiny_model(), cfg, use_apex=False, device_type="cpu")
    assert type(opt) is EXPECTED[name]
    decay, no_decay = opt.param_groups
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.02, 0.0)
    assert decay["eps"] == 1e-8
    if name == "madgrad":
        assert decay["momentum"] == 0.8  # betas[0]; MADGRAD has no second beta
    else:
        assert decay["betas"] == (0.8, 0.95)
    if name == "adam":  # torch's fused kernel (CPU and CUDA); the multi-tensor one on other devices
        assert decay["fused"] is True and not decay["foreach"]
        other = build_optimizer(tiny_model(), cfg, use_apex=False, device_type="meta").param_groups[0]
        assert other["foreach"] is True and not other["fused"]


def test_an_unknown_name_is_an_error_not_adam():
    cfg = OptimConfig.model_construct(**{**optim_config("adam").model_dump(), "name": "sgd"})
    with pytest.raises(ValueError, match="optim.name: no optimizer named 'sgd'; expected one of lamb, adam, madgrad, acclip"):
        build_optimizer(tiny_model(), cfg, use_apex=False, device_type="cpu")
    with pytest.raises(ValueError, match="Input should be 'lamb', 'adam', 'madgrad' or 'acclip'"):  # nor can a run file
        optim_config("sgd")


class FusedLAMB(torch.optim.SGD):
    """Stand-in for apex's class (apex does not build here): records what it was given."""

    def __init__(self, groups, lr, **kw):
        super().__init__(groups, lr=lr)
        self.kw = kw


class FusedAdam(FusedLAMB):
    pass


def stand_in_apex(monkeypatch, without: str | None = None) -> None:
    """apex's modules as sys.modules entries, all but `without` (a CUDA extension left unbuilt)."""
    modules = {name: types.ModuleType(name) for name in ("apex", "apex.optimizers", "apex.normalization",
                                                          "amp_C", "fused_layer_norm_cuda")}
    modules["apex.optimizers"].FusedLAMB, modules["apex.optimizers"].FusedAdam = FusedLAMB, FusedAdam
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, None if name == without else module)  # None: ImportError


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_apex_kernels_are_used_only_for_the_names_apex_has(name, monkeypatch):
    stand_in_apex(monkeypatch)
    opt = build_optimizer(tiny_model(), optim_config(name), use_apex=True, device_type="cuda")
    assert type(opt) is {"lamb": FusedLAMB, "adam": FusedAdam}.get(name, EXPECTED[name])


def test_apex_lamb_never_clips(monkeypatch):
    """apex's LAMB kernel divides the gradients by norm / max_grad_norm when the norm exceeds
    max_grad_norm (csrc/multi_tensor_lamb.cu). Clipping is ours, before the allreduce: the factor
    must be 1 for every norm (with max_grad_norm=0 it was infinite, and every gradient zero)."""
    stand_in_apex(monkeypatch)
    max_norm = build_optimizer(tiny_model(), optim_config("lamb"), use_apex=True, device_type="cuda").kw["max_grad_norm"]
    for norm in (0.0, 1.0, 1e30, float("inf")):
        assert not norm > max_norm  # the kernel's test for clipping


def test_apex_without_its_cuda_extensions_is_not_used_and_refused_in_one_line(monkeypatch):
    from trainer.config import RuntimeConfig
    from trainer.parallel.distributed import LaunchError, check_kernels

    stand_in_apex(monkeypatch, without="amp_C")
    assert type(build_optimizer(tiny_model(), optim_config("lamb"), use_apex=True, device_type="cuda")) is EXPECTED["lamb"]
    with pytest.raises(LaunchError, match=r"^runtime.kernels: apex is asked for but amp_C cannot be imported on this node "
                                          r"\(install NVIDIA apex with its CUDA extensions in the image, or set runtime.kernels=torch\)$"):
        check_kernels(RuntimeConfig(kernels="apex"), torch.device("cpu"))


# ---- every optimizer with the trainer's schedule, clipping, checkpoints and fp16 skips ----------

def gradients(model, update: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(update)
    return [torch.randn(p.shape, generator=g) for p in model.parameters()]


def train_updates(model, opt, cfg: OptimConfig, first: int, last: int) -> None:
    """Updates first..last as train_step makes them: the schedule's LR, clipped gradients, a step."""
    for update in range(first, last + 1):
        set_learning_rate(opt, learning_rate(update, cfg))
        grads = gradients(model, update)
        clip_(grads, cfg.max_grad_norm, global_norm(grads))  # the norms are ~30: clipping acts
        for p, g in zip(model.parameters(), grads):
            p.grad = g
        take_step(opt, None)
        opt.zero_grad(set_to_none=True)


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_a_checkpoint_round_trip_gives_identical_next_steps(name):
    cfg = optim_config(name)
    model = tiny_model()
    opt = build_optimizer(model, cfg, use_apex=False, device_type="cpu")
    train_updates(model, opt, cfg, 1, 4)
    saved = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, saved)
    train_updates(model, opt, cfg, 5, 8)

    saved.seek(0)
    checkpoint = torch.load(saved, map_location="cpu", weights_only=False)  # as trainer/checkpoints/run.py loads it
    resumed = tiny_model(seed=1)
    resumed.load_state_dict(checkpoint["model"])
    resumed_opt = build_optimizer(resumed, cfg, use_apex=False, device_type="cpu")
    resumed_opt.load_state_dict(checkpoint["optimizer"])
    train_updates(resumed, resumed_opt, cfg, 5, 8)
    moved = [not torch.equal(a, b) for a, b in zip(model.parameters(), tiny_model().parameters())]
    assert sum(moved) >= len(moved) - 1  # it trained (a tensor with no gradient path may stay)
    for a, b in zip(model.parameters(), resumed.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_an_overflowing_fp16_step_is_skipped_without_touching_the_optimizer(name):
    cfg = optim_config(name)
    model, reference = tiny_model(), tiny_model()
    opt = build_optimizer(model, cfg, use_apex=False, device_type="cpu")
    ref_opt = build_optimizer(reference, cfg, use_apex=False, device_type="cpu")
    train_updates(model, opt, cfg, 1, 2)
    train_updates(reference, ref_opt, cfg, 1, 2)

    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale(torch.ones(()))  # a training step scales its loss first
    before = io.BytesIO()
    torch.save(opt.state_dict(), before)
    for p in model.parameters():
        p.grad = torch.full_like(p, float("inf"))
    assert take_step(opt, scaler) is True and scaler.get_scale() == 512.0
    after = io.BytesIO()
    torch.save(opt.state_dict(), after)
    assert before.getvalue() == after.getvalue()  # no moment, counter or step advanced
    for a, b in zip(model.parameters(), reference.parameters()):
        assert torch.equal(a, b)

    # the update is then made as if the overflow never happened (the scaled gradient unscales exactly)
    set_learning_rate(opt, learning_rate(3, cfg))
    grads = gradients(model, 3)
    clip_(grads, cfg.max_grad_norm, global_norm(grads))
    for p, g in zip(model.parameters(), grads):
        p.grad = g * 512.0
    assert take_step(opt, scaler) is False
    train_updates(reference, ref_opt, cfg, 3, 3)
    for a, b in zip(model.parameters(), reference.parameters()):
        assert torch.equal(a, b)


class HostReads(TorchDispatchMode):
    """Counts the reads of a tensor's value by the host (.item(), bool(), float(), .tolist())."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", ["lamb", "acclip"])
def test_lamb_and_acclip_steps_never_read_a_value_back_to_the_host(name):
    # on a GPU such a read waits for the queue (a sync per step); the counter sees them on the CPU too
    model = tiny_model()
    opt = build_optimizer(model, optim_config(name), use_apex=False, device_type="cpu")
    for p, g in zip(model.parameters(), gradients(model, 1)):
        p.grad = g
    with HostReads() as reads:
        opt.step()
        opt.step()
    with HostReads() as control:
        float(model.cls.predictions.bias.detach().sum())  # what a stray .item() would do
    assert (reads.count, control.count) == (0, 1)


@pytest.mark.parametrize("name,clip,lr", [("madgrad", "bucket", 3e-2), ("acclip", "after_allreduce", 1.0)])
def test_an_open_division_run_with_a_trial_optimizer_trains_and_passes_the_checker(name, clip, lr, tmp_path):
    config = tiny_run_config(tmp_path, optim={"name": name, "lr": lr, "max_steps": 40, "clip": clip},
                             train={"target_accuracy": 0.99}, mlperf={"division": "open"}, runtime={"num_threads": 1})
    raw = yaml.safe_load(config.read_text())
    torch.manual_seed(0)
    start = BertForPreTraining(ModelConfig(**raw["model"]))
    raw["train"]["init_checkpoint"] = str(write_model(tmp_path / "start.pt", start))
    raw["checkpoint"] = {"final_model": str(tmp_path / "final.pt")}
    config.write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    log_cache_clear(out / "results" / "result_0.txt")  # the launcher's part
    proc = launched.trainer("--config", str(config), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "(40 updates, 0 skipped)" in proc.stdout
    assert all(math.isfinite(x) for x in launched.losses(out))
    final = torch.load(tmp_path / "final.pt", weights_only=True)["model"]
    for key, before in start.state_dict().items():  # every weight was updated, none blew up
        assert torch.isfinite(final[key]).all() and not torch.equal(final[key], before), key
    log = out / "results" / "result_0.txt"
    result = launched.checker(log, tmp=tmp_path)
    assert result.returncode == 0 and result.stderr.strip().endswith("INFO - SUCCESS"), result.stderr[-1500:]
    events = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in log.read_text().splitlines()]
    assert [e["value"] for e in events if e["key"] in ("opt_name", "submission_division")] == ["open", name]
    assert not [e["key"] for e in events if e["key"].startswith("opt_lamb") or e["key"] == "opt_epsilon"]


@pytest.mark.parametrize("name,keys", [
    ("lamb", ["opt_lamb_weight_decay_rate", "opt_lamb_beta_1", "opt_lamb_beta_2", "opt_lamb_learning_rate_decay_poly_power",
              "opt_lamb_epsilon", "opt_epsilon"]),
    ("adam", ["opt_adamw_weight_decay", "opt_adamw_beta_1", "opt_adamw_beta_2", "opt_adamw_epsilon"]),
    ("madgrad", ["opt_weight_decay", "opt_madgrad_momentum", "opt_madgrad_epsilon"]),
    ("acclip", ["opt_weight_decay", "opt_acclip_beta_1", "opt_acclip_beta_2", "opt_acclip_epsilon"]),
])
def test_the_log_carries_the_keys_of_the_optimizer_in_use_only(tmp_path, name, keys):
    """LAMB's keys are what the closed checker (closed_bert.yaml) reads as a LAMB run: an ADAM run that
    logged them passed it as one. Every other optimizer logs its own keys (mllog's names where it has them)."""
    from trainer.config import RunConfig
    from trainer.mlperf import RunLogger

    division = "closed" if name == "lamb" else "open"
    cfg = RunConfig.model_validate(yaml.safe_load(tiny_run_config(
        tmp_path, optim={"name": name, "betas": [0.8, 0.95], "epsilon": 1e-8, "weight_decay": 0.02},
        mlperf={"division": division, "waive_scale_rules": True}).read_text()))
    path = tmp_path / "result_0.txt"
    log = RunLogger(path, enabled=True)
    log.hyperparameters(cfg, seed=3, optimizer_keys=mlperf_keys(cfg.optim))
    log.close()
    events = {e["key"]: e["value"] for e in (json.loads(line.split(":::MLLOG ", 1)[1]) for line in path.read_text().splitlines())}
    optimizer = {k: v for k, v in events.items() if k.startswith("opt_") and not k.startswith(("opt_learning_rate", "opt_base"))}
    assert list(optimizer) == ["opt_name", *keys]
    assert events["opt_name"] == name and events["opt_base_learning_rate"] == 3e-3
    assert sorted(v for k, v in optimizer.items() if k != "opt_name") == sorted(
        {"lamb": [0.02, 0.8, 0.95, 1.0, 1e-8, 1e-8], "adam": [0.02, 0.8, 0.95, 1e-8], "madgrad": [0.02, 0.8, 1e-8],
         "acclip": [0.02, 0.8, 0.95, 1e-8]}[name])


def test_an_optimizer_that_declares_no_keys_logs_none_rather_than_invented_ones(monkeypatch):
    """The keys live beside the builder (trainer/optim.py::OPTIMIZERS): a name without an entry there is
    an error, never `opt_<name>_beta_1` made up from its name."""
    cfg = optim_config("lamb").model_copy(update={"name": "sgd"})
    with pytest.raises(ValueError, match="optim.name: no optimizer named 'sgd'; expected one of lamb, adam, madgrad, acclip"):
        mlperf_keys(cfg)
    assert set(OPTIMIZERS) == set(CONFIG_NAMES)  # every schema name declares its keys


# ---- LAMB compiled (runtime.compile: Lamb.compile_update) ------------------------------------------

def test_compiled_lamb_trains_like_eager_lamb_over_20_scheduled_updates():
    """torch.compile with inductor, the compiler the GPU runs, here making the CPU's kernels: the schedule's
    learning rate changes every update and the weights stay within 1e-6 of the eager update's."""
    cfg = optim_config("lamb")
    eager, compiled = tiny_model(), tiny_model()
    eager_opt = build_optimizer(eager, cfg, use_apex=False, device_type="cpu")
    compiled_opt = build_optimizer(compiled, cfg, use_apex=False, device_type="cpu", compiled=True)
    assert (eager_opt.compiled, compiled_opt.compiled) == (False, True)
    train_updates(eager, eager_opt, cfg, 1, 20)
    train_updates(compiled, compiled_opt, cfg, 1, 20)
    assert compiled_opt.update.failed is None
    moved = [not torch.equal(a, b) for a, b in zip(eager.parameters(), tiny_model().parameters())]
    assert sum(moved) >= len(moved) - 1
    for (name, a), b in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(b.detach(), a.detach(), rtol=0, atol=1e-6, msg=name)
    step = compiled_opt.state[next(compiled.parameters())]["step"]
    assert step.dtype == torch.float64 and step.item() == 20.0


def counting_backend(graphs: list):
    """A torch.compile backend that keeps each graph dynamo hands it and runs it as traced."""
    def backend(graph, example_inputs):
        graphs.append(graph)
        return graph.forward
    return backend


def test_compiled_lamb_compiles_one_whole_graph_per_parameter_group_for_the_whole_schedule():
    """The learning rate and the step count are device tensors: 20 updates with a new learning rate each
    compile the update once for the decayed group and once for the other, each whole (fullgraph: a host
    value would break the graph, and on a GPU cost a sync)."""
    graphs: list = []
    cfg = optim_config("lamb")
    model = tiny_model()
    opt = build_optimizer(model, cfg, use_apex=False, device_type="cpu")
    torch.compiler.reset()
    opt.compile_update(backend=counting_backend(graphs))
    train_updates(model, opt, cfg, 1, 20)
    torch.compiler.reset()
    assert len(graphs) == 2 and opt.update.failed is None


@pytest.mark.parametrize("first,then", [(False, True), (True, False)])
def test_eager_and_compiled_lamb_take_each_others_checkpoints(first, then):
    """A run may change runtime.compile between a checkpoint and its resume: the step counter is an int
    eager and a device tensor compiled, and either continues from the other's state as if uninterrupted."""
    cfg = optim_config("lamb")

    def built(model, compiled):
        opt = build_optimizer(model, cfg, use_apex=False, device_type="cpu")
        return opt.compile_update(backend="eager") if compiled else opt

    model = tiny_model()
    opt = built(model, first)
    train_updates(model, opt, cfg, 1, 4)
    saved = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, saved)
    train_updates(model, opt, cfg, 5, 8)
    saved.seek(0)
    checkpoint = torch.load(saved, map_location="cpu", weights_only=False)
    resumed = tiny_model(seed=1)
    resumed.load_state_dict(checkpoint["model"])
    resumed_opt = built(resumed, then)
    resumed_opt.load_state_dict(checkpoint["optimizer"])
    train_updates(resumed, resumed_opt, cfg, 5, 8)
    torch.compiler.reset()
    for a, b in zip(model.parameters(), resumed.parameters()):
        torch.testing.assert_close(b.detach(), a.detach(), rtol=0, atol=1e-6)
    steps = {type(s["step"]) for s in resumed_opt.state.values()}
    assert steps == ({torch.Tensor} if then else {int})


def test_a_lamb_update_that_fails_to_compile_ends_the_run_unless_eager_is_allowed(capfd):
    from trainer.model.compiled import CompileFailed

    def broken(graph, example_inputs):
        raise RuntimeError("no kernel for this today")

    cfg = optim_config("lamb")
    model = tiny_model()
    torch.compiler.reset()
    opt = build_optimizer(model, cfg, use_apex=False, device_type="cpu").compile_update(backend=broken)
    with pytest.raises(CompileFailed, match=r"^runtime.compile: torch.compile of LAMB's update failed \(.*no kernel for this "
                                            r"today\); set runtime.compile: false, or runtime.compile_fallback: eager"):
        train_updates(model, opt, cfg, 1, 1)
    reference, fallback = tiny_model(), tiny_model()
    reference_opt = build_optimizer(reference, cfg, use_apex=False, device_type="cpu")
    fallback_opt = build_optimizer(fallback, cfg, use_apex=False, device_type="cpu").compile_update(fallback=True, backend=broken)
    train_updates(reference, reference_opt, cfg, 1, 3)
    train_updates(fallback, fallback_opt, cfg, 1, 3)
    torch.compiler.reset()
    for a, b in zip(reference.parameters(), fallback.parameters()):
        torch.testing.assert_close(b.detach(), a.detach(), rtol=0, atol=1e-6)
    assert capfd.readouterr().err.count("warning: torch.compile of LAMB's update failed") == 1
