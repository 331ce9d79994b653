"""Binding by GPU locality, on a fake DGX A100 tree (tests/fake_node.py), and its fallback to position."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fake_node import GPUS, IB_DEVICES, dgx_a100, gpu_uuid

from trainer.launch.binding import Policy, describe, plan_rank
from trainer.launch.dist_env import binding_plan
from trainer.launch.topology import format_cpu_list, parse_cpu_list, read_topology

ALL_CPUS = set(range(256))
EXCLUSIVE = Policy(cpu="exclusive", mem="node", ib="single", ib_devices=IB_DEVICES)

# rank: (GPU bus id, NUMA node, CPUs, IB device). GPUs 0-1 sit on NUMA node 3, 2-3 on 1, 4-5 on 7,
# 6-7 on 5; two ranks split a node's 16 cores; each GPU's NIC is the one behind its own PCIe switch.
BY_GPU = {
    0: ("0000:07:00.0", 3, "48-55,176-183", "mlx5_1"),
    1: ("0000:0f:00.0", 3, "56-63,184-191", "mlx5_0"),
    2: ("0000:47:00.0", 1, "16-23,144-151", "mlx5_3"),
    3: ("0000:4e:00.0", 1, "24-31,152-159", "mlx5_2"),
    4: ("0000:87:00.0", 7, "112-119,240-247", "mlx5_7"),
    5: ("0000:90:00.0", 7, "120-127,248-255", "mlx5_6"),
    6: ("0000:b7:00.0", 5, "80-87,208-215", "mlx5_9"),
    7: ("0000:bd:00.0", 5, "88-95,216-223", "mlx5_8"),
}
# bind.sh's position rule: rank r gets cores 16r..16r+15 with siblings, NUMA node r, the r-th listed NIC
BY_POSITION = {
    r: (None, r, f"{16 * r}-{16 * r + 15},{128 + 16 * r}-{128 + 16 * r + 15}", IB_DEVICES[r]) for r in range(8)
}


@pytest.fixture
def node(tmp_path: Path) -> Path:
    return dgx_a100(tmp_path)


def plan(root: Path, rank: int, environ: dict | None = None, policy: Policy = EXCLUSIVE, tasks: int = 8, allowed=None):
    return plan_rank(rank, tasks, policy, root, environ or {}, ALL_CPUS if allowed is None else allowed)


def summary(p) -> tuple:
    return p.gpu, p.numa_node, format_cpu_list(p.cpus), p.ib_device


def test_each_rank_binds_to_its_gpus_numa_node_cores_and_nic(node):
    for rank, expected in BY_GPU.items():
        p = plan(node, rank)
        assert summary(p) == expected, rank
        assert p.fallback is None
        assert p.numactl == [f"--physcpubind={expected[2]}", f"--membind={expected[1]}"]
        assert p.env == {"UCX_NET_DEVICES": f"{expected[3]}:1", "OMPI_MCA_btl_openib_if_include": expected[3]}


@pytest.mark.parametrize("cpu, per_rank", [("exclusive", 16), ("exclusive_nosmt", 8)])
def test_ranks_sharing_a_numa_node_get_disjoint_cores_of_that_node(node, cpu, per_rank):
    topo = read_topology(node, ALL_CPUS)
    plans = [plan(node, r, policy=Policy(cpu=cpu, mem="node")) for r in range(8)]
    taken = [c for p in plans for c in p.cpus]
    assert len(taken) == len(set(taken)) == 8 * per_rank
    for p in plans:
        assert len(p.cpus) == per_rank and set(p.cpus) <= set(topo.numa_nodes[p.numa_node])


def test_cpu_node_policy_binds_the_gpus_whole_numa_node(node):
    p = plan(node, 0, policy=Policy(cpu="node", mem="node"))
    assert p.numactl == ["--cpunodebind=3", "--membind=3"]
    assert format_cpu_list(p.cpus) == "48-63,176-191"
    assert p.ib_device is None and p.env == {}


def test_cuda_visible_devices_in_order_is_the_same_as_unset(node):
    visible = {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
    assert [summary(plan(node, r, visible)) for r in range(8)] == list(BY_GPU.values())


def test_reordered_cuda_visible_devices_follow_the_gpu_not_the_rank(node):
    visible = {"CUDA_VISIBLE_DEVICES": "3,2,1,0"}
    plans = [summary(plan(node, r, visible, tasks=4)) for r in range(4)]
    assert plans == [
        ("0000:4e:00.0", 1, "16-23,144-151", "mlx5_2"),
        ("0000:47:00.0", 1, "24-31,152-159", "mlx5_3"),
        ("0000:0f:00.0", 3, "48-55,176-183", "mlx5_0"),
        ("0000:07:00.0", 3, "56-63,184-191", "mlx5_1"),
    ]


def test_cuda_visible_devices_as_uuids_and_unique_prefixes(node):
    uuids = [gpu_uuid(GPUS[7]), gpu_uuid(GPUS[6])[:12], gpu_uuid(GPUS[0])]
    visible = {"CUDA_VISIBLE_DEVICES": ",".join(uuids)}
    assert [plan(node, r, visible, tasks=3).gpu for r in range(3)] == [GPUS[7], GPUS[6], GPUS[0]]


def test_old_style_mig_ids_name_their_gpu_and_new_style_ones_fall_back(node):
    old = {"CUDA_VISIBLE_DEVICES": f"MIG-{gpu_uuid(GPUS[4])}/1/0"}
    assert summary(plan(node, 0, old, tasks=1))[:2] == (GPUS[4], 7)
    new = {"CUDA_VISIBLE_DEVICES": "MIG-3c1f4e5d-2a6b-5c7d-8e9f-0a1b2c3d4e5f"}
    p = plan(node, 0, new, tasks=1)
    assert p.fallback == ("CUDA_VISIBLE_DEVICES names MIG instance MIG-3c1f4e5d-2a6b-5c7d-8e9f-0a1b2c3d4e5f, whose GPU "
                          "the driver's procfs does not tell: NUMA node and IB device by position")


def test_slurm_renumbered_devices_count_only_the_jobs_gpus(node):
    # ConstrainDevices: the job got /dev/nvidia4-7, CUDA sees them as 0-3
    constrained = {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "SLURM_STEP_GPUS": "4,5,6,7"}
    # without it, Slurm writes the global ids into CUDA_VISIBLE_DEVICES
    unconstrained = {"CUDA_VISIBLE_DEVICES": "4,5,6,7", "SLURM_JOB_GPUS": "4,5,6,7"}
    for environ in (constrained, unconstrained):
        plans = [summary(plan(node, r, environ, tasks=4)) for r in range(4)]
        assert plans == [BY_GPU[4], BY_GPU[5], BY_GPU[6], BY_GPU[7]]


def test_mixed_gpu_models_need_pci_bus_order_to_read_indexes(tmp_path):
    node = dgx_a100(tmp_path, models={GPUS[7]: "NVIDIA A100-SXM4-80GB"})
    p = plan(node, 0)
    assert p.fallback == ("this node mixes GPU models and CUDA_DEVICE_ORDER is not PCI_BUS_ID, so CUDA's device order "
                          "is unknown: NUMA node and IB device by position")
    assert summary(p) == BY_POSITION[0]
    assert summary(plan(node, 0, {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})) == BY_GPU[0]
    # UUIDs name a GPU whatever the order
    assert plan(node, 0, {"CUDA_VISIBLE_DEVICES": gpu_uuid(GPUS[2])}, tasks=1).gpu == GPUS[2]


def test_no_nvidia_driver_falls_back_to_position(tmp_path):
    node = dgx_a100(tmp_path, driver=False)
    for rank in range(8):
        p = plan(node, rank)
        assert summary(p) == BY_POSITION[rank]
        assert p.fallback == "no /proc/driver/nvidia/gpus (no NVIDIA driver): NUMA node and IB device by position"
    assert plan(node, 3, policy=Policy(cpu="exclusive", mem="node")).fallback == (
        "no /proc/driver/nvidia/gpus (no NVIDIA driver): NUMA node by position")


def test_one_gpu_without_numa_node_sends_the_whole_node_to_position(tmp_path):
    node = dgx_a100(tmp_path, numa_node={"0000:4e:00.0": -1})
    plans = [plan(node, r) for r in range(8)]
    assert [summary(p) for p in plans] == list(BY_POSITION.values())  # disjoint: no rank by locality
    assert {p.fallback for p in plans} == {
        "GPU 0000:4e:00.0 has numa_node -1 (the firmware does not say where it sits): "
        "NUMA node and IB device by position"}


def test_gpu_on_a_numa_node_without_usable_cpus_falls_back(node):
    allowed = ALL_CPUS - set(parse_cpu_list("48-63,176-191"))  # this task may not run on NUMA node 3
    p = plan(node, 2, allowed=allowed)
    assert p.fallback == ("GPU 0000:07:00.0 sits on NUMA node 3, where this task may use no CPU: "
                          "NUMA node and IB device by position")
    # the position rule over the 7 usable nodes 0, 1, 2, 4, 5, 6, 7 (rank 2: 2 * 7 // 8 = 1 -> node 1)
    # and the 112 usable cores (14 each)
    assert summary(p) == (None, 1, "28-41,156-169", "mlx5_2")


def test_fewer_visible_gpus_than_ranks_falls_back(node):
    p = plan(node, 1, {"CUDA_VISIBLE_DEVICES": "0,1"})
    assert p.fallback == ("CUDA_VISIBLE_DEVICES='0,1' gives 2 GPUs for 8 ranks per node: "
                          "NUMA node and IB device by position")
    # CUDA stops at the first invalid entry
    p = plan(node, 0, {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,9,7"})
    assert p.fallback.startswith("CUDA_VISIBLE_DEVICES='0,1,2,3,4,5,6,9,7' gives 7 GPUs for 8 ranks per node")
    p = plan(node, 0, {"CUDA_VISIBLE_DEVICES": ""}, tasks=1)
    assert p.fallback.startswith("CUDA_VISIBLE_DEVICES='' gives 0 GPUs for 1 ranks per node")


def test_uuids_the_driver_does_not_show_yet_fall_back(tmp_path):
    node = dgx_a100(tmp_path, uuids_known=False)
    p = plan(node, 0, {"CUDA_VISIBLE_DEVICES": gpu_uuid(GPUS[3])}, tasks=1)
    assert p.fallback == (f"CUDA_VISIBLE_DEVICES names {gpu_uuid(GPUS[3])}, but the driver shows GPU UUIDs as GPU-???? "
                          "(GPUs not initialised: is the persistence daemon running?): "
                          "NUMA node and IB device by position")
    assert summary(plan(node, 3)) == BY_GPU[3]  # indexes need no UUID


def test_excluded_gpus_are_not_cuda_devices(node):
    info = node / "proc/driver/nvidia/gpus" / GPUS[0] / "information"
    info.write_text(info.read_text().replace("GPU Excluded:\t No", "GPU Excluded:\t Yes"))
    assert plan(node, 0, tasks=7).gpu == GPUS[1]


def test_nic_list_without_a_nic_on_the_gpus_node_falls_back_for_the_nic_only(node):
    policy = Policy(cpu="exclusive", mem="node", ib="single", ib_devices=("mlx5_0", "mlx5_1"))
    p = plan(node, 2, policy=policy)
    assert summary(p) == ("0000:47:00.0", 1, "16-23,144-151", "mlx5_0")  # position: 2 * 2 // 8 = 0
    assert p.fallback == "none of the IB devices mlx5_0,mlx5_1 sits on NUMA node 1: IB device by position"
    assert summary(plan(node, 1, policy=policy)) == BY_GPU[1]


def test_a_listed_nic_missing_from_sysfs_falls_back_for_the_nic_only(node):
    policy = Policy(cpu="exclusive", mem="node", ib="single", ib_devices=("mlx5_4", *IB_DEVICES[1:]))
    p = plan(node, 0, policy=policy)
    assert summary(p) == ("0000:07:00.0", 3, "48-55,176-183", "mlx5_4")
    assert p.fallback == "mlx5_4 is not in /sys/class/infiniband: IB device by position"


def test_equally_near_nics_are_shared_out_in_turn(tmp_path):
    # no PCIe switches: every device of a NUMA node hangs off its root port, all equally near
    node = dgx_a100(tmp_path, switches=False)
    policy = Policy(ib="single", ib_devices=IB_DEVICES)
    assert [plan(node, r, policy=policy).ib_device for r in range(8)] == [
        "mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9"]


def test_topology_keeps_numa_node_ids_when_a_node_has_no_usable_cpu(tmp_path):
    node = dgx_a100(tmp_path, driver=False)
    allowed = ALL_CPUS - set(parse_cpu_list("0-15,128-143"))
    topo = read_topology(node, allowed)
    assert sorted(topo.numa_nodes) == [1, 2, 3, 4, 5, 6, 7]
    assert len(topo.cores) == 112 and topo.cores[0] == [16, 144]
    assert plan(node, 0, allowed=allowed).numactl[-1] == "--membind=1"  # the first usable node, not "node 0"


def test_describe_reports_this_ranks_plan_and_binding_plan_reads_the_wrappers(node):
    environ = {"RANK": "13", "LOCAL_RANK": "5", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}
    d = describe(EXCLUSIVE, environ=environ, root=node, allowed=ALL_CPUS)
    assert d == {
        "rank": 13, "local_rank": 5, "gpu": "0000:90:00.0", "numa_node": 7, "cpus": "120-127,248-255",
        "ib_device": "mlx5_6", "numactl": ["--physcpubind=120-127,248-255", "--membind=7"],
        "env": {"UCX_NET_DEVICES": "mlx5_6:1", "OMPI_MCA_btl_openib_if_include": "mlx5_6"}, "fallback": None,
    }
    assert binding_plan({"BERTCTL_BINDING": json.dumps(d)}) == d
    assert binding_plan({}) is None


@pytest.mark.skipif(Path("/proc/driver/nvidia/gpus").exists(), reason="this machine has an NVIDIA driver")
def test_wrapper_prints_one_reason_line_and_passes_its_plan_to_the_command():
    env = {**os.environ, "RANK": "3", "LOCAL_RANK": "3", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8"}
    show = ("import json, os; "
            "print(json.dumps([json.loads(os.environ['BERTCTL_BINDING']), os.environ['UCX_NET_DEVICES']]))")
    proc = subprocess.run(
        [sys.executable, "-m", "trainer.launch.binding", "--ib", "single", "--ib-devices", ",".join(IB_DEVICES),
         "--tasks-per-node", "8", "--", sys.executable, "-c", show],
        env=env, capture_output=True, text=True, check=True,
    )
    assert proc.stderr == ("binding: rank 3: no /proc/driver/nvidia/gpus (no NVIDIA driver): "
                           "NUMA node and IB device by position\n")
    plan_seen, ucx = json.loads(proc.stdout)
    assert (plan_seen["rank"], plan_seen["gpu"], plan_seen["ib_device"], ucx) == (3, None, "mlx5_3", "mlx5_3:1")


@pytest.mark.parametrize("rank, args, message", [
    (0, ["--ib", "single", "--tasks-per-node", "1"], "--ib single needs --ib-devices (e.g. mlx5_0,mlx5_1)"),
    (2, ["--tasks-per-node", "2"], "local rank 2 is not below --tasks-per-node 2"),
])
def test_wrapper_mistakes_are_one_line_and_exit_2(rank, args, message):
    env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"}
    proc = subprocess.run([sys.executable, "-m", "trainer.launch.binding", *args, "--", "true"],
                          env=env, capture_output=True, text=True)
    assert (proc.returncode, proc.stderr) == (2, f"error: binding rank {rank}: {message}\n")


def test_cpu_lists_round_trip():
    assert parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert format_cpu_list([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"
