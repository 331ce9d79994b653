"""`bertctl rehearsal EXP`: the verdict on a launch-path probe (`bertctl submit --probe`).

Every rank of every run reported, as one `BERTCTL_PROBE {json}` line in the run's log, what the
trainer would use there (trainer/launch/probe.py). This module checks those reports against the cluster
file: each rank once, the node and GPU layout, disjoint CPU sets, one rendezvous, every shard read
once, exchange groups inside nodes, the container's options, distinct seeds. A broken check names
the key of the cluster file to look at.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass

from orchestrator.config import configfile
from orchestrator.errors import UserError
from orchestrator.experiments import Experiment
from orchestrator.jobs import status
from orchestrator.jobs.executors import batch_outputs
from orchestrator.jobs.scheduler import State
from trainer.config.regular import read_regular_text
from trainer.launch.topology import parse_cpu_list

PROBE_LINE = re.compile(r"^(?:\s*\d+: )?BERTCTL_PROBE (\{.*\})\s*$")
PYXIS_ERROR = re.compile(r"pyxis: --container-(image|name|mounts|workdir)")


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    key: str | None = None  # the cluster-file key to look at when it fails


@dataclass
class Verdict:
    experiment: str
    ranks: int
    runs: int
    verified: int  # rank reports that passed every per-rank check, over all runs
    checks: list[Check]

    @property
    def passed(self) -> bool:
        return all(c.ok for c in self.checks)

    def as_json(self) -> dict:
        return {**asdict(self), "passed": self.passed}


def read_reports(exp: Experiment, run: int) -> list[dict]:
    """Every rank's whole report (probe/run_N/rank_R.json); the log's short lines where there are none."""
    files = sorted((exp.path / "probe" / f"run_{run}").glob("rank_*.json"))
    if files:
        return [json.loads(read_regular_text(f)) for f in files]
    try:
        lines = read_regular_text(exp.log_file(run), errors="replace").splitlines()
    except OSError:
        return []
    return [json.loads(m.group(1)) for line in lines if (m := PROBE_LINE.match(line))]


def assess(exp: Experiment) -> Verdict:
    if exp.program != "probe":
        raise UserError("is a training experiment: the rehearsal judges `bertctl submit --probe` experiments", where=exp.id)
    view = status.collect([exp])[0]
    if not view.state.finished:
        raise UserError(f"is still {view.state.value.lower()}: wait for it to end", where=exp.id)
    cluster = configfile.read_mapping(exp.path / "cluster.yaml")
    checks: list[Check] = []
    verified = 0
    seeds = []
    for run in range(exp.nexp):
        reports = read_reports(exp, run)
        if not reports:
            checks.append(launch_failure(exp, run, view.runs[run]))
            continue
        seeds.append(reports[0]["seed"])
        run_checks = rank_checks(reports, cluster)
        checks += [Check(f"run {run}: {c.name}", c.ok, c.detail, c.key) for c in run_checks]
        if all(c.ok for c in run_checks):
            verified += len(reports)
    if exp.nexp > 1 and seeds:
        distinct = len(set(seeds)) == len(seeds) == exp.nexp
        checks.append(Check("seeds", distinct, f"runs have seeds {seeds}", None if distinct else "run.train.seed"))
    world = cluster["resources"]["nodes"] * cluster["resources"]["tasks_per_node"]
    return Verdict(exp.id, world, exp.nexp, verified, checks)


def launch_failure(exp: Experiment, run: int, rv) -> Check:
    """A run without reports: its job failed before the ranks ran (a pyxis option, a missing venv ...)."""
    line = pyxis_error(exp, run) or rv.error or "no rank reported"
    pyxis = PYXIS_ERROR.search(line)
    key = f"container.{pyxis.group(1)}" if pyxis else None
    return Check(f"run {run}: launch", False, f"{rv.state.value}: {line}" if rv.state != State.COMPLETED else line, key)


def pyxis_error(exp: Experiment, run: int) -> str | None:
    """The container runtime's own complaint, which says more than the script's line after it."""
    for path in [exp.log_file(run), *batch_outputs(exp.executor, exp.path, exp.history)]:
        try:
            lines = read_regular_text(path, errors="replace").splitlines()
        except OSError:
            continue
        found = [line.strip() for line in lines if PYXIS_ERROR.search(line)]
        if found:
            return found[0]
    return None


def rank_checks(reports: list[dict], cluster: dict) -> list[Check]:
    res, run = cluster["resources"], cluster["run"]
    nodes, per_node = res["nodes"], res["tasks_per_node"]
    by_node: dict[str, list[dict]] = defaultdict(list)
    for r in reports:
        by_node[r["node"]].append(r)
    checks = [
        ranks_once(reports, nodes * per_node),
        node_layout(by_node, nodes, per_node),
        local_ranks(by_node, per_node),
        rendezvous(reports),
        shards_once(reports, run),
    ]
    if res.get("gpus_per_node"):
        checks.append(gpus(by_node, res["gpus_per_node"]))
    binding = (cluster.get("node") or {}).get("binding") or {}
    if binding.get("cpu", "none") != "none":
        checks.append(cpu_sets(by_node))
    if binding.get("mem", "none") != "none" or binding.get("ib", "none") != "none":
        checks.append(numa_and_nic(reports, binding))
    if (run.get("balance") or {}).get("exchange_padding", "none") != "none":
        checks.append(exchange_groups(reports, run["balance"], per_node))
    container = cluster.get("container") or {}
    if container.get("kind") == "pyxis":
        checks.append(container_options(reports, container))
    return checks


def ranks_once(reports: list[dict], world: int) -> Check:
    counts = Counter(r["rank"] for r in reports)
    twice = sorted(r for r, n in counts.items() if n > 1)
    missing = sorted(set(range(world)) - set(counts))
    ok = not twice and not missing and len(counts) == world
    detail = f"{len(counts)} of {world} ranks reported" + (f"; twice: {twice[:8]}" if twice else "") + \
        (f"; missing: {missing[:8]}" if missing else "")
    return Check("each rank once", ok, detail, None if ok else "resources.nodes")


def node_layout(by_node: dict, nodes: int, per_node: int) -> Check:
    wrong = {n: len(rs) for n, rs in by_node.items() if len(rs) != per_node}
    ok = len(by_node) == nodes and not wrong
    others = f"; nodes with other counts: {dict(list(wrong.items())[:4])}" if wrong else ""
    detail = f"{len(by_node)} node(s) x {per_node} task(s){others}"
    return Check("tasks per node", ok, detail, None if ok else "resources.tasks_per_node")


def local_ranks(by_node: dict, per_node: int) -> Check:
    bad = [n for n, rs in by_node.items() if sorted(r["local_rank"] for r in rs) != list(range(per_node))]
    blocks = [n for n, rs in by_node.items() if len({r["rank"] // per_node for r in rs}) != 1]
    ok = not bad and not blocks
    detail = "local ranks 0..{} on every node, consecutive ranks per node".format(per_node - 1) if ok else \
        f"wrong local ranks on {bad[:4]}" if bad else f"ranks not in blocks of {per_node} on {blocks[:4]}"
    return Check("local ranks", ok, detail, None if ok else "resources.tasks_per_node")


def rendezvous(reports: list[dict]) -> Check:
    addresses = {(r["master_addr"], r["master_port"]) for r in reports}
    ok = len(addresses) == 1
    return Check("one rendezvous", ok, f"{len(addresses)} address(es): {sorted(addresses)[:3]}")


def shards_once(reports: list[dict], run: dict) -> Check:
    errors = [r["shards_error"] for r in reports if r.get("shards_error")]
    if errors:
        return Check("every shard read once", False, f"{len(errors)} rank(s) cannot read their shards: {errors[0]}", "run.data.train_dir")
    read = Counter(f for r in reports for f in r.get("shards") or [])
    twice = [f for f, n in read.items() if n > 1]
    ok = bool(read) and not twice
    return Check("every shard read once", ok, f"{len(read)} shard(s), each by one rank" if ok else
                 f"{len(twice)} shard(s) read by several ranks, e.g. {twice[:2]}", None if ok else "run.data.streams")


def gpus(by_node: dict, gpus_per_node: int) -> Check:
    for node, rs in by_node.items():
        chosen = [r.get("gpu") for r in rs]
        if None in chosen:
            return Check("one GPU per rank", False, f"{node}: a rank sees no GPU of its own "
                         f"(CUDA_VISIBLE_DEVICES={rs[0].get('cuda_visible_devices')!r})", "resources.gpus_per_node")
        if len(set(chosen)) != len(chosen):
            return Check("one GPU per rank", False, f"{node}: ranks share GPUs {sorted(chosen)}", "resources.gpus_per_node")
        if len(rs) != gpus_per_node:
            return Check("one GPU per rank", False, f"{node}: {len(rs)} ranks for {gpus_per_node} GPUs "
                         f"({abs(gpus_per_node - len(rs))} {'idle' if len(rs) < gpus_per_node else 'missing'})",
                         "resources.tasks_per_node")
    return Check("one GPU per rank", True, f"{gpus_per_node} distinct GPUs on each of {len(by_node)} node(s)")


def cpu_sets(by_node: dict) -> Check:
    for node, rs in by_node.items():
        plans = [r.get("binding") for r in rs]
        if None in plans:
            return Check("disjoint CPU sets", False, f"{node}: a rank has no binding plan (the binding wrapper did not run)",
                         "node.binding.cpu")
        seen: dict[int, int] = {}
        for r, plan in zip(rs, plans):
            for cpu in parse_cpu_list(plan["cpus"]):
                if cpu in seen:
                    return Check("disjoint CPU sets", False, f"{node}: CPU {cpu} given to local ranks {seen[cpu]} and "
                                 f"{r['local_rank']}", "node.binding.cpu")
                seen[cpu] = r["local_rank"]
    fallbacks = {r["binding"]["fallback"] for rs in by_node.values() for r in rs if r["binding"].get("fallback")}
    note = f"; by position: {sorted(fallbacks)[0]}" if fallbacks else "; by GPU locality"
    return Check("disjoint CPU sets", True, f"no CPU shared within any node{note}")


def numa_and_nic(reports: list[dict], binding: dict) -> Check:
    plans = [r.get("binding") or {} for r in reports]
    if binding.get("ib", "none") == "single" and any(not p.get("ib_device") for p in plans):
        return Check("memory and NIC", False, "a rank has no IB device", "node.binding.ib_devices")
    if binding.get("mem", "none") == "node" and any(p.get("numa_node") is None for p in plans):
        return Check("memory and NIC", False, "a rank has no NUMA node", "node.binding.mem")
    nodes = Counter(p.get("numa_node") for p in plans)
    return Check("memory and NIC", True, f"NUMA nodes used: {dict(sorted(nodes.items()))}")


def exchange_groups(reports: list[dict], balance: dict, per_node: int) -> Check:
    node_of = {r["rank"]: r["node"] for r in reports}
    groups = {tuple(r["exchange"]["members"]) for r in reports if r.get("exchange")}
    if balance.get("exchange_padding") == "group":
        spanning = [g for g in groups if len({node_of.get(m) for m in g}) != 1]
        if spanning:
            return Check("exchange groups", False, f"group {list(spanning[0])[:4]}... spans nodes "
                         f"{sorted({node_of.get(m) for m in spanning[0]})[:4]}", "run.balance.group_size")
        same = balance.get("group_size") == per_node
        return Check("exchange groups", True, f"{len(groups)} group(s), each inside one node"
                     + (" (one per node)" if same else ""))
    return Check("exchange groups", len(groups) == 1, f"{len(groups)} global group(s)", "run.balance.exchange_padding")


def container_options(reports: list[dict], container: dict) -> Check:
    got = [r.get("container") for r in reports]
    if None in got:
        return Check("container", False, "a rank ran outside the container (no pyxis options reached it)", "container.kind")
    wanted = {f"{m['host']}:{m['container']}" for m in container.get("mounts") or []}
    for c in got:
        mounts = {m.rsplit(":", 1)[0] if m.count(":") > 1 else m for m in (c.get("mounts") or "").split(",") if m}
        if not wanted <= mounts:
            return Check("container", False, f"mounts {sorted(wanted - mounts)} missing on a rank", "container.mounts")
        if c.get("name") != container.get("name"):
            return Check("container", False, f"a rank ran in container {c.get('name')!r}", "container.name")
    return Check("container", True, f"named container {container.get('name')!r} with {len(wanted)} mount(s) on every rank")


def print_verdict(v: Verdict, console) -> None:
    from rich.table import Table

    table = Table(title=f"{v.experiment}: launch rehearsal, {v.ranks} rank(s) x {v.runs} run(s)", header_style="bold")
    for col in ("check", "result", "detail", "key"):
        table.add_column(col, overflow="fold")
    for c in v.checks:
        table.add_row(c.name, "[green]PASS[/green]" if c.ok else "[red]FAIL[/red]", c.detail, c.key or "")
    console.print(table)
    console.print(f"verified {v.verified} of {v.ranks * v.runs} rank report(s): {'PASSED' if v.passed else 'FAILED'}")
