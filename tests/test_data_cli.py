"""`bertctl data prepare|verify|list` as a user meets them: manifests, one-line errors, no torch in
the control plane, the rendered Slurm job arrays, atomic outputs, restarts and bad input."""

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import GOLDEN, REPO, run_cli
from data_helpers import SMALL, bertctl, digests, worker

from orchestrator import data
from orchestrator.config.clusters import load_cluster
from trainer.config import DatasetManifest


def test_the_shipped_manifests_are_valid_and_listed():
    for name in ("sample", "mlperf_wiki"):
        m = data.load_manifest(name).config
        assert isinstance(m, DatasetManifest) and m.name == name
    wiki = data.load_manifest("mlperf_wiki").config
    assert (wiki.prepare.masked_lm_prob, wiki.prepare.dupe_factor, wiki.prepare.random_seed) == (0.15, 10, 12345)
    assert wiki.outputs["train"].bins == [128, 256, 384, 512] and wiki.outputs["eval"].pick == 10000
    assert wiki.checkpoint.files[".data-00000-of-00001"].bytes == 4_034_713_312
    result = run_cli("data", "list")
    assert result.code == 0 and [line.split("\t")[:2] for line in result.out.splitlines()] == [
        ["mlperf_wiki", "tfrecord"], ["sample", "python_stdlib"]]


@pytest.mark.parametrize("args, message", [
    (["--dataset", "nope"], "--dataset: unknown dataset 'nope' (known: mlperf_wiki, sample)"),
    (["--dataset", "sample", "-o", "prepare.dupe=3"], "unknown key 'prepare.dupe' (valid keys under prepare: array_tasks,"),
    (["--dataset", "sample", "-o", "outputs.train.bins=[128,256]"], "outputs.train.bins: the last edge must be max_seq_length (512), got 256"),
    (["--dataset", "mlperf_wiki"], "mlperf_wiki.yaml: source.train: not set: point it at the training parts"),
    (["--dataset", "mlperf_wiki", "-o", "source.train=/nonexistent/tfrecords", "-o", "source.eval=/x"],
     "/nonexistent/tfrecords: source.train: no such file or folder"),
    (["--dataset", "mlperf_wiki", "-o", "source.kind=text", "-o", "source.train=/tmp", "-o", "source.eval=/x"],
     "vocab.file: not set: text sources need the vocabulary"),
])
def test_bad_requests_exit_2_with_one_line_and_write_nothing(bertctl_home, args, message):
    result = run_cli("data", "prepare", *args)
    assert result.code == 2 and result.out == ""
    assert result.err.startswith("bertctl: error: ") and result.err.count("\n") == 1 and message in result.err, result.err
    assert not (bertctl_home / "datasets").exists()


@pytest.mark.parametrize("args", [
    ["data", "prepare", "--dataset", "sample", "-o", "root=$BERTCTL_TEST_UNSET/d"],
    ["data", "verify", "--dataset", "sample", "-o", "root=$BERTCTL_TEST_UNSET/d"],
    ["convert-checkpoint", "--tf-checkpoint", "$BERTCTL_TEST_UNSET/ck", "--bert-config", "c.json", "--output", "o.pt"],
])
def test_an_unset_variable_in_a_path_is_a_user_error(bertctl_home, monkeypatch, args):
    monkeypatch.delenv("BERTCTL_TEST_UNSET", raising=False)
    result = run_cli(*args)
    assert result.code == 2 and result.out == "", result.err
    assert result.err.startswith("bertctl: error: path '$BERTCTL_TEST_UNSET/") and result.err.count("\n") == 1
    assert "uses $BERTCTL_TEST_UNSET, which is not set in this environment" in result.err


def test_the_control_plane_never_imports_torch(tmp_path):
    code = ("import sys; from orchestrator.cli import main\n"
            "for argv in (['data', 'list'], ['data', 'prepare', '--dataset', 'mlperf_wiki'], ['data', 'verify', '--dataset', 'sample'],\n"
            "             ['convert-checkpoint', '--tf-checkpoint', 'x', '--bert-config', 'y', '--output', 'z']):\n"
            "    print('RESULT', argv[0] + argv[1], main(argv), file=sys.stderr)\n"
            "print('RESULT torch', 'torch' in sys.modules, file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "BERTCTL_HOME": str(tmp_path)})
    results = [line.split(" ", 1)[1] for line in proc.stderr.splitlines() if line.startswith("RESULT ")]
    assert results == ["datalist 0", "dataprepare 2", "dataverify 1", "convert-checkpoint--tf-checkpoint 2", "torch False"]


def test_verify_of_a_dataset_never_prepared_fails_clearly(bertctl_home):
    result = run_cli("data", "verify", "--dataset", "sample")
    assert result.code == 1 and result.out == ""
    assert "FAIL  prepared:" in result.err and "run `bertctl data prepare --dataset sample`" in result.err


# ---- the Slurm job arrays: rendered from templates/data_prepare.sbatch.j2

CASES = {
    "data_prepare_sample_ci_slurm": ("sample", "ci_slurm", [], "examples", 9, None),
    "data_prepare_mlperf_wiki_nvidia_8x8": ("mlperf_wiki", "nvidia_dgxa100_8x8", ["-o", "source.train=/data/tfrecords"],
                                            "combine", 4 * 32 + 1, "1234"),
}


def render_case(case: str) -> str:
    dataset, cluster, overrides, stage, tasks, after = CASES[case]
    loaded = data.load_manifest(dataset, overrides[1::2])
    stages = ["examples", "combine", "finish"] if dataset == "mlperf_wiki" else ["corpus", "examples", "combine", "finish"]
    return data.render_stage(loaded, load_cluster(cluster), stage, tasks, stages, stages.index(stage) + 1, after)


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_data_job_scripts(case, tmp_path):
    text = render_case(case)
    path = GOLDEN / f"{case}.sh"
    if os.environ.get("BERTCTL_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"rendered script differs from {path} (BERTCTL_UPDATE_GOLDEN=1 to accept)"
    (tmp_path / "job.sh").write_text(text)
    assert subprocess.run(["bash", "-n", str(tmp_path / "job.sh")]).returncode == 0


def test_prepare_overrides_reach_the_cluster_keys_by_a_stated_rule(monkeypatch, bertctl_home):
    """A key whose first part is a manifest section is the manifest's; with --cluster any other is the
    cluster file's: a data job can go to another partition or account without editing a file."""
    overrides = ["source.parts=3", "slurm.partition=cpu", "slurm.account=lab", "prepare.array_tasks=2"]
    mine, clusters = data.split_overrides(overrides, with_cluster=True)
    assert mine == ["source.parts=3", "prepare.array_tasks=2"] and clusters == ["slurm.partition=cpu", "slurm.account=lab"]
    assert data.split_overrides(overrides, with_cluster=False) == (overrides, [])
    script = data.render_stage(data.load_manifest("sample", mine), load_cluster("ci_slurm", clusters), "examples", 9,
                               ["corpus", "examples", "combine", "finish"], 2, None)
    assert "#SBATCH --partition=cpu\n#SBATCH --account=lab\n" in script and "--partition=debug" not in script
    assert "#SBATCH --array=0-1\n" in script  # the manifest's override too
    assert ("bertctl data prepare --dataset sample --cluster ci_slurm -o source.parts=3 -o prepare.array_tasks=2 "
            "-o slurm.partition=cpu -o slurm.account=lab") in script
    monkeypatch.setenv("PATH", "/nonexistent")  # up to the submission: the overrides were taken
    result = run_cli("data", "prepare", "--dataset", "sample", "--cluster", "ci_slurm", "-o", "slurm.partition=cpu")
    assert result.code == 2 and "sbatch not found" in result.err, result.err
    typo = run_cli("data", "prepare", "--dataset", "sample", "--cluster", "ci_slurm", "-o", "slurm.partiton=cpu")
    assert typo.code == 2 and typo.err.count("\n") == 1 and "unknown key 'slurm.partiton'" in typo.err
    assert "valid keys under slurm: account," in typo.err and not (bertctl_home / "datasets").exists()


def test_array_sizes_group_tasks_and_chain_stages():
    wiki = render_case("data_prepare_mlperf_wiki_nvidia_8x8")
    assert "#SBATCH --array=0-128\n" in wiki  # 129 combine tasks fit under array_tasks 256
    assert "#SBATCH --dependency=afterok:1234\n#SBATCH --kill-on-invalid-dep=yes\n" in wiki
    assert "--gpus" not in wiki and "--exclusive" not in wiki
    assert data.array_groups(8192, 256) == (256, 32) and data.array_groups(9, 64) == (9, 1) and data.array_groups(10, 3) == (3, 4)


def test_hostile_values_in_a_data_job_are_quoted_never_executed(tmp_path):
    from test_render import HOSTILE, HOSTILE_NL, fake_commands, hostile_samsung

    loaded = data.load_manifest("sample", ["description=" + json.dumps(HOSTILE_NL)])
    script_text = data.render_stage(loaded, load_cluster(str(hostile_samsung(tmp_path))), "examples", 9,
                                    ["corpus", "examples"], 2, "77")
    work = tmp_path / "job dir; $(touch PWNED)"
    work.mkdir()
    (work / "job.sbatch").write_text(script_text)
    record = tmp_path / "calls.jsonl"
    fake_commands(tmp_path / "bin", record)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "SLURM_ARRAY_TASK_ID": "3", "HOME": str(tmp_path)}
    proc = subprocess.run(["bash", str(work / "job.sbatch")], cwd=work, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert not list(tmp_path.rglob("PWNED")) and not Path("PWNED").exists()
    argv = json.loads(record.read_text().splitlines()[0])["argv"]
    assert f"--container-image={HOSTILE_NL}" in argv
    mounts = next(a for a in argv if a.startswith("--container-mounts="))
    assert mounts.startswith(f"--container-mounts={work}:{work},/data/{HOSTILE}:")
    assert argv[-11:] == ["-m", "trainer.data.prepare", "run", "--manifest", f"{work}/manifest.yaml",
                          "--stage", "examples", "--group", "3", "--group-size", "1"]


# ---- atomic outputs, restarts, bad input

def small_home(tmp_path, name="home") -> Path:
    return tmp_path / name


def test_an_interrupted_build_restarts_where_it_stopped_and_ends_identical(tmp_path):
    reference = tmp_path / "reference"
    assert bertctl("data", "prepare", "--dataset", "sample", *SMALL, home=reference).returncode == 0
    home = tmp_path / "home"
    env = {**os.environ, "BERTCTL_HOME": str(home), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    keep = ["-o", "prepare.keep_work=true"]
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "data", "prepare", "--dataset", "sample", *SMALL, *keep,
                             "--workers", "1"], cwd=REPO, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = home / "datasets" / "sample" / ".work" / "examples" / "train" / "part-00000.json"
    deadline = time.time() + 60
    while not first.exists() and time.time() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the build and its workers, mid-way
    proc.wait()
    assert first.exists()
    root = home / "datasets" / "sample"
    assert not (root / "prepared.json").exists()
    before = first.stat().st_mtime_ns
    again = bertctl("data", "prepare", "--dataset", "sample", *SMALL, *keep, home=home)
    assert again.returncode == 0, again.stderr
    assert "continuing an interrupted build" in again.stderr
    assert first.stat().st_mtime_ns == before  # the finished part was skipped, not redone
    assert digests(root) == digests(reference / "datasets" / "sample")
    assert not list(root.rglob(".*.tmp-*"))


def test_other_parameters_need_force_which_rebuilds(tmp_path):
    home = small_home(tmp_path)
    assert bertctl("data", "prepare", "--dataset", "sample", *SMALL, home=home).returncode == 0
    before = digests(home / "datasets" / "sample")
    refused = bertctl("data", "prepare", "--dataset", "sample", *SMALL, "-o", "prepare.random_seed=1", home=home)
    assert refused.returncode == 2 and "holds a dataset built with other parameters" in refused.stderr
    assert refused.stderr.count("\n") == 1
    forced = bertctl("data", "prepare", "--dataset", "sample", *SMALL, "-o", "prepare.random_seed=1", "--force", home=home)
    assert forced.returncode == 0
    after = digests(home / "datasets" / "sample")
    assert after.keys() == before.keys() and after != before


def text_manifest(tmp_path, train_files: dict[str, bytes], vocab: str | None = None) -> Path:
    (tmp_path / "text").mkdir()
    for name, content in train_files.items():
        (tmp_path / "text" / name).write_bytes(content)
    manifest = {"name": "mine", "root": str(tmp_path / "out"),
                "source": {"kind": "text", "train": str(tmp_path / "text"), "eval": str(tmp_path / "text" / "part-0")},
                "vocab": {"file": vocab, "learn": vocab is None, "size": 200},
                "prepare": {"dupe_factor": 1},
                "outputs": {"train": {"split": "train", "max_seq_length": 64, "max_predictions": 10}}}
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(manifest))
    return tmp_path / "mine.yaml"


GOOD_TEXT = ("Text for a tokenizer to learn from. It has several sentences in it.\nAnother line follows here.\n\n"
             "A second document begins. It ends soon after.\n").encode() * 20


@pytest.mark.parametrize("content, message", [
    (b"", "part-1: no text (the file is empty or blank)"),
    (b"caf\xe9 au lait\n", "part-1: not UTF-8 text"),
])
def test_empty_or_non_utf8_text_fails_naming_the_file(tmp_path, content, message):
    manifest = text_manifest(tmp_path, {"part-0": GOOD_TEXT, "part-1": content}, vocab=None)
    result = bertctl("data", "prepare", "--dataset", str(manifest), home=tmp_path / "home")
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("bertctl: error: ") and message in lines[-1], result.stderr
    assert str(tmp_path / "text" / "part-1") in lines[-1]
    assert not (tmp_path / "out" / "prepared.json").exists() and not (tmp_path / "out" / "train").exists()


def test_a_missing_vocab_fails_naming_it(tmp_path):
    manifest = text_manifest(tmp_path, {"part-0": GOOD_TEXT}, vocab=str(tmp_path / "vocab.txt"))
    result = bertctl("data", "prepare", "--dataset", str(manifest), home=tmp_path / "home")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == f"bertctl: error: {tmp_path / 'vocab.txt'}: vocab file not found"


def limit_file_size(limit: int):
    def apply():  # in the child: a write past `limit` bytes fails with EFBIG, as a full disk fails
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_failed_write_exits_1_naming_the_file_and_leaves_no_partial_file(tmp_path):
    vocab = tmp_path / "vocab.txt"
    (tmp_path / "corpus.txt").write_bytes(GOOD_TEXT * 20)
    assert worker("train-vocab", "--input", str(tmp_path / "corpus.txt"), "--output", str(vocab), "--size", "300").returncode == 0
    out = tmp_path / "out" / "part.hdf5"
    result = worker("text-to-hdf5", "--input", str(tmp_path / "corpus.txt"), "--vocab", str(vocab), "--output", str(out),
                    "--max-seq-length", "128", "--max-predictions", "20", "--dupe-factor", "20",
                    preexec_fn=limit_file_size(64 * 1024))
    assert result.returncode == 1, result.stderr
    assert result.stderr == f"error: {out}: cannot write: File too large\n"
    assert list((tmp_path / "out").iterdir()) == []  # neither the file nor its temporary
    # the same through bertctl: the pipeline stops at the first failed task and says which file
    manifest = text_manifest(tmp_path / "b", {"part-0": GOOD_TEXT * 30}, vocab=str(vocab)) if (tmp_path / "b").mkdir() is None else None
    proc = subprocess.run([sys.executable, "-m", "orchestrator", "data", "prepare", "--dataset", str(manifest)], cwd=REPO,
                          capture_output=True, text=True, env={**os.environ, "BERTCTL_HOME": str(tmp_path / "home")},
                          preexec_fn=limit_file_size(64 * 1024))
    assert proc.returncode == 1 and "failed: " in proc.stderr and "cannot write: File too large" in proc.stderr
    root = tmp_path / "b" / "out"
    assert not (root / "prepared.json").exists() and not list(root.rglob(".*.tmp-*"))
    assert all(p.stat().st_size < 64 * 1024 for p in root.rglob("*.hdf5"))


def test_a_node_variable_added_in_its_one_place_reaches_training_and_data_jobs_alike(monkeypatch):
    """orchestrator/rendering/render.py::node_environment is the node environment of every job kind: what it adds
    (here a stand-in for a new node key) is exported by the training script and the data-preparation array."""
    from orchestrator.rendering import render

    plain = render.node_environment
    monkeypatch.setattr(render, "node_environment", lambda c: sorted([*plain(c), ("NEW_NODE_KEY", "a b'c")]))
    training = render.render(load_cluster("nvidia_dgxa100_8x8"), nexp=1)
    preparing = render_case("data_prepare_mlperf_wiki_nvidia_8x8")
    for script in (training, preparing):
        exports = [line for line in script.splitlines() if line.startswith("export NEW_NODE_KEY=") or
                   line.startswith("export NCCL_TOPO_FILE=")]
        assert exports == ["export NCCL_TOPO_FILE=/workspace/bert/dgxa100_nic_affinity.xml",
                           "export NEW_NODE_KEY='a b'\"'\"'c'"], exports
