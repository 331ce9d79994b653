"""A set of BERT result logs to judge, plot or package: an experiment's runs or a folder of result_*.txt.

Everything that makes the input unusable is found here and reported as one `UserError` line
(exit code 2): no logs, damaged JSON, logs that are not BERT's, runs missing. Logs that are
merely non-compliant are not bad input; the compliance checker judges them.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from orchestrator.errors import UserError
from orchestrator.results import resultlog
from orchestrator.results import summary as results
from orchestrator.results.summary import RunSummary

RESULT_GLOB = "result_*.txt"
BENCHMARK_DIR = "bert"


@dataclass
class ResultSet:
    label: str  # the experiment id, or the folder as given
    directory: Path  # the folder that holds the result_*.txt files
    files: list[Path]  # in run order
    summaries: list[RunSummary]
    experiment: object | None = None  # orchestrator.experiments.Experiment for our own runs
    run_config: dict | None = None  # the experiment's run.yaml
    cluster_config: dict | None = None  # the experiment's resolved cluster.yaml

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.files]

    @property
    def first_time_ms(self) -> float | None:
        times = [s.first_time_ms for s in self.summaries if s.first_time_ms]
        return min(times) if times else None

    @property
    def recorded_ruleset(self) -> str | None:
        return ((self.run_config or {}).get("mlperf") or {}).get("ruleset")

    @property
    def division(self) -> str | None:
        """What the logs say (the first submission_division of each); run.yaml if no log says it."""
        logged = [s.division for s in self.summaries if s.division]
        if logged:
            return max(set(logged), key=logged.count)
        return ((self.run_config or {}).get("mlperf") or {}).get("division")

    @property
    def uses_train_samples(self) -> bool:
        """Logs whose eval epoch_num is not a sample count (v1.x NVIDIA-derived): RCP reads train_samples."""
        converged = [s for s in self.summaries if s.converged and s.evals]
        return bool(converged) and not any(s.epoch_num_counts_samples for s in converged)

    def metrics_file(self, index: int) -> Path | None:
        """metrics/run_N.jsonl of the index-th log: the trainer writes it next to results/ (None if absent)."""
        run = _run_order(self.files[index])[0]
        root = self.experiment.path if self.experiment is not None else self.directory.parent
        path = root / "metrics" / f"run_{run}.jsonl"
        return path if path.is_file() else None

    def loss_curve(self, index: int) -> list[tuple[int, float]]:
        """(samples trained, mean training loss since the previous report) from the run's metrics file.

        A resumed run re-trains the updates after its last checkpoint and reports them again: the
        later report of an update wins. Damaged lines (a run killed mid-write) are skipped.
        """
        path = self.metrics_file(index)
        if path is None:
            return []
        by_update: dict[int, tuple[int, float]] = {}
        data, _ = resultlog.read_bounded(path, what="metrics file")
        for line in data.decode("utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
                # the window's mean (mlm_loss + nsp_loss) is smoother than the report's last step (loss)
                loss = float(record["mlm_loss"] + record["nsp_loss"] if "mlm_loss" in record else record["loss"])
                if math.isfinite(loss):
                    by_update[int(record["update"])] = (int(record["samples"]), loss)
            except (ValueError, KeyError, TypeError, OverflowError, RecursionError):
                continue
        return [by_update[u] for u in sorted(by_update)]

    def require_runs(self, count: int) -> None:
        if len(self.files) != count:
            where = f"experiment {self.label}" if self.experiment else str(self.directory)
            raise UserError(
                f"an MLPerf BERT result is {count} runs, found {len(self.files)} result log(s) "
                f"({', '.join(self.names[:12])}); --no-score checks the logs alone", where=where,
            )


def load(experiment: str | None, results_dir: str | None) -> ResultSet:
    """The set named on the command line: an experiment of ours, or --results DIR."""
    if bool(experiment) == bool(results_dir):
        raise UserError("name an experiment (EXP) or a folder of logs (--results DIR), exactly one of them",
                        where="arguments")
    if experiment:
        from orchestrator import experiments

        return from_experiment(experiments.find(experiment))
    return from_directory(Path(results_dir))


def load_many(experiments: list[str], results_dirs: list[str]) -> list[ResultSet]:
    """Every set named on the command line, experiments first (`bertctl plot EXP1 EXP2` overlays them)."""
    if not experiments and not results_dirs:
        raise UserError("name at least one experiment (EXP) or folder of logs (--results DIR)", where="arguments")
    from orchestrator import experiments as registry

    return [from_experiment(registry.find(e)) for e in experiments] + [from_directory(Path(d)) for d in results_dirs]


def from_experiment(exp) -> ResultSet:
    where = f"experiment {exp.id}"
    if exp.program != "train":
        raise UserError(f"ran the {exp.program}, not training: it has no MLPerf result logs", where=where)
    files = [exp.result_file(i) for i in range(exp.nexp)]
    missing = [f.name for f in files if not os.path.lexists(f)]  # a FIFO or a directory is named by its reader
    if missing:
        raise UserError(
            f"no result log for {len(missing)} of {exp.nexp} runs ({', '.join(missing[:5])}"
            f"{', ...' if len(missing) > 5 else ''} in {exp.path / 'results'}); still running? "
            f"see `bertctl status {exp.id}`", where=where,
        )
    return ResultSet(
        label=exp.id, directory=exp.path / "results", files=files, summaries=_summaries(files),
        experiment=exp, run_config=_read_yaml(exp.path / "run.yaml"),
        cluster_config=_read_yaml(exp.path / "cluster.yaml"),
    )


def from_run(exp, run: int) -> ResultSet:
    """One run of an experiment, its log read as `from_experiment` reads each (`bertctl export`'s model card)."""
    files = [exp.result_file(run)]
    if not os.path.lexists(files[0]):
        raise UserError(f"run {run} has no result log ({files[0]})", where=f"experiment {exp.id}")
    return ResultSet(
        label=f"{exp.id} run {run}", directory=exp.path / "results", files=files, summaries=_summaries(files),
        experiment=exp, run_config=_read_yaml(exp.path / "run.yaml"), cluster_config=_read_yaml(exp.path / "cluster.yaml"),
    )


def from_directory(path: Path) -> ResultSet:
    if not path.is_dir():
        raise UserError("not a directory (expected an MLPerf result tree or a folder of result_*.txt logs)",
                        where=str(path))
    # absolute: the official checker runs in a folder of its own
    folder = _log_folder(path.absolute())
    files = sorted(folder.glob(RESULT_GLOB), key=_run_order)
    return ResultSet(label=str(path), directory=folder, files=files, summaries=_summaries(files))


def _log_folder(path: Path) -> Path:
    """The one folder under `path` with result_*.txt files; in a submission tree, the `bert` one."""
    folders = sorted({f.parent for f in path.rglob(RESULT_GLOB) if f.is_file()})
    if not folders:
        raise UserError(
            "no result_*.txt logs here or below (expected ORG/results/SYSTEM/bert/result_*.txt "
            "or a folder of result_*.txt)", where=str(path),
        )
    bert = [f for f in folders if f.name == BENCHMARK_DIR]
    if len(folders) > 1 and len(bert) == 1:
        return bert[0]
    if len(folders) > 1:
        shown = ", ".join(str(f.relative_to(path)) for f in (bert or folders)[:4])
        raise UserError(f"holds {len(bert or folders)} sets of result logs ({shown}); pass one of them",
                        where=str(path))
    return folders[0]


def _summaries(files: list[Path]) -> list[RunSummary]:
    """Each log read and checked (orchestrator/results/resultlog.py). Lines that are no event, a file that is no
    log or not BERT's: bad input, one line. Events that break a rule: the run fails (`problem`)."""
    summaries = []
    for f in files:
        s = results.summarize(f)
        if s.damaged:
            line, why = s.damaged[0]
            raise UserError(f"damaged MLPerf log: line {line} is {why} ({len(s.damaged)} bad line(s))", where=str(f))
        if s.events == 0:
            raise UserError("not an MLPerf log: no :::MLLOG lines", where=str(f))
        if s.benchmark not in (None, BENCHMARK_DIR):
            raise UserError(f"logs submission_benchmark {s.benchmark!r}; bertctl judges BERT results only",
                            where=str(f))
        summaries.append(s)
    return summaries


def _run_order(path: Path) -> tuple[int, str]:
    m = re.search(r"result_(\d+)\.txt$", path.name)
    return (int(m.group(1)) if m else 1 << 30, path.name)


def _read_yaml(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise UserError(f"unreadable YAML: {e}".replace("\n", " "), where=str(path)) from None
    return data if isinstance(data, dict) else None
