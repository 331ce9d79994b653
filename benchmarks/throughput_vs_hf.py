"""Training throughput of bertctl's BERT against Hugging Face `BertForPreTraining`, same config.

    python benchmarks/throughput_vs_hf.py [--steps 5] [--threads N]

4 layers, 256 hidden, 4 heads (1024 FFN), vocabulary 30522, batch 16 x 512 with sequence lengths
drawn from the real Wikipedia length histogram, up to 76 masked positions per sequence
(min(76, length - 2): the busiest realistic case), fp32 on the CPU. One training step = forward,
backward and an AdamW step. Both models start from the same weights and see the same batches, in
the same process, interleaved; the median step time of each is reported.

Hugging Face pads every sequence to 512 and runs its MLM head on all 512 positions; ours runs
the encoder on real tokens only (unpadded) and the MLM head on the masked positions only.
Last line: speedup_vs_hf=<ratio> ours_seq_per_s=<x> hf_seq_per_s=<y>
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import numpy as np
import torch
import transformers
from transformers import BertConfig
from transformers import BertForPreTraining as HFBert

from trainer.config import ModelConfig
from trainer.data.batch import collate
from trainer.data.histogram import sample_lengths
from trainer.data.layout import Sample
from trainer.model import BertForPreTraining, pretraining_loss_sums
from trainer.weights import load_pretrained

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


def hf_inputs(samples: list[Sample]) -> dict:
    batch = collate(samples, unpadded=False, pad_to=SEQ)
    labels = torch.full((BATCH, SEQ), -100, dtype=torch.long)
    labels.view(-1)[batch.mlm_positions] = batch.mlm_labels
    return dict(input_ids=batch.input_ids, token_type_ids=batch.segment_ids, attention_mask=batch.attention_mask.long(),
                labels=labels, next_sentence_label=batch.nsp_labels)


def ours_step(model, opt, samples):
    batch = collate(samples, unpadded=True)
    mlm, nsp = model(batch)
    mlm_sum, nsp_sum = pretraining_loss_sums(mlm, nsp, batch)
    (mlm_sum / batch.num_masked + nsp_sum / batch.num_sequences).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def hf_step(model, opt, samples):
    model(**hf_inputs(samples)).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5, help="timed steps per model (after one warm-up step each)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = ModelConfig(num_layers=4, hidden_size=256, num_heads=4, intermediate_size=1024)
    hf = HFBert(BertConfig(vocab_size=cfg.vocab_size, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                           intermediate_size=1024)).train()
    ours = BertForPreTraining(cfg).train()
    load_pretrained(ours, hf.state_dict(), "hf")
    opts = {name: torch.optim.AdamW(m.parameters(), lr=1e-4) for name, m in (("ours", ours), ("hf", hf))}
    rng = np.random.default_rng(0)
    batches = [make_batch(rng, cfg.vocab_size) for _ in range(args.steps + 1)]
    times = {"ours": [], "hf": []}
    for i, samples in enumerate(batches):  # interleaved, the first step of each is warm-up
        t_ours = timed(lambda: ours_step(ours, opts["ours"], samples))
        t_hf = timed(lambda: hf_step(hf, opts["hf"], samples))
        if i:
            times["ours"].append(t_ours)
            times["hf"].append(t_hf)
        print(f"step {i}{' (warm-up)' if i == 0 else ''}: ours {t_ours:.2f} s, hf {t_hf:.2f} s, "
              f"mean length {np.mean([len(s) for s in samples]):.0f}", flush=True)
    ours_s, hf_s = (BATCH / statistics.median(times[k]) for k in ("ours", "hf"))
    print(f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads; "
          f"torch {torch.__version__}, transformers {transformers.__version__}, HF attention "
          f"{hf.config._attn_implementation}; fp32, batch {BATCH} x {SEQ}, {args.steps} timed steps, medians")
    print(f"speedup_vs_hf={ours_s / hf_s:.2f} ours_seq_per_s={ours_s:.2f} hf_seq_per_s={hf_s:.2f}")


if __name__ == "__main__":
    main()
