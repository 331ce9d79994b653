"""The experiment registry: one directory per `bertctl submit`, with every write atomic.

An experiment directory holds what was submitted and what the job writes:

    experiment.json   id, cluster, executor, nexp, seeds, job ids, paths (this module)
    cluster.yaml      the resolved cluster configuration, overrides applied
    run.yaml          the run configuration every rank reads (the script also writes it)
    job.sbatch        the rendered script, exactly as submitted (job.sh for the local executor)
    results/result_N.txt, logs/run_N.log, runs/N.exit, checkpoints/   (written by the job)

The registry is `$BERTCTL_HOME/experiments/`. A cluster with `experiments_dir` (a shared filesystem)
keeps its experiments there, with a symlink in the registry.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from orchestrator import resources
from orchestrator.errors import UserError

RECORD = "experiment.json"


@dataclass(frozen=True)
class Experiment:
    id: str
    cluster: str
    cluster_source: str
    executor: str  # slurm | local
    nexp: int
    seeds: list[int]
    program: str  # train | probe
    overrides: list[str]
    script: str  # file name of the rendered script inside the directory
    created: float
    dir: str
    job_ids: list[str] = field(default_factory=list)  # one per run for arrays, else one
    submitted: bool = False
    steps: list[str] = field(default_factory=list)  # preparatory steps before the runs: prepare, phase1
    array: bool = False  # Slurm: one array element per run (job_ids are `JOB_i`)
    container: str = "none"  # the cluster's container kind (the job's Python follows from it)
    history: list[str] = field(default_factory=list)  # every job id this experiment ever had, resumes included

    @property
    def path(self) -> Path:
        return Path(self.dir)

    def result_file(self, run: int) -> Path:
        return self.path / "results" / f"result_{run}.txt"

    def log_file(self, run: int) -> Path:
        return self.path / "logs" / f"run_{run}.log"

    def exit_file(self, run: int) -> Path:
        return self.path / "runs" / f"{run}.exit"


def registry_dir() -> Path:
    return resources.bertctl_home() / "experiments"


def new_id(cluster: str) -> str:
    """cluster-date-time-random: sortable by time, and 32 random bits keep concurrent submits apart."""
    return f"{cluster}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(4)}"


def create(exp: Experiment, files: dict[str, str], home: Path | None = None) -> Experiment:
    """Give the experiment a fresh id and write its directory, all or nothing.

    The id is claimed by creating its (empty) directory, which fails if another submit took it; the
    files are written into a staging directory that then replaces the claimed one in one rename;
    the registry's link comes last. Any failure removes what was made and, for a file-system error
    on the user's path, becomes one UserError naming the path.
    """
    parent = Path(home) if home else registry_dir()
    try:
        parent.mkdir(parents=True, exist_ok=True)
        final = _claim(parent, exp.cluster)
    except OSError as e:
        raise _path_error(e, parent, "experiments_dir" if home else "BERTCTL_HOME") from None
    exp = replace(exp, id=final.name, dir=str(final))
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{exp.id}.", dir=parent))
        try:
            for name, text in files.items():
                (staging / name).write_text(text, encoding="utf-8")
            _write_json(staging / RECORD, asdict(exp))
            os.rename(staging, final)  # replaces the empty claimed directory atomically
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        if home:  # keep the registry the one place to look
            link = registry_dir() / exp.id
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(final, target_is_directory=True)
    except BaseException as e:
        shutil.rmtree(final, ignore_errors=True)
        if isinstance(e, OSError):
            raise _path_error(e, Path(e.filename) if e.filename else parent, "experiment") from None
        raise
    return exp


def _claim(parent: Path, cluster: str) -> Path:
    for _ in range(100):
        candidate = parent / new_id(cluster)
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise FileExistsError(f"no free experiment id in {parent}")


def _path_error(error: OSError, path: Path, what: str) -> UserError:
    reason = error.strerror or str(error)
    return UserError(f"cannot write the {what} directory: {reason}", where=str(path))


def save(exp: Experiment) -> None:
    try:
        _write_json(exp.path / RECORD, asdict(exp))
    except OSError as e:
        raise _path_error(e, exp.path, "experiment") from None


def remove(exp: Experiment) -> None:
    """Forget an experiment that never reached the scheduler."""
    link = registry_dir() / exp.id
    if link.is_symlink():
        link.unlink()
    shutil.rmtree(exp.path, ignore_errors=True)


def load_all() -> list[Experiment]:
    folder = registry_dir()
    if not folder.is_dir():
        return []
    found = []
    for entry in sorted(folder.iterdir()):
        record = entry / RECORD
        if not entry.name.startswith(".") and record.is_file():
            found.append(_read(record))
    return sorted(found, key=lambda e: e.created)


def find(ref: str) -> Experiment:
    """An experiment by id, by unique prefix, or `last` for the newest."""
    everything = load_all()
    if not everything:
        raise UserError(f"no experiments in {registry_dir()} (bertctl submit creates them)", where=ref)
    if ref == "last":
        return everything[-1]
    exact = [e for e in everything if e.id == ref]
    matches = exact or [e for e in everything if e.id.startswith(ref)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        known = ", ".join(e.id for e in everything[-5:])
        raise UserError(f"no such experiment (newest: {known})", where=ref)
    raise UserError(f"ambiguous: {len(matches)} experiments start with it ({', '.join(e.id for e in matches[:4])}, ...)", where=ref)


def _read(path: Path) -> Experiment:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Experiment(**data)
    except (OSError, ValueError, TypeError) as e:
        raise UserError(f"unreadable experiment record: {e}", where=str(path)) from None


def _write_json(path: Path, data: dict) -> None:
    """Write to a temporary file in the same directory, fsync, then rename over the old one."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
