"""The GPU suite's checks and measurements: each a function that returns its record (pass, fail with
its one-line reason, or skip saying why, and its figures). `benchmarks/gpu_suite.py` runs them in
stages; tests/test_gpu_suite.py runs the CPU-runnable ones at tiny shapes.

- parity: our model on the device in fp32 against our model on the CPU and against Hugging Face's
  `BertForPreTraining` on the device, same weights, padded and unpadded;
- attention: every variable-length backend that can run here (flash_attn, nested, per_sequence) in
  bf16, fp16 and fp32 against the per-sequence reference in fp32, forward and gradients;
- precision: one bf16 and one fp16 training step at BERT-large phase-2 shapes, and an fp16 step
  whose gradients overflow: skipped, counted, the loss scale halved, the weights untouched;
- trainer: the real trainer (`python -m trainer` under torchrun, 1 rank) for 20 updates with each
  `optim.clip` mode and the warm-up (bucket-wise clipping in a one-rank NCCL DDP group, the others
  without a process group), then the MLPerf path once more in fp16 (the dynamic loss scaler), with
  apex's kernels where usable and `runtime.compile`;
- steady state: the loop's training steps (Trainer.train_step, in this process) under CUDA's sync
  debug mode: every device->host copy counted and located; bf16 must make none, packed or not;
- apex: FusedLayerNorm and FusedLAMB against the PyTorch path (their updates, not just the
  weights), when apex and its CUDA extensions import;
- throughput: BERT-large phase 2 (lengths from the Wikipedia histogram, at most 76 masked per
  sequence), bf16, in this one process, on the same packed batches (48 rows of at most 3 sequences per
  step, the H100 recipe's micro-batch): Hugging Face padded to 512 (SDPA), ours reference (runtime.step
  reference), and the fast step (trainer/loop/fast_step.py) added in turn: direct flash, + static compile,
  + CUDA graph, + the recipe's LAMB, + FP8 GEMMs (runtime.fp8); the recipe's step also at MLPerf's length mix;
  sequences/s, MFU (real-token training FLOPs over the GPU's dense bf16 peak, named in the output), peak
  memory, host and device milliseconds per step;
- profile: torch.profiler over fast steps: the top ops by device time, the casts per step;
- fp8: `torch._scaled_mm` against bf16 at the encoder's GEMM shapes, sizing what FP8 could save;
- attention kernels: the packed flash operator against cuDNN's SDPA and PyTorch's other kernels on the
  packed stream (dropout 0.1, forward and backward), each checked against the fp32 reference at dropout 0;
- FP8 convergence: the recipe's step from one initialisation on one order of the sample dataset's batches,
  in bf16 and with FP8 GEMMs: both loss curves, their ends within 1 %.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import sys
import tempfile
import time
import traceback
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import yaml

from trainer.balance.algorithms import pack_sequences
from trainer.config import ModelConfig, OptimConfig
from trainer.data.batch import Capacity, collate, fixed_shape
from trainer.data.histogram import sample_lengths
from trainer.data.layout import Sample, Shard, write_shard
from trainer.loop.fast_step import CompiledForward, device_counts
from trainer.loop.progress import peak_tflops, synchronize
from trainer.model.apex_kernels import apex_missing
from trainer.model.attention import AttentionUnavailable, flash_attn_installed, varlen_attention
from trainer.model.bert import BertForPreTraining, flops_per_sequence, pretraining_loss_sums
from trainer.model.fp8 import fp8_problem, to_fp8_training, torchao_problem
from trainer.model.weights import load_pretrained
from trainer.optim import build_optimizer, learning_rate, set_learning_rate, take_step

from .children import run as run_child

RESULTS: list[dict] = []
REPO = Path(__file__).resolve().parents[2]


def check(name: str):
    """Run the decorated check; record pass / fail (with its one-line reason) / skip, and its figures."""
    def wrap(fn):
        def run(*args, **kwargs):
            started = time.perf_counter()
            record = {"check": name}
            try:
                outcome = fn(*args, **kwargs) or {}
                record.update({"status": "pass"}, **outcome)
            except Skip as s:
                record.update(status="skip", reason=str(s))
            except Exception as e:  # noqa: BLE001 - a failed check is a result, the suite goes on
                record.update(status="fail", reason=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300])
                traceback.print_exc(limit=3)
            record["seconds"] = round(time.perf_counter() - started, 1)
            RESULTS.append(record)
            print(f"[{record['status']:>4}] {name} ({record['seconds']} s): "
                  f"{ {k: v for k, v in record.items() if k not in ('check', 'status', 'seconds')} }", flush=True)
            return record
        return run
    return wrap


class Skip(Exception):
    pass


# ---- inputs ----------------------------------------------------------------------------------

def make_samples(n: int, rng: np.random.Generator, vocab: int, max_len: int = 512, max_pred: int = 76,
                 masked_share: float | None = None, lengths=None) -> list[Sample]:
    """Sequences with Wikipedia's length distribution (or the `lengths` given), min(76, length - 2) masked each
    (the busiest case), or with `masked_share` min(76, round(share x length)), as MLPerf's data (0.15)."""
    samples = []
    for length in sample_lengths(n, rng) if lengths is None else lengths:
        length = int(min(max(length, 8), max_len))
        ids = rng.integers(1000 % vocab, vocab, length)
        k = min(max_pred, length - 2) if masked_share is None else min(max_pred, max(1, round(masked_share * length)))
        positions = np.sort(rng.choice(np.arange(1, length - 1), size=k, replace=False))
        samples.append(Sample(ids, (np.arange(length) >= length // 2).astype(np.int64), positions,
                              rng.integers(0, vocab, k), int(rng.integers(0, 2))))
    return samples


def hf_model(cfg: ModelConfig, attn: str):
    from transformers import BertConfig
    from transformers import BertForPreTraining as HFBert

    return HFBert(BertConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
                             num_attention_heads=cfg.num_heads, intermediate_size=cfg.intermediate_size,
                             max_position_embeddings=cfg.max_position_embeddings, attn_implementation=attn))


def hf_inputs(samples: list[Sample], device, pad_to: int) -> dict:
    batch = collate(samples, unpadded=False, pad_to=pad_to)
    labels = torch.full(batch.input_ids.shape, -100, dtype=torch.long)
    labels.view(-1)[batch.mlm_positions] = batch.mlm_labels
    return {k: v.to(device) for k, v in dict(
        input_ids=batch.input_ids, token_type_ids=batch.segment_ids, attention_mask=batch.attention_mask.long(),
        labels=labels, next_sentence_label=batch.nsp_labels).items()}


def peak_memory(device: torch.device) -> dict:
    """GiB since the last reset: what tensors held, and what the caching allocator held (their
    peak plus its free blocks; NCCL's and flash_attn's own buffers are in neither)."""
    if device.type != "cuda":
        return {"peak_allocated_gib": None, "peak_reserved_gib": None}
    return {"peak_allocated_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2),
            "peak_reserved_gib": round(torch.cuda.max_memory_reserved(device) / 2**30, 2)}


# ---- checks ----------------------------------------------------------------------------------

@check("parity: fp32 forward, device vs CPU vs Hugging Face, padded and unpadded")
def parity(device: torch.device, cfg: ModelConfig, n: int) -> dict:
    torch.manual_seed(0)
    samples = make_samples(n, np.random.default_rng(1), cfg.vocab_size, cfg.max_position_embeddings)
    hf = hf_model(cfg, "eager").eval()
    ours = BertForPreTraining(cfg).eval()
    load_pretrained(ours, hf.state_dict(), "hf")
    padded, unpadded = collate(samples, unpadded=False), collate(samples, unpadded=True)
    with torch.no_grad():
        cpu_mlm, cpu_nsp = ours(padded)
        ours.to(device)
        dev = {name: [t.float().cpu() for t in ours(b.to(device))] for name, b in (("padded", padded), ("unpadded", unpadded))}
        out = hf.to(device)(**{k: v for k, v in hf_inputs(samples, device, padded.input_ids.shape[1]).items()
                               if k not in ("labels", "next_sentence_label")})
        hf_mlm = out.prediction_logits.reshape(-1, out.prediction_logits.shape[-1])[padded.mlm_positions.to(device)].float().cpu()
        hf_nsp = out.seq_relationship_logits.float().cpu()
    errors = {}
    for name, (mlm, nsp) in dev.items():
        errors[f"{name}_vs_cpu"] = max((mlm - cpu_mlm).abs().max().item(), (nsp - cpu_nsp).abs().max().item())
        errors[f"{name}_vs_hf"] = max((mlm - hf_mlm).abs().max().item(), (nsp - hf_nsp).abs().max().item())
    worst = max(errors.values())
    assert worst < 5e-3, f"largest logit difference {worst:.2e} (>= 5e-3): {errors}"
    return {"max_abs_logit_diff": {k: float(f"{v:.3g}") for k, v in errors.items()}}


@check("attention: every runnable backend in bf16/fp16/fp32 against the fp32 per-sequence reference")
def attention_backends(device: torch.device, heads: int, head_dim: int, n: int) -> dict:
    rng = np.random.default_rng(2)
    lengths = [int(x) for x in np.clip(sample_lengths(n, rng), 2, 512)]
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32, device=device)
    total, longest = int(cu[-1]), max(lengths)
    g = torch.Generator(device="cpu").manual_seed(3)
    q, k, v, grad = (torch.randn(total, heads, head_dim, generator=g).to(device) for _ in range(4))
    ref_inputs = [x.clone().requires_grad_() for x in (q, k, v)]
    reference = varlen_attention(*ref_inputs, cu, longest, 0.0, "per_sequence", lengths)
    ref_grads = torch.autograd.grad(reference, ref_inputs, grad)
    errors, skipped = {}, {}
    for backend in ("flash_attn", "nested", "per_sequence"):
        for dtype in (torch.bfloat16, torch.float16, torch.float32):  # fp32: torch's memory-efficient kernel
            name = f"{backend}_{str(dtype).removeprefix('torch.')}"
            inputs = [x.to(dtype).requires_grad_() for x in (q, k, v)]
            try:
                out = varlen_attention(*inputs, cu, longest, 0.0, backend, lengths)
            except AttentionUnavailable as e:
                skipped[name] = str(e).split(";")[0]
                continue
            grads = torch.autograd.grad(out, inputs, grad.to(dtype))
            errors[name] = max([(out.float() - reference).abs().max().item()] +
                               [(a.float() - b).abs().max().item() for a, b in zip(grads, ref_grads)])
    assert errors, f"no backend ran: {skipped}"
    worst = max(errors.values())
    assert worst < 5e-2, f"largest difference {worst:.2e} (>= 5e-2): {errors}"
    fused = nested_kernel_with_dropout(q, k, v, grad, cu, longest, lengths) if device.type == "cuda" else "no CUDA here"
    return {"max_abs_diff": {k: float(f"{v:.3g}") for k, v in errors.items()}, "not_runnable": skipped,
            "nested_with_dropout": fused}


def nested_kernel_with_dropout(q, k, v, grad, cu, longest, lengths) -> dict:
    """The nested backend in training (dropout 0.1, forward and backward) with SDPA's math kernel
    forbidden: it must reach flash (fp16/bf16) or memory-efficient attention (fp32), or fail here
    instead of running the slow per-sequence math fallback unseen."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    result = {}
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        inputs = [x.to(dtype).requires_grad_() for x in (q, k, v)]
        try:
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
                out = varlen_attention(*inputs, cu, longest, 0.1, "nested", lengths)
                torch.autograd.grad(out, inputs, grad.to(dtype))
            result[str(dtype).removeprefix("torch.")] = "fused kernel"
        except RuntimeError as e:
            result[str(dtype).removeprefix("torch.")] = f"no fused kernel: {str(e).splitlines()[0][:200]}"
    assert all(r == "fused kernel" for r in result.values()), result
    return result


@check("precision: bf16 and fp16 steps at phase-2 shapes, an overflowing fp16 step skipped and counted")
def precision_steps(device: torch.device, cfg: ModelConfig, n: int) -> dict:
    torch.manual_seed(0)
    samples = make_samples(n, np.random.default_rng(4), cfg.vocab_size)
    batch = collate(samples, unpadded=True).to(device)
    model = BertForPreTraining(cfg).to(device).train()
    optim_cfg = OptimConfig(name="lamb", lr=1e-4, max_steps=10)
    optimizer = build_optimizer(model, optim_cfg, use_apex=False, device_type=device.type)
    losses = {}
    for precision, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        scaler = torch.amp.GradScaler(device.type, init_scale=2.0**16) if precision == "fp16" else None
        with torch.autocast(device.type, dtype=dtype):
            mlm, nsp = model(batch)
        mlm_sum, nsp_sum = pretraining_loss_sums(mlm, nsp, batch)
        loss = mlm_sum / batch.num_masked + nsp_sum / batch.num_sequences
        (scaler.scale(loss) if scaler else loss).backward()
        skipped = take_step(optimizer, scaler)
        optimizer.zero_grad(set_to_none=True)
        assert math.isfinite(loss.item()) and not skipped, f"{precision}: loss {loss.item()}, skipped {skipped}"
        losses[precision] = round(loss.item(), 4)
    # an overflowing fp16 step: the scaler must skip it, halve the scale, and leave the weights alone
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**16)
    with torch.autocast(device.type, dtype=torch.float16):
        mlm, nsp = model(batch)
    mlm_sum, nsp_sum = pretraining_loss_sums(mlm, nsp, batch)
    scaler.scale(mlm_sum / batch.num_masked + nsp_sum / batch.num_sequences).backward()
    next(model.parameters()).grad.view(-1)[0] = float("inf")
    before = [p.detach().clone() for p in model.parameters()]
    skipped = take_step(optimizer, scaler)
    unchanged = all(torch.equal(a, p.detach()) for a, p in zip(before, model.parameters()))
    assert skipped and scaler.get_scale() == 2.0**15 and unchanged, \
        f"overflow: skipped {skipped}, scale {scaler.get_scale()}, weights unchanged {unchanged}"
    return {"loss": losses, "overflow_skipped": True, "scale_after_overflow": scaler.get_scale()}


@check("trainer: 1-rank runs of python -m trainer under torchrun: each optim.clip mode with the warm-up "
       "(bucket through NCCL and DDP), and the MLPerf path in fp16 with apex where usable and torch.compile")
def trainer_runs(device: torch.device, precision: str, deadline: float, log: Path,
                 clips: tuple[str, ...] = ("local", "bucket", "after_allreduce", "none"), compiled: bool = True) -> dict:
    from synthetic import tiny_run_config

    backend = "nccl" if device.type == "cuda" else "gloo"
    kernels = "apex" if device.type == "cuda" and apex_missing() is None else "torch"
    fp16 = "fp16" if device.type == "cuda" else precision  # the dynamic loss scaler needs CUDA
    runs = {clip: ({"clip": clip}, {"precision": precision}) for clip in clips}
    if compiled:
        runs[f"bucket_{fp16}_{kernels}_compiled"] = ({"clip": "bucket"}, {"precision": fp16, "kernels": kernels, "compile": True})
    results = {}
    with tempfile.TemporaryDirectory(prefix="bertctl-gpu-suite-") as tmp:
        for label, (optim, runtime) in runs.items():
            folder = Path(tmp) / label
            folder.mkdir()
            config = tiny_run_config(folder, world_size=1, batch_size=8, optim={"max_steps": 20, **optim},
                                     train={"max_samples_termination": 160, "eval_every_samples": 80},
                                     runtime={"device": device.type, "backend": backend, "unpad": True,
                                              "nccl_warmup_steps": 2, **runtime},
                                     mlperf={"division": "open"})
            out = folder / "out"
            proc = run_child([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1",
                              "-m", "trainer", "--config", str(config), "--out", str(out)], deadline, log, f"trainer {label}")
            assert proc.returncode == 0, f"{label}: {proc.reason()}"
            records = [json.loads(line) for line in (out / "metrics" / "run_0.jsonl").read_text().splitlines()]
            losses = [r["loss"] for r in records]
            assert len(losses) >= 20 and all(map(math.isfinite, losses)), f"{label}: losses {losses}"
            results[label] = {"first_loss": round(losses[0], 4), "last_loss": round(losses[-1], 4),
                              "steps_logged": len(losses), "warm_up_logged": "warm-up" in proc.stdout,
                              "compile_warning": "torch.compile of" in proc.stderr}
    return {"backend": backend, "precision": precision, "runs": results}


# what torch warns at each synchronising call in sync debug mode "warn" (c10's warn_or_error_on_sync). Matched
# whole: switching the mode on also warns, once per process, that it "is a prototype feature and does not yet
# detect all synchronizing operations", and a looser match counted that notice as the first case's one sync
# (the "0.2 per step" of bucket bf16 on the H100, 2026-11-27; on the H200, 2026-11-28: 1 while switching on,
# 0 in 10 steps, and none raised in error mode)
SYNC_WARNING = "called a synchronizing CUDA operation"


def counted_syncs(trainer, device: torch.device, steps: int) -> dict:
    """`steps` of the loop's training steps under CUDA's sync debug mode "warn": the synchronising calls
    per step, and where each came from: the innermost frame in bertctl's code (a torch frame alone names
    torch's wrapper, not the caller), counted apart for switching the mode on, each step, and off."""
    import warnings

    seen: dict[str, list[str]] = {"switching on": [], "steps": [], "switching off": []}
    phase = "switching on"

    def record(message, category, filename, lineno, file=None, line=None):
        if SYNC_WARNING in str(message):
            seen[phase].append(our_frame(traceback.extract_stack()[:-1]) or f"{Path(filename).name}:{lineno}")

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        if device.type == "cuda":
            torch.cuda.set_sync_debug_mode("warn")
        try:
            phase = "steps"
            for _ in range(steps):  # the loop's own calls, evaluation and reports aside
                step = trainer.train_step(trainer.next_micro_batches())
                trainer.counts.count(step)
                assert not trainer.eval_due(step) and trainer.stop_decision() is None
            phase = "switching off"
        finally:
            if device.type == "cuda":
                torch.cuda.set_sync_debug_mode("default")
    everywhere = [w for where in seen.values() for w in where]
    return {"syncs_per_step": round(len(everywhere) / steps, 2), "where": sorted(set(everywhere)),
            "by_phase": {k: len(v) for k, v in seen.items()}}


def first_sync_raised(trainer, steps: int = 3) -> str:
    """The first synchronising call of `steps` more steps, with sync debug mode "error": the exception's
    traceback names the call (a warning only names the Python frame it surfaced in)."""
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(steps):
            trainer.counts.count(trainer.train_step(trainer.next_micro_batches()))
        return f"none raised in {steps} steps: the syncs counted happen outside the calls the error mode checks"
    except RuntimeError as e:
        frames = traceback.extract_tb(e.__traceback__)
        return f"{str(e).splitlines()[0][:120]} at {' <- '.join(our_frames(frames)[::-1][:4]) or 'a torch frame'}"
    finally:
        torch.cuda.set_sync_debug_mode("default")


def our_frames(frames) -> list[str]:
    """file:line of the frames in bertctl's own code (trainer/, orchestrator/), innermost last."""
    return [f"{Path(f.filename).relative_to(REPO)}:{f.lineno}" for f in frames
            if Path(f.filename).is_relative_to(REPO / "trainer") or Path(f.filename).is_relative_to(REPO / "orchestrator")]


def our_frame(frames) -> str | None:
    found = our_frames(frames)
    return found[-1] if found else None


@check("steady state: the real loop's training steps, every device->host copy counted (CUDA sync debug mode)")
def steady_state_syncs(device: torch.device, precision: str, steps: int = 5) -> dict:
    """Trainer.train_step, in this process, after the warm-up and 10 steps (lazy initialisation may
    sync; DDP times its first 10 iterations with CUDA events it waits on, waits the debug mode does
    not see), with CUDA's sync debug mode warning on every synchronising call: where each one came from.
    bf16 / fp32 must make none, packed (on CUDA the fast step) or not, eager, compiled or graphed (on CUDA);
    fp16 reads the device at least twice a step (its overflow flag: the schedule must know whether the
    update happened). Syncs inside the backward
    are reported at autograd's Python frame, not their source: the count is right, the place is
    autograd's."""
    from gloo import free_port
    from synthetic import tiny_run_config

    from trainer.config import load_run_config
    from trainer.loop.entry import RunArgs
    from trainer.loop.train import Trainer
    from trainer.parallel import distributed

    runtime = {"device": device.type, "backend": "nccl" if device.type == "cuda" else "gloo", "unpad": True,
               "nccl_warmup_steps": 2}
    cases = {f"bucket_{precision}": ({"clip": "bucket"}, {"precision": precision}, {}),
             f"local_{precision}_packed": ({"clip": "local"}, {"precision": precision},
                                           {"packing": True, "pack_sequences": 3, "pack_average": 2})}
    if device.type == "cuda":
        cases[f"bucket_{precision}_compiled"] = ({"clip": "bucket"}, {"precision": precision, "compile": True}, {})
        # the packed cases run the fast step on CUDA (runtime.step auto); this one compiled and replayed as CUDA graphs
        for clip in ("local", "bucket"):  # the H100 recipe's clip mode and Samsung's, each on the fast step as shipped
            cases[f"{clip}_{precision}_packed_graphed"] = ({"clip": clip, "name": "lamb"}, {"precision": precision, "compile": True,
                                                                                           "cuda_graph": precision == "bf16"},
                                                           {"packing": True, "pack_sequences": 3, "pack_average": 2})
        cases["bucket_fp16"] = ({"clip": "bucket"}, {"precision": "fp16"}, {})
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    results = {}
    for label, (optim, changes, balance) in cases.items():
        os.environ["MASTER_PORT"] = str(free_port())
        with tempfile.TemporaryDirectory(prefix="bertctl-gpu-suite-") as tmp:
            # no evaluation or sample limit near: the loop's decisions then need no count from the device
            train = {"global_batch_size": 8 * balance.get("pack_average", 1), "eval_every_samples": 10**6,
                     "max_samples_termination": 10**7}
            config = tiny_run_config(Path(tmp), optim=optim, runtime={**runtime, **changes}, balance=balance, train=train,
                                     mlperf={"division": "open"})
            trainer = Trainer(load_run_config(str(config)), RunArgs(config=str(config), out=str(Path(tmp) / "out")))
            try:
                trainer.warm_up()
                for _ in range(10):
                    trainer.counts.count(trainer.train_step(trainer.next_micro_batches()))
                results[label] = counted_syncs(trainer, device, steps)
                if results[label]["syncs_per_step"] and device.type == "cuda":
                    results[label]["first_sync"] = first_sync_raised(trainer)
            finally:
                trainer.close()
                distributed.close()
    if device.type != "cuda":
        return {"runs": results, "note": "no CUDA here: the steps ran, the syncs were not counted"}
    syncing = [label for label in (f"bucket_{precision}", f"local_{precision}_packed", f"bucket_{precision}_compiled",
                                   f"local_{precision}_packed_graphed", f"bucket_{precision}_packed_graphed")
               if results[label]["syncs_per_step"]]
    if syncing:  # every case's counts stay in the record
        found = results[syncing[0]]
        return {"runs": results, "status": "fail",
                "reason": f"{syncing[0]}: {found['syncs_per_step']} device->host copies per step at {found['where']} "
                          f"(by phase {found['by_phase']}; error mode: {found.get('first_sync')})"[:300]}
    return {"runs": results}


@check("apex: FusedLayerNorm and FusedLAMB against the PyTorch path")
def apex_paths(device: torch.device, cfg: ModelConfig, n: int) -> dict:
    missing = apex_missing()
    if missing:
        raise Skip(f"apex is not usable here ({missing} cannot be imported)")
    torch.manual_seed(0)
    samples = make_samples(n, np.random.default_rng(5), cfg.vocab_size)
    batch = collate(samples, unpadded=True).to(device)
    plain = BertForPreTraining(cfg).to(device).train()
    fused = BertForPreTraining(cfg, fused_kernels=True).to(device).train()
    fused.load_state_dict(plain.state_dict())
    optim_cfg = OptimConfig(name="lamb", lr=1e-3, max_steps=10)
    before = [p.detach().float().clone() for p in plain.parameters()]
    steps = {}
    for name, model, use_apex in (("torch", plain, False), ("apex", fused, True)):
        optimizer = build_optimizer(model, optim_cfg, use_apex=use_apex, device_type=device.type)
        torch.manual_seed(1)  # the same dropout masks
        mlm, nsp = model(batch)
        mlm_sum, nsp_sum = pretraining_loss_sums(mlm, nsp, batch)
        loss = mlm_sum / batch.num_masked + nsp_sum / batch.num_sequences
        loss.backward()
        optimizer.step()
        updates = [p.detach().float() - p0 for p, p0 in zip(model.parameters(), before)]
        steps[name] = (loss.item(), type(optimizer).__name__, updates)
    loss_diff = abs(steps["torch"][0] - steps["apex"][0])
    # the updates, not the weights: an optimizer that did nothing would still leave the weights
    # within lr of each other (apex's LAMB with max_grad_norm=0 zeroes every gradient)
    update_error = max(((a - b).norm() / a.norm().clamp_min(1e-12)).item() for a, b in zip(steps["torch"][2], steps["apex"][2]))
    assert loss_diff < 1e-3 and update_error < 2e-2, \
        f"loss differs by {loss_diff:.2e}; the updates by {update_error:.2e} of their norm"
    return {"optimizers": [steps["torch"][1], steps["apex"][1]], "loss_diff": float(f"{loss_diff:.3g}"),
            "max_relative_update_diff": float(f"{update_error:.3g}")}


@check("throughput: BERT-large phase 2, bf16, the H100 recipe's packs: Hugging Face as its users train it, ours "
       "reference, the fast step added in turn (direct flash, static compile, CUDA graph, the recipe's LAMB compiled, FP8 GEMMs), "
       "the recipe's step also at MLPerf's length mix")
def throughput(device: torch.device, cfg: ModelConfig, packs: int, steps: int, seq_len: int = 512, warmup: int = 3,
               probes: int = 3, hf_batch: int = 56) -> dict:
    """One run, one device, the same sequences: `steps` batches of `packs` packs (rows of at most 3 sequences and
    `seq_len` tokens, NVIDIA's H100 recipe: 48 packs of 512), trained by
    - hugging_face (the baseline): Hugging Face's BertForPreTraining as its users train it: batches of `hf_batch`
      sequences (56, NVIDIA's A100 batch per GPU) padded to 512, SDPA attention, the forward in autocast and the
      backward outside it, torch's fused AdamW, one update per batch;
    - ours_reference: runtime.step reference (the unpadded stream, attention auto: NestedTensor on CUDA), eager;
    - fast_direct_flash: runtime.step fast (fixed shapes, the packed attention operator, fused QKV), eager;
    - fast_static_compile: + the whole model torch.compile'd with static shapes;
    - fast_cuda_graph: + its forward and backward replayed as CUDA graphs (mode reduce-overhead; CUDA only);
    - fast_cuda_graph_lamb: the same with the recipe's LAMB compiled (Lamb.compile_update), as the trainer runs it
      with runtime.compile; fast_cuda_graph_lamb_eager: with its multi-tensor eager update, for the A/B;
    - fast_cuda_graph_lamb_fp8: the recipe's step with runtime.fp8 (the encoder's GEMMs in FP8, trainer/model/fp8.py),
      its graphs compiled anew (skipped, saying why, where FP8 cannot run); on the CPU fast_static_compile_fp8, the
      rehearsal of the same code (torch._scaled_mm runs there, slowly).
    The recipe's step (on the CPU: fast_static_compile), bf16 and FP8, is measured again on batches at MLPerf's length
    mix (mlperf_mix_batches: ~255 tokens a sequence, ~2.0 a pack; the `mlperf_mix` figures say what they held):
    `<variant>_mlperf_mix`. The fast step's shapes are fixed, so its step time hardly changes; its sequences a step do.
    Every variant's forward runs in autocast and its backward outside it, as Trainer.forward_backward does. Each:
    sequences/s and MFU over the timed steps, peak memory, and from probe steps run one at a time (the device idle
    before each) the host's time to issue a step (cpu_ms) and the device's time to run it (gpu_ms, CUDA events);
    `speedup_vs_hf`: each variant's sequences/s over the baseline's."""
    rng = np.random.default_rng(6)
    batches = packed_batches(rng, cfg.vocab_size, packs, warmup + steps + probes, seq_len)
    timed = [s for b in batches[warmup:warmup + steps] for s in b]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    peak = peak_tflops(name) if device.type == "cuda" else None
    # per sequence, then averaged: attention's FLOPs grow with each length squared
    flops = float(np.mean([flops_per_sequence(cfg, len(s.input_ids), len(s.masked_lm_positions)) for s in timed]))
    figures = {"packs": packs, "steps": steps, "sequences_per_step": round(len(timed) / steps, 1),
               "mean_length": round(float(np.mean([len(s.input_ids) for s in timed])), 1),
               "masked_per_sequence": round(float(np.mean([len(s.masked_lm_positions) for s in timed])), 1),
               "hf_batch": hf_batch, "peak_tflops_bf16_dense": peak, "gpu": name, "compile_backend": compile_backend(device)}
    cap = Capacity.of_packs(packs, seq_len, 3, 76)
    autocast = partial(torch.autocast, device.type, dtype=torch.bfloat16)
    failed: list[str] = []

    def measure(label: str, model, step, optimizer: str = "adamw_fused", plan=None) -> None:
        """One variant's figures; a variant that raises is recorded with its reason and the next one runs
        (each variant is the first run of its code path on a GPU: one failure must not cost the rest)."""
        try:
            figures[label] = measured(model, step, optimizer, plan or (batches[:warmup], batches[warmup:warmup + steps],
                                                                       batches[warmup + steps:]))
        except Exception as e:  # noqa: BLE001 - a broken variant is a result
            traceback.print_exc(limit=4)
            figures[label] = {"error": f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"[:300]}
            failed.append(label)
        print(f"  {label}: {figures[label]}", flush=True)

    def measured(model, step, name: str, plan) -> dict:
        warm, timed_batches, probe = plan
        if name.startswith("lamb"):  # the recipe's optimizer as the trainer builds it, its update compiled or eager
            optimizer = build_optimizer(model, OptimConfig(name="lamb", lr=1e-4, max_steps=100), use_apex=False,
                                        device_type=device.type, compiled=name == "lamb_compiled")
        else:
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the blocks the previous model left cached would count as reserved
            torch.cuda.reset_peak_memory_stats(device)

        def train(samples):
            step(model, samples)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        for samples in warm:
            train(samples)
        synchronize(device)
        started = time.perf_counter()
        for samples in timed_batches:
            train(samples)
        synchronize(device)
        seq_per_s = sum(map(len, timed_batches)) / (time.perf_counter() - started)
        cpu_ms, gpu_ms = probe_steps(device, train, probe)
        return {"seq_per_s": round(seq_per_s, 1), "mfu": round(seq_per_s * flops / (peak * 1e12), 4) if peak else None,
                "cpu_ms_per_step": cpu_ms, "gpu_ms_per_step": gpu_ms, **peak_memory(device)}

    def hf_step(model, samples):
        with autocast():
            loss = model(**hf_inputs(samples, device, seq_len)).loss
        loss.backward()

    def reference_step(model, samples):
        batch = collate(samples, unpadded=True).to(device)
        with autocast():
            mlm_sum, nsp_sum = model(batch, loss_sums=True)
        (mlm_sum / batch.num_masked + nsp_sum / batch.num_sequences).backward()

    def fast_step_with(forward):
        def step(model, samples):
            batch = fixed_shape(collate(samples, unpadded=True), cap).to(device)
            masked, sequences = device_counts([batch])
            with autocast():
                mlm_sum, nsp_sum = forward(batch)
            (mlm_sum / masked + nsp_sum / sequences).backward()
        return step

    torch.manual_seed(0)
    hf_batch = figures["hf_batch"] = max(1, min(hf_batch, len(timed)))  # --quick's steps hold a few sequences
    pool = [s for b in batches for s in b]  # the same sequences, in Hugging Face's batches of hf_batch
    chunks = [pool[i:i + hf_batch] for i in range(0, len(pool), hf_batch)]
    hf_plan = (chunks[:warmup], chunks[warmup:warmup + max(1, len(timed) // hf_batch)], chunks[-probes:])
    measure("hugging_face", hf_model(cfg, "sdpa").to(device).train(), hf_step, plan=hf_plan)
    model = BertForPreTraining(cfg).to(device).train()
    measure("ours_reference", model, reference_step)
    measure("fast_direct_flash", model, fast_step_with(lambda batch: model(batch, loss_sums=True)))
    compiled = CompiledForward(model, backend=compile_backend(device))
    measure("fast_static_compile", model, fast_step_with(compiled))
    if device.type == "cuda":
        graphed = CompiledForward(model, cuda_graph=True, backend=compile_backend(device))
        measure("fast_cuda_graph", model, fast_step_with(graphed))
        measure("fast_cuda_graph_lamb", model, fast_step_with(graphed), optimizer="lamb_compiled")
        measure("fast_cuda_graph_lamb_eager", model, fast_step_with(graphed), optimizer="lamb_eager")
    else:
        for label in ("fast_cuda_graph", "fast_cuda_graph_lamb", "fast_cuda_graph_lamb_eager"):
            figures[label] = {"skipped": "CUDA graphs need a CUDA device"}
    # the recipe's step (the CPU: the most of it it runs) at MLPerf's mix, then with FP8 GEMMs at both mixes
    recipe, recipe_optimizer = ("fast_cuda_graph_lamb", "lamb_compiled") if device.type == "cuda" else ("fast_static_compile", "adamw")
    recipe_forward = graphed if device.type == "cuda" else compiled
    mix = mlperf_mix_batches(np.random.default_rng(13), cfg.vocab_size, packs, warmup + steps + probes, seq_len)
    mix_plan = (mix[:warmup], mix[warmup:warmup + steps], mix[warmup + steps:])
    figures["mlperf_mix"] = mix_of(mix_plan[1], packs)
    measure(f"{recipe}_mlperf_mix", model, fast_step_with(recipe_forward), optimizer=recipe_optimizer, plan=mix_plan)
    # the CPU rehearses the FP8 path with torchao (torch._scaled_mm runs there); the GPU needs compute capability 8.9
    problem = fp8_problem(device) if device.type == "cuda" else torchao_problem(device)
    if problem:
        figures[f"{recipe}_fp8"] = figures[f"{recipe}_fp8_mlperf_mix"] = {"skipped": problem}
    else:
        to_fp8_training(model)  # the last variants: the model's encoder GEMMs in FP8 from here on
        fp8_forward = CompiledForward(model, cuda_graph=device.type == "cuda", backend=compile_backend(device))
        measure(f"{recipe}_fp8", model, fast_step_with(fp8_forward), optimizer=recipe_optimizer)
        measure(f"{recipe}_fp8_mlperf_mix", model, fast_step_with(fp8_forward), optimizer=recipe_optimizer, plan=mix_plan)
    hf = figures["hugging_face"].get("seq_per_s")
    if hf:  # at stage e's mix: Hugging Face trained the same sequences
        figures["speedup_vs_hf"] = {k: round(figures[k]["seq_per_s"] / hf, 2) for k in VARIANTS if "seq_per_s" in figures.get(k, {})}
    if failed:  # the figures of the variants that ran stay in the record
        return {**figures, "status": "fail", "reason": f"{', '.join(failed)} raised: {figures[failed[0]]['error']}"[:300]}
    return figures


VARIANTS = ("ours_reference", "fast_direct_flash", "fast_static_compile", "fast_cuda_graph", "fast_cuda_graph_lamb",
            "fast_cuda_graph_lamb_eager", "fast_cuda_graph_lamb_fp8", "fast_static_compile_fp8")


@check("trainer throughput: python -m trainer under torchrun, BERT-large phase 2 on packed synthetic shards, the H100 "
       "recipe's step (48 packs, bf16, the model, evaluation and LAMB compiled, graphed): the rate its own metrics report")
def trainer_throughput(device: torch.device, cfg: ModelConfig, packs: int, steps: int, deadline: float, log: Path,
                       seq_len: int = 512, eval_samples: int = 10_000, clips: tuple[str, ...] = ("local", "bucket"),
                       stage_e: Path | None = None) -> dict:
    """The product, not a harness: the real trainer (`python -m trainer`, one rank under torchrun, NCCL on CUDA)
    on HDF5 shards of sequences with Wikipedia's lengths (15 % masked, as stage e's), `steps` updates of `packs`
    packs each in every `clips` mode, then one evaluation of `eval_samples` samples. Reported from the run's own
    files: sequences/s (the median of metrics/run_0.jsonl's windows after the first, which holds the first
    steps' compilation), the evaluation's seconds (eval_start to eval_stop in its MLPerf log) and the step's
    setting. A compile failure fails the run (runtime.compile_fallback: error). With stage e's record at hand
    (`stage_e`), its fast_cuda_graph_lamb figure must agree within 5 %."""
    rng = np.random.default_rng(11)
    per_step = 2 * packs  # NVIDIA's packed data: 2 sequences a pack on average
    cuda = device.type == "cuda"
    figures = {"packs": packs, "steps": steps, "eval_samples": eval_samples, "runs": {}}
    with tempfile.TemporaryDirectory(prefix="bertctl-gpu-suite-") as tmp:
        train_dir, eval_dir = Path(tmp) / "train", Path(tmp) / "eval"
        shards = 4
        for i in range(shards):
            write_shard(train_dir / f"part_{i:05d}.hdf5", make_samples(per_step * (steps + 30) // shards, rng, cfg.vocab_size,
                                                                       max_len=seq_len, masked_share=0.15), "varlen", seq_len, 76)
        write_shard(eval_dir / "eval.hdf5", make_samples(eval_samples, rng, cfg.vocab_size, max_len=seq_len, masked_share=0.15),
                    "varlen", seq_len, 76)
        for clip in clips:
            folder = Path(tmp) / clip
            folder.mkdir()
            config = folder / "run.yaml"
            config.write_text(yaml.safe_dump(product_run(cfg, train_dir, eval_dir, packs, steps, seq_len, eval_samples, clip, cuda)))
            proc = run_child([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", "-m", "trainer",
                              "--config", str(config), "--out", str(folder / "out")], deadline, log, f"trainer {clip}")
            assert proc.returncode == 0, f"clip {clip}: {proc.reason()}"
            figures["runs"][clip] = run_figures(folder / "out")
    return {**figures, **against_stage_e({clip: run["seq_per_s"] for clip, run in figures["runs"].items()}, stage_e)}


def against_stage_e(rates: dict[str, float], stage_e: Path | None) -> dict:
    """The trainer's rates over stage e's fast_cuda_graph_lamb (the same step in the harness), when its record is
    there; AssertionError when one differs by more than 5 %."""
    record = json.loads(stage_e.read_text()) if stage_e is not None and stage_e.exists() else {}
    harness = (record.get("checks") or [{}])[0].get("fast_cuda_graph_lamb", {}).get("seq_per_s")
    if not harness:
        return {"stage_e": "no stage e record with fast_cuda_graph_lamb's rate to compare with"}
    ratios = {clip: round(rate / harness, 3) for clip, rate in rates.items()}
    off = {clip: ratio for clip, ratio in ratios.items() if abs(ratio - 1) > 0.05}
    assert not off, f"the trainer's rate differs from stage e's {harness} seq/s by more than 5 %: {off}"
    return {"stage_e_fast_cuda_graph_lamb": harness, "trainer_over_stage_e": ratios}


def product_run(cfg: ModelConfig, train_dir: Path, eval_dir: Path, packs: int, steps: int, seq_len: int, eval_samples: int,
                clip: str, cuda: bool) -> dict:
    """The H100 recipe's run (clusters/nvidia_dgxh100_1x8.yaml: LAMB, 48 packs of up to 3 averaging 2, bf16, compiled and
    graphed) on one rank for `steps` updates, with one evaluation 5 updates before the end; the CPU rehearsal runs it
    in fp32, eager."""
    per_step = 2 * packs
    return {
        "world_size": 1, "model": cfg.model_dump(),
        "data": {"train_dir": str(train_dir), "eval_dir": str(eval_dir), "max_seq_length": seq_len, "max_predictions_per_seq": 76,
                 "num_workers": 2, "eval_samples": eval_samples},
        "optim": {"name": "lamb", "lr": 9.6e-4, "betas": [0.60466, 0.85437], "weight_decay": 0.1, "max_steps": steps, "clip": clip},
        "train": {"batch_size": packs, "global_batch_size": per_step, "max_samples_termination": 10**9, "target_accuracy": 0.99,
                  "eval_every_samples": per_step * (steps - 5), "eval_start_samples": per_step * (steps - 5),
                  "log_every_steps": max(1, steps // 6)},
        "balance": {"packing": True, "pack_sequences": 3, "pack_average": 2, "pack_window": min(65536, 20 * per_step)},
        "runtime": {"device": "cuda" if cuda else "cpu", "backend": "nccl" if cuda else "gloo", "precision": "bf16" if cuda else "fp32",
                    "unpad": True, "step": "fast", "compile": cuda, "cuda_graph": cuda, "nccl_warmup_steps": 2},
        "mlperf": {"division": "open"},
    }


def run_figures(out: Path) -> dict:
    """What a run's own files say: sequences/s (median window after the first), MFU, memory, its evaluation's seconds."""
    records = [json.loads(line) for line in (out / "metrics" / "run_0.jsonl").read_text().splitlines()]
    steady = records[1:] or records
    events = {}
    for line in (out / "results" / "result_0.txt").read_text().splitlines():
        event = json.loads(line.split(":::MLLOG ", 1)[1])
        events.setdefault(event["key"], event["time_ms"])
    return {"seq_per_s": round(float(np.median([r["seq_per_s"] for r in steady])), 1),
            "windows_seq_per_s": [round(r["seq_per_s"], 1) for r in records],
            "mfu": round(float(np.median([r["mfu"] for r in steady])), 4) if "mfu" in steady[0] else None,
            "memory_gb": max(r["memory_gb"] for r in records), "loss": [round(records[0]["loss"], 3), round(records[-1]["loss"], 3)],
            "eval_seconds": round((events["eval_stop"] - events["eval_start"]) / 1e3, 2)}


def compile_backend(device: torch.device) -> str:
    """inductor on CUDA (the fused kernels measured); aot_eager on the CPU, where the rehearsal checks the
    compiled path's plumbing, not its speed, and inductor's C++ toolchain may be missing."""
    return "inductor" if device.type == "cuda" else "aot_eager"


def probe_steps(device: torch.device, train, batches) -> tuple[float, float | None]:
    """Median host milliseconds to issue one step, and device milliseconds to run it (None off CUDA),
    each step started on an idle device."""
    cpu, gpu = [], []
    for samples in batches:
        synchronize(device)
        if device.type == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
        started = time.perf_counter()
        train(samples)
        cpu.append(1e3 * (time.perf_counter() - started))
        if device.type == "cuda":
            end.record()
            end.synchronize()
            gpu.append(begin.elapsed_time(end))
    return round(float(np.median(cpu)), 1), round(float(np.median(gpu)), 1) if gpu else None


@check("profile: the fast step's top kernels and its casts (torch.profiler, bf16, eager or compiled)")
def profile(device: torch.device, cfg: ModelConfig, packs: int, seq_len: int = 512, steps: int = 2, top: int = 15,
            compiled: bool = False) -> dict:
    """`steps` fast steps after 2 warm-up ones: the `top` ops and kernels by device time (by host time off
    CUDA), the casts (aten::_to_copy) per step, and the host's and the device's total per step. Eager
    (fast_direct_flash) names which op costs what; `compiled` (fast_static_compile, stage e's best without
    graphs) shows what is left once the pointwise work is fused: the kernels the next gain must come from."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    rng = np.random.default_rng(7)
    batches = packed_batches(rng, cfg.vocab_size, packs, steps + 2, seq_len)
    cap = Capacity.of_packs(packs, seq_len, 3, 76)
    model = BertForPreTraining(cfg).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    forward = CompiledForward(model, backend=compile_backend(device)) if compiled else (
        lambda batch: model(batch, loss_sums=True))

    def train(samples):
        batch = fixed_shape(collate(samples, unpadded=True), cap).to(device)
        masked, sequences = device_counts([batch])
        with torch.autocast(device.type, dtype=torch.bfloat16):
            mlm_sum, nsp_sum = forward(batch)
        (mlm_sum / masked + nsp_sum / sequences).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for samples in batches[:2]:
        train(samples)
    synchronize(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch_profile(activities=activities) as prof:
        for samples in batches[2:]:
            train(samples)
        synchronize(device)
    events = prof.key_averages()
    on_device = device.type == "cuda"
    time_of = (lambda e: e.self_device_time_total) if on_device else (lambda e: e.self_cpu_time_total)
    ranked = sorted(events, key=time_of, reverse=True)[:top]
    casts = sum(e.count for e in events if e.key == "aten::_to_copy")
    return {"variant": "fast_static_compile" if compiled else "fast_direct_flash",
            **({"compile_failed": forward.failed} if compiled else {}),
            "steps": steps, "packs": packs, "ranked_by": "self device time" if on_device else "self host time",
            "top": [{"name": e.key[:80], "ms_per_step": round(time_of(e) / 1e3 / steps, 2), "calls_per_step": e.count // steps}
                    for e in ranked],
            "casts_per_step": casts // steps,
            "host_ms_per_step": round(sum(e.self_cpu_time_total for e in events) / 1e3 / steps, 1),
            # the kernels' own events only: an aten op also carries its kernels' time as its self device time,
            # so a sum over every event counts the device's time twice (275.9 ms against 143.8 timed, H200)
            "device_ms_per_step": round(sum(e.self_device_time_total for e in events if e.device_type != DeviceType.CPU)
                                        / 1e3 / steps, 1) if on_device else None}


@check("fp8: torch._scaled_mm against bf16 torch.mm at BERT-large's encoder GEMMs (headroom past bf16)")
def fp8_gemms(device: torch.device, tokens: int = 48 * 512, repeats: int = 20) -> dict:
    """The four encoder GEMMs' forward shapes at `tokens` tokens (QKV, attention output, FC1, FC2), bf16
    against FP8 e4m3 with per-tensor scales and a bf16 output; TFLOP/s each, and what the step would
    save if every encoder GEMM (forward and both backward GEMMs, 24 layers) ran at the FP8 rate."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 9):
        raise Skip("FP8 GEMMs need a CUDA GPU of compute capability 8.9 or later (Ada, Hopper)")
    shapes = {"qkv": (tokens, 1024, 3072), "attention_output": (tokens, 1024, 1024), "fc1": (tokens, 1024, 4096),
              "fc2": (tokens, 4096, 1024)}
    one = torch.ones((), device=device)
    figures, saved_ms = {}, 0.0
    for label, (m, k, n) in shapes.items():
        a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        b = torch.randn(n, k, device=device, dtype=torch.bfloat16)
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
        bf16_ms = time_cuda(lambda a=a, b=b: torch.mm(a, b.t()), repeats)
        fp8_ms = time_cuda(lambda a8=a8, b8=b8: torch._scaled_mm(a8, b8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
                           repeats)
        tflop = 2 * m * k * n / 1e12
        figures[label] = {"bf16_tflops": round(tflop / bf16_ms * 1e3, 1), "fp8_tflops": round(tflop / fp8_ms * 1e3, 1)}
        saved_ms += 3 * 24 * (bf16_ms - fp8_ms)
    return {"tokens": tokens, **figures, "encoder_gemm_ms_saved_per_step_if_all_fp8": round(saved_ms, 1),
            "note": "per-tensor scales of 1 (no amax pass): an upper bound on the saving"}


@check("attention kernels: the packed flash operator against cuDNN's SDPA and PyTorch's other kernels on the packed stream, "
       "dropout 0.1, forward and backward (measured, not adopted)")
def attention_kernels(device: torch.device, packs: int = 48, seq_len: int = 512, heads: int = 16, head_dim: int = 64,
                      repeats: int = 10) -> dict:
    """The fast step's attention as it runs today (trainer/model/flash_varlen.py::packed_attention: PyTorch's flash kernel
    through its variable-length entry point) against what stock PyTorch offers for the same packed stream ([T, heads, D],
    stage e's lengths and its fixed-shape padding), in bf16 (fp32 off CUDA):
    - nested_<kernel>: SDPA on jagged NestedTensors of the stream's sequences (trainer/model/attention.py::nested_attention)
      with one SDPA backend forced (torch.nn.attention.sdpa_kernel): CUDNN_ATTENTION (cuDNN's kernels, Hopper's among
      them), FLASH_ATTENTION, EFFICIENT_ATTENTION;
    - packs_masked_<kernel>: the sequences laid in rows of seq_len, each row one dense attention with a block-diagonal
      mask (a sequence sees itself only): no ragged layout, but each row's seq_len^2 work; CUDNN_ATTENTION,
      EFFICIENT_ATTENTION (flash takes no mask). The gathers into rows and back are in its time.
    Off CUDA (the rehearsal) none of those kernels runs: SDPA's math kernel runs both layouts instead, so their code is
    checked against the reference there.
    Each: milliseconds for the forward and backward at dropout 0.1, whether dropout changed the output, and at dropout 0
    the largest difference from the fp32 reference (output and the three gradients, real tokens): equal under 5e-2 (the
    attention check's bound). A kernel that cannot take the inputs is recorded with PyTorch's reason. `fastest`: the
    quickest kernel equal to the reference; `over_packed_flash`: each one's time over today's operator's."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from trainer.model.attention import nested_attention
    from trainer.model.flash_varlen import packed_attention

    rng = np.random.default_rng(12)
    cap = Capacity.of_packs(packs, seq_len, 3, 76)
    batch = fixed_shape(collate(packed_batches(rng, 30522, packs, 1, seq_len)[0], unpadded=True), cap)
    lengths = [int(n) for n in batch.seqlens]  # the real sequences; the stream's padding follows them
    real = sum(lengths)
    cu = batch.cu_seqlens.to(device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    g = torch.Generator(device="cpu").manual_seed(13)
    q, k, v, grad = (torch.randn(cap.tokens, heads, head_dim, generator=g).to(device) for _ in range(4))
    reference_inputs = [x.clone().requires_grad_() for x in (q, k, v)]
    reference = packed_attention(*reference_inputs, cu, seq_len, 0.0)  # fp32: the reference kernel, one segment at a time
    reference_grads = torch.autograd.grad(reference, reference_inputs, grad)
    nested_cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int64, device=device)
    rows, segments = rows_of(lengths, seq_len, cap.tokens, device)

    def nested(kernel):
        def run(q, k, v, p):
            with sdpa_kernel([kernel]):
                out = nested_attention(q[:real], k[:real], v[:real], nested_cu, max(lengths), min(lengths), p)
            return torch.cat([out, out.new_zeros(cap.tokens - real, *out.shape[1:])])
        return run

    def packs_masked(kernel):
        mask = (segments[:, None, :, None] == segments[:, None, None, :])  # [rows, 1, L, L]

        def run(q, k, v, p):
            dense = [torch.cat([x, x.new_zeros(1, *x.shape[1:])])[rows].transpose(1, 2) for x in (q, k, v)]  # [rows, h, L, D]
            with sdpa_kernel([kernel]):
                out = F.scaled_dot_product_attention(*dense, attn_mask=mask, dropout_p=p).transpose(1, 2)
            stream = out.new_zeros(cap.tokens + 1, *out.shape[2:])
            return stream.index_put((rows.flatten(),), out.flatten(0, 1))[:cap.tokens]  # padding slots write the spare row
        return run

    fused = [("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION)]
    # off CUDA no fused kernel takes these inputs: SDPA's math kernel checks the two layouts' code there instead
    extra = [] if device.type == "cuda" else [("math", SDPBackend.MATH)]
    candidates = {"packed_flash_operator": lambda q, k, v, p: packed_attention(q, k, v, cu, seq_len, p),
                  **{f"nested_{name}": nested(kernel) for name, kernel in fused + extra},
                  **{f"packs_masked_{name}": packs_masked(kernel) for name, kernel in fused + extra if name != "flash"}}
    kernels = {}
    for name, attend in candidates.items():
        inputs = [x.to(dtype).requires_grad_() for x in (q, k, v)]
        try:
            exact = attend(*inputs, 0.0)
            grads = torch.autograd.grad(exact, inputs, grad.to(dtype))
            differences = [(a[:real].float() - b[:real]).abs().max().item()
                           for a, b in zip((exact, *grads), (reference, *reference_grads))]
            dropped = attend(*inputs, 0.1)
            ms = milliseconds(device, lambda attend=attend, inputs=inputs: torch.autograd.grad(attend(*inputs, 0.1), inputs,
                                                                                                grad.to(dtype)), repeats)
        except RuntimeError as e:
            kernels[name] = {"not_runnable": (str(e).strip().splitlines() or [""])[0][:200]}
            continue
        kernels[name] = {"ms_forward_backward": round(ms, 3), "max_abs_diff_at_p0": float(f"{max(differences):.3g}"),
                         "equal_to_reference": max(differences) < 5e-2,
                         "dropout_changes_output": not torch.equal(dropped[:real], exact[:real])}
    today = kernels["packed_flash_operator"]
    assert "ms_forward_backward" in today and today["equal_to_reference"], f"today's operator: {today}"
    equal = {name: r["ms_forward_backward"] for name, r in kernels.items() if r.get("equal_to_reference")}
    return {"tokens": cap.tokens, "real_tokens": real, "sequences": len(lengths), "rows": int(rows.shape[0]),
            "heads": heads, "head_dim": head_dim, "dtype": str(dtype).removeprefix("torch."), "kernels": kernels,
            "fastest": min(equal, key=equal.get),
            "over_packed_flash": {name: round(ms / today["ms_forward_backward"], 3) for name, ms in equal.items()},
            "adopted": "no: measured only (runtime.attention: auto keeps the packed flash operator)"}


@check("convergence: BERT-large phase 2 from one initialisation and one data order, in bf16 and with FP8 GEMMs: both MLM "
       "loss curves, their ends within 1 %")
def fp8_convergence(device: torch.device, cfg: ModelConfig, packs: int, steps: int, deadline: float, log: Path,
                    seq_len: int = 512, tolerance: float = 0.01, lr: float = 4e-3, min_fall: float | None = 0.1,
                    home: Path | None = None) -> dict:
    """`steps` updates of the recipe's step (fixed-shape packs of at most 3 sequences, `packs` a step; LAMB with the H100
    recipe's betas and weight decay, `lr` after a warm-up of a tenth of the steps then decaying linearly, the
    gradient's norm clipped to 1; compiled, on CUDA graphed, as the trainer runs it) twice from one initialisation on
    one order of batches: in bf16, and with runtime.fp8's GEMMs (trainer/model/fp8.py). The data is real text, the
    only text a bare GPU machine has: the embedded sample dataset (`bertctl data prepare --dataset sample`, in `home`
    or a temporary one: ~6,800 phase-2 sequences of Python's documentation, ~300 tokens each, its 8,192-token
    vocabulary), its packs reshuffled each epoch. Recorded: each step's MLM loss (the masked positions' mean
    cross-entropy, read from the device once at the end); passed when the bf16 loss fell by `min_fall` of its start
    (else the comparison says nothing; None: not asked, the CPU rehearsal's few steps) and the two curves' ends, each
    the mean of the last tenth of its steps, differ by at most `tolerance` of the bf16 end. lr 4e-3: on the CPU (4
    layers of 256, 8 packs of 128 tokens, 100 updates) LAMB took the loss from 9.10 to 8.35 at 1e-3, 7.19 at 4e-3 and
    6.20 at 1e-2; BERT-large's 24 post-LayerNorm layers are given the middle one."""
    problem = fp8_problem(device) if device.type == "cuda" else torchao_problem(device)
    if problem:
        raise Skip(problem)
    samples, vocab = sample_dataset(seq_len, deadline, log, home)
    cfg = cfg.model_copy(update={"vocab_size": vocab})
    max_predictions = max(len(s.masked_lm_positions) for s in samples)
    batches = epochs_of_packs(samples, packs, steps, seq_len, np.random.default_rng(14))
    torch.manual_seed(0)
    initial = BertForPreTraining(cfg).state_dict()
    optim = OptimConfig(name="lamb", lr=lr, betas=(0.60466, 0.85437), weight_decay=0.1, warmup_steps=max(1, steps // 10),
                        max_steps=steps)
    curves, seconds = {}, {}  # each leg's seconds: its compilation and its steps
    for leg in ("bf16", "fp8"):
        started = time.perf_counter()
        curves[leg] = loss_curve(device, cfg, initial, batches, Capacity.of_packs(packs, seq_len, 3, max_predictions), optim,
                                 fp8=leg == "fp8")
        seconds[leg] = round(time.perf_counter() - started, 1)
    tail = max(1, steps // 10)
    ends = {leg: float(np.mean(curve[-tail:])) for leg, curve in curves.items()}
    gap = (ends["fp8"] - ends["bf16"]) / ends["bf16"]
    figures = {"steps": steps, "packs": packs, "sequences": len(samples), "vocab_size": vocab, "lr": lr, "leg_seconds": seconds,
               "mix": mix_of(batches, packs), "first_loss": {leg: c[0] for leg, c in curves.items()},
               "end_loss": {leg: round(e, 4) for leg, e in ends.items()}, "fp8_over_bf16_at_the_end": round(gap, 5),
               "curves": curves}
    assert all(np.isfinite(c).all() for c in curves.values()), f"a loss curve is not finite: {figures['end_loss']}"
    assert min_fall is None or ends["bf16"] < (1 - min_fall) * float(np.mean(curves["bf16"][:tail])), \
        f"the bf16 loss did not fall by {min_fall:.0%} ({figures['first_loss']['bf16']} -> {ends['bf16']:.4f}): raise steps or lr"
    assert abs(gap) <= tolerance, f"FP8's loss ends {gap:+.2%} from bf16's ({ends['fp8']:.4f} vs {ends['bf16']:.4f}), past {tolerance:.0%}"
    return figures


def sample_dataset(seq_len: int, deadline: float, log: Path, home: Path | None = None) -> tuple[list[Sample], int]:
    """The embedded sample dataset's training sequences (phase 2's at 512, phase 1's at 128) and its vocabulary size,
    prepared by `bertctl data prepare --dataset sample` in `home` (where it is already, it returns at once) or in a
    temporary one."""
    with tempfile.TemporaryDirectory(prefix="bertctl-gpu-sample-") as tmp:
        env = {"BERTCTL_HOME": str(home or tmp)}
        done = run_child([sys.executable, "-m", "orchestrator", "data", "prepare", "--dataset", "sample"], deadline, log,
                         "bertctl data prepare", env)
        assert done.returncode == 0, f"bertctl data prepare --dataset sample: {done.reason()}"
        root = Path(done.stdout.strip().splitlines()[-1])
        shards = [Shard(path) for path in sorted((root / ("train" if seq_len == 512 else "train_128")).rglob("*.hdf5"))]
        vocab = json.loads((root / "prepared.json").read_text())["corpus"]["vocab_size"]
        return [s for shard in shards for s in shard.samples(range(len(shard)))], vocab


def epochs_of_packs(samples: list[Sample], packs: int, steps: int, seq_len: int, rng: np.random.Generator) -> list[list[Sample]]:
    """`steps` batches of `packs` packs (at most 3 sequences, `seq_len` tokens), the packs reshuffled each epoch."""
    rows = pack_sequences(np.array([len(s.input_ids) for s in samples]), seq_len, 3)
    order: list[list[int]] = []
    while len(order) < packs * steps:
        order += [rows[i] for i in rng.permutation(len(rows))]
    return [[samples[i] for row in order[k * packs:(k + 1) * packs] for i in row] for k in range(steps)]


def loss_curve(device: torch.device, cfg: ModelConfig, initial: dict, batches: list[list[Sample]], cap: Capacity,
               optim: OptimConfig, fp8: bool) -> list[float]:
    """The MLM loss of each update of a model from `initial` trained on `batches` (fp8: with runtime.fp8's GEMMs)."""
    model = BertForPreTraining(cfg)
    model.load_state_dict(initial)
    if fp8:
        to_fp8_training(model)
    model.to(device).train()
    cuda = device.type == "cuda"
    optimizer = build_optimizer(model, optim, use_apex=False, device_type=device.type, compiled=cuda)
    forward = CompiledForward(model, cuda_graph=cuda, backend=compile_backend(device))
    torch.manual_seed(1)  # the same dropout seeds (the masks part where the numerics do)
    losses = []
    for update, samples in enumerate(batches, 1):
        set_learning_rate(optimizer, learning_rate(update, optim))
        batch = fixed_shape(collate(samples, unpadded=True), cap).to(device)
        masked, sequences = device_counts([batch])
        with torch.autocast(device.type, dtype=torch.bfloat16):
            mlm_sum, nsp_sum = forward(batch)
        (mlm_sum / masked + nsp_sum / sequences).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        take_step(optimizer, None)
        optimizer.zero_grad(set_to_none=True)
        losses.append((mlm_sum / masked).detach())
    assert forward.failed is None, f"compiling the {'FP8' if fp8 else 'bf16'} step failed: {forward.failed}"
    curve = [round(x, 4) for x in torch.stack(losses).float().tolist()]
    del model, optimizer, forward
    torch.compiler.reset()  # the graphs and their memory pools go with the model
    if cuda:
        torch.cuda.empty_cache()
    return curve


def rows_of(lengths: list[int], row: int, spare: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences of the stream (consecutive, `lengths`) laid into rows of `row` slots, filled in order: for each slot the
    stream position it holds (`spare` where none: a zero row past the stream's end), and its sequence's number (padding
    slots each a number of their own, so each attends to itself alone and no row of the mask is empty)."""
    positions, numbers, row_positions, row_numbers, start = [], [], [], [], 0
    for number, length in enumerate(lengths):
        if len(row_positions) + length > row:
            positions.append(row_positions + [spare] * (row - len(row_positions)))
            numbers.append(row_numbers + list(range(-1, -1 - row + len(row_numbers), -1)))
            row_positions, row_numbers = [], []
        row_positions += range(start, start + length)
        row_numbers += [number] * length
        start += length
    positions.append(row_positions + [spare] * (row - len(row_positions)))
    numbers.append(row_numbers + list(range(-1, -1 - row + len(row_numbers), -1)))
    return torch.tensor(positions, device=device), torch.tensor(numbers, device=device)


def milliseconds(device: torch.device, fn, repeats: int) -> float:
    """Milliseconds per call of fn: CUDA events on CUDA, the host's clock elsewhere (after one warm-up call)."""
    if device.type == "cuda":
        return time_cuda(fn, repeats)
    fn()
    started = time.perf_counter()
    for _ in range(repeats):
        fn()
    return 1e3 * (time.perf_counter() - started) / repeats


def time_cuda(fn, repeats: int) -> float:
    """Milliseconds per call of fn on the device, after 3 warm-up calls."""
    for _ in range(3):
        fn()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(repeats):
        fn()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / repeats


def mlperf_mix_batches(rng: np.random.Generator, vocab: int, packs: int, steps: int, seq_len: int = 512,
                       pool: int = 100_000) -> list[list[Sample]]:
    """`steps` batches of `packs` packs at MLPerf's packed length mix: `pool` Wikipedia lengths packed as the trainer packs
    (at most 3 a pack, trainer/balance/algorithms.py::pack_sequences) and `packs x steps` of those packs drawn at random,
    so the batches carry the whole pool's mix: ~255 tokens a sequence and ~2.0 sequences a pack, as NVIDIA's packed
    data (1.999). packed_batches packs only the sequences it trains, and its mix is poorer (H200, 2026-11-28: 269 tokens,
    1.90 a pack)."""
    lengths = np.clip(sample_lengths(pool, rng), 8, seq_len)
    rows = pack_sequences(lengths, seq_len, 3)
    chosen = [rows[i] for i in rng.permutation(len(rows))[:packs * steps]]
    samples = iter(make_samples(0, rng, vocab, max_len=seq_len, masked_share=0.15, lengths=[lengths[i] for row in chosen for i in row]))
    return [[next(samples) for row in chosen[k * packs:(k + 1) * packs] for _ in row] for k in range(steps)]


def mix_of(batches: list[list[Sample]], packs: int) -> dict:
    """What a list of batches holds: tokens a sequence, sequences a pack."""
    sequences = [s for b in batches for s in b]
    return {"mean_length": round(float(np.mean([len(s.input_ids) for s in sequences])), 1),
            "sequences_per_pack": round(len(sequences) / (packs * len(batches)), 3)}


def packed_batches(rng: np.random.Generator, vocab: int, packs: int, steps: int, seq_len: int = 512) -> list[list[Sample]]:
    """`steps` batches of `packs` packs (at most 3 sequences, `seq_len` tokens each: the H100 recipe's 512), in pack order;
    15 % of each sequence masked, as in MLPerf's data (a pack's masked positions then fit the fast step's bound)."""
    pool = make_samples(2 * packs * steps, rng, vocab, max_len=seq_len, masked_share=0.15)
    rows = pack_sequences(np.array([len(s.input_ids) for s in pool]), seq_len, 3)
    return [[pool[i] for row in rows[k * packs:(k + 1) * packs] for i in row] for k in range(steps)]




def environment(device: torch.device) -> dict:
    """What the other stages ran on: the machine, the GPU and its driver, and the versions that matter."""
    env = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "host": platform.node(),
           "cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "device": device.type, "apex": apex_missing() is None, "flash_attn": flash_attn_installed(),
           "versions": {name: installed_version(name) for name in
                        ("transformers", "triton", "numpy", "pydantic", "mlperf-logging", "flash-attn", "apex", "torchao")}}
    # whether runtime.fp8 runs here: on a GPU, its compute capability and torchao with this torch (an FP8 Linear's
    # forward and backward); on the CPU, torchao with this torch
    env["fp8"] = (fp8_problem(device) if device.type == "cuda" else torchao_problem(device)) or "runs"
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(gpu=props.name, capability=f"{props.major}.{props.minor}", gpu_memory_gb=round(props.total_memory / 2**30, 1),
                   multiprocessors=props.multi_processor_count, driver=nvidia_driver(),
                   cudnn=torch.backends.cudnn.version(), nccl=".".join(map(str, torch.cuda.nccl.version())))
    return env


def installed_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def nvidia_driver() -> str | None:
    """The driver's version as nvidia-smi reports it (torch does not say)."""
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
