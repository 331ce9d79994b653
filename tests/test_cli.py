"""The command line as a user meets it: output contract, exit codes, no torch on the control plane."""

import os
import re
import subprocess
import sys

import pytest
from conftest import REPO, run_cli


@pytest.mark.serial  # a bound on seconds: alone, not beside another test's load
def test_help_is_instant_and_imports_no_torch():
    code = ("import sys, time; t = time.perf_counter(); from orchestrator.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print(time.perf_counter() - t, 'torch' in sys.modules, 'pydantic' in sys.modules, file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    seconds, torch_loaded, pydantic_loaded = proc.stderr.split()
    assert torch_loaded == "False" and pydantic_loaded == "False"
    assert float(seconds) < 0.5
    assert "submit" in proc.stdout and "compliance" not in proc.stderr


def test_render_and_status_never_import_torch(tmp_path):
    code = ("import sys; from orchestrator.cli import main\n"
            "main(['render', '--cluster', 'samsung_dgxa100', '--nexp', '10']); main(['status', '--json'])\n"
            "print('torch' in sys.modules, file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "BERTCTL_HOME": str(tmp_path)})
    assert proc.returncode == 0 and proc.stderr.strip() == "False"


def test_bad_input_exits_2_with_one_line_and_writes_nothing(bertctl_home):
    for args in (["submit", "--cluster", "nope"],
                 ["submit", "--cluster", "ci_slurm", "-o", "resources.nodes=3"],
                 ["submit", "--cluster", "ci_slurm", "-o", "run.optim.lr=-1"],
                 ["logs", "nothing-like-this"],
                 ["status", "nothing-like-this"],
                 ["cancel", "nothing-like-this"]):
        result = run_cli(*args)
        assert result.code == 2, args
        assert result.out == "" and result.err.startswith("bertctl: error: ") and result.err.count("\n") == 1, args
    assert not (bertctl_home / "experiments").exists() or not any((bertctl_home / "experiments").iterdir())


@pytest.mark.parametrize("overrides,words", [
    (["run.mlperf.division=closed"], ["run.optim.name: adam", "mlperf.division closed", "allows lamb only"]),
    (["run.balance.bin_quotas=[1,1,1,1]", "run.data.streams=8"],
     ["run.balance.bin_quotas: [1, 1, 1, 1] add up to 4", "8 data stream(s)", "must add up to 2"]),
])
def test_submit_refuses_what_mlperf_or_the_streams_cannot_take(bertctl_home, overrides, words):
    """Samsung's ADAM recipe declared closed; quotas that fill train.batch_size (4) while each of 8
    streams over 4 ranks takes 2 samples: one line naming the key, exit 2, nothing written."""
    cluster = "samsung_dgxa100" if "closed" in overrides[0] else "ci_slurm"
    result = run_cli("submit", "--cluster", cluster, *[a for o in overrides for a in ("-o", o)])
    assert result.code == 2 and result.out == "" and result.err.count("\n") == 1, result.err
    assert all(w in result.err for w in words), result.err
    assert not (bertctl_home / "experiments").exists() or not any((bertctl_home / "experiments").iterdir())


def test_usage_errors_exit_2():
    assert run_cli("submit").code == 2
    assert run_cli("submit", "--cluster", "local", "--nexp", "0").code == 2
    assert run_cli("frobnicate").code == 2


def test_submit_without_slurm_says_so(monkeypatch, bertctl_home):
    monkeypatch.setenv("PATH", "/nonexistent")
    result = run_cli("submit", "--cluster", "samsung_dgxa100", "--nexp", "10")
    assert result.code == 2 and "sbatch not found" in result.err
    assert not (bertctl_home / "experiments").exists()


def test_clusters_lists_one_line_each():
    result = run_cli("clusters")
    lines = result.out.splitlines()
    shipped = sorted(p.stem for p in (REPO / "clusters").glob("*.yaml"))
    assert result.code == 0 and [line.split("\t")[0] for line in lines] == shipped
    assert lines[-1].split("\t")[:3] == ["samsung_dgxa100", "slurm", "128x8"]


def test_a_normal_install_finds_templates_clusters_and_datasets(tmp_path):
    """Build and install the wheel into a folder (not editable) and render from outside the checkout."""
    target = tmp_path / "site"
    build = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                            "--target", str(target), str(REPO)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    env = {**os.environ, "PYTHONPATH": str(target)}
    code = ("import orchestrator.resources as r, sys; from orchestrator.cli import main\n"
            "assert str(r.shipped_dir('templates')).startswith(sys.argv[1]), r.shipped_dir('templates')\n"
            "assert sorted(p.name for p in r.shipped_dir('datasets').glob('*.yaml')), 'no dataset manifests'\n"
            "raise SystemExit(main(['render', '--cluster', 'nvidia_dgxa100_1x8']))")
    proc = subprocess.run([sys.executable, "-c", code, str(target)], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --nodes=1" in proc.stdout and "lr: 0.00035" in proc.stdout


def verb_parsers() -> dict:
    """Every verb's parser (and each `data` action's), by the words that follow `bertctl`."""
    import argparse

    from orchestrator.cli import build_parser

    found = {}

    def walk(parser, words):
        for action in parser._actions:  # argparse keeps its subparsers here: no public accessor
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    found[" ".join([*words, name])] = sub
                    walk(sub, [*words, name])

    walk(build_parser(), [])
    return found


def test_bertctl_alone_and_its_help_list_every_verb_under_its_task(capsys):
    """`bertctl` and `bertctl --help` print the same page: every verb once, one line, under the task the
    guides file it under (GROUPS); a verb in no group lands under "other" and fails here."""
    from orchestrator.cli import main
    from orchestrator.help_text import GROUPS

    assert main([]) == 0
    alone = capsys.readouterr().out
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0 and capsys.readouterr().out == alone
    verbs = [words for words in verb_parsers() if " " not in words]
    listed = [line.split()[0] for line in alone.splitlines() if line.startswith("  ") and not line.startswith("  -")]
    assert sorted(listed) == sorted(verbs) and "other:" not in alone, (listed, verbs)
    for task, names in GROUPS:
        assert f"\n{task}:\n" in alone or not set(names) & set(verbs)
        for guide in re.findall(r"docs/[\w-]+\.md", task):
            assert (REPO / guide).is_file(), f"GROUPS names {guide}, which does not exist"


def test_every_verbs_help_ends_with_examples_that_parse():
    """Each verb's --help (each `data` action's too, and the balance simulator's) ends with one or two
    examples, and each example is a command line that bertctl's parser accepts."""
    import shlex

    from orchestrator.checks.balance import simulator_arguments
    from orchestrator.cli import build_parser
    from trainer.balance.simulate import argument_parser as balance_parser

    for words, parser in verb_parsers().items():
        text = (balance_parser() if words == "balance" else parser).format_help()
        assert "\nexamples:\n" in text, f"bertctl {words} --help shows no examples"
        examples = text.rsplit("\nexamples:\n", 1)[1].strip().splitlines()
        assert 1 <= len(examples) <= 2, (words, examples)
        for example in examples:
            argv = shlex.split(example)
            assert argv[:2] == ["bertctl", words.split()[0]], example
            if argv[1] == "balance":
                balance_parser().parse_args(simulator_arguments(argv[2:]))
            else:
                build_parser().parse_args(argv[1:])  # a stale option is a SystemExit(2) here
