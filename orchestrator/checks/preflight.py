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
import math
import re
import statistics
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from orchestrator.errors import UserError, WorkFailed
from orchestrator.experiments import Experiment
from trainer.config.regular import read_regular_text

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


# the settings each rank reads from its environment (trainer/launch/preflight.py::main): name, kind, bounds
SETTINGS = {"BERTCTL_PREFLIGHT_WINDOW": (float, 1e-3, 3600.0, "seconds per timing window"),
            "BERTCTL_PREFLIGHT_WINDOWS": (int, 1, 1000, "timing windows per figure"),
            "BERTCTL_PREFLIGHT_STEPS": (int, 1, 100_000, "training steps timed")}
ASCII_NUMBER = {float: re.compile(r"[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?"), int: re.compile(r"[0-9]+")}


def check_settings(environ) -> None:
    """The preflight settings in the environment, refused in one line before anything is submitted: a
    rank that got `nan` seconds per window would measure forever, and `0` steps would blame the machine."""
    for name, (kind, low, high, what) in SETTINGS.items():
        text = environ.get(name)
        if text is None:
            continue
        value = kind(text) if ASCII_NUMBER[kind].fullmatch(text.strip()) else None
        if value is None or not low <= value <= high:
            expected = "a whole number" if kind is int else "a number"
            raise UserError(f"must be {expected} of {what} from {low:g} to {high:g}, got {text[:40]!r}", where=name)


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
    broken: dict[str, str] = field(default_factory=dict)  # measures no rank measured sensibly: why
    strangers: list[str] = field(default_factory=list)  # reports of ranks the job does not have: why each is one

    @property
    def failed(self) -> bool:
        """A node is flagged, a measure failed everywhere, or a report is no rank's of the job: exit code 1."""
        return bool(self.flagged or self.broken or self.strangers)

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
                "nodes": [asdict(n) | {"flagged": n.flagged} for n in self.nodes], "time_to_train": self.time_to_train,
                "broken_measures": self.broken, "reports_of_no_rank": self.strangers}


# ---- gathering ---------------------------------------------------------------------------------

RANK_FILE = re.compile(r"rank_([0-9]{1,9})\.json")  # ASCII digits: "rank_٣.json" is no rank's file
MAX_RANK_FILE_BYTES = 16 << 20
# the rate units a rank may report, by what they count: (quantity, factor to that quantity's unit in CANONICAL); every
# figure is compared in its quantity's canonical unit (the trainer's own, trainer/launch/preflight_measures.py), so
# 0.5 GB/s is not taken for faster than 400 MB/s, and a node that reports KB/s is not judged by the digits
UNITS = {"B/s": ("bytes", 1e-9), "KB/s": ("bytes", 1e-6), "MB/s": ("bytes", 1e-3), "GB/s": ("bytes", 1.0),
         "TB/s": ("bytes", 1e3), "KiB/s": ("bytes", 2**10 / 1e9), "MiB/s": ("bytes", 2**20 / 1e9),
         "GiB/s": ("bytes", 2**30 / 1e9), "TiB/s": ("bytes", 2**40 / 1e9), "FLOP/s": ("flop", 1e-12),
         "GFLOP/s": ("flop", 1e-3), "TFLOP/s": ("flop", 1.0), "PFLOP/s": ("flop", 1e3), "samples/s": ("samples", 1.0)}
CANONICAL = {"bytes": "GB/s", "flop": "TFLOP/s", "samples": "samples/s"}
RATE_DETAILS = ("algbw",)  # a figure's other rates, in the figure's unit (the all-reduces' algorithm bandwidth)
# the figures' fields the prediction divides by or adds up (orchestrator/checks/predict.py::from_preflight);
# a list (each timed step) is checked element by element
PREDICTION_FIELDS = {"train_compute": ("compute_s", "first_batch_s", "first_step_s", "eval_s"),
                     "allreduce_world": ("algbw",), "train_step": ("step_s", "steps_s")}


def rank_reports(exp_dir: Path) -> dict[int, dict]:
    """Each rank's report by the rank its file is named after. A file that cannot be read as one (a
    FIFO, not JSON: a rank that died while writing it) is a report that says so (`unreadable`)."""
    reports, names = {}, {}
    for path in sorted((exp_dir / "preflight").glob("rank_*.json")):
        match = RANK_FILE.fullmatch(path.name)
        if match is None:
            continue
        rank = int(match.group(1))
        if rank in names:  # rank_01.json beside rank_1.json: which is the rank's own is no guess to make
            raise UserError(f"{names[rank]} and {path.name} both report rank {rank}: remove the one the rank did not "
                            f"write (a rank writes rank_{rank}.json)", where=str(exp_dir / "preflight"))
        names[rank] = path.name
        try:
            reports[rank] = json.loads(read_regular_text(path, limit=MAX_RANK_FILE_BYTES))
        except (OSError, ValueError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            reports[rank] = {"rank": rank, "unreadable": f"{path.name}: {str(e).splitlines()[0][:200]}"}
    return reports


def checked_reports(reports: dict[int, dict]) -> tuple[dict[int, dict], dict[str, str]]:
    """The reports with every figure checked (a finite, positive number with a unit bertctl knows) and in its
    quantity's canonical unit, and the measures no rank measured sensibly (measure: why), which are failures of
    the measure, not of any node. A figure that is wrong on some ranks only (or counts another quantity than
    most ranks' figures of that measure) is a failure of the measure on those ranks (an `errors` entry naming
    the file)."""
    checked = {rank: checked_report(rank, report) for rank, report in reports.items()}
    agree_on_units(checked)
    valid = {m for r in checked.values() for m in r["measures"]}
    broken: dict[str, str] = {}
    for report in checked.values():
        for measure, why in report.pop("invalid").items():
            if measure not in valid and measure != "report":
                broken.setdefault(measure, why)
                report["errors"].pop(measure, None)
    return checked, broken


def checked_report(rank: int, report) -> dict:
    name = f"rank_{rank}.json"
    if not isinstance(report, dict) or "unreadable" in report:
        why = report["unreadable"] if isinstance(report, dict) else f"{name}: not a JSON object"
        return {"rank": rank, "node": None, "done": False, "measures": {}, "errors": {"report": why},
                "invalid": {"report": why}}
    out = {"rank": rank, "node": report.get("node") if isinstance(report.get("node"), str) else None,
           "done": report.get("done") is True, "measures": {}, "errors": {}, "invalid": {}}
    if type(report.get("rank")) is not int or report["rank"] != rank:
        out["errors"]["report"] = f"{name}: its rank is {json.dumps(report.get('rank'))[:40]}, not {rank}"
    if out["node"] is None:
        out["errors"]["node"] = f"{name}: its node is {json.dumps(report.get('node'))[:40]}, not a name"
    errors = report.get("errors", {})
    if not isinstance(errors, dict):
        errors = {"report": f"{name}: errors is {json.dumps(errors)[:40]}, not an object"}
    for measure, error in errors.items():
        out["errors"][str(measure)[:80]] = str(error)[:500]
    measures = report.get("measures", {})
    if not isinstance(measures, dict):
        measures = {}
        out["errors"]["report"] = f"{name}: measures is not an object"
    for measure, figure in measures.items():
        why = figure_problem(measure, figure)
        if why is None:
            out["measures"][measure] = in_canonical_unit(figure)
        else:
            key = "allreduce_pair" if measure.startswith(PAIR_PREFIX) else measure
            out["errors"][key] = out["invalid"][key] = f"{name}: {measure} {why}"
    return out


def figure_problem(measure: str, figure) -> str | None:
    """What is wrong with one figure, or None."""
    if not isinstance(figure, dict):
        return f"is {json.dumps(figure)[:40]}, not a figure"
    if not isinstance(figure.get("unit"), str) or not figure["unit"]:
        return f"has no unit (unit is {json.dumps(figure.get('unit'))[:40]})"
    if figure["unit"] not in UNITS:
        return f"is in {figure['unit'][:40]!r}, no rate unit bertctl can compare ({', '.join(UNITS)})"
    for key in ("value", *PREDICTION_FIELDS.get(measure, ())):
        if key != "value" and key not in figure:
            continue
        value = figure.get(key)
        values = value if isinstance(value, list) and key == "steps_s" else [value]
        if not values or not all(positive_number(v) for v in values):
            return f"{key} is {json.dumps(value)[:40]}, not a finite positive number"
    return None


def in_canonical_unit(figure: dict) -> dict:
    """A checked figure (and its other rates) converted to its quantity's canonical unit: 500 MB/s is 0.5 GB/s."""
    quantity, factor = UNITS[figure["unit"]]
    converted = {**figure, "value": figure["value"] * factor, "unit": CANONICAL[quantity]}
    for key in RATE_DETAILS:
        if positive_number(figure.get(key)):
            converted[key] = figure[key] * factor
    return converted


def agree_on_units(checked: dict[int, dict]) -> None:
    """Within one measure every rank's figure must count the same quantity (bytes, FLOP or samples per second):
    a figure that counts another than most ranks' is a failure of that measure on its rank."""
    units: dict[str, list[str]] = {}
    for report in checked.values():
        for measure, figure in report["measures"].items():
            units.setdefault(measure, []).append(figure["unit"])
    for report in checked.values():
        for measure, figure in list(report["measures"].items()):
            usual = max(sorted(set(units[measure])), key=units[measure].count)
            if figure["unit"] != usual:
                key = "allreduce_pair" if measure.startswith(PAIR_PREFIX) else measure
                report["errors"][key] = report["invalid"][key] = (f"rank_{report['rank']}.json: {measure} counts "
                                                                  f"{figure['unit']}, the other ranks {usual}")
                del report["measures"][measure]


def positive_number(value) -> bool:
    return type(value) in (int, float) and math.isfinite(value) and 0 < value < 1e300


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
        seen = [reports[r]["node"] for r in range(k * per_node, (k + 1) * per_node) if r in reports and reports[r]["node"]]
        names.append(seen[0] if seen else allocated[k] if k < len(allocated) else f"node #{k} of the job")
    return names


# ---- judging -----------------------------------------------------------------------------------

def assess(exp_id: str, reports: dict[int, dict], world_size: int, per_node: int, threshold: float,
           allocated: list[str] = ()) -> Verdict:
    reports, strangers = the_jobs_ranks(reports, world_size)
    reports, broken = checked_reports(reports)
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
    return Verdict(exp_id, threshold, nodes, medians, broken=broken, strangers=strangers)


def the_jobs_ranks(reports: dict[int, dict], world_size: int) -> tuple[dict[int, dict], list[str]]:
    """The reports of the job's ranks, and why each other is none of theirs. Such a report is judged apart: its
    figures would join no node's, but its progress would make the job's own ranks look stopped mid-check."""
    ours = {rank: report for rank, report in reports.items() if rank < world_size}
    strangers = [f"rank_{rank}.json: rank {rank}, but the job has {world_size} rank(s), 0 to {world_size - 1}: written by "
                 "another job or by a job started with more ranks than the cluster file gives it"
                 for rank in sorted(set(reports) - set(ours))]
    return ours, strangers


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
    verdict.time_to_train = predicted_time(checked_reports(the_jobs_ranks(reports, world)[0])[0], config.run)
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
        prediction = predict.from_preflight(reports, run, predict.earlier_converged_samples(run)).as_json()
    except predict.NoPrediction as why:
        return {"error": str(why)}
    absurd = next((f"{key} is {value}" for key, value in prediction.items() if isinstance(value, (int, float))
                   and not isinstance(value, bool) and not (math.isfinite(value) and value >= 0)), None)
    return {"error": f"the figures predict nothing sensible ({absurd})"} if absurd else prediction


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
    try:
        out = scheduler.run_command(["scontrol", "show", "hostnames", info.node_list])
    except (OSError, subprocess.TimeoutExpired):
        return []
    return out.stdout.split() if out.returncode == 0 else []


def write_json(path: Path, data: dict) -> None:
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(strict_json(data))
    temporary.replace(path)


def strict_json(data) -> str:
    """JSON without NaN or Infinity (which are no JSON: other tools refuse the file): such a number,
    which a rank's file may hold, is written as null."""
    return json.dumps(finite(data), indent=2, sort_keys=True, allow_nan=False)


def finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


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
    for why in verdict.strangers:
        console.print(f"[red]report of no rank[/red] {why}", highlight=False, soft_wrap=True)
    for measure, why in verdict.broken.items():
        console.print(f"[red]measure failed[/red] {MEASURES.get(measure, measure)}: no rank measured it sensibly "
                      f"({why}): a failure of the measure, not of a node", highlight=False, soft_wrap=True)
    if verdict.time_to_train is not None:
        from orchestrator.checks import predict

        predict.print_prediction(verdict.time_to_train, console)
