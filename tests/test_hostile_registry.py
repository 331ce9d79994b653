"""Hostile input, round two (the registry and config half): one damaged experiment never takes down a
verb for the others; experiment references name registry entries only; node.env cannot set the job
script's or bash's own variables; FIFOs and devices where files belong never block; YAML is read
as YAML 1.2; the smaller bounds. Every case: one line, exit 2, or the verb's normal outcome; never a
traceback or a hang (the FIFO cases run as processes with a timeout: before the fixes they hung).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from conftest import REPO, run_bertctl, run_cli
from registry_records import record

from orchestrator import experiments
from orchestrator.config.clusters import load_cluster
from orchestrator.errors import UserError

GOOD_ID = "c-20260101-000000-aaaaaaaa"
OTHER_ID = "c-20260101-000001-bbbbbbbb"
BAD_ID = "c-20260101-000002-cccccccc"


def add_experiment(home: Path, exp_id: str, text: str | None = None, **changes) -> Path:
    exp_dir = home / "experiments" / exp_id
    exp_dir.mkdir(parents=True)
    (exp_dir / "experiment.json").write_text(text if text is not None else json.dumps(record(exp_dir, **changes)))
    return exp_dir


def one_line_error(result, *needles: str) -> None:
    assert result.code == 2, (result.code, result.out, result.err)
    assert len(result.err.strip().splitlines()) == 1 and "Traceback" not in result.err, result.err
    for needle in needles:
        assert needle in result.err, result.err


# ---- one damaged experiment: listed with its reason, the others as usual

VALID = json.dumps(record(Path("/x") / BAD_ID))
DAMAGE = {
    "truncated": VALID[:40],
    "empty": "",
    "null": "null",
    "a list": "[1, 2]",
    "not UTF-8": "\udcff",  # written below as bytes 0xff
    "no keys": "{}",
    "nexp as text": {"nexp": "1"},
    "nexp as bool": {"nexp": True},
    "huge nexp": {"nexp": 10**12, "seeds": [0]},
    "zero nexp": {"nexp": 0, "seeds": []},
    "seeds short": {"nexp": 3, "seeds": [0]},
    "seeds as text": {"seeds": ["zero"]},
    "NaN created": {"created": float("nan")},
    "created as text": {"created": "yesterday"},
    "id not its folder": {"id": "../../etc"},
    "hostile job id": {"job_ids": ["1; rm -rf ~"]},
    "job id number": {"job_ids": [17]},
    "script outside": {"script": "../../../bin/sh"},
    "unknown executor": {"executor": "pbs"},
    "step outside": {"steps": ["../../../etc/passwd"]},  # `--follow` reads logs/<step>.log
    "unknown container": {"container": "docker"},
    "lone surrogate": {"cluster": "\ud800"},  # json.dumps writes the \\ud800 escape
    "deep nesting": "[" * 100_000 + "]" * 100_000,
    "5000-digit nexp": '{"nexp": 1%s}' % ("0" * 5000),
    "markup in cluster": {"cluster": "[/bold]"},  # rich markup must not be parsed from a record
}


def write_damaged(home: Path, damage) -> None:
    exp_dir = home / "experiments" / BAD_ID
    if isinstance(damage, dict):
        add_experiment(home, BAD_ID, **damage)
    elif damage == "\udcff":
        exp_dir.mkdir(parents=True)
        (exp_dir / "experiment.json").write_bytes(b"\xff\xfe{")
    else:
        add_experiment(home, BAD_ID, text=damage)


@pytest.mark.parametrize("damage", DAMAGE.values(), ids=DAMAGE.keys())
def test_status_lists_the_others_and_marks_the_damaged_one(bertctl_home, damage):
    add_experiment(bertctl_home, GOOD_ID)
    write_damaged(bertctl_home, damage)
    result = run_cli("status")
    assert result.code == 0 and "Traceback" not in result.err, result.err
    assert GOOD_ID in result.out
    if damage == {"cluster": "[/bold]"}:  # a valid record after all: listed normally
        assert BAD_ID in result.out and "DAMAGED" not in result.out
        return
    row = next(line for line in result.out.splitlines() if BAD_ID in line)
    assert "DAMAGED" in row
    listing = json.loads(run_cli("status", "--json").out)
    assert [e["id"] for e in listing["experiments"]] == [GOOD_ID]
    assert [d["id"] for d in listing["damaged"]] == [BAD_ID] and listing["damaged"][0]["reason"]


def test_a_damaged_experiment_named_is_one_line_and_other_verbs_still_work(bertctl_home):
    good = add_experiment(bertctl_home, GOOD_ID)
    (good / "cluster.yaml").write_text("name: c\n")
    add_experiment(bertctl_home, OTHER_ID, created=2.0)
    write_damaged(bertctl_home, DAMAGE["null"])
    one_line_error(run_cli("status", BAD_ID), "damaged experiment record", "holds NoneType")
    one_line_error(run_cli("cancel", BAD_ID), "damaged experiment record")
    assert run_cli("cancel", GOOD_ID).code == 0
    assert run_cli("status", "last").code == 0 and OTHER_ID in run_cli("status", "last").out
    assert run_cli("diff", GOOD_ID, OTHER_ID, "--json").code == 0
    from orchestrator.cli import complete_experiments

    assert complete_experiments("") == [OTHER_ID, GOOD_ID, "last"]


def test_extra_keys_are_ignored_and_a_wrong_dir_is_not_followed(bertctl_home, tmp_path):
    add_experiment(bertctl_home, GOOD_ID, surprise={"from": "a newer bertctl"}, dir=str(tmp_path))
    exp = experiments.find(GOOD_ID)
    assert exp.path.resolve() == (bertctl_home / "experiments" / GOOD_ID).resolve()


def test_a_record_written_by_submit_is_read_back_unchanged(bertctl_home):
    made = experiments.create(experiments.Experiment(
        id="", cluster="c", cluster_source="x.yaml", executor="slurm", nexp=3, seeds=[5, 6, 7], program="train",
        overrides=["a=1"], script="job.sbatch", created=1.5, dir="", job_ids=["12_0", "12_1", "12_2"], array=True), {})
    assert experiments.find(made.id) == made


# ---- experiment references

@pytest.mark.parametrize("ref", ["", " ", "\t", "\n"])
def test_an_empty_reference_names_nothing(bertctl_home, ref):
    add_experiment(bertctl_home, GOOD_ID)
    for verb in (["cancel", ref], ["status", ref], ["logs", ref], ["diff", ref, ref], ["rerun", ref], ["resume", ref]):
        one_line_error(run_cli(*verb), "empty experiment reference")


@pytest.mark.parametrize("ref", ["..", ".", "/", "../experiments/" + GOOD_ID, GOOD_ID + "/..", "/etc/passwd",
                                 "c\0", "x" * 5000, "-c", "c*", "c?"])
def test_a_hostile_reference_is_refused_without_touching_a_path(bertctl_home, ref):
    add_experiment(bertctl_home, GOOD_ID)
    one_line_error(run_cli("status", ref))
    with pytest.raises(UserError):
        experiments.find(ref)


def test_a_prefix_must_be_a_real_prefix_of_exactly_one_id(bertctl_home):
    add_experiment(bertctl_home, GOOD_ID)
    add_experiment(bertctl_home, OTHER_ID, created=2.0)
    assert experiments.find("c-20260101-000000").id == GOOD_ID
    assert experiments.find(GOOD_ID).id == GOOD_ID
    one_line_error(run_cli("status", "c-2026"), "ambiguous: 2 experiments")
    one_line_error(run_cli("status", "aaaaaaaa"), "no such experiment")  # a part of an id is no prefix
    assert experiments.find("last").id == OTHER_ID


def test_last_without_a_readable_experiment_is_one_line(bertctl_home):
    write_damaged(bertctl_home, DAMAGE["truncated"])
    one_line_error(run_cli("status", "last"), "no readable experiments")


# ---- node.env: the job script's own names and bash's are reserved

def assigned_in_templates() -> set[str]:
    """Every NAME= the shipped templates assign (export/local/plain, several per line), found here by
    a pattern of this test's own, so a new template variable must be reserved to pass."""
    names = set()
    for template in (REPO / "templates").glob("*.j2"):
        text = re.sub(r"\{[{%#].*?[}%#]\}", " ", template.read_text(), flags=re.S)
        for line in text.splitlines():
            if not line.lstrip().startswith("#"):
                names.update(re.findall(r"(?:^|[\s;({])([A-Za-z_][A-Za-z0-9_]*)=(?!=)", line))
    return names


# node.env may set these: thread-count defaults, and PYTHONPATH, which the script extends (keeping the node's)
THREAD_DEFAULTS = {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TOKENIZERS_PARALLELISM", "PYTHONPATH"}


def test_the_template_scan_finds_the_script_variables():
    assert {"NEXP", "EXP_DIR", "SEEDS", "PYTHON", "MASTER_ADDR", "MASTER_PORT", "BERTCTL_SEED", "JOB_DIR"} <= assigned_in_templates()


@pytest.mark.parametrize("name", sorted(assigned_in_templates() - THREAD_DEFAULTS)
                         + ["UID", "EUID", "PPID", "SHELLOPTS", "BASHOPTS", "BASH_ENV", "BASH_XTRACEFD", "IFS",
                            "SLURM_JOB_ID", "SLURM_ARRAY_TASK_ID", "PIPESTATUS", "BASH_SOURCE"])
def test_a_reserved_name_in_node_env_is_refused(name):
    with pytest.raises(UserError, match=rf"node.env: {name}: reserved"):
        load_cluster("ci_slurm", [f"node.env.{name}=1"])


def test_every_reserved_name_in_one_line(tmp_path):
    raw = yaml.safe_load((REPO / "clusters" / "ci_slurm.yaml").read_text())
    raw["node"]["env"] = {"NEXP": "0", "UID": "0", "NCCL_DEBUG": "INFO"}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    one_line_error(run_cli("render", "--cluster", str(path)), "node.env: NEXP, UID: reserved", "(reserved: ")


@pytest.mark.parametrize("name", ["NCCL_DEBUG", "OMP_NUM_THREADS", "PYTHONPATH", "GLOO_SOCKET_IFNAME", "HOME"])
def test_ordinary_names_stay_allowed(name):
    assert load_cluster("ci_slurm", [f"node.env.{name}=x"]).config.node.env[name] == "x"


# ---- FIFOs where files belong (processes with a timeout: before the fix these blocked forever)

def bertctl_with_timeout(home: Path, *args: str):
    return run_bertctl(*args, env={"BERTCTL_HOME": str(home)}, timeout=20)


def test_fifos_in_an_experiment_never_block_status(bertctl_home):
    good = add_experiment(bertctl_home, GOOD_ID, job_ids=["999999999"])
    (good / "runs").mkdir()
    for name in ("job.exit", "runs/0.exit", "run.yaml"):
        os.mkfifo(good / name)
    bad = bertctl_home / "experiments" / BAD_ID
    bad.mkdir()
    os.mkfifo(bad / "experiment.json")
    result = bertctl_with_timeout(bertctl_home, "status")
    assert result.code == 0 and GOOD_ID in result.out and "Traceback" not in result.err, result.err
    row = next(line for line in result.out.splitlines() if BAD_ID in line)
    assert "DAMAGED" in row and "FIFO" in row


def test_a_fifo_cluster_file_is_one_line(bertctl_home, tmp_path):
    os.mkfifo(tmp_path / "c.yaml")
    result = bertctl_with_timeout(bertctl_home, "render", "--cluster", str(tmp_path / "c.yaml"))
    one_line_error(result, "c.yaml", "FIFO")


def test_a_fifo_bert_config_is_one_line(bertctl_home, tmp_path):
    os.mkfifo(tmp_path / "bert_config.json")
    (tmp_path / "model.ckpt.index").write_bytes(b"")
    result = bertctl_with_timeout(bertctl_home, "convert-checkpoint", "--tf-checkpoint", str(tmp_path / "model.ckpt"),
                                  "--bert-config", str(tmp_path / "bert_config.json"), "--output", str(tmp_path / "o.pt"))
    one_line_error(result, "bert_config.json", "FIFO")
    (tmp_path / "model.ckpt.index").unlink()
    os.mkfifo(tmp_path / "model.ckpt.index")
    (tmp_path / "bert_config.json").unlink()
    (tmp_path / "bert_config.json").write_text("{}")
    result = bertctl_with_timeout(bertctl_home, "convert-checkpoint", "--tf-checkpoint", str(tmp_path / "model.ckpt"),
                                  "--bert-config", str(tmp_path / "bert_config.json"), "--output", str(tmp_path / "o.pt"))
    one_line_error(result, "--tf-checkpoint", "model.ckpt.index", "FIFO")
    assert not (tmp_path / "o.pt").exists()


TRAINER_READS = """
import sys
from pathlib import Path
from trainer.data.layout import Shard, ShardError, sample_count
from trainer.data.prepare import files
from trainer.data.prepare.errors import BadInput
from trainer.data.prepare.textfile import read_documents
from trainer.data.prepare.vocab import read_vocab
from trainer.data.prepare.tfrecord import read_records
fifo = Path(sys.argv[1])
for read in (Shard, sample_count, files.read_json, read_vocab, read_documents, lambda p: list(read_records(p))):
    try:
        read(fifo)
        print("read")
    except (ShardError, BadInput) as e:
        print(str(e).replace(chr(10), " "))
"""


def test_the_data_plane_refuses_a_fifo_in_one_line(tmp_path):
    fifo = tmp_path / "shard.hdf5"
    os.mkfifo(fifo)
    out = subprocess.run([sys.executable, "-c", TRAINER_READS, str(fifo)], capture_output=True, text=True,
                         timeout=20, cwd=REPO)
    lines = out.stdout.splitlines()
    assert out.returncode == 0 and len(lines) == 6, out.stderr
    assert all(str(fifo) in line and "FIFO" in line for line in lines), lines


@pytest.mark.parametrize("make", ["fifo", "dir", "device"])
def test_open_regular_refuses_without_blocking(tmp_path, make):
    from trainer.config.regular import NotRegularFile, open_regular, read_regular_text

    path = {"fifo": tmp_path / "f", "dir": tmp_path, "device": Path("/dev/zero")}[make]
    if make == "fifo":
        os.mkfifo(path)
    done = []

    def attempt():
        with pytest.raises(NotRegularFile, match="not a regular file"):
            open_regular(path)
        done.append(True)

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(10)
    assert done, f"open_regular blocked on {make}"
    (tmp_path / "ok").write_text("yes")
    assert read_regular_text(tmp_path / "ok") == "yes"
    with pytest.raises(OSError, match="larger than 2 bytes"):
        read_regular_text(tmp_path / "ok", limit=2)


# ---- YAML read as YAML 1.2, and the one-line check

def cluster_file(tmp_path: Path, edit) -> Path:
    text = (REPO / "clusters" / "ci_slurm.yaml").read_text()
    path = tmp_path / "c.yaml"
    path.write_text(edit(text))
    return path


def test_a_sexagesimal_looking_time_is_text(tmp_path):
    path = cluster_file(tmp_path, lambda t: t.replace('time_limit: "00:30:00"', "time_limit: 1:30:00"))
    assert "time_limit: 1:30:00" in path.read_text()
    assert load_cluster(str(path)).config.slurm.time_limit == "1:30:00"  # YAML 1.1 made it 5400


def test_a_leading_zero_is_refused_not_read_as_octal(tmp_path):
    path = tmp_path / "c.yaml"
    raw = yaml.safe_load((REPO / "clusters" / "ci_slurm.yaml").read_text())
    raw["run"]["train"]["seed"] = "SEED"
    path.write_text(yaml.safe_dump(raw).replace("SEED", "010"))
    one_line_error(run_cli("render", "--cluster", str(path)), "line", "010: a leading zero is ambiguous",
                   "octal 8 in YAML 1.1 but 10 in YAML 1.2")
    one_line_error(run_cli("render", "--cluster", "ci_slurm", "-o", "run.train.seed=010"), "leading zero")


def test_merge_keys_are_refused_by_name(tmp_path):
    for doc in ("<<: {name: x}\n", "a: &x {name: y}\nb:\n  <<: *x\n"):
        path = tmp_path / "m.yaml"
        path.write_text(doc)
        one_line_error(run_cli("render", "--cluster", str(path)), "merge keys (<<) are not accepted")


def test_mem_zero_in_a_file_is_what_the_override_gives(tmp_path):
    path = cluster_file(tmp_path, lambda t: t.replace("mem: null", "mem: 0"))
    from_file = run_cli("render", "--cluster", str(path))
    from_override = run_cli("render", "--cluster", "ci_slurm", "-o", "slurm.mem=0")
    assert from_file.code == 0 and from_override.code == 0, from_file.err
    assert "#SBATCH --mem=0" in from_file.out and "#SBATCH --mem=0" in from_override.out


@pytest.mark.parametrize("char", ["\u2028", "\u2029", "\u202e", "\u2066", "\u200b", "\x85", "\x1b"])
def test_hidden_characters_fail_the_one_line_check(char):
    one_line_error(run_cli("render", "--cluster", "ci_slurm", "-o", f"slurm.partition=debug{char}x"),
                   "slurm.partition: must be one line without control characters", f"U+{ord(char):04X}")


def test_a_nul_in_experiments_dir_is_one_line(bertctl_home):
    one_line_error(run_cli("submit", "--cluster", "local", "-o", "experiments_dir=/tmp/a\0b"),
                   "experiments_dir: must be one line")
    assert not (bertctl_home / "experiments").exists() or not list((bertctl_home / "experiments").iterdir())


# ---- bounds

def test_nexp_is_bounded(bertctl_home):
    one_line_error(run_cli("render", "--cluster", "ci_slurm", "--nexp", "100000000"), "at most 1000 runs")
    one_line_error(run_cli("submit", "--cluster", "local", "--nexp", "1001"), "at most 1000 runs")
    result = run_cli("render", "--cluster", "ci_slurm", "--nexp", "1000")
    assert result.code == 0 and "NEXP=1000" in result.out


def test_balance_bounds_answer_at_once(bertctl_home):
    for args in (["--ranks", "100000000", "--batch", "1"], ["--ranks", "8", "--batch", "100000000"],
                 ["--ranks", "65536", "--batch", "4096"], ["--ranks", "8", "--batch", "1", "--seed", "-1"]):
        result = bertctl_with_timeout(bertctl_home, "balance", *args)
        one_line_error(result, "bertctl balance: error: --")


# ---- data

def test_prepare_on_an_unusable_root_is_bad_input(bertctl_home, tmp_path):
    (tmp_path / "a_file").write_text("")
    result = bertctl_with_timeout(bertctl_home, "data", "prepare", "--dataset", "sample",
                                  "-o", f"root={tmp_path / 'a_file' / 'x'}")
    one_line_error(result, "cannot be used as the dataset root", "Not a directory")
    assert "crashed" not in result.err


@pytest.mark.parametrize("n", [1, 2, 3])
def test_verify_on_a_subset_passes_an_intact_dataset(tmp_path_factory, n):
    from data_helpers import bertctl, sample_home

    home = sample_home(tmp_path_factory)
    result = bertctl("data", "verify", "--dataset", "sample", "--stats-files", str(n), home=home)
    assert result.returncode == 0 and "FAIL" not in result.stderr, result.stderr
    assert "(from a subset of the files)" in result.stderr
