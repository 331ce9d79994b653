"""CPU training throughput on the real length mix: padded vs unpadded vs packed, same model, same process.

    python benchmarks/padding_throughput.py [--steps 6] [--threads N]

A 4-layer, 256-hidden BERT (the throughput benchmark's size), fp32, one training step = forward,
backward, AdamW. Batches of 16 sequences drawn from the real Wikipedia length histogram (15 %
masked, at most 76): padded to the batch's longest sequence; unpadded (a token stream with
sequence offsets); packed (8 packs of <= 512 tokens, best fit from the same kind of draw, which
carry about 16 sequences). Reported: tokens of real data per second (median step), interleaved.

On this implementation packing costs the same compute as unpadding (both run the variable-length
path on real tokens only); what packing adds is equal work per rank and fixed row shapes.
"""

import argparse
import platform
import statistics
import time

import numpy as np
import torch

from trainer.balance.algorithms import pack_sequences
from trainer.config import ModelConfig
from trainer.data.batch import collate
from trainer.data.histogram import sample_lengths
from trainer.data.layout import Sample
from trainer.model.bert import BertForPreTraining


def sample_of(length: int, rng, vocab: int) -> Sample:
    length = int(max(length, 8))
    k = min(76, max(1, round(0.15 * length)))
    pos = np.sort(rng.choice(np.arange(1, length - 1), size=k, replace=False))
    return Sample(rng.integers(1000, vocab, length), (np.arange(length) >= length // 2).astype(np.int64), pos,
                  rng.integers(1000, vocab, k), int(rng.integers(0, 2)))


def batches(rng, vocab: int):
    """One draw of each kind: 16 sequences (padded and unpadded use the same), and 8 packs."""
    plain = [sample_of(n, rng, vocab) for n in sample_lengths(16, rng)]
    window = [sample_of(n, rng, vocab) for n in sample_lengths(256, rng)]
    groups = pack_sequences(np.array([len(s) for s in window]), 512)
    packed = [window[i] for g in groups[:8] for i in g]
    return {"padded": (plain, False), "unpadded": (plain, True), "packed": (packed, True)}


def step(model, opt, samples, unpadded) -> tuple[float, int]:
    batch = collate(samples, unpadded=unpadded)
    start = time.perf_counter()
    mlm_sum, nsp_sum = model(batch, loss_sums=True)
    (mlm_sum / batch.num_masked + nsp_sum / batch.num_sequences).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - start, sum(len(s) for s in samples)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = ModelConfig(num_layers=4, hidden_size=256, num_heads=4, intermediate_size=1024)
    model = BertForPreTraining(cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng = np.random.default_rng(0)
    rates = {"padded": [], "unpadded": [], "packed": []}
    for i in range(args.steps + 1):
        for kind, (samples, unpadded) in batches(rng, cfg.vocab_size).items():
            seconds, tokens = step(model, opt, samples, unpadded)
            if i:  # the first round warms up
                rates[kind].append(tokens / seconds)
    print(f"machine: {platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}; "
          f"4 layers x 256 hidden, fp32, {args.steps} steps each, medians")
    for kind, values in rates.items():
        print(f"{kind:>9}: {statistics.median(values):>9,.0f} real tokens/s")
    base = statistics.median(rates["padded"])
    print(f"unpadded/padded={statistics.median(rates['unpadded']) / base:.2f} "
          f"packed/padded={statistics.median(rates['packed']) / base:.2f}")


if __name__ == "__main__":
    main()
