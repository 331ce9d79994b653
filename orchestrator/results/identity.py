"""bertctl's checks on what a run and a set claim to be, beyond one log's events (resultlog.py).

Per run (`run_findings`):
- counted accuracy: MLPerf's 10,000-sample evaluation set has 428,235 masked tokens, and most
  implementations log each accuracy as correct tokens / 428,235 (to float32): 275 of the 337 published
  sets do so at every evaluation. Where most of a log's evaluations are such fractions, one that is not
  was not counted: it was typed in.
- samples per step: where tracked_stats gives a step with a sample count, the samples are the steps
  times the global batch (or the global batch over the gradient accumulation, for implementations that
  count micro-batches), within what packing varies.
- the training rate per accelerator (`rate_findings`): samples to converge over the time to train, per
  accelerator of the system description, stays under RATE_MARGIN times the fastest published result of
  the accelerator's class (orchestrator/results/accepted.yaml); without a description, the whole run
  stays under resultlog.MAX_SAMPLES_PER_S, and the report says which bound it used. A submission tree
  without a readable one fails as the package checker fails it (`description_problem`).

Per set (`set_findings`): one system (platform, organisation, division), one recipe (every
hyperparameter but the seed), no copies (two runs whose evaluation accuracies agree at every evaluation
they share, at the coarser of their logged decimal places, are one run), one accuracy format (counted
tokens in every run or in at most half of them). And `seeds`, the package checker's seed check: a seed
in every run.

Each is a failure unless a published, accepted result shows it: then a warning naming that round and
set (accepted.py). None of these is checked by the official tools.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.results import accepted, resultlog

# The masked tokens of MLPerf BERT's evaluation set (10,000 samples, at most 76 masked positions each):
# every accuracy of 275 published sets of v0.7 to v5.0 is a whole number of them over this
EVAL_MASKED_TOKENS = 428_235
# accuracy x 428,235 is within this of a whole number when it is one: half a float32 step below 1.0
# (2^-25) times 428,235 is 0.013, and Intel-HabanaLabs' logs, rounded a few times, are off by up to 0.024
COUNT_TOLERANCE = 0.03
# A log is counted when at least three quarters of its evaluations (and three) are whole counts: by chance
# a value is one 6 % of the time, and no published log that does not count has more than 40 % of them
COUNTED_SHARE = 0.75
COUNTED_MIN = 3
COUNTED_ACCURACY = "counted accuracy"
# samples / (step x global batch): 0.944 to 1.001 in every published log that gives both (packing varies
# the sequences per step; the last step is partial)
SAMPLES_PER_STEP = (0.9, 1.01)
SAMPLES_PER_STEP_RULE = "samples per step"
# The fastest published result per accelerator of a class rose at most 2.2 times from one round to the
# next (A100 from v0.7 to v1.0): three times the fastest is more than any software gain seen. Checked out of
# sample (benchmarks/rate_bound_out_of_sample.py): every set of v1.0 to v5.0 stays within three times the
# fastest closed set of the rounds before it (2.15 at most; 2.55 for a class new in its round)
RATE_MARGIN = 3.0
MAX_ACCELERATORS = 1_000_000  # nodes, or accelerators per node, a description may claim (the largest set: 4,320 GPUs)
# Runs sharing this many evaluations, all equal to the logged digits and not all one value, are one run
COPY_MIN_EVALS = 2
COPY_RULE = "one run counted twice"
# The NVIDIA reference's default platform: a run that kept it names no system (v1.1 Lenovo's accepted
# SR670v2_8xA100-PCIe-80GB-300W set logs it in 5 of 10 runs, with the reference's org, NVIDIA)
PLACEHOLDER_PLATFORM = "SUBMISSION_PLATFORM_PLACEHOLDER"
PLACEHOLDER_SET = "v1.1 Lenovo/SR670v2_8xA100-PCIe-80GB-300W"
# Hyperparameters published, accepted sets vary between runs: the per-device batch, with the global batch
# fixed (v2.1 Intel/8-nodes-SPR-pytorch: 64 in nine runs, 32 in one)
VARYING_ACCEPTED = {"d_batch_size": "v2.1 Intel/8-nodes-SPR-pytorch"}
# Not hyperparameters: the seed, what the system says about itself (checked as one system), and values
# of no recipe (the time a run ended, the file it read)
NOT_RECIPE = {"seed", "submission_org", "submission_platform", "submission_division", "submission_status",
              "submission_benchmark", "submission_poc_name", "submission_poc_email", "run_final", ""}
SEED_CHECK_RULESETS = ("1.0.0", "1.1.0", "2.0.0", "2.1.0", "3.0.0", "3.1.0", "4.0.0", "4.1.0", "5.0.0")
# The seed check asks every run for a seed since this change ("Check seeds are always logged"); the rounds
# published after it always had it
SEEDS_REQUIRED_SINCE = "2024-09-13, mlperf-logging 4.1.0-rc4, commit ac0096ca830b"
SEEDS_ALWAYS_REQUIRED = ("4.1.0", "5.0.0")


@dataclass
class Findings:
    """What bertctl's checks say about runs (by file name) and about the set."""

    failures: dict[str, list[str]] = field(default_factory=dict)
    warnings: dict[str, list[str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # the set fails
    set_warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def fail(self, run: str, why: str) -> None:
        self.failures.setdefault(run, []).append(why)

    def warn(self, run: str, why: str) -> None:
        self.warnings.setdefault(run, []).append(why)

    def excusable(self, run: str, s, rule: str, why: str) -> None:
        """A failure, or a warning naming the published log accepted with this break."""
        known = accepted.accepted_log(s.sha256)
        if known and known.excuses(rule):
            self.warn(run, known.warning(rule, why))
        else:
            self.fail(run, why)

    def merge(self, other: "Findings") -> "Findings":
        for run, whys in other.failures.items():
            self.failures.setdefault(run, []).extend(whys)
        for run, whys in other.warnings.items():
            self.warnings.setdefault(run, []).extend(whys)
        self.problems += other.problems
        self.set_warnings += other.set_warnings
        self.notes += other.notes
        return self


def name(s) -> str:
    return Path(s.file).name


def whole(s) -> bool:
    """A log that passed resultlog's rules and holds a whole run: the ones these checks read."""
    return not s.problem and not s.incomplete


# ---- one run


def run_findings(summaries: list) -> Findings:
    found = Findings()
    for s in summaries:
        if whole(s):
            counted_accuracy(s, found)
            samples_per_step(s, found)
    return found


def _counted(s) -> tuple[list[tuple[int, float]], list[bool]]:
    """The log's evaluations after the first samples (line, accuracy), and which are counts of correct tokens."""
    evals = [(line, acc) for line, (samples, acc) in zip(s.eval_lines, s.evals) if samples]
    return evals, [abs(acc * EVAL_MASKED_TOKENS - round(acc * EVAL_MASKED_TOKENS)) < COUNT_TOLERANCE for _, acc in evals]


def counts_tokens(s) -> bool | None:
    """Does the log write its accuracies as counts of correct tokens over 428,235 (most of them)? None for a
    log of fewer than COUNTED_MIN evaluations."""
    evals, counted = _counted(s)
    if len(evals) < COUNTED_MIN:
        return None
    return sum(counted) >= max(COUNTED_MIN, COUNTED_SHARE * len(evals))


def counted_accuracy(s, found: Findings) -> None:
    evals, counted = _counted(s)
    if not counts_tokens(s) or all(counted):
        return
    typed = [(line, acc) for (line, acc), c in zip(evals, counted) if not c]
    shown = ", ".join(f"{acc!r} (line {line})" for line, acc in typed[:3])
    found.excusable(name(s), s, COUNTED_ACCURACY,
                    f"eval_accuracy {shown}: not a count of correct tokens over the evaluation set's "
                    f"{EVAL_MASKED_TOKENS:,} masked tokens, as the log's other {sum(counted)} of {len(evals)} are: "
                    "not computed by the evaluation")


def samples_per_step(s, found: Findings) -> None:
    gbs = s.global_batch_size
    accumulation = _number(s.values.get("gradient_accumulation_steps", [None])[0]) or 1
    if not gbs or not s.steps:
        return
    low, high = SAMPLES_PER_STEP
    for line, step, samples in s.steps:
        if step <= 0:
            continue
        ratios = [samples / (step * gbs), samples * accumulation / (step * gbs)]
        if not any(low <= r <= high for r in ratios):
            found.excusable(name(s), s, SAMPLES_PER_STEP_RULE,
                            f"tracked_stats on line {line}: {samples:,.0f} samples at step {step:,.0f} of global batch "
                            f"{gbs:,} is {ratios[0]:.3f} batches per step, not 1 (published logs: 0.944 to 1.001)")
            return


def rate_findings(summaries: list, system: dict | None, where: str | None) -> Findings:
    """The training rate per accelerator against the fastest published result of the accelerator's class."""
    found = Findings()
    accelerators, model = _accelerators(system)
    if not accelerators:
        why = f"{where} describes no accelerators" if system is not None else f"no system description ({where})"
        found.notes.append(f"rate bound: {why}, so each run's whole rate is held to "
                           f"{resultlog.MAX_SAMPLES_PER_S:,} samples/s (13 times the fastest published BERT run)")
        return found
    fastest = accepted.fastest(model)
    if fastest is None:
        fastest = accepted.fastest_of_all()
        found.notes.append(f"rate bound: no published BERT result has a {model}; the bound is {RATE_MARGIN:g} x the "
                           f"fastest of any accelerator ({fastest.accelerator_class}, {fastest.rate:,.0f} samples/s per "
                           f"accelerator, {fastest.set})")
    else:
        found.notes.append(f"rate bound: {RATE_MARGIN:g} x the fastest published {fastest.accelerator_class} result "
                           f"({fastest.rate:,.0f} samples/s per accelerator, {fastest.set}), for {accelerators} x {model} "
                           f"({where})")
    bound = RATE_MARGIN * fastest.rate
    for s in summaries:
        samples, minutes = s.samples_to_converge, s.minutes
        if not (whole(s) and samples and minutes and minutes > 0):
            continue
        rate = samples / (minutes * 60.0) / accelerators
        if rate > bound:
            found.fail(name(s), f"{samples:,} samples in {minutes * 60:,.1f} s on {accelerators} x {model} is {rate:,.0f} "
                                f"samples/s per accelerator: more than {RATE_MARGIN:g} x the fastest published "
                                f"{fastest.accelerator_class} result ({fastest.rate:,.0f}, {fastest.set})")
    return found


def _accelerators(system: dict | None) -> tuple[int, str]:
    if not system:
        return 0, ""
    nodes, per_node = _number(system.get("number_of_nodes")), _number(system.get("accelerators_per_node"))
    model = str(system.get("accelerator_model_name") or "")[:200]
    if not (nodes and per_node and model and 1 <= nodes <= MAX_ACCELERATORS and 1 <= per_node <= MAX_ACCELERATORS):
        return 0, model
    return int(nodes) * int(per_node), model


def _number(value) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number == number and abs(number) != float("inf") else None


# ---- the set


def set_findings(summaries: list) -> Findings:
    found = Findings()
    runs = [s for s in summaries if whole(s)]
    one_system(runs, found)
    one_recipe(runs, found)
    copies(runs, found)
    one_accuracy_format(runs, found)
    return found


def package_division(logged: str | None, system: dict | None) -> str | None:
    """The division the package checker judges a set by (its seed and RCP checks): the system
    description's, where there is one; else what the logs say."""
    described = (system or {}).get("division")
    return described if described in ("closed", "open") else logged


def division_findings(logged: str | None, system: dict | None, where: str) -> Findings:
    """The logs and the system description name one division. Logs that say closed in an open submission
    claim less than they are judged by (warned); logs that say open in a closed one would escape the
    closed target the checker applies by the log's word (failed)."""
    found = Findings()
    described = (system or {}).get("division")
    if described not in ("closed", "open") or logged in (None, described):
        return found
    why = f"the logs say {logged}, {where} says {described}: the package checker judges the set as {described}"
    if described == "open":
        found.set_warnings.append(f"{why}; the logs' closed rules are checked too (accepted so: v2.1 "
                                  "Intel/16-nodes-SPR-pytorch-open)")
    else:
        found.problems.append(f"{why}, but the official checker holds each log to the {logged} division's rules "
                              "(no target accuracy in the open division)")
    return found


def one_system(runs: list, found: Findings) -> None:
    placeholder = [s for s in runs if PLACEHOLDER_PLATFORM in (s.platform or "")]
    named = [s for s in runs if s not in placeholder]
    if placeholder and named:
        found.set_warnings.append(
            f"{', '.join(name(s) for s in placeholder)} log the reference implementation's placeholder platform "
            f"({placeholder[0].platform}, org {placeholder[0].org}): no system named; accepted so in {PLACEHOLDER_SET}")
    for what, value in (("platform", lambda s: s.platform), ("organisation", lambda s: s.org),
                        ("division", lambda s: s.division)):
        pool = named if what != "division" else runs
        seen = _by_value(pool, value)
        if len(seen) > 1:
            found.problems.append(f"the runs name {len(seen)} {what}s ({_shown(seen)}): one set is one system's "
                                  "runs")


def one_recipe(runs: list, found: Findings) -> None:
    keys = sorted({k for s in runs for k in s.values} - NOT_RECIPE)
    for key in keys:  # among the runs that log it: a key left out is the official checker's to judge
        seen = _by_value([s for s in runs if key in s.values],
                         lambda s, key=key: json.dumps(sorted({json.dumps(v, sort_keys=True) for v in s.values[key]})))
        if len(seen) <= 1:
            continue
        shown = {", ".join(json.loads(v)): files for v, files in seen.items()}
        why = f"the runs log {len(seen)} values of {key} ({_shown(shown)}): a set's runs share every hyperparameter but the seed"
        if key in VARYING_ACCEPTED:
            found.set_warnings.append(f"{why}; accepted so in {VARYING_ACCEPTED[key]}")
        else:
            found.problems.append(why)


def one_accuracy_format(runs: list, found: Findings) -> None:
    """One implementation logs one accuracy format: where most runs' accuracies are counts of correct tokens
    over the 428,235 masked tokens, every run's are (a run of another format was not evaluated as they were,
    or was rewritten: a copy rounded, say)."""
    counting = {name(s): counts_tokens(s) for s in runs}
    counted = [run for run, c in counting.items() if c]
    other = [run for run, c in counting.items() if c is False]
    if other and len(counted) > len(counted + other) / 2:
        found.problems.append(f"{', '.join(other[:4])}{', ...' if len(other) > 4 else ''} log accuracies that are not "
                              f"counts of correct tokens over the evaluation set's {EVAL_MASKED_TOKENS:,} masked tokens, as "
                              f"the other {len(counted)} runs' are: one implementation logs one accuracy format")


def decimals(accuracy: float) -> int:
    """The decimal places a logged accuracy has (its shortest text that reads back as the same number)."""
    digits, _, exponent = repr(accuracy).partition("e")
    return max(0, len(digits.partition(".")[2].rstrip("0")) - int(exponent or 0))


def _shared_evaluations(a, b) -> list[tuple[float, float]]:
    """Both runs' accuracies at the evaluations both logged: at the same epoch_num (samples trained) where
    each log gives a distinct one at every evaluation and they share two or more, else in order."""
    by_a, by_b = dict(a.evals), dict(b.evals)
    if len(by_a) == len(a.evals) and len(by_b) == len(b.evals) and 0 not in by_a and 0 not in by_b:
        common = sorted(set(by_a) & set(by_b))
        if len(common) >= COPY_MIN_EVALS:
            return [(by_a[n], by_b[n]) for n in common]
    return [(x, y) for (_, x), (_, y) in zip(a.evals, b.evals)]


def copies(runs: list, found: Findings) -> None:
    """Two runs whose accuracies agree at every evaluation they share, to the coarser of their logged decimal
    places (two or more, not all one value), are one run: a copy, truncated or rounded to hide it."""
    places = [max((decimals(acc) for _, acc in s.evals), default=0) for s in runs]
    for i, a in enumerate(runs):
        for j in range(i + 1, len(runs)):
            b, digits = runs[j], min(places[i], places[j])
            shared = _shared_evaluations(a, b)
            if (len(shared) < COPY_MIN_EVALS or any(round(x, digits) != round(y, digits) for x, y in shared)
                    or len({round(x, digits) for x, _ in shared}) == 1):
                continue
            rounded = f" to {digits} decimal places" if digits < max(places[i], places[j]) else ""
            why = (f"{name(b)} and {name(a)} log the same {len(shared)} evaluation accuracies{rounded} ({shared[0][0]!r}, ..., "
                   f"{shared[-1][0]!r}): one run counted twice, not two runs")
            known = [accepted.accepted_log(s.sha256) for s in (a, b)]
            if all(k and k.excuses(COPY_RULE) for k in known):
                found.set_warnings.append(known[0].warning(COPY_RULE, why))
            else:
                found.problems.append(why)


def seeds(summaries: list, ruleset: str, division: str | None, found: Findings) -> None:
    """The package checker's seed check: every run of a closed set (rulesets 1.0.0 on) logs a seed. Until
    mlperf-logging 4.1.0-rc4 a set in which no run logged one passed it; the problem says so for the rounds
    published before."""
    if division != "closed" or ruleset not in SEED_CHECK_RULESETS:
        return
    read = [s for s in summaries if not s.problem]
    missing = [name(s) for s in read if "seed" not in s.keys]
    if not missing:
        return
    why = (f"{len(missing)} run(s) log no seed ({', '.join(missing[:4])}{', ...' if len(missing) > 4 else ''}): the "
           "package checker's seed check fails a closed set from ruleset 1.0.0 on")
    if len(missing) == len(read) and ruleset not in SEEDS_ALWAYS_REQUIRED:
        why += (f" (since {SEEDS_REQUIRED_SINCE}: when the round of ruleset {ruleset} was published, a set in which no "
                "run logged a seed passed the seed check)")
    found.problems.append(why)


def _by_value(runs: list, value) -> dict:
    seen: dict = {}
    for s in runs:
        seen.setdefault(value(s), []).append(name(s))
    return seen


def _shown(seen: dict) -> str:
    return "; ".join(f"{v if v is not None else 'none'} in {', '.join(files[:3])}{', ...' if len(files) > 3 else ''}"
                     for v, files in seen.items())


def system_description(rs) -> tuple[dict | None, str]:
    """The set's system description and where it is: an experiment's recorded cluster.yaml (with the nodes
    its runs used), or the submission tree's ORG/systems/SYSTEM.json beside ORG/results/SYSTEM/bert; else
    None and why."""
    if rs.experiment is not None:
        cluster = rs.cluster_config or {}
        system = cluster.get("system")
        if not system:
            return None, "the experiment's cluster.yaml has no system: section"
        nodes = (cluster.get("resources") or {}).get("nodes") or system.get("number_of_nodes")
        return {**system, "number_of_nodes": nodes}, "the experiment's cluster.yaml"
    path = rs.directory.parent.parent.parent / "systems" / f"{rs.directory.parent.name}.json"
    if rs.directory.name != "bert" or not (path.exists() or in_submission_tree(rs)):
        return None, "no systems/<system>.json beside the logs"
    if not path.exists():
        return None, f"systems/{path.name} is missing"
    try:
        data, _ = resultlog.read_bounded(path, 1024 * 1024, "system description")
        described = json.loads(data)
    except (resultlog.UserError, ValueError, RecursionError) as e:
        return None, f"systems/{path.name} is unreadable ({str(e)[:80]})"
    return (described, f"systems/{path.name}") if isinstance(described, dict) else (None, f"systems/{path.name} is no object")


def in_submission_tree(rs) -> bool:
    """Are the logs a submission tree's (ORG/results/SYSTEM/bert), not an experiment or a bare folder of logs?"""
    return rs.experiment is None and rs.directory.name == "bert" and rs.directory.parent.parent.name == "results"


def description_problem(rs, system: dict | None, where: str) -> str | None:
    """The package checker reads each system's description of a submission tree (its division) and fails
    the tree without a readable one (it stops at FileNotFoundError); a bare folder of logs has none to read."""
    if system is not None or not in_submission_tree(rs):
        return None
    return f"{where}: the package checker reads the system description of a submission tree and fails without it"
