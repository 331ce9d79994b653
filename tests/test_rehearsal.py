"""The launch rehearsal on the real 2-node Slurm cluster: `bertctl submit --probe` reports what every
rank would use, `bertctl rehearsal` checks it, and a broken configuration is caught naming its key.

Stand-ins, because these cannot exist here: the fake GPUs of .ci/slurm.sh, the pyxis SPANK stand-in
(.ci/pyxis-standin), a copied DGX A100 /sys tree for the binding plans (tests/fake_node.py)."""

import json
import sys
import time

import pytest
from conftest import STATUS_EVERY, run_bertctl, status_now
from fake_node import dgx_a100

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm")]


def shards(root, count: int = 8):
    for edge in (128, 256, 384, 512):
        (root / str(edge)).mkdir(parents=True)
        for i in range(count):
            (root / str(edge) / f"part_{i}.hdf5").touch()
    return root


def rehearse(*overrides: str, nexp: int = 1) -> tuple[str, dict, object]:
    words = [w for o in overrides for w in ("-o", o)]
    submitted = run_bertctl("submit", "--cluster", "ci_slurm", "--probe", "--nexp", str(nexp), *words)
    assert submitted.code == 0, submitted.err
    exp = submitted.out.strip()
    end = time.time() + 120
    while time.time() < end:
        state = status_now(exp)["state"]
        if state not in ("PENDING", "RUNNING", "UNKNOWN"):
            break
        time.sleep(STATUS_EVERY)
    result = run_bertctl("rehearsal", exp, "--json")
    return exp, json.loads(result.out), result


def failed(verdict: dict) -> list[dict]:
    return [c for c in verdict["checks"] if not c["ok"]]


def test_every_rank_of_two_runs_is_verified(tmp_path):
    _, verdict, result = rehearse(f"run.data.train_dir={shards(tmp_path / 'train')}", nexp=2)
    assert result.code == 0 and verdict["passed"], failed(verdict)
    assert verdict["verified"] == 8 and verdict["ranks"] == 4
    names = {c["name"] for c in verdict["checks"]}
    assert {"run 0: each rank once", "run 1: every shard read once", "run 0: exchange groups", "seeds"} <= names
    table = run_bertctl("rehearsal", "last")
    assert table.code == 0 and "PASSED" in table.out and "every shard read once" in table.out


def test_gpus_and_binding_are_planned_per_rank(tmp_path):
    """4 fake GPUs per node for 2 ranks: two GPUs would sit idle, and the key to change is named;
    with 2 GPUs every rank has its own, and the binding plan (from a DGX A100's tree) is disjoint."""
    data = shards(tmp_path / "train")
    _, verdict, result = rehearse(f"run.data.train_dir={data}", "resources.gpus_per_node=4")
    assert result.code == 1
    gpu = next(c for c in failed(verdict) if "one GPU per rank" in c["name"])
    assert gpu["key"] == "resources.tasks_per_node" and "2 ranks for 4 GPUs (2 idle)" in gpu["detail"]

    topology = dgx_a100(tmp_path / "dgx")
    _, verdict, result = rehearse(f"run.data.train_dir={data}", "resources.gpus_per_node=2",
                                  "node.binding.cpu=exclusive", "node.binding.mem=node",
                                  f"node.env.BERTCTL_TOPOLOGY_ROOT={topology}")
    assert result.code == 0 and verdict["passed"], failed(verdict)
    cpu = next(c for c in verdict["checks"] if "disjoint CPU sets" in c["name"])
    assert "by GPU locality" in cpu["detail"]


def test_a_missing_mount_source_is_caught_naming_the_key(tmp_path):
    _, verdict, result = rehearse(
        f"run.data.train_dir={shards(tmp_path / 'train')}", "container.kind=pyxis", "container.image=docker://bertctl:test",
        f"container.python={sys.executable}",
        'container.mounts=[{host: /nonexistent/bertctl-data, container: /workspace/data_phase2}]')
    assert result.code == 1
    launch = failed(verdict)[0]
    assert launch["key"] == "container.mounts" and "/nonexistent/bertctl-data" in launch["detail"], launch


def test_shards_that_cannot_serve_every_rank_are_named(tmp_path):
    _, verdict, result = rehearse(f"run.data.train_dir={shards(tmp_path / 'train', count=2)}")
    assert result.code == 1
    check = failed(verdict)[0]
    assert check["key"] == "run.data.train_dir" and "2 shard(s) for 4 readers" in check["detail"]


def test_a_group_that_would_straddle_nodes_is_refused_before_submitting():
    result = run_bertctl("submit", "--cluster", "ci_slurm", "--probe", "-o", "run.balance.group_size=4")
    assert result.code == 2 and "run.balance.group_size: 4 must divide resources.tasks_per_node (2)" in result.err


def test_what_cannot_be_rehearsed_is_bad_input(bertctl_home):
    local = run_bertctl("submit", "--cluster", "local", "--probe")
    assert local.code == 2 and "executor: --probe rehearses a Slurm launch" in local.err
    too_many = run_bertctl("submit", "--cluster", "ci_slurm", "--probe", "-o", "resources.gpus_per_node=9")
    assert too_many.code == 2 and "resources.gpus_per_node: asks for 9 GPUs per node but the nodes of partition debug have 8" in too_many.err
    assert not (bertctl_home / "experiments").exists()  # nothing submitted
    assert run_bertctl("rehearsal", "nonexistent").code == 2
