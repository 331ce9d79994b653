"""Whole published MLPerf BERT result sets (tests/data/mlperf-sets), extracted for a test, and the official
checker run on their logs once per distinct content (a lie that edits two logs costs two checker runs)."""

from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
from pathlib import Path

from orchestrator.results import compliance, resultset, verdict

SETS = Path(__file__).parent / "data" / "mlperf-sets"
MANIFEST = json.loads((SETS / "sets.json").read_text())
_CHECKED: dict[tuple[str, str, bool], compliance.CheckResult] = {}


def extract(name: str, into: Path) -> Path:
    """`v5.0/Dell/1xXE9712x4GB200` unpacked as ORG/results/SYSTEM/bert + ORG/systems/SYSTEM.json under
    `into`; returns the bert folder."""
    round_, org, system = name.split("/")
    org_dir = into / round_ / org
    with tarfile.open(SETS / round_ / org / f"{system}.tar.gz") as tar:
        tar.extractall(org_dir, filter="data")
    return org_dir / "results" / system / "bert"


def copy_set(bert: Path, into: Path) -> Path:
    """A copy of the whole ORG tree holding `bert`, to tell a lie in; returns the copy's bert folder."""
    org_dir = bert.parents[2]
    shutil.copytree(org_dir, into / org_dir.name)
    return into / org_dir.name / bert.relative_to(org_dir)


def official(paths, ruleset: str, werror: bool = False) -> list[compliance.CheckResult]:
    """The real checker's verdict on each log, run once per content and ruleset."""
    keys = [(hashlib.sha256(Path(p).read_bytes()).hexdigest(), ruleset, werror) for p in paths]
    todo = [(key, p) for key, p in zip(keys, paths) if key not in _CHECKED]
    for (key, _), result in zip(todo, compliance.check_logs([p for _, p in todo], ruleset, werror)):
        _CHECKED[key] = result
    return [_CHECKED[key] for key in keys]


def judge(bert: Path, **kwargs) -> verdict.Report:
    return verdict.assess(resultset.from_directory(bert), check=official, summarizer=False, **kwargs)
