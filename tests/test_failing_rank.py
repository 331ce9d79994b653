"""A rank that fails a bound ends the job at once, not after the collectives' timeout: two gloo ranks under
torchrun (as templates/local.sh.j2 starts a local cluster's ranks; under Slurm, srun --kill-on-bad-exit=1
in templates/sbatch.sh.j2), rank 1 reading a shard whose packs exceed the fast step's masked-position bound."""

import os
import subprocess
import sys

import numpy as np
from conftest import REPO
from synthetic import tiny_run_config

from trainer.config import load_run_config
from trainer.data.dataset import files_by_rank
from trainer.data.layout import Sample, write_shard


def overfull_shard(path, count: int = 256) -> None:
    """Sequences of 12 tokens with 10 masked each: three to a pack are 30 masked positions, past the tiny
    run's bound of max_predictions_per_seq + pack_sequences = 13 per pack."""
    ids = np.array([2] + [20] * 10 + [3])
    write_shard(path, [Sample(ids, np.zeros(12, np.int64), np.arange(1, 11), np.full(10, 20), 0)] * count, "varlen", 64, 10)


def test_one_rank_failing_a_bound_ends_both_ranks_within_seconds(tmp_path):
    config = tiny_run_config(tmp_path, world_size=2, train={"global_batch_size": 16}, optim={"max_steps": 50},
                             balance={"packing": True, "pack_sequences": 3, "pack_window": 64},
                             runtime={"unpad": True, "step": "fast", "num_threads": 1})
    cfg = load_run_config(str(config))
    overfull_shard(files_by_rank(cfg.data, cfg.balance, 2, cfg.train.seed)[1][0])  # rank 1's first shard
    # a rank left waiting would wait for gloo's 30-minute timeout: the subprocess's 4 minutes would then expire
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "trainer",
                           "--config", str(config), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=240, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode != 0
    failed = [line for line in proc.stderr.splitlines() if line.startswith("error: balance.pack_sequences")]
    assert failed == ["error: balance.pack_sequences or data.max_predictions_per_seq: a batch has 240 masked, more than the fast "
                      "step's fixed bound (104); raise balance.pack_sequences or data.max_predictions_per_seq or set "
                      "runtime.step: reference"]
    # rank 1 ended with the bad-input code; rank 0's all-reduce lost its peer and ended it (~2 s later on this machine)
    assert "exitcode  : 2" in proc.stderr and "rank      : 1" in proc.stderr
