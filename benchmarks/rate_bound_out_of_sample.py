"""The training-rate bound checked out of sample: every published BERT set against the bound bertctl would
have held it to when it was published, built from the earlier rounds only.

    python benchmarks/rate_bound_out_of_sample.py --repos GITDIR [GITDIR ...] [--out FILE]

bertctl holds a run's samples per second per accelerator to RATE_MARGIN (3) times the fastest published
result of the accelerator's class, or of any class where its class was never published
(orchestrator/results/identity.py::rate_findings). The bound comes from the published results themselves
(orchestrator/results/accepted.yaml's `rates`), so checking those results against it proves nothing: the
fastest set of a class is always within 3 times itself. Here each round's sets meet the bound of the rounds
before it, as a new result meets today's: a set whose class was published earlier is held to 3 times that
class's fastest; a set of a class new in its round, to 3 times the fastest of any class before it. A set
that republishes an earlier round's logs is left out (it is its first round's result). The rates are read
as the sweep reads them (published_logs_sweep.py::fastest_rate: samples to converge over the time to train,
per accelerator of the system description, the set's fastest run); only accepted.yaml's class patterns
are used, never its rates.

Only closed-division sets form the bound (every set is held to it): an open-division set may train another
model (v1.1 Google's tpu-v4-4096 set trains lingvo's much larger model for hours, at 1.2 samples/s per chip),
and a bound built on it would say nothing about BERT-large.

It prints every set's rate against its bound, the highest ratio, and how far a set's times must be divided
before the bound catches them (the `every time divided by 40` lie of tests/lies.py is one such).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from published_logs_sweep import LOG_PATH, SYSTEM_PATH, Blobs, fastest_rate, head_commit, listing, machine_line, round_ruleset

from orchestrator.errors import UserError
from orchestrator.results import compliance, resultset
from orchestrator.results.identity import RATE_MARGIN


@dataclass(frozen=True)
class SetRate:
    set_id: str
    rate: float  # samples/s per accelerator, the set's fastest run
    accelerator_class: str
    model: str
    division: str | None  # as the logs say it


def round_rates(git_dir: Path, ruleset: str, seen: set[str], tmp: Path) -> list[SetRate]:
    """The rate of every set the round publishes first (a set whose every log an earlier round holds is not)."""
    rows = listing(git_dir)
    systems = {(m["org"], m["system"]): blob for path, blob in rows if (m := SYSTEM_PATH.match(path))}
    by_set: dict[tuple[str, str], list[tuple[str, str]]] = defaultdict(list)
    for path, blob in rows:
        if m := LOG_PATH.match(path):
            by_set[(m["org"], m["system"])].append((m["name"], blob))
    blobs = Blobs(git_dir)
    out = []
    try:
        for (org, system), logs in sorted(by_set.items()):
            republished = all(blob in seen for _, blob in logs)
            seen.update(blob for _, blob in logs)
            if republished:
                continue
            set_id = f"v{ruleset.rsplit('.', 1)[0]}/{org}/{system}"
            rate = set_rate(blobs, org, system, logs, systems.get((org, system)), tmp / set_id.replace("/", "_"))
            if rate is not None:
                out.append(SetRate(set_id, *rate))
    finally:
        blobs.close()
    return out


def set_rate(blobs: Blobs, org: str, system: str, logs: list[tuple[str, str]], system_blob: str | None,
             root: Path) -> tuple[float, str, str, str | None] | None:
    """The set staged as ORG/results/SYSTEM/bert + ORG/systems/SYSTEM.json, and its fastest rate (None: no log in
    the clone, no system description, or no run that converged)."""
    bert = root / org / "results" / system / "bert"
    bert.mkdir(parents=True)
    written = 0
    for name, blob in logs:
        data = blobs.read(blob)
        if data is not None:
            (bert / name).write_bytes(data)
            written += 1
    system_json = blobs.read(system_blob) if system_blob else None
    if not written or system_json is None:
        return None
    (root / org / "systems").mkdir()
    (root / org / "systems" / f"{system}.json").write_bytes(system_json)
    try:
        rs = resultset.from_directory(bert)
    except UserError:
        return None
    rate = fastest_rate(rs)
    return None if rate is None else (*rate, rs.division)


def judged_lines(rounds: list[list[SetRate]]) -> list[str]:
    """Each round's sets against the bound of the rounds before it, then the summary."""
    fastest: dict[str, SetRate] = {}  # class -> its fastest set so far
    lines, ratios, unbounded = [], [], 0
    for rates in rounds:
        for r in sorted(rates, key=lambda r: -r.rate):
            ground = fastest.get(r.accelerator_class) or (max(fastest.values(), key=lambda f: f.rate) if fastest else None)
            if ground is None:
                unbounded += 1
                lines.append(f"{r.set_id} ({r.division}): {r.rate:,.1f} ({r.model}): no earlier round, no bound")
                continue
            kind = "its class" if ground.accelerator_class == r.accelerator_class else "any class (its class is new)"
            ratio = r.rate / ground.rate
            ratios.append((ratio, r, ground, kind))
            verdict = "within" if ratio <= RATE_MARGIN else "BEYOND"
            lines.append(f"{r.set_id} ({r.division}): {r.rate:,.1f} ({r.model}) = {ratio:.2f} x the fastest earlier of {kind} "
                         f"({ground.rate:,.1f}, {ground.set_id}): {verdict} {RATE_MARGIN:g} x")
        for r in rates:  # a round's closed sets become the ground of the next rounds only (see GROUND)
            if r.division == "closed" and (r.accelerator_class not in fastest or r.rate > fastest[r.accelerator_class].rate):
                fastest[r.accelerator_class] = r
    return summary(ratios, unbounded) + [""] + lines


def summary(ratios: list, unbounded: int) -> list[str]:
    beyond = [(ratio, r) for ratio, r, _, _ in ratios if ratio > RATE_MARGIN]
    lines = [f"{len(ratios)} sets held to the bound of the rounds before them ({unbounded} of the first round have "
             f"none): {len(ratios) - len(beyond)} within {RATE_MARGIN:g} x, {len(beyond)} beyond"
             + (": " + ", ".join(f"{r.set_id} ({ratio:.2f} x)" for ratio, r in beyond) if beyond else "")]
    for kind in ("its class", "any class (its class is new)"):
        some = [(ratio, r, ground) for ratio, r, ground, k in ratios if k == kind]
        if some:
            ratio, r, ground = max(some, key=lambda x: x[0])
            lines.append(f"by {kind}: {len(some)} sets; the highest ratio {ratio:.2f} ({r.set_id}, {r.rate:,.1f} against "
                         f"{ground.set_id}, {ground.rate:,.1f})")
    # a lie dividing every time by k multiplies the rate by k: caught once k x ratio > RATE_MARGIN
    caught_from = sorted(RATE_MARGIN / ratio for ratio, r, _, _ in ratios if r.division == "closed")
    if caught_from:
        lines.append(f"a closed set's times divided by k are caught on every closed set for k > {caught_from[-1]:.1f}, "
                     f"on half of them for k > {caught_from[len(caught_from) // 2]:.1f}, on a tenth of them (the nearest their "
                     f"bound) for k > {caught_from[len(caught_from) // 10]:.1f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repos", nargs="+", type=Path, required=True, help="clones of mlcommons/training_results_vX.Y")
    ap.add_argument("--out", type=Path, default=None, help="the record (default: print only)")
    args = ap.parse_args(argv)
    repos = sorted(((round_ruleset(g), g) for g in args.repos), key=lambda r: compliance._version_key(r[0]))
    seen: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="bertctl-rates-") as tmp:
        rounds = [round_rates(git_dir, ruleset, seen, Path(tmp)) for ruleset, git_dir in repos]
    lines = [f"# the rate bound out of sample: each round's BERT sets against the bound of the rounds before, "
             f"{dt.date.today().isoformat()}",
             f"# {machine_line()}",
             "# command: python benchmarks/rate_bound_out_of_sample.py --repos ...",
             "# clones: " + ", ".join(f"training_results_v{r.rsplit('.', 1)[0]}@{head_commit(g)}" for r, g in repos), ""]
    lines += judged_lines(rounds)
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
