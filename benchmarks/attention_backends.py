"""CPU time of the variable-length attention backends (runtime.attention), and of torch.compile.

    python benchmarks/attention_backends.py [--rounds 5] [--threads 2] [--compile]

Attention alone (forward + backward) on 16 sequences drawn from the Wikipedia length histogram
(phase 2, up to 512 tokens), at the demo model's shape (2 heads x 64) and a BERT-base layer's
(12 heads x 64), with attention dropout 0.1 (training) and 0 (evaluation); then whole training
steps (forward, backward, AdamW) of the demo model (2 layers x 128 hidden) with dropout 0.1 per
backend, and with --compile eager against torch.compile'd pointwise kernels (compile time shown).
Within each measurement the contenders alternate round by round and each reports its median, so a
load change hits all of them alike. Last line: one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import numpy as np
import torch

from trainer.config import ModelConfig
from trainer.data.batch import collate
from trainer.data.histogram import sample_lengths
from trainer.data.layout import Sample
from trainer.model.attention import varlen_attention
from trainer.model.bert import BertForPreTraining

BACKENDS = ("per_sequence", "nested")


def lengths(rng, n=16) -> list[int]:
    return [int(max(x, 8)) for x in sample_lengths(n, rng)]


def attention_step(backend, heads, lengths_, dropout, rng_seed=0):
    gen = torch.Generator().manual_seed(rng_seed)
    total = sum(lengths_)
    q, k, v = (torch.randn(total, heads, 64, generator=gen, requires_grad=True) for _ in range(3))
    cu = torch.tensor([0, *np.cumsum(lengths_)], dtype=torch.int32)

    def step():
        out = varlen_attention(q, k, v, cu, max(lengths_), dropout, backend, lengths_)
        out.sum().backward()

    return step


def sample(length: int, rng, vocab: int) -> Sample:
    k = min(76, max(1, round(0.15 * length)))
    pos = np.sort(rng.choice(np.arange(1, length - 1), size=k, replace=False))
    return Sample(rng.integers(5, vocab, length), (np.arange(length) >= length // 2).astype(np.int64), pos,
                  rng.integers(5, vocab, k), int(rng.integers(0, 2)))


def training_step(model, samples):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = collate(samples, unpadded=True)

    def step():
        mlm_sum, nsp_sum = model(batch, loss_sums=True)
        (mlm_sum / batch.num_masked + nsp_sum / batch.num_sequences).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def alternate(steps: dict, rounds: int) -> dict:
    """Median seconds per contender; one warm-up call each (its time is returned as 'first')."""
    first = {}
    for name, fn in steps.items():
        start = time.perf_counter()
        fn()
        first[name] = time.perf_counter() - start
    times = {name: [] for name in steps}
    for _ in range(rounds):
        for name, fn in steps.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: {"median_ms": 1e3 * statistics.median(t), "first_ms": 1e3 * first[name]} for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compile", action="store_true", help="also time torch.compile'd pointwise kernels")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    lens = lengths(rng)
    results = {"lengths": lens}
    print(f"16 sequences, {sum(lens)} tokens (mean {np.mean(lens):.0f}, max {max(lens)}); load average {os.getloadavg()[0]:.1f}",
          flush=True)
    for heads, shape in ((2, "demo 2x64"), (12, "bert-base 12x64")):
        for dropout in (0.1, 0.0):
            key = f"attention {shape} dropout {dropout}"
            results[key] = alternate({b: attention_step(b, heads, lens, dropout) for b in BACKENDS}, args.rounds)
            print(key + ": " + ", ".join(f"{b} {r['median_ms']:.0f} ms" for b, r in results[key].items()), flush=True)

    demo = ModelConfig(num_layers=2, hidden_size=128, num_heads=2, intermediate_size=512, vocab_size=8192,
                       hidden_dropout=0.1, attention_dropout=0.1)
    samples = [sample(n, rng, demo.vocab_size) for n in lens]
    torch.manual_seed(0)
    reference = BertForPreTraining(demo).train()
    models = {}
    for backend in BACKENDS:
        models[backend] = BertForPreTraining(demo, attention=backend).train()
        models[backend].load_state_dict(reference.state_dict())
    if args.compile:
        models["per_sequence+compile"] = BertForPreTraining(demo, attention="per_sequence", compile=True).train()
        models["per_sequence+compile"].load_state_dict(reference.state_dict())
    key = "demo model training step (dropout 0.1)"
    results[key] = alternate({name: training_step(m, samples) for name, m in models.items()}, args.rounds)
    print(key + ": " + ", ".join(f"{b} {r['median_ms']:.0f} ms (first {r['first_ms'] / 1e3:.1f} s)"
                                 for b, r in results[key].items()), flush=True)
    results.update(machine=platform.processor() or platform.machine(), threads=torch.get_num_threads(),
                   omp_wait_policy=os.environ.get("OMP_WAIT_POLICY", "default"),
                   torch=torch.__version__, load_average_end=os.getloadavg()[0], rounds=args.rounds)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
