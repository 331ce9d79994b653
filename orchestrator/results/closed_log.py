"""The closed division read from the log: a closed result log held to MLPerf's BERT rules.

The official checker reads almost no value of a BERT log (trainer/config/closed_rules.py says which), so
a log that says closed passes it with sequences of 128 or half the evaluation set. Here each rule of
`CLOSED_RULES` that a log shows (`ClosedRule.logged`: max_sequence_length, max_predictions_per_seq,
eval_samples, opt_name, the LR decay power) is checked against the log's value, by the same data the
configuration is checked with, for the rounds the rule held in; and the evaluation cadence (since v1.0)
against the evaluations' sample counts: the rules evaluate every
floor(0.05*(230.23*GBS + 3,000,000)/25,000)*25,000 samples, and every published closed log keeps its
evaluations 0.86 to 1.18 intervals apart.

A run that waived the rules of scale (mlperf.waive_scale_rules: its log carries `WAIVER_KEY`, or the
experiment's run.yaml says so) is a rehearsal: never a result. Published, accepted logs that evaluate
on more than 10,000 samples (a last batch padded: tinycorp v4.1 and v5.0, Google v0.7) get a warning.
"""

from __future__ import annotations

from orchestrator.results.identity import Findings, name, whole
from trainer.config.closed_rules import CLOSED_RULES, WAIVER_KEY, eval_interval_rule

EVAL_SAMPLES = 10_000
# eval_samples above 10,000 in published, accepted closed logs: the set padded to whole batches
PADDED_EVAL_SETS = "tinycorp's v4.1 and v5.0 (10,002 to 10,240) and Google's v0.7 TPU v4-512 (12,288) published logs"
# Evaluations (sample counts) apart, in the rules' intervals: published closed logs keep 0.86 to 1.18
CADENCE_RANGE = (0.8, 1.25)
CADENCE_RULE = next(r for r in CLOSED_RULES if r.key == "train.eval_every_samples")


def bert_round(ruleset: str) -> str:
    """ "2.1.0" -> "v2.1" (closed_rules.BERT_ROUNDS) """
    return "v" + ruleset.rsplit(".", 1)[0]


def waived(s, run_config: dict | None) -> bool:
    logged = s.values.get(WAIVER_KEY, [])
    recorded = ((run_config or {}).get("mlperf") or {}).get("waive_scale_rules")
    return any(v is True for v in logged) or recorded is True


def findings(summaries: list, ruleset: str, division: str | None, run_config: dict | None = None) -> Findings:
    found = Findings()
    if division != "closed":
        return found
    rehearsal = [name(s) for s in summaries if waived(s, run_config)]
    if rehearsal:
        found.problems.append(
            f"a rehearsal, never a result: {', '.join(rehearsal[:4])}{', ...' if len(rehearsal) > 4 else ''} waived the "
            "closed division's rules of scale (mlperf.waive_scale_rules: model, lengths, evaluation set and cadence, "
            "checkpoint)")
    current = bert_round(ruleset)
    for s in summaries:
        if whole(s):
            logged_rules(s, current, bool(rehearsal), found)
            if not rehearsal and CADENCE_RULE.applies_in(current):
                cadence(s, found)
    return found


def logged_rules(s, current: str, rehearsal: bool, found: Findings) -> None:
    for rule in CLOSED_RULES:
        if rule.logged is None or not rule.applies_in(current) or (rehearsal and rule.scale):
            continue
        requirement = rule.logged.requirement or rule.requirement
        for value in dict.fromkeys(_one(v) for v in s.values.get(rule.logged.key, [])):
            if requirement.holds(value, None):
                continue
            why = (f"{rule.logged.key} {value!r} in a closed log: MLPerf BERT rule '{rule.rule}' (since {rule.since}) "
                   f"allows {requirement.allows(None)} only")
            if rule.logged.key == "eval_samples" and _number(value) and value > EVAL_SAMPLES:
                found.warn(name(s), f"{why}; more is the set padded to whole batches, as {PADDED_EVAL_SETS} have it")
            else:
                found.fail(name(s), why)


def cadence(s, found: Findings) -> None:
    """Evaluations every interval of the rules, as the sample counts of eval_accuracy say."""
    gbs = s.global_batch_size
    if not gbs or not s.epoch_num_counts_samples:
        return
    interval = eval_interval_rule(gbs)
    low, high = CADENCE_RANGE
    previous = 0
    for line, (samples, _) in zip(s.eval_lines, s.evals):
        if samples <= 0:
            continue  # an evaluation of the initial checkpoint
        apart = (samples - previous) / interval
        if not low <= apart <= high:
            found.fail(name(s), f"eval_accuracy at epoch_num {samples:,} (line {line}) is {apart:.2f} intervals after "
                                f"{'the previous evaluation' if previous else 'the start'}: MLPerf BERT rule "
                                f"'{CADENCE_RULE.rule}' (since {CADENCE_RULE.since}) evaluates every {interval:,} samples "
                                f"at global batch {gbs:,} (published closed logs: 0.86 to 1.18 intervals apart)")
            return
        previous = samples


def _one(value):
    """Graphcore's published logs give values as [n]; JSON lists are not hashable."""
    while isinstance(value, list) and len(value) == 1:
        value = value[0]
    return value if not isinstance(value, (list, dict)) else str(value)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
