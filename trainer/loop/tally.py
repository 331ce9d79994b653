"""A rank's sums of losses and counts over one step or a window of steps.

A `Tally` is kept on the device as one small tensor so that nothing waits for the GPU until the
progress line is due, and so that summing a window and its last step over all ranks is a single
all-reduce.
"""

from __future__ import annotations

import torch

from trainer.data.batch import Batch
from trainer.parallel import distributed


class Tally:
    """Sums of one rank: MLM and NSP cross-entropy, masked tokens, sequences, real tokens and the
    squares of the sequences' lengths (for the attention's FLOPs)."""

    FIELDS = ("mlm_loss", "nsp_loss", "masked", "sequences", "tokens", "squared_lengths")

    def __init__(self, device: torch.device | str, values: torch.Tensor | None = None):
        # float64: a window's sum of squared lengths passes float32's exact integers (2**24) in one step
        self.values = torch.zeros(len(self.FIELDS), dtype=torch.float64, device=device) if values is None else values

    def add(self, mlm_loss: torch.Tensor, nsp_loss: torch.Tensor, batch: Batch) -> None:
        """The batch's losses (device tensors) and its counts (known on the host)."""
        squared = sum(n * n for n in batch.seqlens)
        counts = torch.tensor([batch.num_masked, batch.num_sequences, batch.num_tokens, squared],
                              dtype=self.values.dtype).to(self.values.device, non_blocking=True)
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
