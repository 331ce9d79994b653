"""What `bertctl --help` and each verb's `--help` say beyond argparse's own lines: the verbs grouped by the task a
user comes with (as the README's "What it can do" and the guides group them), a verb's longer description, and
the examples each verb's help ends with (tests/test_cli.py parses every one). orchestrator/cli.py builds the
parser from them."""

from __future__ import annotations

ABOUT = "Train BERT the MLPerf way, from a laptop to a 1,024-GPU Slurm cluster."
# the verbs by the task a user comes with, as the README's "What it can do" and the guides under docs/ group them
GROUPS = [
    ("run and follow experiments (docs/clusters.md, docs/experiments.md)",
     ["clusters", "render", "submit", "status", "logs", "plot", "diff", "cancel", "resume", "rerun"]),
    ("before the allocation (docs/preflight.md, docs/balance.md)", ["preflight", "rehearsal", "balance"]),
    ("results (docs/compliance.md, docs/export.md)", ["compliance-check", "package", "export"]),
    ("data (docs/data.md)", ["data", "convert-checkpoint"]),
]


def verbs_by_task(helps: dict[str, str]) -> str:
    """`bertctl --help`'s body: every verb under its task, one line each (a verb in no group under "other")."""
    width = max(map(len, helps)) + 2
    grouped = [(task, [n for n in names if n in helps]) for task, names in GROUPS]
    other = [n for n in helps if all(n not in names for _, names in GROUPS)]
    lines = [ABOUT]
    for task, names in grouped + ([("other", other)] if other else []):
        lines += ["", f"{task}:"] + [f"  {name:<{width}}{helps[name]}" for name in names]
    return "\n".join(lines)


# a verb's --help description where its one line in the list says less
DETAILS = {
    "rehearsal": "Check every rank's report of a launch probe (submit --probe): ranks, nodes, GPUs, CPU sets, "
                 "rendezvous, shards, exchange groups, container, seeds.",
    "plot": "Draw eval accuracy, training loss and throughput of every run as a PNG; prints its path. Several "
            "experiments (or --results) are overlaid, one colour and line style each.",
    "export": "Write a run's weights as a Hugging Face model folder (config.json, model.safetensors, tokenizer, "
              "model card); prints its path.",
    "preflight": "Measure every node before a run (matmul, memory copy, all-reduce busbw within nodes, across all "
                 "and between node pairs, shard reads, training steps), flag the slow ones and predict the time "
                 "to train. Exit 1 when a node is flagged.",
}

# each verb's --help ends with these (tests/test_cli.py parses every one); the guides show the same commands
EXAMPLES = {
    "clusters": ["bertctl clusters"],
    "render": ["bertctl render --cluster nvidia_dgxa100_8x8 -o run.optim.lr=1.2e-3 -o slurm.partition=batch"],
    "submit": ["bertctl submit --cluster local --nexp 2 --follow",
               "bertctl submit --cluster samsung_dgxa100 --nexp 10 --dry-run"],
    "status": ["bertctl status last", "bertctl status --state FAILED -n 5"],
    "logs": ["bertctl logs last --run 0 --rank 0", "bertctl logs last -f --grep straggler"],
    "cancel": ["bertctl cancel last"],
    "resume": ["bertctl resume last --follow", "bertctl resume last --run 3"],
    "rerun": ["bertctl rerun last -o run.optim.lr=1e-3 --nexp 10"],
    "diff": ["bertctl diff EXP last", "bertctl diff EXP last --json"],
    "rehearsal": ["bertctl rehearsal last", "bertctl rehearsal last --json"],
    "compliance-check": ["bertctl compliance-check last --no-score",
                         "bertctl compliance-check --results tests/data/mlperf-results/v1.1/Inspur --json"],
    "package": ["bertctl package last --org MyOrg --out submission"],
    "plot": ["bertctl plot last", "bertctl plot EXP last --out compare.png"],
    "export": ["bertctl export last --to bert-mlperf",
               "bertctl export last --checkpoint ~/.bertctl/datasets/sample/phase1_checkpoint/model.pt --to bert-phase1"],
    "preflight": ["bertctl preflight --cluster ci_slurm", "bertctl preflight --cluster mycluster --threshold 15 --json"],
    "data": ["bertctl data prepare --dataset sample", "bertctl data verify --dataset sample"],
    "data prepare": ["bertctl data prepare --dataset sample",
                     "bertctl data prepare --dataset mlperf_wiki --cluster mycluster --wait -o root=/lustre/me/bert"],
    "data verify": ["bertctl data verify --dataset sample --json"],
    "data list": ["bertctl data list"],
    "convert-checkpoint": ["bertctl convert-checkpoint --tf-checkpoint /data/phase1/model.ckpt-28252 "
                           "--bert-config /data/phase1/bert_config.json --output model.pt"],
}
