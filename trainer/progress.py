"""What a run says about itself while it trains: step tallies, the progress line, metrics, MFU.

A `Tally` is a rank's sums of losses and counts over one step or a window of steps, kept on the
device as one small tensor so that nothing waits for the GPU until the progress line is due, and
so that summing a window and its last step over all ranks is a single all-reduce.
"""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path

import torch

from trainer import distributed
from trainer.config import ModelConfig
from trainer.model import flops_per_sequence


class Tally:
    """Sums of one rank: MLM and NSP cross-entropy, masked tokens, sequences and real tokens."""

    FIELDS = ("mlm_loss", "nsp_loss", "masked", "sequences", "tokens")

    def __init__(self, device: torch.device | str, values: torch.Tensor | None = None):
        self.values = torch.zeros(len(self.FIELDS), device=device) if values is None else values

    def add(self, mlm_loss: torch.Tensor, nsp_loss: torch.Tensor, masked: int, sequences: int, tokens: int) -> None:
        counts = torch.tensor([masked, sequences, tokens], dtype=self.values.dtype).to(self.values.device, non_blocking=True)
        self.values += torch.cat([torch.stack([mlm_loss.detach(), nsp_loss.detach()]).to(self.values.dtype), counts])

    def __iadd__(self, other: "Tally") -> "Tally":
        self.values += other.values
        return self

    def read(self) -> dict[str, float]:
        """The sums on the host (this waits for the device)."""
        return dict(zip(self.FIELDS, self.values.tolist()))


def global_sums(window: Tally, last: Tally) -> tuple[dict[str, float], dict[str, float]]:
    """The window's and its last step's sums over all ranks, in one all-reduce."""
    both = distributed.all_reduce_sum(torch.stack([window.values, last.values]))
    rows = both.tolist()
    return dict(zip(Tally.FIELDS, rows[0])), dict(zip(Tally.FIELDS, rows[1]))


def mean_losses(sums: dict[str, float]) -> tuple[float, float]:
    """(MLM loss per masked token, NSP loss per sequence)."""
    return sums["mlm_loss"] / max(sums["masked"], 1), sums["nsp_loss"] / max(sums["sequences"], 1)


def progress_record(update: int, samples: int, skipped: int, lr: float, seconds: float, window: dict, last: dict,
                    device: torch.device, model: ModelConfig, world_size: int) -> dict:
    """One line of metrics/run_N.jsonl: the last step's loss, the window's means and rates."""
    mlm, nsp = mean_losses(window)
    last_mlm, last_nsp = mean_losses(last)
    seq_per_s, tok_per_s = window["sequences"] / seconds, window["tokens"] / seconds
    record = {
        "update": update, "samples": samples, "loss": last_mlm + last_nsp, "mlm_loss": mlm, "nsp_loss": nsp, "lr": lr,
        "seq_per_s": seq_per_s, "tokens_per_s": tok_per_s, "skipped": skipped, "memory_gb": memory_gb(device),
        "time": time.time(),
    }
    per_seq = max(window["sequences"], 1)
    mfu = model_flops_utilization(model, device, seq_per_s / world_size, window["tokens"] / per_seq, window["masked"] / per_seq)
    if mfu is not None:
        record["mfu"] = mfu
    return record


def progress_line(record: dict) -> str:
    mfu = f" | mfu {record['mfu']:.1%}" if "mfu" in record else ""
    return (f"update {record['update']} | loss {record['loss']:.4f} (mlm {record['mlm_loss']:.4f}, nsp {record['nsp_loss']:.4f}) "
            f"| lr {record['lr']:.3e} | {record['seq_per_s']:.1f} seq/s {record['tokens_per_s']:,.0f} tok/s "
            f"| mem {record['memory_gb']:.2f} GB{mfu}")


def append_json_line(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")


def memory_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # kB on Linux


# dense bf16/fp16 tensor-core peaks, TFLOP/s (the SXM parts)
# dense bf16, vendor datasheets; the first name the GPU's contains wins (the PCIe card before the SXM)
PEAK_TFLOPS = {"A100": 312.0, "H100 PCIe": 756.0, "H100": 989.0, "H200": 989.0, "B200": 2250.0}


def peak_tflops(device_name: str) -> float | None:
    return next((v for k, v in PEAK_TFLOPS.items() if k in device_name), None)


def model_flops_utilization(model: ModelConfig, device: torch.device, seq_per_s_per_gpu: float, mean_len: float,
                            masked_per_seq: float) -> float | None:
    """Real-token training FLOPs per second of one GPU over its dense bf16 peak; None off CUDA."""
    if device.type != "cuda":
        return None
    peak = peak_tflops(torch.cuda.get_device_name(device))
    if peak is None:
        return None
    return seq_per_s_per_gpu * flops_per_sequence(model, mean_len, masked_per_seq) / (peak * 1e12)
