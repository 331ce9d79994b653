"""Training throughput of bertctl's BERT against Hugging Face `BertForPreTraining`, same config.

    python benchmarks/throughput_vs_hf.py [--rounds 6] [--threads 2] [--load N] [--attention auto] [--compile]

4 layers, 256 hidden, 4 heads (1024 FFN), vocabulary 30522, batch 16 x 512 with sequence lengths
drawn from the real Wikipedia length histogram, up to 76 masked positions per sequence
(min(76, length - 2): the busiest realistic case), fp32 on the CPU, dropout 0.1 as in BERT. One
training step = forward, backward and an AdamW step: torch's fused AdamW for both, which is
both what Hugging Face's Trainer picks by default (optim "adamw_torch_fused" with torch >= 2.8)
and what bertctl's trainer runs for optim.name: adam. Both models start from the same weights and
see the same batches, in the same process with the same threads, in rounds: each round times one
step of each on the same batch (who goes first alternates), so a change of load hits both alike;
the ratio is the median of the per-round ratios.

Hugging Face pads every sequence to 512 and runs its MLM head on all 512 positions; ours runs
the encoder on real tokens only (unpadded) and the MLM head on the masked positions only, with
the loss as the trainer computes it (model(batch, loss_sums=True): on the CPU the decoder and its
cross-entropy are one function, trainer/model/mlm_loss.py).

Threads: OpenMP's default wait policy lets idle threads spin; when another process shares the
cores the spinning threads take the time slices the working thread needs, and a step with many
small kernels (ours) loses far more than one with few large ones (Hugging Face's). The script
sets OMP_WAIT_POLICY=PASSIVE unless it is set already (it must be set before torch loads), and
the thread count explicitly. --load N starts N busy-loop processes for the measurement, to see
the ratio when the cores are shared.
Each round also shows the CPU time of each step (all threads of this process): the ratio of those
is the ratio of work, which other processes on the machine do not change. And the ratio of the two
steps' training FLOPs (trainer/model/bert.py::flops_per_sequence: Hugging Face's at 512 tokens with the MLM
head on all 512 positions, ours at the real lengths and masked positions): a speedup above it means
ours also does its FLOPs faster.
Last line: speedup_vs_hf=<median ratio> ours_seq_per_s=<x> hf_seq_per_s=<y> flop_ratio=<median FLOP ratio>
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch (and its OpenMP) is loaded

import argparse  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from functools import partial  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import BertConfig  # noqa: E402
from transformers import BertForPreTraining as HFBert  # noqa: E402

from trainer.config import ModelConfig
from trainer.data.batch import collate
from trainer.data.histogram import sample_lengths
from trainer.data.layout import Sample
from trainer.model.bert import BertForPreTraining, flops_per_sequence
from trainer.model.weights import load_pretrained

BATCH, SEQ, MAX_PRED = 16, 512, 76


def make_batch(rng: np.random.Generator, vocab: int) -> list[Sample]:
    samples = []
    for length in sample_lengths(BATCH, rng):
        length = int(max(length, 8))
        ids = rng.integers(1000, vocab, length)
        ids[0] = 101
        seg = (np.arange(length) >= length // 2).astype(np.int64)
        k = min(MAX_PRED, length - 2)
        pos = np.sort(rng.choice(np.arange(1, length - 1), size=k, replace=False))
        samples.append(Sample(ids, seg, pos, rng.integers(1000, vocab, k), int(rng.integers(0, 2))))
    return samples


def flop_ratio(cfg: ModelConfig, samples: list[Sample]) -> float:
    """Hugging Face's training FLOPs for this batch over ours: padded to 512 and the MLM head on every position."""
    ours = sum(flops_per_sequence(cfg, len(s), len(s.masked_lm_positions)) for s in samples)
    return len(samples) * flops_per_sequence(cfg, SEQ, SEQ) / ours


def hf_inputs(samples: list[Sample]) -> dict:
    batch = collate(samples, unpadded=False, pad_to=SEQ)
    labels = torch.full((BATCH, SEQ), -100, dtype=torch.long)
    labels.view(-1)[batch.mlm_positions] = batch.mlm_labels
    return dict(input_ids=batch.input_ids, token_type_ids=batch.segment_ids, attention_mask=batch.attention_mask.long(),
                labels=labels, next_sentence_label=batch.nsp_labels)


def ours_step(model, opt, samples):
    batch = collate(samples, unpadded=True)
    mlm_sum, nsp_sum = model(batch, loss_sums=True)
    (mlm_sum / batch.num_masked + nsp_sum / batch.num_sequences).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def hf_step(model, opt, samples):
    model(**hf_inputs(samples)).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def timed(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process: its work, whatever else runs on the cores)."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


@contextmanager
def busy_processes(n: int):
    """n processes that keep a core busy each, for as long as the block runs."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6, help="timed rounds (after one warm-up round)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--load", type=int, default=0, help="busy-loop processes sharing the cores while measuring")
    parser.add_argument("--attention", default="auto", help="runtime.attention for ours")
    parser.add_argument("--compile", action="store_true", help="runtime.compile for ours")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = ModelConfig(num_layers=4, hidden_size=256, num_heads=4, intermediate_size=1024)
    hf = HFBert(BertConfig(vocab_size=cfg.vocab_size, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                           intermediate_size=1024)).train()
    ours = BertForPreTraining(cfg, attention=args.attention, compile=args.compile).train()
    load_pretrained(ours, hf.state_dict(), "hf")
    opts = {name: torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True) for name, m in (("ours", ours), ("hf", hf))}
    steps = {"ours": lambda b: ours_step(ours, opts["ours"], b), "hf": lambda b: hf_step(hf, opts["hf"], b)}
    rng = np.random.default_rng(0)
    batches = [make_batch(rng, cfg.vocab_size) for _ in range(args.rounds + 1)]
    times = {"ours": [], "hf": []}
    cpu = {"ours": [], "hf": []}
    load_before = os.getloadavg()[0]
    with busy_processes(args.load):
        for i, samples in enumerate(batches):  # round 0 is the warm-up
            order = ("ours", "hf") if i % 2 == 0 else ("hf", "ours")
            took = {name: timed(partial(steps[name], samples)) for name in order}
            if i:
                for name in times:
                    times[name].append(took[name][0])
                    cpu[name].append(took[name][1])
            print(f"round {i}{' (warm-up)' if i == 0 else ''}: ours {took['ours'][0]:.2f} s (cpu {took['ours'][1]:.2f} s), "
                  f"hf {took['hf'][0]:.2f} s (cpu {took['hf'][1]:.2f} s), ratio {took['hf'][0] / took['ours'][0]:.2f}, "
                  f"FLOP ratio {flop_ratio(cfg, samples):.2f}, mean length {np.mean([len(s) for s in samples]):.0f}",
                  flush=True)
    ratio = statistics.median(h / o for h, o in zip(times["hf"], times["ours"]))
    cpu_ratio = statistics.median(h / o for h, o in zip(cpu["hf"], cpu["ours"]))
    flops = statistics.median(flop_ratio(cfg, samples) for samples in batches[1:])
    ours_s, hf_s = (BATCH / statistics.median(times[k]) for k in ("ours", "hf"))
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} threads, "
          f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}, {args.load} busy processes, load average "
          f"{load_before:.1f} -> {os.getloadavg()[0]:.1f}; torch {torch.__version__}, transformers {transformers.__version__}, "
          f"HF attention {hf.config._attn_implementation}, ours {args.attention}{' compiled' if args.compile else ''}; "
          f"fp32, batch {BATCH} x {SEQ}, {args.rounds} rounds, medians; CPU-time ratio {cpu_ratio:.2f}")
    print(f"speedup_vs_hf={ratio:.2f} ours_seq_per_s={ours_s:.2f} hf_seq_per_s={hf_s:.2f} flop_ratio={flops:.2f}")


if __name__ == "__main__":
    main()
