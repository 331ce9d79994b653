"""runtime.fp8: the encoder's GEMMs in FP8 through torchao.float8 (trainer/model/fp8.py), on the CPU, where
torch._scaled_mm runs FP8 too: the numerics against bf16 within FP8's expected error, the scales following the
data, what an overflowing amax does, checkpoints interchangeable with bf16 runs and a resumed run exact, the
fast step compiled whole with FP8 GEMMs in its graphs, the refusals (the run key on a CPU or with fp16, a GPU
older than 8.9, a torchao that does not run), and the precision the MLPerf log states."""

import io
import json

import numpy as np
import pytest
import torch
from test_fast_step import TINY, packed_samples, run_config
from torch import nn

from trainer.data.batch import Capacity, collate, fixed_shape
from trainer.loop.fast_step import CompiledForward
from trainer.model import fp8
from trainer.model.bert import BertForPreTraining, plain
from trainer.model.fp8 import to_fp8_training

# Rounding to p mantissa bits errs by at most half a unit in the last place; over values whose mantissas are
# spread log-uniformly (as random data's are) the relative error's RMS is 2^-p x sqrt(E[1/m^2] / 12), m in [1, 2)
# (E[1/m^2] = 3 / (8 ln 2)): 0.0265 for e4m3 (p = 3), 0.0530 for e5m2 (p = 2). A GEMM of two independently
# rounded operands errs by the root sum of squares: e4m3 x e4m3 (the forward) 0.0375; e5m2 x e4m3 (both
# gradients: the output's gradient in e5m2) 0.0593. bf16 (p = 7) gives 0.0023 for one operand.
E4M3, E5M2 = (2.0**-p * np.sqrt(3 / (8 * np.log(2)) / 12) for p in (3, 2))
FORWARD, GRADIENT = np.hypot(E4M3, E4M3), np.hypot(E5M2, E4M3)


# small: torch._scaled_mm on a CPU is a plain loop (~70 M multiply-adds a second)
IN, OUT, ROWS = 64, 128, 256


def linear_pair(seed: int = 0, bias: bool = False):
    """A plain nn.Linear(IN, OUT) with BERT's initialisation, and the FP8 Linear torchao makes of a copy."""
    generator = torch.Generator().manual_seed(seed)
    reference = nn.Linear(IN, OUT, bias=bias)
    with torch.no_grad():
        reference.weight.copy_(0.02 * torch.randn(OUT, IN, generator=generator))
    swapped = fp8.float8().convert_to_float8_training(nn.Sequential(nn.Linear(IN, OUT, bias=bias)))[0]
    swapped.load_state_dict(reference.state_dict())
    return reference, swapped


def forward_backward(layer, x, grad_output, autocast: bool = True):
    x = x.clone().requires_grad_()
    layer.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        y = layer(x)
    y.backward(grad_output.to(y.dtype))
    return y.float(), x.grad.float(), layer.weight.grad.float().clone()


def relative(a, b) -> float:
    return ((a - b).norm() / b.norm()).item()


# ---- numerics --------------------------------------------------------------------------------------

def test_an_fp8_linear_errs_by_fp8s_rounding_and_bf16_by_far_less():
    """Against the fp32 GEMM, under bf16 autocast as the trainer runs it: the FP8 output within 15 % of the 0.0375
    e4m3 x e4m3 predicts, both gradients of the 0.0593 e5m2 x e4m3 predicts; bf16 ~16x closer (so the
    FP8 layer did run FP8)."""
    reference, swapped = linear_pair()
    generator = torch.Generator().manual_seed(1)
    x, grad_output = torch.randn(ROWS, IN, generator=generator), torch.randn(ROWS, OUT, generator=generator)
    exact = forward_backward(reference, x, grad_output, autocast=False)
    in_bf16 = forward_backward(reference, x, grad_output)
    in_fp8 = forward_backward(swapped, x, grad_output)
    assert in_fp8[0].dtype == torch.float32 and swapped(x).dtype == torch.float32  # the output keeps the input's dtype
    errors = [relative(got, want) for got, want in zip(in_fp8, exact)]
    assert errors[0] == pytest.approx(FORWARD, rel=0.15), errors
    assert errors[1:] == pytest.approx([GRADIENT, GRADIENT], rel=0.15), errors
    assert max(relative(got, want) for got, want in zip(in_bf16, exact)) < FORWARD / 8


def test_the_scales_follow_the_data_at_every_call():
    """Current scaling: each operand's scale is 448 / its amax at this call, so data scaled by 2^k gives outputs and
    gradients scaled by exactly 2^k, from 2^-24 to 2^24, where one fixed scale would saturate (e4m3's largest value
    is 448) or flush everything to zero."""
    _, swapped = linear_pair()
    generator = torch.Generator().manual_seed(2)
    x, grad_output = torch.randn(ROWS, IN, generator=generator), torch.randn(ROWS, OUT, generator=generator)
    base = forward_backward(swapped, x, grad_output, autocast=False)
    for k in (-24, -8, 8, 24):
        scaled = forward_backward(swapped, x * 2.0**k, grad_output, autocast=False)
        assert torch.equal(scaled[0], base[0] * 2.0**k) and torch.equal(scaled[2], base[2] * 2.0**k), k
        assert torch.equal(scaled[1], base[1])  # the input's gradient does not depend on the input's scale
    assert (x * 2.0**24).to(torch.float8_e4m3fn).float().abs().max() == 448  # scale 1: saturated
    assert not (x * 2.0**-24).to(torch.float8_e4m3fn).float().any()  # scale 1: all flushed to zero


def test_what_an_overflowing_amax_does():
    """An inf in the input makes its amax inf, its scale 0 and the whole output NaN (bf16 spoils the inf's own row
    only): a loud failure, never finite wrong values. A finite outlier (1e30) keeps everything finite: its own row
    is right within FP8's error; the other rows, scaled down with it below e4m3's smallest value, are exactly
    zero. All zeros (amax 0) give zeros, no NaN (torchao clamps the amax)."""
    reference, swapped = linear_pair()
    x = torch.randn(16, IN, generator=torch.Generator().manual_seed(3))
    with_inf = x.clone()
    with_inf[3, 5] = float("inf")
    assert torch.isnan(swapped(with_inf)).all()
    assert (~torch.isfinite(reference(with_inf))).any(1).nonzero().flatten().tolist() == [3]
    outlier = x.clone()
    outlier[3, 5] = 1e30
    got, want = swapped(outlier), reference(outlier)
    assert torch.isfinite(got).all()
    assert relative(got[3].double(), want[3].double()) < 2 * E4M3  # ~1e28 each: their norms overflow fp32
    assert not torch.cat([got[:3], got[4:]]).any() and torch.cat([want[:3], want[4:]]).abs().min() > 0
    assert torch.equal(swapped(torch.zeros(4, IN)), torch.zeros(4, OUT))


# ---- the model -------------------------------------------------------------------------------------

def fp8_model(seed: int = 0, cfg=TINY) -> BertForPreTraining:
    torch.manual_seed(seed)
    model = BertForPreTraining(cfg, attention="per_sequence").train()
    to_fp8_training(model)
    return model


def test_only_the_encoders_six_linear_layers_are_swapped_and_names_and_parameters_stay():
    torch.manual_seed(0)
    model = BertForPreTraining(TINY).train()
    before = dict(model.named_parameters())
    assert to_fp8_training(model) == 6 * TINY.num_layers
    swapped = [name for name, m in model.named_modules() if isinstance(m, nn.Linear) and not plain(m)]
    assert swapped == [f"bert.encoder.layer.{i}.{name}" for i in range(TINY.num_layers) for name in fp8.ENCODER_LINEARS]
    kept = [name for name, m in model.named_modules() if isinstance(m, nn.Linear) and plain(m)]
    assert kept == ["bert.pooler.dense", "cls.predictions.transform.dense", "cls.predictions.decoder", "cls.seq_relationship"]
    after = dict(model.named_parameters())
    assert list(after) == list(before) and all(after[n] is before[n] for n in before)  # the optimizer's tensors
    assert not list(model.buffers())  # no scaling state to checkpoint


def test_checkpoints_of_fp8_and_bf16_runs_load_into_each_other_exactly():
    fp8_run, bf16_run = fp8_model(seed=1), BertForPreTraining(TINY).train()
    assert list(fp8_run.state_dict()) == list(bf16_run.state_dict())
    for source, target in ((fp8_run, bf16_run), (bf16_run, fp8_model(seed=2))):
        saved = io.BytesIO()
        torch.save(source.state_dict(), saved)
        saved.seek(0)
        target.load_state_dict(torch.load(saved, weights_only=True))  # strict: same keys, same shapes
        assert all(torch.equal(a, b) for a, b in zip(source.state_dict().values(), target.state_dict().values()))


def fast_batch(seed: int):
    batch = collate(packed_samples(np.random.default_rng(seed)), unpadded=True)
    return fixed_shape(batch, Capacity.of_packs(packs=4, max_seq_length=128, per_pack=3, max_predictions=20))


def train_steps(model, optimizer, seeds) -> list[float]:
    """Fast-step updates as Trainer.train_step makes them (forward in bf16 autocast, backward outside), their losses."""
    losses = []
    for seed in seeds:
        batch = fast_batch(seed)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            mlm, nsp = model(batch, loss_sums=True)
        loss = mlm / batch.num_masked + nsp / batch.num_sequences
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def test_a_resumed_fp8_run_continues_exactly():
    """Current scaling keeps no state: the model's and LAMB's state dicts are the whole checkpoint, and the run
    resumed from them repeats the uninterrupted run's losses and weights bit for bit."""
    from test_optim import optim_config

    from trainer.optim import build_optimizer

    cfg = optim_config("lamb", lr=1e-3)
    model = fp8_model(seed=3)
    optimizer = build_optimizer(model, cfg, use_apex=False, device_type="cpu")
    train_steps(model, optimizer, [10, 11])
    saved = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, saved)
    straight = train_steps(model, optimizer, [12, 13, 14])

    saved.seek(0)
    state = torch.load(saved, weights_only=True)
    resumed_model = fp8_model(seed=4)
    resumed_model.load_state_dict(state["model"])
    resumed_optimizer = build_optimizer(resumed_model, cfg, use_apex=False, device_type="cpu")
    resumed_optimizer.load_state_dict(state["optimizer"])
    assert train_steps(resumed_model, resumed_optimizer, [12, 13, 14]) == straight
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), resumed_model.state_dict().values()))


def test_the_fast_step_compiled_whole_runs_its_encoder_gemms_in_fp8():
    """CompiledForward (AOT autograd, the compiler's forward and backward graphs): 6 FP8 GEMMs a layer forward
    (Q, K and V each its own: the concatenated QKV GEMM is the plain layers' path) and 12 backward; the loss and
    gradients those of the eager FP8 model, and within FP8's error of the bf16 model's."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs = {"forward": [], "backward": []}

    def keep(into):
        return lambda graph, inputs: graphs[into].append(graph) or make_boxed_func(graph)

    bf16_model = BertForPreTraining(TINY, attention="per_sequence").train()
    model = fp8_model(seed=5)
    bf16_model.load_state_dict(model.state_dict())
    compiled = CompiledForward(model, backend=aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward")))
    batch = fast_batch(6)

    def loss_and_grads(forward, module):
        module.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            mlm, nsp = forward(batch)
        (mlm / batch.num_masked + nsp / batch.num_sequences).backward()
        return mlm.item(), {n: p.grad.clone() for n, p in module.named_parameters()}

    got = loss_and_grads(compiled, model)
    eager = loss_and_grads(lambda b: model(b, loss_sums=True), model)
    in_bf16 = loss_and_grads(lambda b: bf16_model(b, loss_sums=True), bf16_model)
    assert compiled.failed is None
    scaled_mm = {phase: sum(str(node.target) == "aten._scaled_mm.default" for g in found for node in g.graph.nodes)
                 for phase, found in graphs.items()}
    assert scaled_mm == {"forward": 6 * TINY.num_layers, "backward": 12 * TINY.num_layers}
    assert got[0] == pytest.approx(eager[0], rel=1e-4)
    query = "bert.encoder.layer.0.attention.self.query.weight"
    assert relative(got[1][query], eager[1][query]) < 0.02
    assert got[0] == pytest.approx(in_bf16[0], rel=0.01)
    assert relative(got[1][query], in_bf16[1][query]) < 3 * GRADIENT


# ---- refusals --------------------------------------------------------------------------------------

@pytest.mark.parametrize("runtime,message", [
    ({"fp8": True}, "runtime.fp8: FP8 GEMMs need runtime.device: cuda (a GPU of compute capability 8.9 or newer), "
                    "or set runtime.fp8: false"),
    ({"device": "cuda", "precision": "fp16", "fp8": True},
     "runtime.fp8: FP8 GEMMs run beside bf16, not fp16: set runtime.precision: bf16, or set runtime.fp8: false"),
])
def test_a_run_key_the_configuration_cannot_run_is_refused_naming_it_and_the_fix(runtime, message):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        run_config(**runtime)
    assert run_config(device="cuda", precision="bf16", fp8=True).runtime.fp8


def test_fp8_on_the_cpu_is_one_line_from_bertctl():
    from orchestrator.config.clusters import load_cluster
    from orchestrator.errors import UserError

    with pytest.raises(UserError) as raised:
        load_cluster("local", ["run.runtime.fp8=true"])
    assert str(raised.value).endswith("run.runtime.fp8: FP8 GEMMs need runtime.device: cuda (a GPU of compute capability 8.9 "
                                      "or newer), or set runtime.fp8: false")
    assert "\n" not in str(raised.value)


def test_torchao_runs_here_and_a_broken_or_missing_one_is_one_line(monkeypatch):
    from importlib import metadata

    assert fp8.torchao_problem(torch.device("cpu")) is None  # torch 2.13 with torchao 0.18: the smoke test passes
    assert fp8.fp8_problem(torch.device("cpu")).startswith("runtime.fp8: FP8 GEMMs need a CUDA GPU")

    def broken():
        raise ImportError("cannot import name 'is_sm_at_least_100' from 'torch.utils._triton'")

    monkeypatch.setattr(fp8, "float8", broken)
    line = fp8.torchao_problem(torch.device("cpu"))
    assert line == (f"runtime.fp8: torchao {metadata.version('torchao')} does not work with torch {torch.__version__} "
                    "(ImportError: cannot import name 'is_sm_at_least_100' from 'torch.utils._triton'): install the torchao "
                    "release made for this torch, or set runtime.fp8: false")

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(fp8.metadata, "version", not_installed)
    assert fp8.torchao_problem(torch.device("cpu")) == ("runtime.fp8: torchao is not installed: pip install 'bertctl[fp8]' "
                                                        "(torchao 0.18) where the trainer runs, or set runtime.fp8: false")


def test_a_gpu_older_than_8_9_is_refused_before_training(monkeypatch):
    """The GPU is a stand-in (its name and capability as torch.cuda would report an A100's): what the rank's
    check (trainer/parallel/distributed.py::check_kernels) raises, which python -m trainer prints in one line."""
    from trainer.config import RuntimeConfig
    from trainer.parallel import distributed

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    runtime = RuntimeConfig(device="cuda", backend="nccl", precision="bf16", unpad=True, attention="per_sequence", fp8=True)
    with pytest.raises(distributed.LaunchError) as raised:
        distributed.check_kernels(runtime, torch.device("cuda", 0))
    assert str(raised.value) == ("runtime.fp8: NVIDIA A100-SXM4-80GB has compute capability 8.0; FP8 GEMMs need 8.9 or newer "
                                 "(L40S, H100, H200): run on such a GPU, or set runtime.fp8: false")


# ---- the MLPerf log --------------------------------------------------------------------------------

@pytest.mark.parametrize("runtime,stated", [
    ({}, ["fp32", "fp32", "fp32"]),
    ({"device": "cuda", "precision": "bf16"}, ["bfloat16", "bfloat16", "fp32"]),
    ({"device": "cuda", "precision": "bf16", "fp8": True}, ["fp8", "bfloat16", "fp32"]),
])
def test_the_mlperf_log_states_the_precision_in_the_rules_keys(tmp_path, runtime, stated):
    from trainer.mlperf import PRECISION_KEYS, RunLogger

    path = tmp_path / "result_0.txt"
    log = RunLogger(path, enabled=True)
    log.hyperparameters(run_config(**runtime), seed=1, optimizer_keys=[])
    log.close()
    events = {e["key"]: e["value"] for e in (json.loads(line.split(":::MLLOG ", 1)[1]) for line in path.read_text().splitlines())}
    assert [events[key] for key in PRECISION_KEYS] == stated


def test_every_bert_rulesets_official_checker_accepts_the_precision_keys(tmp_path):
    """They are ruleset 6.0.0's (optional, with this vocabulary); BERT's rulesets, 0.7.0 to 5.0.0, pass keys they do not
    know: a complete log with them added after eval_samples passes each as the same log without them does."""
    from mllog_factory import write_log

    from orchestrator.results.compliance import bert_rulesets, check_log
    from trainer.mlperf import PRECISION_KEYS, EventLog

    plain_log = write_log(tmp_path / "plain.txt")
    lines = plain_log.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if '"eval_samples"' in line) + 1
    added = EventLog(tmp_path / "added.txt")
    for key, value in zip(PRECISION_KEYS, ["fp8", "bfloat16", "fp32"]):
        added.event(key, value, time_ms=json.loads(lines[at - 1].split(":::MLLOG ", 1)[1])["time_ms"])
    added.close()
    stated = tmp_path / "stated.txt"
    stated.write_text("".join(lines[:at]) + (tmp_path / "added.txt").read_text() + "".join(lines[at:]))
    rulesets = bert_rulesets()
    assert "5.0.0" in rulesets and "1.1.0" in rulesets
    for ruleset in rulesets:
        assert check_log(plain_log, ruleset).compliant, ruleset
        assert check_log(stated, ruleset).compliant, ruleset


# ---- the trainer -----------------------------------------------------------------------------------

def trained(tmp_path, monkeypatch, fp8_on: bool) -> tuple[list[float], dict, object]:
    """4 packed fast-step updates of the tiny synthetic run, an evaluation after the second, in-process: the losses,
    the MLPerf log's events, the trained model. runtime.fp8 cannot pass the configuration or the rank's check on a CPU:
    both are stood in for (the key set on the checked configuration, the check answering that FP8 runs), so the
    trainer's own FP8 path (build_model's swap, the compiled step, the evaluation, the log) runs here."""
    from gloo import free_port
    from synthetic import tiny_run_config

    from trainer.config import load_run_config
    from trainer.loop.entry import RunArgs
    from trainer.loop.train import Trainer
    from trainer.parallel import distributed

    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    monkeypatch.setattr(distributed, "fp8_problem", lambda device: None)
    folder = tmp_path / ("fp8" if fp8_on else "fp32")
    config = tiny_run_config(folder, balance={"packing": True, "pack_sequences": 3, "pack_average": 2, "pack_window": 64},
                             # small: torch._scaled_mm on a CPU is a plain loop
                             model={"num_layers": 1, "hidden_size": 16, "num_heads": 2, "intermediate_size": 32,
                                    "hidden_dropout": 0.0, "attention_dropout": 0.0},
                             data__eval_samples=50,
                             runtime={"unpad": True, "step": "fast"},
                             optim={"max_steps": 4}, train={"global_batch_size": 16, "eval_every_samples": 32,
                                                            "target_accuracy": 0.99})
    cfg = load_run_config(str(config))
    cfg = cfg.model_copy(update={"runtime": cfg.runtime.model_copy(update={"fp8": fp8_on})})
    trainer = Trainer(cfg, RunArgs(config=str(config), out=str(folder / "out")))
    try:
        assert trainer.run() == 0
    finally:
        trainer.close()
        distributed.close()
    losses = [json.loads(line)["loss"] for line in (folder / "out" / "metrics" / "run_0.jsonl").read_text().splitlines()]
    events = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in (folder / "out" / "results" / "result_0.txt").read_text().splitlines()]
    return losses, {e["key"]: e["value"] for e in events}, trainer.model


def test_the_trainer_trains_with_fp8_gemms_like_without_and_its_log_says_fp8(tmp_path, monkeypatch):
    """The same run with and without runtime.fp8 (fp32 around the GEMMs on the CPU): the losses within FP8's error of
    each other, the evaluation run, the model's encoder swapped, the log stating fp8 for the linear layers."""
    plain_losses, plain_log, _ = trained(tmp_path, monkeypatch, fp8_on=False)
    losses, log, model = trained(tmp_path, monkeypatch, fp8_on=True)
    assert len(losses) == len(plain_losses) == 4 and losses != plain_losses
    assert losses == pytest.approx(plain_losses, rel=1e-3)
    assert "eval_accuracy" in log and log["lowest_numerical_precision_in_linear"] == "fp8"
    assert plain_log["lowest_numerical_precision_in_linear"] == "fp32"
    assert sum(isinstance(m, nn.Linear) and not plain(m) for m in model.modules()) == 6
