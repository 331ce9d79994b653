"""MLPerf Training's closed division for BERT, as data: what each rule fixes, since which round, and the
words of the document it comes from.

`CLOSED_RULES` is the one place these rules live. `RunConfig.closed_division_problems` applies them, so a
closed-division run is refused the same way by `bertctl render`/`submit` (the cluster file's run) and by
the trainer at start (a run.yaml edited by hand): one line naming the key, the rule and what it allows.
Where a result log shows a rule (`ClosedRule.logged`: its MLPerf key), `bertctl compliance-check` holds a
closed log to the same rule (orchestrator/results/closed_log.py), so any log, ours or another's, is judged
by the rules its configuration was.

The official checker checks almost none of this (its closed_bert.yaml only asks for LAMB's keys and an
`eval_accuracy` of at least 0.720; the value of every hyperparameter key is never read), so a log of a
2-layer model at sequence length 128 passes it as "closed". These rules are the rest of the benchmark:
the task (BERT-large from the phase-1 checkpoint, sequences of 512 with 76 masked positions, the
10,000-sample evaluation at the rules' cadence, the 0.720 target) and the recipe the reference fixes
(LAMB, its schedule, gradient clipping). What the closed division lets a submitter tune is left free:
global batch, base LR, epsilon, LR-decay steps, warmup steps, beta1/beta2, weight decay (the rules'
hyperparameter table, row bert/lamb), and how the maths runs (precision, kernels, packing, balance).

A rule marked `scale` fixes the size of the problem. `mlperf.waive_scale_rules: true` waives those, and
only those, for a small model that logs as closed so that the official checker applies its closed rules
(the tests' tiny closed runs); such a run is never a result: its log says so (`WAIVER_KEY`), and
compliance-check and package refuse it.

Torch-free: the orchestrator imports it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

# The rounds of MLPerf Training that had BERT (v5.1 replaced it): a rule's `since` is one of them.
BERT_ROUNDS = ("v0.7", "v1.0", "v1.1", "v2.0", "v2.1", "v3.0", "v3.1", "v4.0", "v4.1", "v5.0")

# The optimizers MLPerf's closed division allows for BERT: the rules' hyperparameter table lists LAMB's
# keys as the ones a submitter may choose, and the official checker's closed_bert.yaml requires
# opt_lamb_epsilon, opt_lamb_beta_1/2 and opt_lamb_weight_decay_rate. Anything else, Samsung's ADAM run
# included, is open division.
CLOSED_OPTIMIZERS = ("lamb",)

# What a run with mlperf.waive_scale_rules logs (true) before init_stop: a rehearsal, never a result. The
# official checker ignores keys it does not know; bertctl's compliance-check and package refuse the run.
WAIVER_KEY = "bertctl_waive_scale_rules"

# The BERT reference and the rules documents the sources below quote.
REF_README = "mlcommons/training language_model/tensorflow/bert/README.md"
REF_OPTIMIZATION = "mlcommons/training language_model/tensorflow/bert/optimization.py"
TRAINING_RULES = "mlcommons/training_policies training_rules.adoc"


def eval_interval_rule(global_batch_size: int) -> int:
    """Samples between evaluations by the MLPerf BERT rule: floor(0.05*(230.23*GBS + 3e6)/25000)*25000."""
    return int(math.floor(0.05 * (230.23 * global_batch_size + 3_000_000) / 25_000) * 25_000)


@dataclass(frozen=True)
class Requirement:
    """What a rule allows for its key: `allows(cfg)` says it in words, `holds(value, cfg)` checks it."""

    allows: Callable[[Any], str]
    holds: Callable[[Any, Any], bool]


def equal_to(*values: Any) -> Requirement:
    return Requirement(allows=lambda cfg: " or ".join(str(v) for v in values),
                       holds=lambda value, cfg: value in values)


def given(what: str) -> Requirement:
    return Requirement(allows=lambda cfg: what, holds=lambda value, cfg: bool(value))


def same_as_max_steps() -> Requirement:
    """The LR decays over the steps the log reports as opt_learning_rate_training_steps (optim.max_steps)."""
    return Requirement(allows=lambda cfg: f"null or optim.max_steps ({cfg.optim.max_steps})",
                       holds=lambda value, cfg: value is None or value == cfg.optim.max_steps)


def rules_cadence() -> Requirement:
    def allows(cfg) -> str:
        gbs = cfg.train.global_batch_size
        return (f"null or {eval_interval_rule(gbs)} (the rules' interval at global batch {gbs}: "
                f"floor(0.05*(230.23*{gbs}+3000000)/25000)*25000)")
    return Requirement(allows=allows,
                       holds=lambda value, cfg: value is None or value == eval_interval_rule(cfg.train.global_batch_size))


def rules_first_eval() -> Requirement:
    """Evaluations fall on multiples of the interval from 0; the one at 0 may be skipped."""
    def allows(cfg) -> str:
        return f"null, 0 or {eval_interval_rule(cfg.train.global_batch_size)} (the first of the rules' evaluations)"
    return Requirement(allows=allows,
                       holds=lambda value, cfg: value in (None, 0, eval_interval_rule(cfg.train.global_batch_size)))


@dataclass(frozen=True)
class Logged:
    """How a result log shows a rule: the MLPerf key, and what the rule allows there (the rule's own
    requirement unless the log states it another way, e.g. the schedule as its decay power)."""

    key: str
    requirement: Requirement | None = None


def any_case(*names: str) -> Requirement:
    """A name the logs spell in either case (tinycorp's published logs say LAMB)."""
    return Requirement(allows=lambda cfg: " or ".join(names) + " (any case)",
                       holds=lambda value, cfg: isinstance(value, str) and value.lower() in names)


@dataclass(frozen=True)
class ClosedRule:
    key: str                  # the RunConfig key it fixes (dotted)
    rule: str                 # its name, as the refusal says it
    requirement: Requirement
    since: str                # the first round of BERT it applies to (one of BERT_ROUNDS)
    source: str               # the document, and the words this rule enforces
    scale: bool = False       # fixes the problem's size: waived by mlperf.waive_scale_rules
    logged: Logged | None = None  # the log's key that shows it, checked by compliance-check

    def applies_in(self, bert_round: str) -> bool:
        """Did this rule hold in that round ("v2.1")?"""
        return bert_round in BERT_ROUNDS and BERT_ROUNDS.index(bert_round) >= BERT_ROUNDS.index(self.since)

    def value(self, cfg: Any) -> Any:
        node = cfg
        for part in self.key.split("."):
            node = getattr(node, part)
        return node


BERT_LARGE = (f"{REF_README} (bert_config.json of the phase-1 checkpoint): BERT-large, 24 layers, hidden 1024, "
              "16 attention heads, intermediate 4096, vocabulary 30522 (padded to 30528 by the implementations)")
EVAL_SET = (f"{REF_README}: the evaluation set is 10,000 samples (pick_eval_samples.py --num_examples_to_pick=10000, "
            "'eval_10k'), max sequence length 512")
CADENCE = (f"{REF_README} @ 9947bdf2 (2021-05-20): evaluate every floor(0.05*(230.23*batch_size+3000000)/25000)*25000 "
           "samples, starting from 0 (the evaluation at 0 may be skipped)")

CLOSED_RULES: tuple[ClosedRule, ...] = (
    ClosedRule("model.num_layers", "BERT-large model", equal_to(24), "v0.7", BERT_LARGE, scale=True),
    ClosedRule("model.hidden_size", "BERT-large model", equal_to(1024), "v0.7", BERT_LARGE, scale=True),
    ClosedRule("model.num_heads", "BERT-large model", equal_to(16), "v0.7", BERT_LARGE, scale=True),
    ClosedRule("model.intermediate_size", "BERT-large model", equal_to(4096), "v0.7", BERT_LARGE, scale=True),
    ClosedRule("model.vocab_size", "BERT-large model", equal_to(30522), "v0.7", BERT_LARGE, scale=True),
    ClosedRule("data.max_seq_length", "sequence length 512", equal_to(512), "v0.7",
               f"{REF_README}: create_pretraining_data.py --max_seq_length=512 (the training and evaluation data)",
               scale=True, logged=Logged("max_sequence_length")),
    ClosedRule("data.max_predictions_per_seq", "76 masked positions", equal_to(76), "v0.7",
               f"{REF_README}: create_pretraining_data.py --max_predictions_per_seq=76 --masked_lm_prob=0.15",
               scale=True, logged=Logged("max_predictions_per_seq")),
    ClosedRule("data.eval_samples", "10,000-sample evaluation set", equal_to(10000), "v0.7", EVAL_SET, scale=True,
               logged=Logged("eval_samples")),
    ClosedRule("data.eval_dir", "10,000-sample evaluation set", given("a folder holding the 10,000-sample evaluation set"),
               "v0.7", EVAL_SET),
    ClosedRule("train.eval_every_samples", "evaluation cadence", rules_cadence(), "v1.0", CADENCE, scale=True),
    ClosedRule("train.eval_start_samples", "evaluation cadence", rules_first_eval(), "v1.0", CADENCE, scale=True),
    ClosedRule("train.init_checkpoint", "initial checkpoint", given("a path to the phase-1 checkpoint, model.ckpt-28252 converted"),
               "v0.7", f"{REF_README}, 'Stopping criteria': training starts from the phase-1 checkpoint "
                       "model.ckpt-28252, whose masked-LM accuracy is 0.34085 before training", scale=True),
    ClosedRule("train.target_accuracy", "quality target 0.720", equal_to(0.72), "v1.0",
               f"{TRAINING_RULES}: 'BERT 0.720 Mask-LM accuracy' (v0.7: 0.712); mlperf_logging "
               "training_1.0.0-5.0.0 closed_bert.yaml: eval_accuracy >= 0.720"),
    ClosedRule("optim.name", "LAMB optimizer", equal_to(*CLOSED_OPTIMIZERS), "v0.7",
               f"{TRAINING_RULES}, hyperparameter table, row bert: optimizer lamb; free: global batch size, base LR, "
               "epsilon, LR-decay steps, warmup steps, beta1/beta2, weight decay",
               logged=Logged("opt_name", any_case(*CLOSED_OPTIMIZERS))),
    ClosedRule("optim.schedule", "reference LR schedule", equal_to("nvidia"), "v0.7",
               f"{REF_OPTIMIZATION}: linear warmup, then polynomial decay (power 1.0) to 0 over num_train_steps",
               logged=Logged("opt_lamb_learning_rate_decay_poly_power", equal_to(1.0))),
    ClosedRule("optim.lr_max_steps", "reference LR schedule", same_as_max_steps(), "v0.7",
               f"{TRAINING_RULES}, hyperparameter table: the LR-decay steps are one value, logged as "
               "opt_learning_rate_training_steps"),
    ClosedRule("optim.clip", "gradient clipping", equal_to("local", "after_allreduce"), "v1.0",
               f"{REF_OPTIMIZATION}: clip_by_global_norm(grads, clip_norm=1.0); {TRAINING_RULES}, appendix 'BERT "
               "clip-normalization order' (v1.0): clipping before or after the all-reduce are both allowed"),
    ClosedRule("optim.max_grad_norm", "gradient clipping", equal_to(1.0), "v1.0",
               f"{REF_OPTIMIZATION}: clip_by_global_norm(grads, clip_norm=1.0)"),
)


def closed_problems(cfg: Any, waive_scale_rules: bool = False) -> list[tuple[str, str]]:
    """(key, one-line message) for every rule `cfg` breaks; waive_scale_rules skips the rules of scale."""
    problems = []
    for r in CLOSED_RULES:
        if waive_scale_rules and r.scale:
            continue
        value = r.value(cfg)
        if not r.requirement.holds(value, cfg):
            problems.append((r.key, f"{shown(value)} is not allowed in mlperf.division closed, which allows "
                                    f"{r.requirement.allows(cfg)} only (MLPerf BERT rule '{r.rule}', since {r.since}): "
                                    "set mlperf.division=open"))
    return problems


def shown(value: Any) -> str:
    return "null" if value is None else str(value)
