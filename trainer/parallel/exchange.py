"""Exchange padding: the ranks of a group pool their step's samples, sort them by length and deal them
back (trainer/balance/algorithms.py), so every rank gets a similar number of tokens.

global (NVIDIA): one group of all ranks. group (Samsung): groups of `group_size` consecutive
ranks, i.e. one node, so the exchange stays within the node. With packing the dealt units are
whole packs.

The exchange only moves samples between ranks within a step: the global set of samples, and so
the loss normalised by the global number of masked tokens, is unchanged.

Where it runs: group mode exchanges over gloo, in host memory, where the samples already are. On
GPUs an NCCL all-gather would queue behind the previous step's kernels, and reading its result back
would hold the loop there every step, the GPU idle while the next batch is decoded and collated;
over gloo the CPU prepares the next batch while the GPU still trains. A node's group moves little
(docs/balance.md: 264 KB per step at group 8). Global mode stays on the run's backend, NCCL on
GPUs, stall included: at scale it moves tens of MB per rank per step (38.6 MB at 1,024 ranks), more
than host TCP would carry in a step's time.

Wire format: each sample is one int16 row [length, predictions, nsp, pack, ids..., segments...,
positions..., masked ids...] padded to a fixed width, sent as float16 bits (NVIDIA's trick: NCCL
has no int16, and an all_gather only copies bits). int16 holds every token id of a vocabulary of
at most 32,768 tokens, the limit the shards have too (trainer.data.layout stores ids as int16), so
a larger vocabulary is refused when the exchange is built rather than widening the rows: int32
would double the bytes every step exchanges and still not let such ids into a shard.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from trainer.balance.algorithms import deal_order
from trainer.config import BalanceConfig, DataConfig
from trainer.data.layout import Sample
from trainer.parallel import distributed


def build_exchange(balance: BalanceConfig, data: DataConfig, device: torch.device, world_size: int) -> Exchange | None:
    """The run's exchange; None when `balance.exchange_padding` is "none" or one rank has nothing to exchange with."""
    if balance.exchange_padding == "none" or world_size == 1:
        return None
    return Exchange(balance, data, device)


class Exchange:
    def __init__(self, balance: BalanceConfig, data: DataConfig, device: torch.device | str):
        # token ids travel as int16 like the shards store them: ModelConfig.vocab_size is bounded to fit
        world, rank = dist.get_world_size(), dist.get_rank()
        global_mode = balance.exchange_padding == "global"
        self.size = world if global_mode else balance.group_size
        self.snake = balance.snake
        self.seq, self.pred = data.max_seq_length, data.max_predictions_per_seq
        self.width = HEADER + 2 * self.seq + 2 * self.pred
        self.device = torch.device(device) if global_mode else torch.device("cpu")  # where the rows travel
        self.group = dist.group.WORLD if global_mode else gloo_group_of(rank, self.size)
        self.index = rank % self.size

    def __call__(self, samples: list[Sample], packs: list[list[int]] | None = None) -> list[Sample]:
        """This rank's share of the group's samples (or of its packs: each pack stays together)."""
        pack_of = np.zeros(len(samples), dtype=np.int64)
        for p, members in enumerate(packs or []):
            pack_of[members] = p
        pool, pool_packs = [], []
        for member, rows in enumerate(self._all_gather(encode(samples, pack_of, self.seq, self.pred))):
            got, their_packs = decode(rows, self.seq, self.pred)
            pool_packs.extend((member, p) for p in their_packs)
            pool.extend(got)
        if packs is None:
            mine = deal_order(np.array([len(s) for s in pool]), self.size, self.snake)[self.index]
            return [pool[i] for i in mine]
        units = {}  # (member, pack) -> indices into the pool, in order
        for i, key in enumerate(pool_packs):
            units.setdefault(key, []).append(i)
        whole = list(units.values())
        tokens = np.array([sum(len(pool[i]) for i in unit) for unit in whole])
        mine = deal_order(tokens, self.size, self.snake)[self.index]
        return [pool[i] for u in mine for i in whole[u]]

    def _all_gather(self, rows: torch.Tensor) -> list[torch.Tensor]:
        """Each member's rows (they may differ in count: the counts are gathered first)."""
        count = torch.tensor([rows.shape[0]], device=self.device)
        counts = [torch.zeros_like(count) for _ in range(self.size)]
        dist.all_gather(counts, count, group=self.group)
        most = int(max(c.item() for c in counts))
        padded = torch.zeros((most, self.width), dtype=torch.int16, device=self.device)
        padded[: rows.shape[0]] = rows.to(self.device)
        buffers = [torch.empty((most, self.width), dtype=torch.float16, device=self.device) for _ in range(self.size)]
        dist.all_gather(buffers, padded.view(torch.float16), group=self.group)
        return [b.view(torch.int16)[: int(c.item())].cpu() for b, c in zip(buffers, counts)]


def gloo_group_of(rank: int, size: int) -> dist.ProcessGroup:
    """This rank's group of `size` consecutive ranks, over gloo. Each rank creates its own group
    only (local synchronization): under an NCCL default group bound to a device, a rank creating
    a group it is not in would take part in an NCCL communicator split, which gloo groups' members
    never do."""
    start = rank - rank % size
    return dist.new_group(list(range(start, start + size)), backend="gloo", use_local_synchronization=True,
                          timeout=distributed.TIMEOUT)


HEADER = 4  # length, predictions, nsp label, pack


def encode(samples: list[Sample], pack_of: np.ndarray, seq: int, pred: int) -> torch.Tensor:
    rows = np.zeros((len(samples), HEADER + 2 * seq + 2 * pred), dtype=np.int16)
    ids, segs, pos, mids = HEADER, HEADER + seq, HEADER + 2 * seq, HEADER + 2 * seq + pred
    for r, s in enumerate(samples):
        n, k = len(s), len(s.masked_lm_positions)
        rows[r, :HEADER] = (n, k, s.next_sentence_label, pack_of[r])
        rows[r, ids:ids + n] = s.input_ids
        rows[r, segs:segs + n] = s.segment_ids
        rows[r, pos:pos + k] = s.masked_lm_positions
        rows[r, mids:mids + k] = s.masked_lm_ids
    return torch.from_numpy(rows)


def decode(rows: torch.Tensor, seq: int, pred: int) -> tuple[list[Sample], list[int]]:
    ids, segs, pos, mids = HEADER, HEADER + seq, HEADER + 2 * seq, HEADER + 2 * seq + pred
    samples, packs = [], []
    for row in rows.numpy().astype(np.int64):
        n, k, nsp, pack = (int(x) for x in row[:HEADER])
        samples.append(Sample(row[ids:ids + n].copy(), row[segs:segs + n].copy(),
                              row[pos:pos + k].copy(), row[mids:mids + k].copy(), nsp))
        packs.append(pack)
    return samples, packs
