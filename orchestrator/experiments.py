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
import math
import os
import re
import secrets
import shutil
import tempfile
import time
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path

from orchestrator import resources
from orchestrator.errors import UserError
from trainer.config.regular import read_regular_text

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
    except (OSError, ValueError) as e:  # ValueError: a NUL in the path
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


def _path_error(error: Exception, path: Path, what: str) -> UserError:
    reason = getattr(error, "strerror", None) or str(error)
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


# Runs per experiment (`--nexp`, and what a record may hold). MLPerf BERT needs 10 (one result set);
# 1,000 is a hundred such sets and the largest array Slurm's default MaxArraySize (1001) accepts. Far
# beyond it the script's SEEDS array, the status table and a loop-mode allocation stop making sense,
# and `--nexp 100000000` spent minutes drawing seeds (a record's huge `nexp` hung `status`).
MAX_NEXP = 1000
MAX_RECORD_BYTES = 1 << 20  # a record is a few hundred bytes; a larger one is not ours
ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}\Z")  # what new_id makes (cluster names match NAME_RE)
JOB_ID_RE = re.compile(r"^[0-9]{1,18}(?:_[0-9]{1,9})?\Z")  # Slurm `JOB` or `JOB_TASK`; a local job is a pid


@dataclass(frozen=True)
class Damaged:
    """A registry entry whose record cannot be trusted: listed with its reason, never used."""

    id: str
    path: Path
    reason: str


def load_all() -> list[Experiment]:
    """Every readable experiment, oldest first; damaged entries are left out (see `load_registry`)."""
    return load_registry()[0]


def load_registry() -> tuple[list[Experiment], list[Damaged]]:
    """The registry's experiments (oldest first) and its damaged entries, each with its reason.

    One damaged record never hides the others: a record that is truncated, not JSON, of the wrong
    shape or with values no bertctl writes (a FIFO, a huge `nexp`, an id that is not its directory's)
    becomes a `Damaged` entry that `status` lists and every verb refuses by name."""
    folder = registry_dir()
    try:
        entries = sorted(folder.iterdir()) if folder.is_dir() else []
    except (OSError, ValueError) as e:  # a NUL in BERTCTL_HOME, a folder without permission
        raise UserError(f"cannot list the registry: {getattr(e, 'strerror', None) or e}", where=str(folder)) from None
    found, damaged = [], []
    for entry in entries:
        if entry.name.startswith("."):  # staging directories of a submit in progress
            continue
        try:
            found.append(read_entry(entry))
        except RecordDamaged as e:
            damaged.append(Damaged(_printable(entry.name), entry, str(e)))
        except NotAnExperiment:
            continue
    return sorted(found, key=lambda e: e.created), damaged


class RecordDamaged(Exception):
    """Why an entry's experiment.json cannot be used."""


class NotAnExperiment(Exception):
    """A registry entry without a record (a stray file, a directory being removed)."""


def read_entry(entry: Path) -> Experiment:
    record = entry / RECORD
    if not (entry.is_dir() and (record.exists() or record.is_symlink())):
        raise NotAnExperiment()
    if not ID_RE.match(entry.name):
        raise RecordDamaged("the directory name is not an experiment id")
    try:
        text = read_regular_text(record, limit=MAX_RECORD_BYTES, encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise RecordDamaged(f"{RECORD} cannot be read: {getattr(e, 'strerror', None) or e}") from None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise RecordDamaged(f"{RECORD} is not valid JSON ({str(e).splitlines()[0][:80]})") from None
    exp = experiment_from_record(data, entry.name)
    # the record's own path is where the experiment is, whatever `dir` claims (a moved home, a hand edit)
    real = entry.resolve()
    if Path(exp.dir).resolve() != real:
        exp = replace(exp, dir=str(real))
    return exp


FIELD_KINDS = {  # the JSON type of every field, as `asdict` writes it
    "id": str, "cluster": str, "cluster_source": str, "executor": str, "nexp": int, "seeds": "ints",
    "program": str, "overrides": "strs", "script": str, "created": float, "dir": str, "job_ids": "strs",
    "submitted": bool, "steps": "strs", "array": bool, "container": str, "history": "strs",
}


def experiment_from_record(data, name: str) -> Experiment:
    """An Experiment from a record's JSON, or RecordDamaged naming the first key that is wrong.

    Keys this bertctl does not know are ignored (a newer bertctl may have written them)."""
    if not isinstance(data, dict):
        raise RecordDamaged(f"{RECORD} holds {type(data).__name__}, not an object")
    required = {f.name for f in fields(Experiment) if f.default is MISSING and f.default_factory is MISSING}
    missing = sorted(required - set(data))
    if missing:
        raise RecordDamaged(f"{RECORD} lacks {', '.join(missing)}")
    values = {}
    for key, kind in FIELD_KINDS.items():
        if key in data:
            problem = _kind_problem(data[key], kind)
            if problem:
                raise RecordDamaged(f"{RECORD}: {key} {problem}")
            values[key] = data[key]
    exp = Experiment(**values)
    for key, broken, expected in (
        ("id", exp.id != name, f"is {_printable(exp.id)!r}, not its directory's name"),
        ("nexp", not 1 <= exp.nexp <= MAX_NEXP, f"must be 1..{MAX_NEXP}, got {exp.nexp}"),
        ("seeds", len(exp.seeds) != exp.nexp, f"must be one per run ({exp.nexp}), got {len(exp.seeds)}"),
        ("seeds", any(not 0 <= s < 2**63 for s in exp.seeds), "must be non-negative 64-bit integers"),
        ("executor", exp.executor not in ("slurm", "local"), "must be slurm or local"),
        ("program", exp.program not in ("train", "probe"), "must be train or probe"),
        ("script", exp.script not in ("job.sh", "job.sbatch"), "must be job.sh or job.sbatch"),
        ("steps", any(step not in ("prepare", "phase1") for step in exp.steps), "must be prepare or phase1"),
        ("container", exp.container not in ("none", "pyxis"), "must be none or pyxis"),
        ("created", not 0 <= exp.created < 1e11, "must be a time in seconds since 1970"),
        ("job_ids", len(exp.job_ids) not in (0, 1, exp.nexp), f"must be none, one, or one per run ({exp.nexp})"),
        ("job_ids", any(not JOB_ID_RE.match(j) for j in exp.job_ids + exp.history), "must be job ids (digits)"),
    ):
        if broken:
            raise RecordDamaged(f"{RECORD}: {key} {expected}")
    return exp


def _kind_problem(value, kind) -> str | None:
    if kind == "ints":
        ok = isinstance(value, list) and all(type(v) is int for v in value)
        return None if ok else "must be a list of integers"
    if kind == "strs":
        ok = isinstance(value, list) and all(isinstance(v, str) and _encodable(v) for v in value)
        return None if ok else "must be a list of strings"
    if kind is float:
        ok = type(value) in (int, float) and math.isfinite(value)
        return None if ok else "must be a finite number"
    if kind is str and not (isinstance(value, str) and _encodable(value)):
        return "must be a string"
    if kind in (int, bool) and type(value) is not kind:
        return f"must be {'an integer' if kind is int else 'true or false'}"
    return None


def _encodable(text: str) -> bool:
    """json.loads turns a `\\ud800` escape into a lone surrogate, which no stream can print."""
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def _printable(text: str, width: int = 80) -> str:
    """A name or value as one short printable line (for listings and messages)."""
    line = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    line = line.encode("utf-8", "backslashreplace").decode("utf-8")
    return line if len(line) <= width else line[: width - 3] + "..."


def find(ref: str) -> Experiment:
    """An experiment by id, by a prefix of exactly one id, or `last` for the newest.

    An empty or blank reference is refused (a script's unset "$EXP" must not name every experiment),
    and so is one that could not be an id: it is only ever compared with the registry's ids, never
    made into a path."""
    check_reference(ref)
    everything, damaged = load_registry()
    if not everything and not damaged:
        raise UserError(f"no experiments in {registry_dir()} (bertctl submit creates them)", where=ref)
    if ref == "last":
        if not everything:
            raise UserError(f"no readable experiments in {registry_dir()} (bertctl status lists the damaged)", where=ref)
        return everything[-1]
    ids = [e.id for e in everything] + [d.id for d in damaged]
    matches = [i for i in ids if i == ref] or [i for i in ids if i.startswith(ref)]
    if len(matches) > 1:
        raise UserError(f"ambiguous: {len(matches)} experiments start with it ({', '.join(matches[:4])}, ...)", where=ref)
    if not matches:
        known = ", ".join(e.id for e in everything[-5:]) or "none readable"
        raise UserError(f"no such experiment (newest: {known})", where=ref)
    for d in damaged:
        if d.id == matches[0]:
            raise UserError(f"damaged experiment record: {d.reason}", where=d.id)
    return next(e for e in everything if e.id == matches[0])


def check_reference(ref: str) -> None:
    """Refuse a reference that is empty, blank, or has characters no experiment id has."""
    if not ref or not ref.strip():
        raise UserError("an empty experiment reference names no experiment (give an id, a prefix of one, or `last`)",
                        where="experiment")
    if ref != "last" and not ID_RE.match(ref):
        raise UserError("not an experiment id: ids are letters, digits, '_', '.' and '-' "
                        "(at most 200), starting with a letter or digit", where=_printable(ref))


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
