"""`bertctl package`: the submission layout, the system description, and the official package checker's verdict."""

import json
import re
from pathlib import Path

import mllog_factory as f
import pytest
from conftest import REPO, run_cli

from orchestrator.config.clusters import cluster_files, load_cluster
from orchestrator.errors import UserError
from orchestrator.results import package, scoring


def system_desc_valid(path: Path, ruleset: str = "5.0.0") -> bool:
    from mlperf_logging.system_desc_checker import system_desc_checker

    with scoring.captured_logging():
        valid, _, _, _ = system_desc_checker.check_system_desc(str(path), "training", ruleset)
    return valid


@pytest.mark.parametrize("name", sorted(cluster_files()))
def test_every_shipped_cluster_has_a_system_description_the_checker_accepts(name, tmp_path):
    config = load_cluster(name).config
    assert config.system is not None, f"clusters/{name}.yaml has no system: section"
    described = package.system_description(config.system.model_dump(mode="json"), "ExampleOrg", config.run.mlperf.division)
    assert list(described) == list(package.SYSTEM_FIELDS)
    assert all(described[k] != "" for k in package.SYSTEM_FIELDS if k not in ("hw_notes", "sw_notes"))
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(described))
    assert system_desc_valid(path)
    assert described["number_of_nodes"] == str(config.resources.nodes)
    assert described["accelerators_per_node"] == str(config.resources.gpus_per_node)


def test_samsung_system_is_the_submitted_one():
    s = load_cluster("samsung_dgxa100").config.system
    assert (s.number_of_nodes, s.accelerators_per_node, s.host_processors_per_node) == (128, 8, 2)
    assert s.accelerator_model_name == "NVIDIA A100-SXM4-80GB (400W)"
    assert (s.host_processor_model_name, s.host_processor_core_count) == ("AMD EPYC 7543", 32)
    assert s.host_memory_capacity == "1 TB" and "4x ConnectX-6 HDR InfiniBand 200 Gb/s" in s.host_networking
    assert s.framework == "PyTorch NVIDIA Release 21.08" and s.status == "Research, Development, or Internal (RDI)"
    assert "nccl 2.9.9" in s.other_software_stack and "pytorch 1.9.1" in s.other_software_stack


def test_cpu_clusters_describe_a_cpu_system():
    for name in ("local", "ci_slurm"):
        s = load_cluster(name).config.system
        assert s.accelerators_per_node == 0 and s.accelerator_model_name.startswith("N/A")


@pytest.mark.parametrize("override,message", [
    ("system.status=onprem", "system.status: Input should be 'Available on-premise', 'Available cloud', "
                             "'Research, Development, or Internal (RDI)' or 'Preview'"),
    ("system.number_of_nodes=0", "system.number_of_nodes: Input should be greater than or equal to 1"),
    ("system.cooling=", "system.cooling: String should have at least 1 character"),
])
def test_a_wrong_system_description_is_rejected_in_one_line(override, message):
    with pytest.raises(UserError, match=re.escape(message)):
        load_cluster("nvidia_dgxa100_1x8", [override])


def test_package_of_ten_good_runs_is_accepted(tmp_path):
    exp = f.make_experiment(f.example_specs())
    result = run_cli("package", exp.id, "--org", "ExampleOrg", "--out", str(tmp_path))
    org = tmp_path / "ExampleOrg"
    assert result.code == 0, result.err
    assert result.out.strip() == str(org)
    bench = org / "results" / "nvidia_dgxa100_1x8" / "bert"
    assert sorted(p.name for p in bench.iterdir()) == sorted(f"result_{i}.txt" for i in range(10))
    assert (bench / "result_3.txt").read_text() == exp.result_file(3).read_text()
    described = json.loads((org / "systems" / "nvidia_dgxa100_1x8.json").read_text())
    assert described["submitter"] == "ExampleOrg" and described["division"] == "closed"
    assert described["system_name"] == "NVIDIA DGX A100 (1 node)"
    assert "package_checker: PACKAGE CHECKER FOUND NO ERRORS, SUCCESS !" in result.err
    assert "bypass" not in result.err


def test_a_rehearsal_run_is_never_packaged_nor_passed(tmp_path):
    """A tiny model run as closed waives the rules of scale (mlperf.waive_scale_rules): never a result."""
    exp = f.make_experiment(f.tiny_closed_specs(), cluster="local", overrides=f.TINY_CLOSED)
    err = bad(exp.id, "--org", "bertctl", "--out", str(tmp_path / "out"), "--system", "laptop")
    assert "a rehearsal run (mlperf.waive_scale_rules: the closed division's rules of scale waived) is never a result" in err
    assert not (tmp_path / "out").exists()
    check = run_cli("compliance-check", exp.id, "--json")
    report = json.loads(check.out)
    assert check.code == 1 and report["passed"] is False and all(r["compliant"] for r in report["runs"])
    assert report["problems"] == ["a rehearsal, never a result: result_0.txt, result_1.txt, result_2.txt, result_3.txt, ... "
                                  "waived the closed division's rules of scale (mlperf.waive_scale_rules: model, lengths, "
                                  "evaluation set and cadence, checkpoint)"]
    assert report["stricter"] == report["problems"] and report["package_checker_view"]["passed"] is True
    # the RCP check applies the same policy as before and says so
    assert report["rcp"]["pass"] is True and report["rcp"]["bypassed"].startswith("RCP bypassed")


def test_bert_large_never_bypasses_rcp(tmp_path):
    specs = [f.RunSpec(seed=i, converge_samples=1_950_000, minutes=m, start_ms=f.T0_MS + i * 3_600_000)
             for i, m in enumerate(f.EXAMPLE_MINUTES)]
    exp = f.make_experiment(specs)
    result = run_cli("package", exp.id, "--org", "ExampleOrg", "--out", str(tmp_path))
    assert result.code == 1
    assert "checker error: RCP Test Failed: RCP found" in result.err
    assert "PACKAGE CHECKER FOUND ERRORS, LOOK INTO ERROR LOG LINES AND FIX THEM." in result.err
    assert not (tmp_path / "ExampleOrg" / "results" / "nvidia_dgxa100_1x8" / "bert" / "package_checker_params").exists()


def test_the_package_states_the_nodes_the_runs_used(tmp_path):
    exp = f.make_experiment(f.example_specs(), cluster="nvidia_dgxa100_8x8",
                            # the closed division's evaluation cadence follows the batch: the rules' interval at 384
                            overrides=("resources.nodes=1", "run.train.global_batch_size=384",
                                       "run.train.eval_every_samples=null", "run.train.eval_start_samples=null"))
    result = run_cli("package", exp.id, "--org", "ExampleOrg", "--out", str(tmp_path))
    assert result.code == 0, result.err
    described = json.loads((tmp_path / "ExampleOrg" / "systems" / "nvidia_dgxa100_8x8.json").read_text())
    assert described["number_of_nodes"] == "1" and described["system_name"] == "NVIDIA DGX A100 (8 nodes)"


def test_the_same_seed_in_every_run_fails_the_seed_checker(tmp_path):
    exp = f.make_experiment(f.example_specs(seed=42))
    result = run_cli("package", exp.id, "--org", "ExampleOrg", "--out", str(tmp_path))
    assert result.code == 1 and "checker error: Seed checker failed" in result.err


def test_the_recorded_system_wins_and_the_cluster_file_is_the_fallback(tmp_path):
    exp = f.make_experiment(f.example_specs(), without_system=True)
    result = run_cli("package", exp.id, "--org", "ExampleOrg", "--out", str(tmp_path))
    assert result.code == 0, result.err
    described = json.loads((tmp_path / "ExampleOrg" / "systems" / "nvidia_dgxa100_1x8.json").read_text())
    assert described["host_processor_model_name"] == "AMD EPYC 7742"


# ---- bad input


def bad(*args):
    result = run_cli("package", *args)
    assert result.code == 2, result.err
    assert result.out == "" and result.err.startswith("bertctl: error: ") and result.err.count("\n") == 1, result.err
    return result.err


def test_missing_system_description(tmp_path, monkeypatch):
    clusters = tmp_path / "clusters"
    clusters.mkdir()
    text = (REPO / "clusters" / "nvidia_dgxa100_1x8.yaml").read_text()
    text = re.sub(r"\nsystem:\n(  .*\n)+", "\n", text).replace("name: nvidia_dgxa100_1x8", "name: bare_dgx")
    (clusters / "bare_dgx.yaml").write_text(text)
    monkeypatch.setenv("BERTCTL_CLUSTERS", str(clusters))
    exp = f.make_experiment(f.example_specs(), cluster="bare_dgx")
    err = bad(exp.id, "--org", "ExampleOrg", "--out", str(tmp_path / "out"))
    assert "no system description: neither its cluster.yaml nor clusters/bare_dgx.yaml has a `system:` section" in err
    assert not (tmp_path / "out").exists()


def test_package_bad_input(tmp_path):
    nine = f.make_experiment(f.example_specs()[:9])
    assert "an MLPerf BERT result is 10 runs, found 9" in bad(nine.id, "--org", "ExampleOrg", "--out", str(tmp_path))
    exp = f.make_experiment(f.example_specs())
    assert "--org: must be letters, digits" in bad(exp.id, "--org", "Example Org", "--out", str(tmp_path))
    assert "ruleset 5.1.0 cannot check BERT" in bad(exp.id, "--org", "E", "--out", str(tmp_path), "--ruleset", "5.1.0")
    assert run_cli("package", exp.id, "--org", "ExampleOrg", "--out", str(tmp_path)).code == 0
    assert "already exists: remove it or choose another --out" in bad(exp.id, "--org", "ExampleOrg", "--out", str(tmp_path))
