"""The launch probe's two halves, without Slurm (trainer/launch/probe.py): the run's plan, computed once by the
trainer's code, gives every rank exactly the shards its training streams would read; each rank's
light report takes its entry and names what its node cannot see. The whole path on a real Slurm
is tests/test_rehearsal.py."""

import json

import pytest
from synthetic import tiny_run_config, train_data

from trainer.launch import probe

WORLD, STREAMS, SEED = 4, 8, 5


def touched_shards(root, stratified: bool, count: int = 12):
    """Empty shard files: the plan lists them, it never opens them."""
    folders = [root / str(edge) for edge in (128, 256, 384, 512)] if stratified else [root]
    for folder in folders:
        folder.mkdir(parents=True)
        for i in range(count):
            (folder / f"part_{i:05d}.hdf5").touch()
    return root


def run_yaml(tmp_path, stratified: bool):
    data = touched_shards(tmp_path / "train", stratified)
    balance = {"stratified": stratified, "exchange_padding": "group", "group_size": 2}
    if stratified:
        balance["bin_quotas"] = [1, 1, 1, 1]  # they fill a stream's batch: 8 x 4 ranks / 8 streams = 4
    return tiny_run_config(tmp_path, world_size=WORLD, data={"train_dir": str(data), "streams": STREAMS},
                           balance=balance), data, balance


@pytest.mark.parametrize("stratified", [False, True])
def test_the_plan_gives_each_rank_the_files_its_training_streams_read(tmp_path, stratified):
    from trainer.config import load_run_config

    config, data, balance = run_yaml(tmp_path, stratified)
    entries = probe.plan(load_run_config(str(config)), WORLD, SEED)
    for rank, entry in enumerate(entries):
        streams = train_data(data, rank=rank, world_size=WORLD, streams=STREAMS, seed=SEED, **balance).streams
        per_stream = [s.bins if stratified else [s] for s in streams]  # a stratified stream reads one per bin
        expected = [str(f) for b in range(len(per_stream[0])) for s in per_stream for f in s[b].my_files(0)]
        assert entry["shards"] == expected and entry["shards_error"] is None
        assert entry["exchange"] == {"mode": "group", "members": [rank - rank % 2, rank - rank % 2 + 1],
                                     "position": rank % 2, "snake": True}
    every = [f for e in entries for f in e["shards"]]
    assert len(every) == len(set(every)) == (48 if stratified else 12)  # each shard read by one rank


def rank_report(out, config, monkeypatch, rank: int, world: int = WORLD) -> dict:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "BERTCTL_BINDING", "PYXIS_STANDIN"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {"SLURM_PROCID": rank, "SLURM_LOCALID": rank % 2, "SLURM_NTASKS": world,
                        "SLURM_JOB_NUM_NODES": world // 2, "SLURMD_NODENAME": f"node{rank // 2 + 1}"}.items():
        monkeypatch.setenv(name, str(value))
    assert probe.main(["--config", str(config), "--out", str(out), "--seed", str(SEED)]) == 0
    return json.loads((out / "probe" / "run_0" / f"rank_{rank}.json").read_text())


def test_a_rank_reports_its_planned_shards_and_names_one_its_node_cannot_see(tmp_path, monkeypatch, capsys):
    config, _, _ = run_yaml(tmp_path, stratified=False)
    out = tmp_path / "exp"
    assert probe.main(["--plan", str(WORLD), "--config", str(config), "--out", str(out), "--seed", str(SEED)]) == 0
    planned = json.loads((out / "probe" / "run_0" / "plan" / "rank_3.json").read_text())  # streams 6 and 7: a shard each

    report = rank_report(out, config, monkeypatch, rank=3)
    assert (report["rank"], report["node"], report["local_rank"], report["node_rank"]) == (3, "node2", 1, 1)
    assert report["shards"] == planned["shards"] and len(report["shards"]) == 2 and report["shards_error"] is None
    assert report["exchange"]["members"] == [2, 3] and report["cpus"]
    line = capsys.readouterr().out.strip()
    assert line.startswith(probe.MARKER) and json.loads(line[len(probe.MARKER):])["shard_count"] == 2

    (tmp_path / planned["shards"][1]).unlink()  # the node does not see one of them (a mount missing there)
    report = rank_report(out, config, monkeypatch, rank=3)
    assert report["shards"] is None
    assert report["shards_error"] == f"{planned['shards'][1]}: not visible on node2 (1 of 2 shard(s) missing)"

    report = rank_report(out, config, monkeypatch, rank=3, world=8)  # a launch with more ranks than planned
    assert report["shards_error"] == "the plan is for 4 ranks, this rank sees 8"


def test_a_rank_without_a_plan_computes_its_own_entry(tmp_path, monkeypatch):
    config, _, _ = run_yaml(tmp_path, stratified=True)
    out = tmp_path / "exp"
    report = rank_report(out, config, monkeypatch, rank=2)
    assert not (out / "probe" / "run_0" / "plan").exists()
    from trainer.config import load_run_config

    assert report["shards"] == probe.plan(load_run_config(str(config)), WORLD, SEED)[2]["shards"]
    assert len(report["shards"]) == 2 * 4  # streams 4 and 5, one shard of each bin (12 shards over 8 streams)
