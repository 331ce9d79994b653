"""Every command the README, CONTRIBUTING.md and the guides under docs/ show is exercised: the cheap ones
run here and their output is compared with what the page prints; the long ones are run word for word by
the tests named below. (Links between the pages: tests/test_docs.py.)"""

import json
import re
from pathlib import Path

import pytest
from conftest import REPO, run_bertctl
from test_demo import MAIN_JOB

from orchestrator.config.local_gpus import visible_gpus


def doc_pages() -> list[Path]:
    """The pages whose commands a user copies: the front page, the contributor's guide and every guide."""
    return [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").rglob("*.md"))]


PAGES = {page.relative_to(REPO).as_posix(): page.read_text() for page in doc_pages() if page.is_file()}

# command -> the test that runs it word for word (they need a finished experiment, Slurm or hours)
MIRRORED = {
    "make demo": "test_make_targets_are_the_readme_commands",
    "make test": "test_make_targets_are_the_readme_commands (.ci/run calls it)",
    " ".join(["bertctl", *MAIN_JOB]): "tests/test_demo.py::test_the_main_job_trains_bert_in_two_phases_and_checks_it",
    "bertctl submit --cluster ci_slurm --nexp 1": "tests/test_demo.py::test_the_same_experiment_on_the_ci_slurm_cluster",
    "bertctl status last": "tests/test_demo.py::test_the_same_experiment_on_the_ci_slurm_cluster",
    "bertctl logs last --run 0 --rank 0": "tests/test_demo.py::test_the_same_experiment_on_the_ci_slurm_cluster",
    "bertctl compliance-check last --no-score": "tests/test_demo.py::test_the_same_experiment_on_the_ci_slurm_cluster",
    "bertctl plot last": "tests/test_demo.py::test_the_same_experiment_on_the_ci_slurm_cluster",
    "bertctl export last --to bert-sample":
        "tests/test_demo.py::test_the_main_jobs_run_exports_to_a_folder_hugging_face_loads_and_fine_tunes",
    "bertctl submit --cluster ci_slurm --test-only": "tests/test_slurm.py::test_test_only_asks_slurm_and_oversized_jobs_are_refused",
    "bertctl submit --cluster ci_slurm --probe": "tests/test_slurm.py::test_two_nodes_times_two_tasks_report_their_ranks_and_nodes",
    # docs/preflight.md: on a fresh $BERTCTL_HOME, the timing windows shortened through the environment
    "bertctl preflight --cluster local": "tests/test_preflight_shipped.py::test_preflight_on_the_local_cluster_as_typed",
    "bertctl preflight --cluster ci_slurm": "tests/test_preflight_shipped.py::test_preflight_on_the_ci_slurm_cluster_as_typed",
    # the GPU suite's device command: rehearsed on the CPU (make gpu-wheels for this Python's version, then the
    # same script with --device cpu --quick) in a Python like the GPU machine's
    "make gpu-wheels": "tests/test_device_run.py::wheels",
    "bash benchmarks/gpu/device_run.sh --budget 480 --out gpu-run":
        "tests/test_device_run.py::test_the_device_command_runs_its_stages_in_a_python_like_the_gpu_machines",
    # the stage table's name for what stage f starts under torchrun (a module, not a whole command line)
    "python -m trainer": "tests/test_device_run.py::test_the_device_command_runs_its_stages_in_a_python_like_the_gpu_machines",
    # needs the user's copy of the MLPerf files and a cluster named mycluster; the same path runs on
    # TFRecords written in the MLPerf layout in tests/test_data_tfrecord.py and as job arrays in tests/test_data_slurm.py
    "bertctl data prepare --dataset mlperf_wiki --cluster mycluster --wait -o source.train=/data/tfrecords "
    "-o source.eval=/data/eval_intermediate -o checkpoint.tf_checkpoint=/data/phase1/model.ckpt-28252 "
    "-o checkpoint.bert_config=/data/phase1/bert_config.json": "tests/test_data_tfrecord.py, tests/test_data_slurm.py",
}


def readme_commands() -> list[tuple[str, str]]:
    """(command, the output the page shows after it) for every `$ ` line in a console block of every page."""
    found = []
    for block in (b for text in PAGES.values() for b in re.findall(r"```console\n(.*?)```", text, re.S)):
        lines = block.splitlines()
        for i, line in enumerate(lines):
            if line.startswith("$ "):
                output = []
                for after in lines[i + 1:]:
                    if after.startswith("$ "):
                        break
                    output.append(after)
                found.append((line[2:], "\n".join(output)))
    return found


TABLE_COMMAND = re.compile(r"`((?:bertctl|bash|make|python) [^`]+)`")


def readme_table_commands() -> list[tuple[str, str]]:
    """(command, "") for every command a Markdown table row of a page shows in backticks."""
    return [(cmd, "") for text in PAGES.values() for line in text.splitlines() if line.startswith("|")
            for cmd in TABLE_COMMAND.findall(line)]


def all_readme_commands() -> list[tuple[str, str]]:
    """Each (command, shown output) once, however many pages show it."""
    return list(dict.fromkeys(readme_commands() + readme_table_commands()))


def test_every_page_is_read():
    assert {"README.md", "CONTRIBUTING.md", "docs/clusters.md", "docs/gpu.md"} <= set(PAGES)
    assert len(readme_commands()) > 15


def test_the_readme_tables_commands_are_read():
    """The GPU guide's stage table's command is found (a test that reads no table cannot fail on one)."""
    assert GPU_COMMAND in [cmd for cmd, _ in readme_table_commands()]


def test_every_readme_command_is_run_here_or_by_a_named_test():
    unknown = [cmd for cmd, _ in all_readme_commands() if cmd not in MIRRORED and cmd not in RUN_HERE]
    assert not unknown, f"commands shown on the pages that no test exercises (add them to RUN_HERE or MIRRORED): {unknown}"


def test_make_targets_are_the_readme_commands():
    makefile = (REPO / "Makefile").read_text()
    demo = re.search(r"^demo: env\n\t(.+)$", makefile, re.M).group(1)
    assert demo == "$(BIN)/" + " ".join(["bertctl", *MAIN_JOB])
    test = re.search(r"^test: env\n((?:\t.+\n)+)", makefile, re.M).group(1)
    # ruff, then the whole suite: the bulk and the serial tests are complements, and both must pass
    assert test.splitlines() == [
        "\t$(BIN)/ruff check .",
        '\t$(BIN)/python -m pytest -n 3 --dist loadgroup --no-loadscope-reorder -m "not serial"; bulk=$$?; \\',
        "\t$(BIN)/python -m pytest -m serial; serial=$$?; \\",
        "\ttest $$bulk -eq 0 -a $$serial -eq 0"]
    assert "make test" in (REPO / ".ci" / "run").read_text()


def test_the_longest_chains_are_handed_out_first_then_the_largest_groups():
    from conftest import FIRST_GROUPS, dispatch_order

    assert FIRST_GROUPS == ("slurm", "demo-local")
    groups = ["a.py", "b.py", "b.py", "demo-local", "slurm", "c.py", "b.py", "slurm", "c.py"]
    assert [groups[i] for i in dispatch_order(groups)] == [
        "slurm", "slurm", "demo-local", "b.py", "b.py", "b.py", "c.py", "c.py", "a.py"]
    assert dispatch_order(groups)[:2] == [4, 7]  # a group's tests in their collection order


def test_the_environment_holds_its_bytecode():
    """`make env` installs with pip's --no-compile and then compiles site-packages on every core; were that
    step lost, every process on a machine with PYTHONDONTWRITEBYTECODE=1 (CI's) would compile torch from
    source, minutes of CI (issue 38)."""
    import sys

    import torch

    assert (Path(torch.__file__).parent / "__pycache__" / f"__init__.{sys.implementation.cache_tag}.pyc").is_file()


def check_clusters(result, shown):
    assert result.code == 0 and result.out.strip() == shown.strip()


def check_dry_run(result, shown):
    assert result.code == 0 and "#SBATCH --nodes=128" in result.out and "lr: 0.00039299421615882676" in result.out


def check_render_override(result, shown):
    assert result.code == 0 and "lr: 0.0012\n" in result.out and "#SBATCH --partition=batch" in result.out


KEY_LIST = re.compile(r"^(?P<head>.*\(valid keys under [\w.]+: )(?P<keys>[^()]*)\)$")


def check_unknown_key(result, shown):
    """Word for word up to the list of valid keys; of that list the README shows a few, in bertctl's order,
    then `...`: a new key needs no README change here, a shown key that is renamed or removed does."""
    said, showed = KEY_LIST.match(result.err.strip()), KEY_LIST.match(shown.strip())
    assert result.code == 2 and said and showed and said["head"] == showed["head"], result.err
    listed, keys = said["keys"].split(", "), showed["keys"].split(", ")
    assert keys[-1] == "..." and keys[:-1] == [k for k in listed if k in keys[:-1]] and len(keys) > 3, (listed, keys)


def check_data_list(result, shown):
    assert result.code == 0 and {"sample", "mlperf_wiki"} <= {line.split()[0] for line in result.out.splitlines() if line.strip()}


def check_data_prepare(result, shown):
    assert result.code == 0 and result.out.strip().endswith("/datasets/sample"), result.err


def check_data_verify(result, shown):
    assert result.code == 0, result.err + result.out


def check_inspur(result, shown):
    data = json.loads(result.out)
    # today's checker rejects the 2021 logs on a rule changed after v1.1 was published; by 1.1.0 as it stood they pass
    assert result.code == 0 and data["passed"] and "weights_initialization required" in data["ruleset_history"]
    assert round(data["score_minutes"], 2) == 19.39


def check_balance(result, shown):
    assert result.code == 0 and result.out.strip() == shown.strip()


def check_gpu_command(result, shown):
    """Where no GPU is visible (the machines CI runs on) the command is refused in one line, exit 2,
    before anything is written. On a GPU machine it trains: the GPU suite's stage b runs it word for
    word, and tests/test_device_run.py rehearses that stage on the CPU."""
    lines = result.err.strip().splitlines()
    assert result.code == 2 and len(lines) == 1 and "run.runtime.device: cuda, but this machine has no GPU" in lines[0], result.err
    assert "Traceback" not in result.err and not result.out.strip()


GPU_COMMAND = "bertctl submit --cluster local -o run.runtime.device=cuda -o run.runtime.precision=bf16 --nexp 1 --follow"

RUN_HERE = {
    "bertctl clusters": check_clusters,
    "bertctl submit --cluster samsung_dgxa100 --nexp 10 --dry-run": check_dry_run,
    "bertctl render --cluster nvidia_dgxa100_8x8 -o run.optim.lr=1.2e-3 -o slurm.partition=batch": check_render_override,
    "bertctl render --cluster nvidia_dgxa100_8x8 -o run.optim.lrr=1e-3": check_unknown_key,
    "bertctl data list": check_data_list,
    "bertctl data prepare --dataset sample": check_data_prepare,
    "bertctl data verify --dataset sample": check_data_verify,
    "bertctl compliance-check --results tests/data/mlperf-results/v1.1/Inspur --json": check_inspur,
    "bertctl balance --ranks 1024 --batch 16 --group 8": check_balance,
    "bertctl balance --cluster nvidia_dgxh100_1x8": check_balance,
    # the stage table's GPU command (stage b of the GPU suite runs it word for word from the README)
    GPU_COMMAND: check_gpu_command,
}


@pytest.fixture(scope="module")
def readme_home(tmp_path_factory) -> Path:
    """One $BERTCTL_HOME for the README's commands, in README order. It holds the session's sample build
    (tests/data_helpers.py::sample_home, made by the README's own `bertctl data prepare --dataset sample`),
    so here that command finds it complete instead of building it a second time, and `data verify` checks it."""
    from data_helpers import home_with_sample

    return home_with_sample(tmp_path_factory, "readme-home")


@pytest.mark.parametrize("command,shown", [c for c in all_readme_commands() if c[0] in RUN_HERE], ids=lambda v: v[:60])
def test_readme_command_does_what_the_readme_shows(command, shown, readme_home):
    words = command.split()
    assert words[0] == "bertctl"
    if command == GPU_COMMAND and visible_gpus():
        pytest.skip("this machine has a GPU: the GPU suite's stage b runs the command (bash benchmarks/gpu/device_run.sh)")
    RUN_HERE[command](run_bertctl(*words[1:], env={"BERTCTL_HOME": str(readme_home)}, timeout=300), shown)


def test_the_gpu_suites_product_stage_runs_the_readmes_command_word_for_word():
    from benchmarks.gpu.product import auto_command, readme_gpu_command

    assert ["bertctl", *readme_gpu_command()] == GPU_COMMAND.split()
    # on a machine without a GPU it then runs the same submit without the device (the auto path)
    assert [w for w in readme_gpu_command() if not w.startswith("run.runtime.") and w != "-o"] == auto_command(quick=False)
