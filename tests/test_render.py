"""Rendering: golden scripts for every shipped cluster, dry-run == render, and hostile values.

Golden files live in tests/golden/. After an intended change, regenerate them with
    BERTCTL_UPDATE_GOLDEN=1 pytest tests/test_render.py
and read the diff before committing it.

Every line of a golden script is the rendered one except inside the run configurations' heredocs
(run.yaml, phase1.yaml): those are checked as data (the whole file, defaults included, read back is
the validated config; `check_run_configurations`), and the golden keeps only the keys that differ
from the schema's defaults, the recipe, with `{digest}` for the content hash in the delimiter. So a new
run key with a default changes no golden file, and a recipe value that changes shows in the diff.
"""

import difflib
import hashlib
import json
import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import GOLDEN, run_cli

from orchestrator.config.clusters import load_cluster
from orchestrator.rendering.render import prerequisites, render
from trainer.config import RunConfig

CASES = {
    "samsung_dgxa100": ("samsung_dgxa100", 10, "train", []),
    "nvidia_dgxa100_1x8": ("nvidia_dgxa100_1x8", 10, "train", []),
    "nvidia_dgxa100_8x8": ("nvidia_dgxa100_8x8", 10, "train", []),
    "nvidia_dgxa100_128x8": ("nvidia_dgxa100_128x8", 10, "train", []),
    "nvidia_dgxh100_1x8": ("nvidia_dgxh100_1x8", 10, "train", []),
    "local_1x8gpu": ("local_1x8gpu", 2, "train", []),
    "local": ("local", 2, "train", []),
    "ci_slurm": ("ci_slurm", 2, "train", []),
    "ci_slurm_probe_array": ("ci_slurm", 3, "probe", ["slurm.nexp_mode=array"]),
}


def test_every_shipped_cluster_has_a_golden_script():
    """A new clusters/NAME.yaml fails here until it has a case above (and `make golden` wrote its script)."""
    from orchestrator.config.clusters import cluster_files

    assert {cluster for cluster, *_ in CASES.values()} == set(cluster_files())


# a run configuration's heredoc, as orchestrator/rendering/render.py::heredoc writes it
RUN_CONFIG_HEREDOC = re.compile(r"^(?P<head>cat > \S+ <<')BERTCTL_(?P<label>RUN_YAML|PHASE1_YAML)_(?P<digest>[0-9a-f]{16})'\n"
                                r"(?P<body>.*?)^BERTCTL_(?P=label)_(?P=digest)$", re.M | re.S)


def run_configurations(text: str) -> dict[str, re.Match]:
    return {m["label"]: m for m in RUN_CONFIG_HEREDOC.finditer(text)}


def check_run_configurations(text: str, cluster, program: str) -> None:
    """What every rank reads: the whole validated configuration, defaults included, and nothing else."""
    expected = {"RUN_YAML": cluster.run}
    if "phase1" in prerequisites(cluster, program):
        expected["PHASE1_YAML"] = cluster.phase1_run()
    found = run_configurations(text)
    assert sorted(found) == sorted(expected)
    for label, m in found.items():
        data = yaml.safe_load(m["body"])
        assert data == expected[label].model_dump(mode="json"), label  # every key, defaults included
        assert RunConfig.model_validate(data) == expected[label], label
        assert m["digest"] == hashlib.sha256(m["body"].encode()).hexdigest()[:16], label


def golden_form(text: str) -> str:
    """The script with each run configuration reduced to its keys that differ from the schema's defaults."""
    def recipe(m: re.Match) -> str:
        sparse = RunConfig.model_validate(yaml.safe_load(m["body"])).model_dump(mode="json", exclude_defaults=True)
        body = yaml.safe_dump(sparse, sort_keys=False, width=100)
        delimiter = f"BERTCTL_{m['label']}_{{digest}}"
        return f"{m['head']}{delimiter}'\n{body}{delimiter}"
    return RUN_CONFIG_HEREDOC.sub(recipe, text)


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_script(case):
    cluster, nexp, program, overrides = CASES[case]
    loaded = load_cluster(cluster, overrides)
    rendered = render(loaded, nexp=nexp, program=program)
    check_run_configurations(rendered, loaded.config, program)
    text = golden_form(rendered)
    path = GOLDEN / f"{case}.sh"
    if os.environ.get("BERTCTL_UPDATE_GOLDEN"):
        path.write_text(text)
    expected = path.read_text()
    if text != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True), str(path), "rendered"))
        pytest.fail(f"rendered script differs from {path}:\n{diff}\nIf intended: BERTCTL_UPDATE_GOLDEN=1 pytest {__file__}")


def test_the_run_configuration_check_fails_on_a_changed_or_missing_key():
    """The heredocs are no longer compared as text: the data check must catch what the text diff caught."""
    loaded = load_cluster("local")
    text = render(loaded, nexp=1)
    check_run_configurations(text, loaded.config, "train")
    body = run_configurations(text)["RUN_YAML"]["body"]
    for changed in (body.replace("  keep: 3\n", "  keep: 4\n", 1), body.replace("  keep: 3\n", "", 1)):
        assert changed != body
        with pytest.raises(AssertionError):
            check_run_configurations(text.replace(body, changed), loaded.config, "train")
    assert "  keep: 3\n" not in golden_form(text) and "  lr: 0.01\n" in golden_form(text)  # defaults out, the recipe in


@pytest.mark.parametrize("case", sorted(CASES))
def test_scripts_are_valid_bash(case, tmp_path):
    cluster, nexp, program, overrides = CASES[case]
    script = tmp_path / "job.sh"
    script.write_text(render(load_cluster(cluster, overrides), nexp=nexp, program=program))
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0


def test_samsung_dry_run_shows_the_allocation_container_and_recipe():
    result = run_cli("submit", "--cluster", "samsung_dgxa100", "--nexp", "10", "--dry-run")
    assert result.code == 0 and result.err == ""
    script = result.out
    for line in ["#SBATCH --nodes=128", "#SBATCH --ntasks-per-node=8", "#SBATCH --gpus-per-node=8", "#SBATCH --exclusive",
                 "SEEDS=(0 1 2 3 4 5 6 7 8 9)", "--container-image=\"$IMAGE\"", "--container-name=language_model",
                 "--container-workdir=/workspace/bert", "/data/bert_v1.0/partial_data/4bin:/workspace/data_phase2",
                 "lr: 0.00039299421615882676", "- 0.8003575444254268", "lr_max_steps: 179", "warmup_steps: 82",
                 "start_warmup_step: -16", "epsilon: 1.0e-09", "global_batch_size: 16384", "exchange_padding: group",
                 "clip: bucket", "trainer.launch.binding --cpu exclusive --mem node", "export NCCL_IB_HCA=mlx5_1,mlx5_0,mlx5_5,mlx5_2",
                 "trainer.mlperf cache-clear", "vm.drop_caches=3"]:
        assert line in script, line


def test_render_and_dry_run_print_the_same_bytes():
    args = ["--cluster", "nvidia_dgxa100_8x8", "--nexp", "5", "-o", "run.optim.lr=0.001"]
    rendered = run_cli("render", *args)
    dry = run_cli("submit", *args, "--dry-run")
    assert rendered.code == dry.code == 0 and rendered.out == dry.out
    assert "# Rendered by bertctl 0.1.0 from clusters/nvidia_dgxa100_8x8.yaml with -o run.optim.lr=0.001" in rendered.out
    assert "lr: 0.001\n" in rendered.out


HOSTILE = "a b'c\"d;$(touch PWNED)`touch PWNED`&|<>*?~!#{x}\\ e"
HOSTILE_NL = HOSTILE + "\nBERTCTL_RUN_YAML\nBERTCTL_TASK\ntouch PWNED"


def hostile_samsung(tmp_path: Path) -> Path:
    raw = yaml.safe_load(load_cluster("samsung_dgxa100").path.read_text())
    raw["name"] = "hostile"
    raw["description"] = HOSTILE
    raw["slurm"].update(partition=HOSTILE, account=HOSTILE, extra_sbatch=["--comment=" + HOSTILE])
    raw["container"].update(image=HOSTILE_NL, workdir=HOSTILE_NL, preload_dir=HOSTILE_NL)
    raw["container"]["mounts"][0]["host"] = "/data/" + HOSTILE
    raw["node"]["env"]["HOSTILE"] = HOSTILE_NL
    raw["run"]["data"]["train_dir"] = HOSTILE_NL
    raw["run"]["mlperf"]["org"] = HOSTILE_NL
    path = tmp_path / "dir with 'quotes' and $(touch PWNED)" / "hostile.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(raw))
    return path


def fake_commands(bin_dir: Path, record: Path) -> None:
    """srun/scontrol/enroot stand-ins: pyxis and 128 GPU nodes cannot exist here. They record argv."""
    bin_dir.mkdir()
    recorder = (
        f"#!{sys.executable}\nimport json, os, sys\n"
        f"with open({str(record)!r}, 'a') as f:\n"
        "    f.write(json.dumps({'argv': sys.argv, 'HOSTILE': os.environ.get('HOSTILE')}) + '\\n')\n"
        "if os.path.basename(sys.argv[0]) == 'scontrol': print('node1')\n"
    )
    for name in ("srun", "scontrol", "enroot"):
        path = bin_dir / name
        path.write_text(recorder)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_hostile_values_are_quoted_never_executed(tmp_path):
    script_text = render(load_cluster(str(hostile_samsung(tmp_path))), nexp=2)
    work = tmp_path / "exp dir; $(touch PWNED)"
    work.mkdir()
    script = work / "job.sbatch"
    script.write_text(script_text)
    record = tmp_path / "calls.jsonl"
    fake_commands(tmp_path / "bin", record)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "SLURM_JOB_ID": "42",
           "SLURM_JOB_NUM_NODES": "128", "SLURM_JOB_NODELIST": "node[1-128]"}
    proc = subprocess.run(["bash", str(script)], cwd=work, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr

    assert not list(tmp_path.rglob("PWNED")) and not Path("PWNED").exists()
    run = RunConfig.model_validate(yaml.safe_load((work / "run.yaml").read_text()))
    assert run.data.train_dir == HOSTILE_NL and run.mlperf.org == HOSTILE_NL

    calls = [json.loads(line) for line in record.read_text().splitlines()]
    argvs = [c["argv"] for c in calls]
    pull = next(a for a in argvs if "enroot" in a)
    assert pull[pull.index("enroot") + 1:] == ["import", "--output", f"{HOSTILE_NL}/42_language_model.sqsh", f"docker://{HOSTILE_NL}"]
    create = next(a for a in argvs if a[0].endswith("srun") and any(x.startswith("--container-image=") for x in a))
    assert f"--container-image={HOSTILE_NL}/42_language_model.sqsh" in create
    ranks = [a for a in argvs if a[0].endswith("srun") and "-l" in a]
    assert len(ranks) == 2  # one srun of all ranks per run
    assert f"--container-workdir={HOSTILE_NL}" in ranks[0]
    mounts = next(x for x in ranks[0] if x.startswith("--container-mounts="))
    assert mounts == f"--container-mounts={work}:{work},/data/{HOSTILE}:/workspace/data_phase2," \
        "/data/bert_v1.0/eval_10k_tf:/workspace/evaldata,/data/bert_v1.0/checkpointdir_phase1:/workspace/phase1"
    assert all(c["HOSTILE"] == HOSTILE_NL for c in calls if c["argv"][0].endswith("srun"))
    assert (work / "runs" / "0.exit").read_text().strip() == "0"

    # every #SBATCH directive is one line that parses (as sbatch does) back to the exact value
    directives = {line.split("=", 1)[0]: line.split("=", 1)[1] for line in script_text.splitlines()
                  if line.startswith("#SBATCH --") and "=" in line}
    assert shlex.split(directives["#SBATCH --partition"]) == [HOSTILE]
    assert shlex.split(directives["#SBATCH --comment"]) == [HOSTILE]
    header = [line for line in script_text.splitlines() if line.startswith("#")]
    assert all("touch PWNED" not in line or line.startswith(("#SBATCH", "# ")) for line in header)


def test_hostile_values_in_single_line_fields_are_rejected(tmp_path):
    raw = yaml.safe_load(load_cluster("ci_slurm").path.read_text())
    raw["slurm"]["partition"] = "debug\n#SBATCH --uid=0"
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    result = run_cli("render", "--cluster", str(path))
    assert result.code == 2 and "slurm.partition: must be one line without control characters" in result.err


@pytest.mark.parametrize("key,value", [("name", "a\n"), ("node.env", {"FOO\n": "1"}), ("slurm.time_limit", "10\n")])
def test_a_trailing_newline_does_not_slip_through_a_pattern(tmp_path, key, value):
    """`$` in a Python pattern also matches before a final newline: names are checked to the very end."""
    raw = yaml.safe_load(load_cluster("ci_slurm").path.read_text())
    section, _, field = key.rpartition(".")
    (raw[section] if section else raw)[field] = value
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    result = run_cli("render", "--cluster", str(path), "-o", "description=$(touch PWNED)")
    assert result.code == 2 and result.out == "" and result.err.startswith("bertctl: error: ") and key in result.err, result.err
    assert "unknown key" not in result.err  # the value is refused, not the key (the key exists)
