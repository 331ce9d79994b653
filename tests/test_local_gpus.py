"""`resources.gpus_per_node: auto` (clusters/local.yaml): the machine's GPUs decide how the run starts.

Stand-in: the probe's answer comes from a fake `nvidia-smi` put first on PATH (a shell script printing
`nvidia-smi -L` lines the way the driver's tool does); this machine has no GPU. Everything after the
probe (override precedence, validation, rendering, the CLI's refusal) is the real code."""

from __future__ import annotations

import os
import signal
import time

import pytest
from conftest import REPO, run_bertctl, run_cli

from orchestrator.config import local_gpus
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
    assert (c.run.train.batch_size, c.run.train.global_batch_size) == (10, 30)  # per rank: 10 packs of 1.5 sequences


def test_overrides_win_over_what_the_probe_decides(gpus):
    gpus(2)
    c = load_cluster("local", ["run.runtime.precision=fp16", "run.runtime.cuda_graph=false", "resources.tasks_per_node=1",
                               "run.train.global_batch_size=15"]).config
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


@pytest.mark.parametrize("value, seen", [
    ("0,0", 0), ("1,2,1", 0),  # a GPU named twice: CUDA sees none (not two ranks on one GPU)
    ("3,1", 2), ("1,7,2", 1), ("9", 0),  # an index out of range ends the list
    ("2gpu,0", 2), (" 1 , 3", 2), ("1,x,2", 1), ("\u0663", 0),  # strtoul's reading: leading ASCII digits
    ("GPU-00000002", 1), ("GPU-00000003,GPU-00000000", 2),  # UUIDs from `nvidia-smi -L`
    ("GPU-0000000", 0),  # a prefix of several UUIDs is ambiguous: invalid
    ("GPU-00000001,GPU-deadbeef,GPU-00000002", 1), ("GPU-00000001,2", 1),  # an unknown UUID, or a number among UUIDs, ends it
    ("GPU-00000001,GPU-00000001", 0), ("MIG-00000001", 0),
])
def test_cuda_visible_devices_is_parsed_as_cuda_parses_it(gpus, value, seen, capsys):
    gpus(4)
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": value}) == seen
    said = capsys.readouterr().err
    if seen < len(value.split(",")):  # what was dropped is said, in one line
        assert said.count("\n") == 1 and said.startswith("bertctl: warning: CUDA_VISIBLE_DEVICES=") and "Traceback" not in said


def test_a_repeated_gpu_renders_no_gpu_run_and_cuda_asked_for_is_refused(gpus, monkeypatch):
    gpus(2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,0")
    c = load_cluster("local").config
    assert (c.resources.gpus_per_node, c.world_size, c.run.runtime.device) == (0, 1, "cpu")  # was 2 ranks on GPU 0
    with pytest.raises(UserError, match="cuda, but this machine has no GPU"):
        load_cluster("local", ["run.runtime.device=cuda"])


def fake_smi(folder, monkeypatch, body: str) -> None:
    smi = folder / "nvidia-smi"
    smi.write_text(f"#!/bin/bash\n{body}\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_nvidia_smi_output_that_is_not_utf8_is_counted_and_said_in_one_line(tmp_path, monkeypatch):
    fake_smi(tmp_path, monkeypatch, "printf 'GPU 0: NVIDIA \\xff\\xfe (UUID: GPU-1)\\nGPU 1: NVIDIA \\xc3 (UUID: GPU-2)\\n'")
    result = run_bertctl("render", "--cluster", "local")
    assert result.code == 0 and "Traceback" not in result.err, result.err[-2000:]
    assert result.err.splitlines() == ["bertctl: warning: nvidia-smi -L printed bytes that are not UTF-8 (read leniently)"]
    assert "--nproc-per-node=2" in result.out  # both GPUs counted


def test_an_nvidia_smi_whose_child_holds_the_output_answers_when_it_exits(tmp_path, monkeypatch):
    """Its output went to a pipe, read to its end: a child that kept the pipe open (here a sleep) cost 30 s, then
    counted no GPU. Read from a file instead, the answer comes when nvidia-smi itself exits."""
    pids = tmp_path / "child.pid"
    fake_smi(tmp_path, monkeypatch, f"sleep 60 & echo $! > {pids}\necho 'GPU 0: NVIDIA H200 (UUID: GPU-7)'")
    try:
        started = time.monotonic()
        assert visible_gpus({}) == 1
        assert time.monotonic() - started < 10
    finally:
        os.kill(int(pids.read_text()), signal.SIGKILL)


def test_a_hung_nvidia_smi_is_bounded_and_said_in_one_line(tmp_path, monkeypatch, capsys):
    fake_smi(tmp_path, monkeypatch, "exec sleep 60")
    monkeypatch.setattr(local_gpus, "SMI_TIMEOUT_S", 1)
    monkeypatch.setattr(local_gpus, "PROC_GPUS", tmp_path / "no-driver")
    started = time.monotonic()
    assert visible_gpus({}) == 0 and time.monotonic() - started < 10
    said = capsys.readouterr().err
    assert said == f"bertctl: warning: nvidia-smi -L did not answer within 1 s: GPUs counted from {tmp_path / 'no-driver'}\n"


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
    (["run.runtime.precision=fp16", "run.runtime.cuda_graph=false"], (True, "fp16", True, False, True)),
    (["run.runtime.step=reference", "run.runtime.cuda_graph=false"], (False, "bf16", True, False, True)),
    (["run.runtime.cuda_graph=false", "run.runtime.compile=false"], (True, "bf16", False, False, True)),
])
def test_on_gpus_local_runs_the_fast_step_as_measured_unless_an_override_decides(gpus, overrides, expected):
    """(fast step, precision, compile, CUDA graphs, packs) of the run, from local.yaml's on_gpus keys; phase 1 packs
    its batches too, and the logged batches count the packs' sequences (pack_average)."""
    gpus(2)
    c = load_cluster("local", overrides).config
    rt = c.run.runtime
    assert (c.run.fast_step, rt.precision, rt.compile, rt.cuda_graph, c.run.balance.packing) == expected
    assert (c.run.train.batch_size, c.run.balance.pack_average, c.run.train.global_batch_size) == (10, 1.5, 30)
    phase1 = c.phase1_run()
    assert (phase1.fast_step, phase1.runtime.unpad, phase1.train.global_batch_size) == (True, True, 37)


def test_an_on_gpus_setting_the_gpu_cannot_run_is_one_line_naming_the_key_and_the_fix(gpus):
    """fp16 with the file's CUDA graphs: refused, never a silent change of another key."""
    gpus(1)
    with pytest.raises(UserError, match=r"run.runtime.cuda_graph: fp16's loss scaling decides on the host whether a step is "
                                        r"skipped: use runtime.precision: bf16 or runtime.cuda_graph: false$"):
        load_cluster("local", ["run.runtime.precision=fp16"])


def test_an_unknown_on_gpus_key_is_refused_on_a_machine_without_gpus_too(gpus, tmp_path, monkeypatch):
    gpus(0)
    text = (REPO / "clusters" / "local.yaml").read_text().replace("run.balance.packing: true", "run.balance.packng: true")
    (tmp_path / "mylocal.yaml").write_text(text.replace("name: local\n", "name: mylocal\n"))
    monkeypatch.setenv("BERTCTL_CLUSTERS", str(tmp_path))
    with pytest.raises(UserError, match=r"on_gpus.run.balance.packng: unknown key 'run.balance.packng' \(valid keys under "
                                        r"run.balance: bin_quotas, "):
        load_cluster("mylocal")
