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
  sequence), bf16, in this one process: Hugging Face padded to 512 (SDPA) against ours unpadded,
  eager and with `runtime.compile`, and ours packed (48 rows of at most 3 sequences per step, the
  H100 recipe's micro-batch, compiled); sequences/s, MFU (real-token training FLOPs over the GPU's dense
  bf16 peak, named in the output) and peak memory.
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
from pathlib import Path

import numpy as np
import torch

from trainer.balance.algorithms import pack_sequences
from trainer.config import ModelConfig, OptimConfig
from trainer.data.batch import collate
from trainer.data.histogram import sample_lengths
from trainer.data.layout import Sample
from trainer.loop.progress import peak_tflops, synchronize
from trainer.model.apex_kernels import apex_missing
from trainer.model.attention import AttentionUnavailable, flash_attn_installed, varlen_attention
from trainer.model.bert import BertForPreTraining, flops_per_sequence, pretraining_loss_sums
from trainer.model.weights import load_pretrained
from trainer.optim import build_optimizer, take_step

from .children import run as run_child

RESULTS: list[dict] = []


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

def make_samples(n: int, rng: np.random.Generator, vocab: int, max_len: int = 512, max_pred: int = 76) -> list[Sample]:
    """Sequences with Wikipedia's length distribution, min(76, length - 2) masked each (the busiest case)."""
    samples = []
    for length in sample_lengths(n, rng):
        length = int(min(max(length, 8), max_len))
        ids = rng.integers(1000 % vocab, vocab, length)
        k = min(max_pred, length - 2)
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
                              "compile_warning": "torch.compile failed" in proc.stderr}
    return {"backend": backend, "precision": precision, "runs": results}


@check("steady state: the real loop's training steps, every device->host copy counted (CUDA sync debug mode)")
def steady_state_syncs(device: torch.device, precision: str, steps: int = 5) -> dict:
    """Trainer.train_step, in this process, after the warm-up and 10 steps (lazy initialisation may
    sync; DDP times its first 10 iterations with CUDA events it waits on, waits the debug mode does
    not see), with CUDA's sync debug mode warning on every synchronising call: where each one came from.
    bf16 / fp32 must make none, packed or not, eager or compiled (on CUDA); fp16 reads the device at least twice a step (its
    overflow flag: the schedule must know whether the update happened). Syncs inside the backward
    are reported at autograd's Python frame, not their source: the count is right, the place is
    autograd's."""
    import warnings

    from gloo import free_port
    from synthetic import tiny_run_config

    from trainer.config import load_run_config
    from trainer.loop.train import RunArgs, Trainer
    from trainer.parallel import distributed

    runtime = {"device": device.type, "backend": "nccl" if device.type == "cuda" else "gloo", "unpad": True,
               "nccl_warmup_steps": 2}
    cases = {f"bucket_{precision}": ({"clip": "bucket"}, {"precision": precision}, {}),
             f"local_{precision}_packed": ({"clip": "local"}, {"precision": precision},
                                           {"packing": True, "pack_sequences": 3, "pack_average": 2})}
    if device.type == "cuda":
        cases[f"bucket_{precision}_compiled"] = ({"clip": "bucket"}, {"precision": precision, "compile": True}, {})
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
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    if device.type == "cuda":
                        torch.cuda.set_sync_debug_mode("warn")
                    try:
                        for _ in range(steps):  # the loop's own calls, evaluation and reports aside
                            step = trainer.train_step(trainer.next_micro_batches())
                            trainer.counts.count(step)
                            assert not trainer.eval_due(step) and trainer.stop_decision() is None
                    finally:
                        if device.type == "cuda":
                            torch.cuda.set_sync_debug_mode("default")
            finally:
                trainer.close()
                distributed.close()
        syncs = [w for w in caught if "synchroniz" in str(w.message)]
        where = sorted({f"{Path(w.filename).name}:{w.lineno}" for w in syncs})
        results[label] = {"syncs_per_step": round(len(syncs) / steps, 2), "where": where}
    if device.type != "cuda":
        return {"runs": results, "note": "no CUDA here: the steps ran, the syncs were not counted"}
    for label in (f"bucket_{precision}", f"local_{precision}_packed", f"bucket_{precision}_compiled"):
        assert results[label]["syncs_per_step"] == 0, \
            f"{label}: {results[label]['syncs_per_step']} device->host copies per step at {results[label]['where']}"
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


@check("throughput: BERT-large phase 2, bf16, Hugging Face padded vs ours unpadded (eager, compiled) and packed")
def throughput(device: torch.device, cfg: ModelConfig, n: int, steps: int, packs: int) -> dict:
    """n sequences per step (Hugging Face padded, ours unpadded), and ours packed: `packs` rows of at
    most 2 sequences and 512 tokens per step, best-fit packed (NVIDIA's H100 recipe: 48 per GPU)."""
    rng = np.random.default_rng(6)
    batches = [make_samples(n, rng, cfg.vocab_size) for _ in range(steps + 3)]  # 3 warm-up steps
    mean_len = float(np.mean([len(s.input_ids) for b in batches for s in b]))
    masked = float(np.mean([len(s.masked_lm_positions) for b in batches for s in b]))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    peak = peak_tflops(name) if device.type == "cuda" else None
    figures = {"batch": n, "packs": packs, "mean_length": round(mean_len, 1), "masked_per_sequence": round(masked, 1),
               "peak_tflops_bf16_dense": peak, "gpu": name}

    def measure(label: str, model, step, batches=batches) -> None:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the blocks the previous model left cached would count as reserved
            torch.cuda.reset_peak_memory_stats(device)
        for i, samples in enumerate(batches):
            if i == 3:
                synchronize(device)
                started = time.perf_counter()
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = step(model, samples)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        synchronize(device)
        timed = [s for b in batches[3:] for s in b]
        seq_per_s = len(timed) / (time.perf_counter() - started)
        # per sequence, then averaged: attention's FLOPs grow with each length squared
        flops = np.mean([flops_per_sequence(cfg, len(s.input_ids), len(s.masked_lm_positions)) for s in timed])
        figures[label] = {"seq_per_s": round(seq_per_s, 1), "sequences_per_step": round(len(timed) / steps, 1),
                          "mfu": round(seq_per_s * flops / (peak * 1e12), 4) if peak else None, **peak_memory(device)}
        print(f"  {label}: {figures[label]}", flush=True)

    def hf_step(model, samples):
        return model(**hf_inputs(samples, device, cfg.max_position_embeddings)).loss

    def ours_step(model, samples):
        batch = collate(samples, unpadded=True).to(device)
        mlm_sum, nsp_sum = model(batch, loss_sums=True)
        return mlm_sum / batch.num_masked + nsp_sum / batch.num_sequences

    torch.manual_seed(0)
    measure("hugging_face_padded_sdpa", hf_model(cfg, "sdpa").to(device).train(), hf_step)
    torch.cuda.empty_cache() if device.type == "cuda" else None
    measure("ours_unpadded", BertForPreTraining(cfg).to(device).train(), ours_step)
    compiled = BertForPreTraining(cfg, compile=True).to(device).train()
    measure("ours_unpadded_compiled", compiled, ours_step)
    figures["compile_failed"] = compiled.bert.encoder.layer[0].intermediate.pointwise.failed  # then it ran eager
    measure("ours_packed_compiled", compiled, ours_step, packed_batches(rng, cfg.vocab_size, packs, steps + 3))
    hf = figures["hugging_face_padded_sdpa"]["seq_per_s"]
    figures["speedup_vs_hf"] = {k: round(figures[k]["seq_per_s"] / hf, 2)
                                for k in ("ours_unpadded", "ours_unpadded_compiled", "ours_packed_compiled")}
    return figures


def packed_batches(rng: np.random.Generator, vocab: int, packs: int, steps: int) -> list[list[Sample]]:
    """`steps` batches of `packs` packs (at most 3 sequences, 512 tokens each, as the H100 recipe's), in pack order."""
    pool = make_samples(2 * packs * steps, rng, vocab)
    rows = pack_sequences(np.array([len(s.input_ids) for s in pool]), 512, 3)
    return [[pool[i] for row in rows[k * packs:(k + 1) * packs] for i in row] for k in range(steps)]




def environment(device: torch.device) -> dict:
    """What the other stages ran on: the machine, the GPU and its driver, and the versions that matter."""
    env = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "host": platform.node(),
           "cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "device": device.type, "apex": apex_missing() is None, "flash_attn": flash_attn_installed(),
           "versions": {name: installed_version(name) for name in
                        ("transformers", "triton", "numpy", "pydantic", "mlperf-logging", "flash-attn", "apex")}}
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
