"""`bertctl preflight`: find the slow or broken node before a run does.

One job on the cluster's allocation, rendered like a training job (same container, binding and
environment) with every rank running trainer/launch/preflight.py instead of the trainer. Each rank
writes its figures to EXP/preflight/rank_R.json as it goes; this module waits for the job, gathers
them, and judges each node by its slowest rank: a node is flagged when any of its figures is at least
`threshold` % below the median node's, or when a measure failed, or when a rank reported nothing
(its node died or never started) or stopped mid-check. It prints one table per node and the
`-o slurm.exclude=...` override that leaves the flagged nodes out, then the predicted time to train
from the figures (orchestrator/checks/predict.py, every assumption named), writes everything to
EXP/preflight.json, and the verb exits 1 when a node is flagged. Torch-free.

Figures are rates (higher is better). Measures every node shares (the all-ranks all-reduce, and
the pairwise all-reduce with two nodes: one pair) are the same on every node and flag no one; they
are shown for the record. With three or more nodes the pairwise rounds re-pair the nodes, so a node
whose link is slow is slow in every round while its partners are fast in the other: each node's
pairwise figure is its best round.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from orchestrator.errors import UserError, WorkFailed
from orchestrator.experiments import Experiment

MEASURES = {  # in the order a rank measures them; label, and whether it can tell nodes apart
    "matmul": "matmul at the model's GEMM shapes",
    "memcpy": "device memory copy",
    "storage": "read of the rank's shards",
    "allreduce_node": "all-reduce busbw within the node",
    "allreduce_world": "all-reduce busbw, all ranks",
    "allreduce_pair": "all-reduce busbw, node pairs (best round)",
    "train_step": "training step (synchronous)",
    "train_compute": "training step compute (no allreduce)",
}
PAIR_PREFIX = "allreduce_pair_"
DEFAULT_THRESHOLD = 10.0


def check_threshold(threshold: float) -> None:
    if not 0 < threshold < 100:
        raise UserError(f"must be a percentage between 0 and 100 (exclusive), got {threshold:g}", key="--threshold")


@dataclass
class NodeFigure:
    value: float
    unit: str
    rank: int  # the node's slowest rank for this measure
    vs_median: float | None = None  # value / median of the nodes' values


@dataclass
class NodeVerdict:
    node: str
    ranks: list[int]
    measures: dict[str, NodeFigure] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)

    @property
    def flagged(self) -> bool:
        return bool(self.reasons)


@dataclass
class Verdict:
    experiment: str
    threshold: float
    nodes: list[NodeVerdict]
    medians: dict[str, float]
    excluded: str | None = None  # the cluster's slurm.exclude already: the override keeps it
    time_to_train: dict | None = None  # predict.Prediction.as_json(), or {"error": why not}

    @property
    def flagged(self) -> list[str]:
        return [n.node for n in self.nodes if n.flagged]

    def override(self) -> str | None:
        if not self.flagged:
            return None
        return f"-o slurm.exclude={','.join(([self.excluded] if self.excluded else []) + self.flagged)}"

    def as_json(self) -> dict:
        return {"experiment": self.experiment, "threshold": self.threshold, "flagged": self.flagged,
                "override": self.override(), "medians": self.medians,
                "nodes": [asdict(n) | {"flagged": n.flagged} for n in self.nodes], "time_to_train": self.time_to_train}


# ---- gathering ---------------------------------------------------------------------------------

def rank_reports(exp_dir: Path) -> dict[int, dict]:
    reports = {}
    for path in sorted((exp_dir / "preflight").glob("rank_*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # a rank that died while writing: judged as missing
        reports[int(data["rank"])] = data
    return reports


def rank_figures(report: dict) -> dict[str, tuple[float, str]]:
    """A rank's figures by measure; its pairwise rounds folded into one (its best round)."""
    figures = {}
    for name, figure in report.get("measures", {}).items():
        key = "allreduce_pair" if name.startswith(PAIR_PREFIX) else name
        if key not in figures or figure["value"] > figures[key][0]:
            figures[key] = (figure["value"], figure["unit"])
    return figures


def node_names(reports: dict[int, dict], world_size: int, per_node: int, allocated: list[str]) -> list[str]:
    """Each node index's name (block distribution: node k holds ranks k*per_node ...), from its ranks'
    reports, else from the job's node list, else a description."""
    names = []
    for k in range(world_size // per_node):
        seen = [reports[r]["node"] for r in range(k * per_node, (k + 1) * per_node) if r in reports]
        names.append(seen[0] if seen else allocated[k] if k < len(allocated) else f"node #{k} of the job")
    return names


# ---- judging -----------------------------------------------------------------------------------

def assess(exp_id: str, reports: dict[int, dict], world_size: int, per_node: int, threshold: float,
           allocated: list[str] = ()) -> Verdict:
    names = node_names(reports, world_size, per_node, list(allocated))
    nodes = [NodeVerdict(name, list(range(k * per_node, (k + 1) * per_node))) for k, name in enumerate(names)]
    furthest = max((progress(r) for r in reports.values()), default=0)
    for node in nodes:
        collect_node(node, reports, furthest)
    medians = {}
    for measure in MEASURES:
        values = [n.measures[measure].value for n in nodes if measure in n.measures]
        if not values:
            continue
        medians[measure] = statistics.median(values)
        for node in nodes:
            figure = node.measures.get(measure)
            if figure is None or medians[measure] <= 0:
                continue
            figure.vs_median = figure.value / medians[measure]
            if figure.vs_median <= 1 - threshold / 100:
                node.reasons.append(f"{MEASURES[measure]}: {figure.value:.4g} {figure.unit} on rank {figure.rank}, "
                                    f"{100 * (1 - figure.vs_median):.0f} % below the median {medians[measure]:.4g}")
    return Verdict(exp_id, threshold, nodes, medians)


def progress(report: dict) -> int:
    """How far a rank got: the measures it finished or failed (done ranks count one more)."""
    return len(report.get("measures", {})) + len(report.get("errors", {})) + bool(report.get("done"))


def collect_node(node: NodeVerdict, reports: dict[int, dict], furthest: int) -> None:
    """The node's slowest rank per measure, and what went wrong on any of its ranks. A rank that
    stopped mid-check is blamed only if another rank got further: when one node dies, srun ends the
    others' ranks too, at a later point (they were waiting for it)."""
    missing = [r for r in node.ranks if r not in reports]
    if missing:
        node.reasons.append(f"no report from rank(s) {', '.join(map(str, missing))}: the node died or never started")
    for rank in node.ranks:
        report = reports.get(rank)
        if report is None:
            continue
        for measure, error in report.get("errors", {}).items():
            node.reasons.append(f"rank {rank}: {measure} failed: {error}")
        if not report.get("done") and progress(report) < furthest:
            last = list(report.get("measures", {}))[-1:] or ["its start"]
            node.reasons.append(f"rank {rank} stopped mid-check, after {last[0]}")
        for measure, (value, unit) in rank_figures(report).items():
            held = node.measures.get(measure)
            if held is None or value < held.value:
                node.measures[measure] = NodeFigure(value, unit, rank)


# ---- the verb ----------------------------------------------------------------------------------

def run(cluster, threshold: float, say) -> tuple[Experiment, Verdict]:
    """Submit the preflight job, wait for it, judge it, write EXP/preflight.json."""
    from orchestrator.jobs import submit as submission
    from orchestrator.jobs.follow import wait_until_finished

    check_threshold(threshold)
    exp = submission.submit(cluster, 1, "preflight")
    say(f"preflight {exp.id}: job(s) {', '.join(exp.job_ids)} on {exp.cluster}; waiting for it to end")
    final = wait_until_finished(exp)
    config = cluster.config
    per_node, world = config.resources.tasks_per_node, config.world_size
    reports = rank_reports(exp.path)
    if not reports:
        raise WorkFailed(f"preflight {exp.id} ended {final.state.value} and no rank reported: see "
                         f"{exp.log_file(0)} (`bertctl logs {exp.id}`)")
    verdict = assess(exp.id, reports, world, per_node, threshold, allocated_nodes(exp))
    verdict.excluded = config.slurm.exclude if config.executor == "slurm" else None
    verdict.time_to_train = predicted_time(reports, config.run)
    if final.state.value != "COMPLETED":
        blame_first_failure(verdict, exp.log_file(0))
    write_json(exp.path / "preflight.json", verdict.as_json() | {"job_state": final.state.value,
                                                                 "ranks": [reports[r] for r in sorted(reports)]})
    if final.state.value != "COMPLETED" and not verdict.flagged:
        raise WorkFailed(f"preflight {exp.id} ended {final.state.value} and no node is to blame by its figures: see "
                         f"{exp.log_file(0)} (`bertctl logs {exp.id}`)")
    return exp, verdict


def predicted_time(reports: dict[int, dict], run) -> dict:
    """The time to train these figures predict for the recipe, or why there is none."""
    from orchestrator.checks import predict

    try:
        return predict.from_preflight(reports, run, predict.earlier_converged_samples(run)).as_json()
    except predict.NoPrediction as why:
        return {"error": str(why)}


SRUN_TASK_ERROR = re.compile(r"^srun: error: (\S+): tasks? ([\d,-]+): (.+)$")


def blame_first_failure(verdict: Verdict, log: Path) -> None:
    """The node whose tasks srun saw end first (`srun: error: node7: tasks 8-15: Killed`): with
    --kill-on-bad-exit srun then ends every other rank, which all stop where they were waiting for it,
    so their reports alone cannot say who died."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return
    first = next((m for m in map(SRUN_TASK_ERROR.match, lines) if m), None)
    if first is None:
        return
    node, tasks, how = first.groups()
    for n in verdict.nodes:
        if n.node == node:
            n.reasons.append(f"its task(s) {tasks} ended first ({how.strip()}, says srun): the node or its ranks died mid-check")


def allocated_nodes(exp: Experiment) -> list[str]:
    """The job's nodes in order (Slurm's node list, expanded), to name a node none of whose ranks reported."""
    if exp.executor != "slurm":
        return []
    from orchestrator.jobs import scheduler

    try:
        info = scheduler.query_slurm(exp.job_ids).get(exp.job_ids[0])
    except scheduler.SchedulerError:
        return []
    if info is None or not info.node_list or info.node_list in ("None assigned", "(null)"):
        return []
    out = subprocess.run(["scontrol", "show", "hostnames", info.node_list], capture_output=True, text=True)
    return out.stdout.split() if out.returncode == 0 else []


def write_json(path: Path, data: dict) -> None:
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(data, indent=2, sort_keys=True))
    temporary.replace(path)


def print_tables(verdict: Verdict, console) -> None:
    from rich.table import Table

    for node in verdict.nodes:
        mark = "[red]FLAGGED[/red]" if node.flagged else "[green]ok[/green]"
        table = Table(title=f"{node.node} (ranks {node.ranks[0]}-{node.ranks[-1]}): {mark}", header_style="bold",
                      title_justify="left")
        for col in ("measure", "slowest rank", "figure", "vs median"):
            table.add_column(col)
        for measure, label in MEASURES.items():
            figure = node.measures.get(measure)
            if figure is not None:
                ratio = "-" if figure.vs_median is None else f"{100 * figure.vs_median:.0f} %"
                table.add_row(label, str(figure.rank), f"{figure.value:.4g} {figure.unit}", ratio)
        console.print(table)
        for reason in node.reasons:
            console.print(f"  [red]flag[/red] {node.node}: {reason}", highlight=False, soft_wrap=True)
    if sum(len(n.ranks) for n in verdict.nodes) == 1:
        console.print("all-reduce: not measured (one rank: nothing to reduce with)", highlight=False)
    if verdict.flagged:
        console.print(f"{len(verdict.flagged)} node(s) flagged (threshold {verdict.threshold:g} % below the median); "
                      f"leave them out with: {verdict.override()}", highlight=False, soft_wrap=True)
    else:
        console.print(f"no node flagged (threshold {verdict.threshold:g} % below the median)", highlight=False)
    if verdict.time_to_train is not None:
        from orchestrator.checks import predict

        predict.print_prediction(verdict.time_to_train, console)
