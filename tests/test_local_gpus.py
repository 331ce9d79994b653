"""`resources.gpus_per_node: auto` (clusters/local.yaml): the machine's GPUs decide how the run starts.

Stand-in: the probe's answer comes from a fake `nvidia-smi` put first on PATH (a shell script printing
`nvidia-smi -L` lines the way the driver's tool does); this machine has no GPU. Everything after the
probe (override precedence, validation, rendering, the CLI's refusal) is the real code."""

from __future__ import annotations

import os

import pytest
from conftest import run_bertctl, run_cli

from orchestrator.config.clusters import load_cluster
from orchestrator.config.local_gpus import visible_gpus
from orchestrator.errors import UserError

README_GPU_WORDS = ["submit", "--cluster", "local", "-o", "run.runtime.device=cuda", "-o", "run.runtime.precision=bf16",
                    "--nexp", "1", "--follow"]


@pytest.fixture
def gpus(tmp_path, monkeypatch):
    """fake(n): this process and its children see n GPUs through `nvidia-smi -L`."""
    folder = tmp_path / "fake-driver"
    folder.mkdir()

    def fake(n: int) -> None:
        lines = "".join(f'echo "GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i:08d})"\n' for i in range(n))
        smi = folder / "nvidia-smi"
        smi.write_text(f'#!/bin/sh\n[ "$1" = "-L" ] || exit 9\n{lines}')
        smi.chmod(0o755)
        monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    return fake


def test_without_a_gpu_local_runs_one_cpu_rank_as_written(gpus):
    gpus(0)
    c = load_cluster("local").config
    assert (c.resources.gpus_per_node, c.resources.tasks_per_node, c.world_size) == (0, 1, 1)
    assert (c.run.runtime.device, c.run.runtime.backend, c.run.runtime.precision) == ("cpu", "gloo", "fp32")
    assert c.phase1_run().runtime.device == "cpu" and c.run.train.global_batch_size == 16


def test_with_gpus_one_rank_per_gpu_on_cuda_nccl_bf16_phase_one_too(gpus):
    gpus(2)
    c = load_cluster("local").config
    assert (c.resources.gpus_per_node, c.resources.tasks_per_node, c.world_size) == (2, 2, 2)
    assert (c.run.runtime.device, c.run.runtime.backend, c.run.runtime.precision) == ("cuda", "nccl", "bf16")
    phase1 = c.phase1_run().runtime
    assert (phase1.device, phase1.backend, phase1.precision) == ("cuda", "nccl", "bf16")
    assert (c.run.train.batch_size, c.run.train.global_batch_size) == (16, 32)  # batch_size is per rank


def test_overrides_win_over_what_the_probe_decides(gpus):
    gpus(2)
    c = load_cluster("local", ["run.runtime.precision=fp16", "resources.tasks_per_node=1",
                               "run.train.global_batch_size=16"]).config
    assert (c.world_size, c.run.runtime.device, c.run.runtime.precision) == (1, "cuda", "fp16")
    cpu = load_cluster("local", ["run.runtime.device=cpu"]).config  # a GPU machine kept on the CPU
    assert (cpu.resources.gpus_per_node, cpu.world_size, cpu.run.runtime.backend, cpu.phase1_run().runtime.device) == (0, 1, "gloo", "cpu")


def test_cuda_visible_devices_narrows_the_gpus_as_cuda_reads_it(gpus):
    gpus(4)
    assert visible_gpus({}) == 4
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}) == 2
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "1,-1,2"}) == 1  # CUDA stops at the first invalid entry
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == 0
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5"}) == 4


def test_the_readmes_gpu_command_without_a_gpu_is_one_line_exit_2_and_nothing_written(gpus, bertctl_home):
    gpus(0)
    result = run_bertctl(*README_GPU_WORDS)
    assert result.code == 2 and not result.out
    assert result.err.splitlines() == [result.err.strip()] and "Traceback" not in result.err
    assert "run.runtime.device: cuda, but this machine has no GPU" in result.err
    assert not (bertctl_home / "experiments").exists()


def test_the_readmes_gpu_command_with_a_gpu_renders_the_gpu_run(gpus):
    gpus(1)
    result = run_cli("render", "--cluster", "local", "-o", "run.runtime.device=cuda", "-o", "run.runtime.precision=bf16")
    assert result.code == 0, result.err
    assert result.out.count("  device: cuda\n") == 2 and result.out.count("  backend: nccl\n") == 2  # run and phase 1


def test_auto_is_for_the_local_executor_only(gpus):
    gpus(8)
    with pytest.raises(UserError, match="resources.gpus_per_node: auto probes the machine bertctl runs on"):
        load_cluster("ci_slurm", ["resources.gpus_per_node=auto"])


@pytest.mark.parametrize("overrides,expected", [
    ([], (True, "bf16", True, True, True)),
    (["run.runtime.precision=fp16"], (True, "fp16", True, False, True)),  # fp16's loss scaler decides on the host: no graphs
    (["run.runtime.step=reference"], (False, "bf16", True, False, True)),  # graphs replay the fast step only
    (["run.balance.stratified=true"], (False, "bf16", True, False, False)),  # the batches chosen: stratified, not packs
    (["run.runtime.cuda_graph=false", "run.runtime.compile=false"], (True, "bf16", False, False, True)),
])
def test_on_gpus_local_runs_the_fast_step_as_measured_unless_an_override_decides(gpus, overrides, expected):
    """(fast step, precision, compile, CUDA graphs, packs) of the run; phase 1 packs its batches too."""
    gpus(1)
    c = load_cluster("local", overrides).config
    rt = c.run.runtime
    assert (c.run.fast_step, rt.precision, rt.compile, rt.cuda_graph, c.run.balance.packing) == expected
    assert (c.run.balance.pack_sequences, c.run.balance.stratified) == ((3, False) if expected[4] else (None, True))
    assert c.phase1_run().balance.packing and c.phase1_run().runtime.unpad
