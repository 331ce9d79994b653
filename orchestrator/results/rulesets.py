"""Rulesets in time: a past round's logs judged by its rules as they stood when its results were published.

mlperf-logging keeps one rule tree per round and still edits old ones: 1.1.0's weights_initialization
check became a failure months after v1.1 was published (a warning before), and 2.1.0's LAMB epsilon key
was renamed a fortnight after v2.1 was. Today's checker therefore fails every accepted v1.1 and v2.1
log. orchestrator/results/ruleset_changes.yaml lists, per ruleset, the changes made after its round's
publication (from the mlperf-logging history, with the date, the commit and the first release). For a
log the installed checker fails, `as_it_stood` takes each message a listed change explains and judges
it by the rule as it was; the log passes only if every message is so explained and the old rule held,
and the verdict says which change it rests on. `history` says, for every verdict of such a ruleset,
which rules changed since.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from orchestrator.results.compliance import ROUND_PUBLISHED, CheckResult

DATA = Path(__file__).with_name("ruleset_changes.yaml")
# The checker's only warning (put_warning): a key required once, logged several times with one value.
# With --werror the same words are a failure.
REPEATED_KEY = re.compile(r"Required EXACTLY_ONE occurrence of '[^']+' but found ([2-9]|\d{2,})\Z")


@dataclass(frozen=True)
class RuleChange:
    ruleset: str
    date: dt.date
    commit: str
    release: str  # the first mlperf-logging release tag that holds it
    rule: str
    what: str
    messages: tuple[str, ...]  # how today's checker's messages caused by it begin
    before: str | dict  # "warning", or {"exactly_one": KEY}

    def named(self) -> str:
        return f"{self.rule} ({self.date.isoformat()}, mlperf-logging {self.release}, commit {self.commit})"

    def explains(self, message: str) -> bool:
        return any(message.startswith(m) for m in self.messages)

    def held(self, values: dict[str, list]) -> str | None:
        """None if the log kept the rule as it was before the change, else what it broke."""
        if self.before == "warning":
            return None
        key = self.before["exactly_one"]
        logged = values.get(key, [])
        if len(logged) == 1 or (logged and all(v == logged[0] for v in logged)):
            return None
        return f"the rule before it asked for exactly one {key}, the log has {len(logged)}"


@lru_cache(maxsize=1)
def _changes() -> dict[str, tuple[RuleChange, ...]]:
    data = yaml.safe_load(DATA.read_text(encoding="utf-8"))
    return {ruleset: tuple(RuleChange(ruleset, c["date"], c["commit"], c["release"], c["rule"], " ".join(c["what"].split()),
                                      tuple(c["messages"]), c["before"]) for c in changes)
            for ruleset, changes in data.items()}


def changes_since_publication(ruleset: str) -> tuple[RuleChange, ...]:
    return _changes().get(ruleset, ())


def published(ruleset: str) -> dt.date | None:
    return ROUND_PUBLISHED.get(ruleset)


def history(ruleset: str) -> str | None:
    """One line for a report: which rules of this ruleset changed after its round was published."""
    changes = changes_since_publication(ruleset)
    if not changes:
        return None
    return (f"ruleset {ruleset} is judged as it stood when its round was published ({published(ruleset)}); "
            f"mlperf-logging changed since: {'; '.join(c.named() for c in changes)}")


def as_it_stood(check: CheckResult, values: dict[str, list], werror: bool = False) -> CheckResult:
    """The checker's verdict on one log by its ruleset as it stood at publication (see the module)."""
    changes = changes_since_publication(check.ruleset)
    if check.compliant or check.crashed or not changes:
        return check
    failures = [m for m in check.messages if werror or not REPEATED_KEY.match(m)]
    reasons = []
    for message in failures:
        # the latest change that explains it: the one that made today's rule
        change = next((c for c in sorted(changes, key=lambda c: c.date, reverse=True) if c.explains(message)), None)
        broken = change.held(values) if change else "no change explains it"
        if broken:
            return check
        reasons.append(change)
    if not reasons:
        return check
    named = "; ".join(dict.fromkeys(c.named() for c in reasons))
    note = (f"compliant by ruleset {check.ruleset} as it stood when its round was published ({published(check.ruleset)}); "
            f"today's checker fails it on a rule changed since: {named}")
    return dataclasses.replace(check, compliant=True, as_it_stood=note)
