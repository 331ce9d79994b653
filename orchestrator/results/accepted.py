"""What published, accepted MLPerf BERT results show that bertctl's own checks would otherwise fail
(orchestrator/results/accepted.yaml, measured by benchmarks/published_logs_sweep.py).

A check of bertctl's fails a log or a set; where an accepted result shows the same thing, the check says
it in a warning naming that round and set. `accepted_log` names the published logs (by content) whose
breaks cannot be told from a lie by their form; `fastest` gives the published rate per accelerator that
the rate bound is taken from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

DATA = Path(__file__).with_name("accepted.yaml")


@dataclass(frozen=True)
class AcceptedLog:
    log: str  # "v3.1 xFusion/G5500V7x8xL40S result_2.txt"
    rules: frozenset[str]  # the rules of bertctl's it breaks, by name

    def excuses(self, rule: str) -> bool:
        return rule in self.rules

    def warning(self, rule: str, why: str) -> str:
        """The failure's reason, said as a warning: this exact file was accepted with it."""
        return f"{why} [{rule}: a failure in any other log; accepted as published: {self.log}]"


@dataclass(frozen=True)
class FastestRate:
    accelerator_class: str
    pattern: str
    rate: float  # samples per second per accelerator
    set: str  # the published set that trained it: "v5.0 Dell/1xXE9712x4GB200"


@lru_cache(maxsize=1)
def _data() -> dict:
    return yaml.safe_load(DATA.read_text(encoding="utf-8"))


@lru_cache(maxsize=1)
def _accepted_logs() -> dict[str, AcceptedLog]:
    """{sha256: the log}: an entry names one log (`sha256`, `log`) or a set's logs (`set`, `files`)."""
    logs = {}
    for entry in _data()["logs"]:
        rules = frozenset(entry["rules"])
        if "files" in entry:
            logs.update({sha: AcceptedLog(f"{entry['set']} {name}", rules) for name, sha in entry["files"].items()})
        else:
            logs[entry["sha256"]] = AcceptedLog(entry["log"], rules)
    return logs


def accepted_log(sha256: str | None) -> AcceptedLog | None:
    """The published, accepted log with this content, if it is one that breaks a rule of bertctl's."""
    return _accepted_logs().get(sha256)


def rates() -> list[FastestRate]:
    return [FastestRate(r["class"], r["match"], float(r["rate"]), r["set"]) for r in _data()["rates"]]


def fastest(accelerator_model_name: str) -> FastestRate | None:
    """The fastest published rate of the accelerator's class, or None for a class never published."""
    for rate in rates():
        if re.search(rate.pattern, accelerator_model_name):
            return rate
    return None


def fastest_of_all() -> FastestRate:
    return max(rates(), key=lambda r: r.rate)
