"""`bertctl package`: an experiment's ten runs in the MLPerf submission layout, judged by the package checker.

    OUT/ORG/systems/<system>.json                       from the cluster file's `system:` section
    OUT/ORG/results/<system>/bert/result_0..9.txt       the runs' MLPerf logs
    OUT/ORG/results/<system>/bert/package_checker_params  only when RCP is bypassed (a tiny model)

`python -m mlperf_logging.package_checker` then checks the system description, every log, the seeds
and the RCP, as MLCommons' submission tooling does. It always exits 0; its verdict is the line
`PACKAGE CHECKER FOUND NO ERRORS, SUCCESS !` or `... FOUND ERRORS, ...`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.errors import UserError
from orchestrator.results import closed_log

BENCHMARK = "bert"
SUCCESS = "PACKAGE CHECKER FOUND NO ERRORS, SUCCESS !"
VERDICT = "PACKAGE CHECKER FOUND"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*\Z")  # repo_checker: no spaces, no leading dot
# Field order of mlperf_logging's system_desc_checker; `submitter` and `division` come from the package.
SYSTEM_FIELDS = (
    "submitter", "division", "status", "system_name", "number_of_nodes", "host_processors_per_node",
    "host_processor_model_name", "host_processor_core_count", "host_processor_vcpu_count",
    "host_processor_frequency", "host_processor_caches", "host_processor_interconnect", "host_memory_capacity",
    "host_storage_type", "host_storage_capacity", "host_networking", "host_networking_topology",
    "host_memory_configuration", "accelerators_per_node", "accelerator_model_name",
    "accelerator_host_interconnect", "accelerator_frequency", "accelerator_on-chip_memories",
    "accelerator_memory_configuration", "accelerator_memory_capacity", "accelerator_interconnect",
    "accelerator_interconnect_topology", "cooling", "hw_notes", "framework", "other_software_stack",
    "operating_system", "sw_notes",
)
# The package checker's parameter that lets a failed RCP check through (no trailing newline: it
# compares whole lines with "rcp-bypass").
RCP_BYPASS_PARAM = "rcp-bypass"


@dataclass
class PackageVerdict:
    org_dir: Path
    system: str
    ruleset: str
    passed: bool
    verdict: str  # the checker's verdict line
    errors: list[str] = field(default_factory=list)  # its ERROR lines
    warnings: list[str] = field(default_factory=list)  # its WARNING lines
    rcp_bypass: str | None = None  # why the package asks the checker to bypass RCP


def system_description(system: dict, submitter: str, division: str) -> dict:
    """The systems/<system>.json content: every field the system-description checker requires, as strings
    like the published files."""
    values = {**system, "submitter": submitter, "division": division}
    values["accelerator_on-chip_memories"] = values.pop("accelerator_on_chip_memories", "")
    described = {}
    for name in SYSTEM_FIELDS:
        value = values.get(name, "")
        described[name] = str(value)
    return described


def find_system(rs) -> tuple[dict, str]:
    """The experiment's system description: the one recorded at submission, else the cluster file's today."""
    recorded = (rs.cluster_config or {}).get("system")
    if recorded:
        return recorded, f"{rs.experiment.path / 'cluster.yaml'}"
    from orchestrator.config.clusters import cluster_files, load_cluster

    name = rs.experiment.cluster
    if name in cluster_files():
        cluster = load_cluster(name)
        if cluster.config.system is not None:
            return cluster.config.system.model_dump(mode="json"), str(cluster.path)
    raise UserError(
        f"no system description: neither its cluster.yaml nor clusters/{name}.yaml has a `system:` section "
        "(MLPerf needs systems/<system>.json; see clusters/nvidia_dgxa100_1x8.yaml for one)",
        where=f"experiment {rs.label}",
    )


def build(rs, org: str, out: Path, system_id: str | None = None) -> tuple[Path, str, str | None]:
    """Write the layout; returns (ORG dir, system id, why RCP is bypassed or None)."""
    from orchestrator.results import scoring

    if not NAME_RE.match(org):
        raise UserError("must be letters, digits, '_', '.' or '-' (it names a folder of the submission)", where="--org")
    system_id = system_id or rs.experiment.cluster
    if not NAME_RE.match(system_id):
        raise UserError("must be letters, digits, '_', '.' or '-' (it names a folder of the submission)", where="--system")
    division = rs.division
    if division not in ("closed", "open"):
        raise UserError(f"the logs give no submission_division (closed or open), got {division!r}",
                        where=f"experiment {rs.label}")
    system, _ = find_system(rs)
    used_nodes = ((rs.cluster_config or {}).get("resources") or {}).get("nodes")
    if used_nodes:  # the scale that produced these results, -o resources.nodes=N included
        system = {**system, "number_of_nodes": used_nodes}
    rs.require_runs(scoring.required_runs())
    rehearsal = [f for f, s in zip(rs.files, rs.summaries) if closed_log.waived(s, rs.run_config)]
    if rehearsal and division == "closed":
        raise UserError("a rehearsal run (mlperf.waive_scale_rules: the closed division's rules of scale waived) is "
                        "never a result: not packaged; run it with the rules, or as mlperf.division=open",
                        where=f"experiment {rs.label}")
    malformed = [(f, s.problem or s.incomplete) for f, s in zip(rs.files, rs.summaries) if s.problem or s.incomplete]
    if malformed:
        f, why = malformed[0]
        raise UserError(f"malformed MLPerf log: {why}; a package holds only logs that pass bertctl's checks "
                        "(see `bertctl compliance-check`)", where=str(f))
    org_dir = out / org
    bench = org_dir / "results" / system_id / BENCHMARK
    if bench.exists():
        raise UserError("already exists: remove it or choose another --out", where=str(bench))
    bypass = scoring.rcp_bypass_reason(rs.run_config) if division == "closed" else None
    description = system_description(system, org, division)
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{org}.package-", dir=out))
    try:  # written whole in a hidden folder beside it, then renamed into place: a full disk leaves nothing
        staged = staging / org
        _write_layout(staged, rs.files, system_id, description, bypass)
        _move_into_place(staged, org_dir, system_id)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return org_dir, system_id, bypass


def _write_layout(org_dir: Path, logs: list[Path], system_id: str, description: dict, bypass: str | None) -> None:
    bench = org_dir / "results" / system_id / BENCHMARK
    bench.mkdir(parents=True)
    for i, log in enumerate(logs):
        shutil.copyfile(log, bench / f"result_{i}.txt")
    if bypass:
        (bench / "package_checker_params").write_text(RCP_BYPASS_PARAM)
    systems = org_dir / "systems"
    systems.mkdir(parents=True)
    (systems / f"{system_id}.json").write_text(json.dumps(description, indent=4) + "\n", encoding="utf-8")


def _move_into_place(staged: Path, org_dir: Path, system_id: str) -> None:
    """The staged ORG folder becomes org_dir; into an existing one (another system's package), its
    system's results folder and description move by rename, each whole."""
    if not org_dir.exists():
        os.replace(staged, org_dir)
        return
    (org_dir / "results").mkdir(exist_ok=True)
    (org_dir / "systems").mkdir(exist_ok=True)
    target = org_dir / "results" / system_id
    if target.exists():  # another benchmark of this system: move only ours
        os.replace(staged / "results" / system_id / BENCHMARK, target / BENCHMARK)
    else:
        os.replace(staged / "results" / system_id, target)
    os.replace(staged / "systems" / f"{system_id}.json", org_dir / "systems" / f"{system_id}.json")


def check_package(org_dir: Path, ruleset: str, bert_train_samples: bool = False) -> PackageVerdict:
    """`python -m mlperf_logging.package_checker ORG_DIR training RULESET` and its verdict.

    `bert_train_samples`: the RCP check reads train_samples (--rcp-bert-train-samples), as the v1.x
    rounds' submitters ran it for logs whose eval epoch_num counts epochs."""
    with tempfile.TemporaryDirectory(prefix="bertctl-pc-") as tmp:
        proc = subprocess.run(
            [sys.executable, "-m", "mlperf_logging.package_checker", str(org_dir.resolve()), "training", ruleset,
             "--log_output", str(Path(tmp) / "package_checker.log")]
            + (["--rcp-bert-train-samples"] if bert_train_samples else []),
            capture_output=True, text=True, cwd=tmp,
        )
    output = proc.stderr + proc.stdout
    verdicts = [line for line in output.splitlines() if VERDICT in line]
    if proc.returncode != 0 or not verdicts:
        tail = [line for line in output.strip().splitlines() if line.strip()][-1:] or ["(no output)"]
        return PackageVerdict(org_dir, "", ruleset, False, f"the package checker failed: {tail[0]}")
    verdict = verdicts[-1].split(" - ", 1)[-1].strip()
    return PackageVerdict(
        org_dir, "", ruleset, passed=verdict == SUCCESS, verdict=verdict,
        errors=[line.split(" - ", 1)[1].strip() for line in output.splitlines() if line.startswith("ERROR - ")],
        warnings=[line.split(" - ", 1)[1].strip() for line in output.splitlines() if line.startswith("WARNING - ")],
    )


def package(rs, org: str, out: Path, ruleset: str | None = None, system_id: str | None = None) -> PackageVerdict:
    from orchestrator.results import compliance

    chosen = compliance.require_bert_ruleset(ruleset) if ruleset else compliance.require_bert_ruleset(
        rs.recorded_ruleset or compliance.newest_bert_ruleset(), where="run.yaml mlperf.ruleset")
    org_dir, system_id, bypass = build(rs, org, out, system_id)
    verdict = check_package(org_dir, chosen)
    verdict.system, verdict.rcp_bypass = system_id, bypass
    return verdict


def print_verdict(v: PackageVerdict, console) -> None:
    from rich.markup import escape

    console.print(f"package: {escape(str(v.org_dir))} (system {escape(v.system)}, ruleset {v.ruleset})", highlight=False)
    if v.rcp_bypass:
        console.print(f"note: {escape(v.rcp_bypass)}; the package says so in "
                      f"results/{escape(v.system)}/{BENCHMARK}/package_checker_params", highlight=False)
    for line in v.warnings:
        console.print(f"[yellow]checker warning:[/] {escape(line)}", highlight=False)
    for line in v.errors:
        console.print(f"[red]checker error:[/] {escape(line)}", highlight=False)
    colour = "green" if v.passed else "red"
    console.print(f"package_checker: [{colour}]{escape(v.verdict)}[/]", highlight=False)
