"""Cluster files: every shipped one is valid and carries the reference's values; bad input is one line."""

import pytest
from conftest import REPO, run_cli

from orchestrator.config.clusters import cluster_files, load_cluster
from orchestrator.errors import UserError

# every file in clusters/: a new cluster file joins every test below by being there
SHIPPED = sorted(path.stem for path in (REPO / "clusters").glob("*.yaml"))


def test_every_shipped_cluster_loads():
    assert len(SHIPPED) >= 8  # the folder was found (an empty glob would prove nothing)
    assert sorted(cluster_files()) == SHIPPED
    for name in SHIPPED:
        c = load_cluster(name).config
        assert c.run.world_size == c.resources.nodes * c.resources.tasks_per_node


@pytest.mark.parametrize("name", ["nvidia_dgxh100_1x8", "local_1x8gpu"])
def test_the_h100_recipe_is_nvidias_config_dgxh100_1x8x48x1_pack(name):
    run = load_cluster(name).config.run
    o, t = run.optim, run.train
    assert (o.name, o.lr, o.betas, o.weight_decay, o.max_steps, o.warmup_steps) == ("lamb", 9.6e-4, (0.60466, 0.85437), 0.1, 3680, 0)
    b = run.balance
    assert (t.batch_size, t.global_batch_size, b.packing, b.pack_sequences, b.pack_average) == (48, 768, True, 3, 2)
    assert (t.eval_every_samples, t.eval_start_samples, t.max_samples_termination) == (150_000, 150_000, 4_500_000)
    assert (run.runtime.precision, run.world_size) == ("bf16", 8)  # NVIDIA's fp16/FP8: see the step test below


# Which step, precision, compile and graph setting each shipped cluster resolves to on a GPU node: (fast step,
# precision, runtime.compile, runtime.cuda_graph) for the run and, where it has one, phase 1. The H100/H200 recipes
# and `local` on a GPU run the fast step as it was measured (benchmarks/results/README.md); the A100 recipes keep
# NVIDIA's v1.1 and Samsung's submitted configurations (unpadded with exchange padding or stratified batches, apex
# fp16: no packs for the fast step to run on); ci_slurm is CPU-only. A new cluster file fails here until it is
# given its row.
RESOLVED_ON_A_GPU = {
    "local": ((True, "bf16", True, True), (True, "bf16", True, True)),
    "local_1x8gpu": ((True, "bf16", True, True), None),
    "nvidia_dgxh100_1x8": ((True, "bf16", True, True), None),
    "nvidia_dgxa100_1x8": ((False, "fp16", False, False), None),
    "nvidia_dgxa100_8x8": ((False, "fp16", False, False), None),
    "nvidia_dgxa100_128x8": ((False, "fp16", False, False), None),
    "samsung_dgxa100": ((False, "fp16", False, False), None),
    "ci_slurm": ((False, "fp32", False, False), (False, "fp32", False, False)),
}


def resolved(run) -> tuple:
    return None if run is None else (run.fast_step, run.runtime.precision, run.runtime.compile, run.runtime.cuda_graph)


@pytest.mark.parametrize("name", SHIPPED)
def test_each_shipped_cluster_resolves_to_its_step_precision_and_compile_setting_on_a_gpu_node(name, tmp_path, monkeypatch):
    """Stand-in: `local`'s GPUs come from a fake `nvidia-smi -L` first on PATH (one H200); the other clusters
    name their GPUs in the file. Everything after the probe is the real loading and validation."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text('#!/bin/sh\n[ "$1" = "-L" ] || exit 9\necho "GPU 0: NVIDIA H200 (UUID: GPU-00000000)"\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{__import__('os').environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert set(RESOLVED_ON_A_GPU) == set(SHIPPED)
    c = load_cluster(name).config
    assert (resolved(c.run), resolved(c.phase1_run())) == RESOLVED_ON_A_GPU[name]
    if c.run.fast_step:  # as measured: packs, the whole model compiled with LAMB's update
        assert (c.run.balance.packing, c.run.balance.pack_sequences in (2, 3), c.run.optim.name) == (True, True, "lamb")


def test_samsung_recipe_is_the_submitted_one():
    c = load_cluster("samsung_dgxa100").config
    assert (c.resources.nodes, c.resources.tasks_per_node, c.resources.gpus_per_node) == (128, 8, 8)
    r = c.run
    assert r.train.global_batch_size == 16384 and r.train.batch_size == 16
    assert r.optim.name == "adam" and r.optim.lr == 0.00039299421615882676
    assert r.optim.betas == (0.8003575444254268, 0.8174653681457493)
    assert (r.optim.warmup_steps, r.optim.start_warmup_step, r.optim.max_steps, r.optim.schedule_horizon) == (82, -16, 299, 179)
    assert r.optim.end_lr == 0.0000494549100544884 and r.optim.epsilon == 1e-9
    assert r.optim.weight_decay == 0.0028861703130042965 and r.optim.clip == "bucket"
    assert r.balance.bin_quotas == [6, 3, 2, 5] and r.balance.exchange_padding == "group" and r.balance.group_size == 8
    assert r.train.eval_interval == 325000 and r.train.max_samples_termination == 5_000_000
    assert r.mlperf.division == "open"


@pytest.mark.parametrize("name,nodes,batch,gbs,lr,steps,betas", [
    ("nvidia_dgxa100_1x8", 1, 56, 448, 3.5e-4, 7100, (0.9, 0.999)),
    ("nvidia_dgxa100_8x8", 8, 48, 3072, 1.5e-3, 1271, (0.83, 0.925)),
    ("nvidia_dgxa100_128x8", 128, 3, 3072, 0.002, 1141, (0.66, 0.998)),
])
def test_nvidia_recipes(name, nodes, batch, gbs, lr, steps, betas):
    c = load_cluster(name).config
    assert c.resources.nodes == nodes and c.run.train.batch_size == batch
    assert c.run.train.global_batch_size == gbs and c.run.optim.lr == lr
    assert c.run.optim.max_steps == steps and c.run.optim.betas == betas
    assert c.run.optim.name == "lamb" and c.run.mlperf.division == "closed"
    assert c.container.kind == "pyxis"


def test_overrides_are_type_checked_and_applied():
    c = load_cluster("ci_slurm", ["run.optim.lr=1e-3", "run.balance.exchange_padding=none", "node.env.NCCL_DEBUG=INFO"]).config
    assert c.run.optim.lr == 1e-3 and c.run.balance.exchange_padding == "none"
    assert c.node.env["NCCL_DEBUG"] == "INFO" and c.node.env["OMP_NUM_THREADS"] == "1"


@pytest.mark.parametrize("override,message", [
    ("run.optim.lrr=1", "unknown key 'run.optim.lrr' (valid keys under run.optim: betas, clip, end_lr, epsilon, lr,"),
    ("run.optim.lr=abc", "run.optim.lr: Input should be a valid number"),
    ("resources.nodes=4", "run.train.global_batch_size: is 16 but ranks x batch_size x gradient_accumulation_steps = 8 x 4 x 1 = 32"),
    ("run.world_size=8", "'run.world_size' is derived"),
    ("run.runtime.precision=bf16", "run.runtime.precision: bf16 needs runtime.device=cuda"),
    ("run.runtime.device=cuda", "resources.gpus_per_node: runtime.device cuda needs one GPU per rank"),
    ("run.balance.group_size=4", "run.balance.group_size: 4 must divide resources.tasks_per_node"),
    ("container.kind=pyxis", "container.image: kind pyxis needs an image"),
    ("slurm.time_limit=soon", "slurm.time_limit: must be a positive time like"),
    ("node.env.1X=a", "node.env: names must be shell identifiers"),
    ("nonsense", "expected key.path=value"),
    ("run.optim.lr.deeper=1", "'run.optim.lr' is a value, not a section"),
])
def test_bad_overrides_name_the_key_and_what_was_expected(override, message):
    with pytest.raises(UserError) as info:
        load_cluster("ci_slurm", [override])
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_unknown_cluster_lists_the_known_ones():
    with pytest.raises(UserError, match="unknown cluster 'samsung' .known: ci_slurm, local, .*samsung_dgxa100"):
        load_cluster("samsung")


def test_user_cluster_folder_comes_first(tmp_path, monkeypatch):
    text = (load_cluster("ci_slurm").path).read_text().replace("name: ci_slurm", "name: mine")
    (tmp_path / "mine.yaml").write_text(text)
    monkeypatch.setenv("BERTCTL_CLUSTERS", str(tmp_path))
    loaded = load_cluster("mine")
    assert loaded.config.name == "mine" and loaded.source == str(tmp_path / "mine.yaml")
    (tmp_path / "copied.yaml").write_text(text)  # copied but not renamed inside: found by a name it does not carry
    with pytest.raises(UserError, match=r"name: must be the file's name 'copied' \(--cluster finds the file by it\), got 'mine'"):
        load_cluster("copied")


@pytest.mark.parametrize("content,message", [
    ("name: x\n  bad: [indent", "invalid YAML"),
    ("- a\n- b\n", "expected a mapping of keys at the top level, got list"),
    ("name: x\n", "resources: required key is missing"),
    ("name: x\nresoruces: {}\n", "unknown key 'resoruces' (valid keys here: container, description, executor, experiments_dir, name, node, on_gpus, preflight, prepare, resources, run, slurm, system)"),
])
def test_malformed_files_give_one_line_with_the_file(tmp_path, content, message):
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    result = run_cli("render", "--cluster", str(path))
    assert result.code == 2 and result.out == ""
    assert result.err.count("\n") == 1 and str(path) in result.err and message in result.err


def test_missing_file_and_non_utf8(tmp_path):
    assert "cluster file not found" in run_cli("render", "--cluster", str(tmp_path / "nope.yaml")).err
    bad = tmp_path / "latin.yaml"
    bad.write_bytes(b"name: caf\xe9\n")
    result = run_cli("render", "--cluster", str(bad))
    assert result.code == 2 and "cannot read file" in result.err


def test_phase1_is_checked_like_a_run_and_named_as_such():
    phase1 = load_cluster("local").config.phase1_run()
    assert phase1.world_size == 1 and phase1.data.max_seq_length == 128
    assert phase1.checkpoint.final_model == load_cluster("local").config.run.train.init_checkpoint
    assert phase1.model == load_cluster("local").config.run.model and phase1.mlperf.division == "open"
    with pytest.raises(UserError) as info:
        load_cluster("local", ["prepare.phase1.train.batch_size=3"])
    assert "prepare.phase1.train.global_batch_size: is 32 but ranks x batch_size x gradient_accumulation_steps = 1 x 3 x 1 = 3" in str(info.value)
    with pytest.raises(UserError, match="prepare.dataset: no dataset manifest named 'wiki'"):
        load_cluster("local", ["prepare.dataset=wiki"])
    with pytest.raises(UserError, match="prepare.phase1: writes run.train.init_checkpoint, which is not set"):
        load_cluster("local", ["run.train.init_checkpoint=null"])
