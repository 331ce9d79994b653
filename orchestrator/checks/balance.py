"""`bertctl balance --cluster C`: the simulator run on a cluster's own settings.

The simulator (trainer/balance/simulate.py) is the trainer's balancing code and takes plain flags;
this module reads a cluster file (with `-o` overrides, as submit does) and turns its ranks, batch,
exchange group, deal order and packing into those flags. Flags the user gives as well come after
them, so they win.
"""

from __future__ import annotations

import argparse

from orchestrator.config.clusters import load_cluster


def simulator_arguments(argv: list[str]) -> list[str]:
    """`argv` with `--cluster NAME [-o KEY=VALUE ...]` replaced by the cluster's settings."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--cluster")
    parser.add_argument("-o", dest="override", action="append", default=[])
    known, rest = parser.parse_known_args(argv)
    if known.cluster is None:
        return argv
    loaded = load_cluster(known.cluster, known.override)
    return cluster_settings(loaded.config) + rest


def cluster_settings(config) -> list[str]:
    """The simulator flags that describe how this cluster's runs balance one micro-batch."""
    run = config.run
    b, ranks = run.balance, run.world_size
    group = {"global": ranks, "group": b.group_size, "none": 1}[b.exchange_padding]
    if b.packing:
        strategy = "packed"
    elif b.exchange_padding == "global":
        strategy = "global-exchange"
    elif b.exchange_padding == "group":
        strategy = "group-exchange"
    else:
        strategy = "stratified" if b.stratified else "random"
    flags = ["--ranks", str(ranks), "--batch", str(run.train.batch_size), "--group", str(group), "--strategy", strategy,
             "--snake" if b.snake else "--no-snake"]
    if b.packing:  # the trainer's batch_size counts packs; without a limit a pack holds at most a token each
        flags += ["--pack-sequences", str(b.pack_sequences or run.data.max_seq_length), "--pack-window", str(b.pack_window)]
        if b.pack_average:
            flags += ["--pack-average", f"{b.pack_average:g}"]
    label = (f"cluster {config.name}: {strategy}, {ranks} ranks x {run.train.batch_size} "
             f"{'packs' if b.packing else 'sequences'} per micro-batch")
    return flags + ["--label", label]
