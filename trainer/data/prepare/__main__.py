"""`python -m trainer.data.prepare`: the data-preparation worker (what `bertctl data` runs).

With a resolved dataset manifest (the orchestrator writes it):

    start   --manifest M [--force]                   check/initialise the root; print the plan as JSON
    run     --manifest M --stage S --group J [--group-size G]
                                                     run tasks J*G .. J*G+G-1 of a stage (a Slurm array task)
    serve   --manifest M                             run the tasks that arrive on stdin, `STAGE INDEX` a line (local workers)
    verify  --manifest M [--json]                    check a prepared dataset; exit 0 if no check fails

Each step alone, on plain files:

    train-vocab       --input FILE... --output vocab.txt --size N
    text-to-hdf5      --input FILE --vocab V --output F.hdf5 [--max-seq-length 512 --max-predictions 76 ...]
    tfrecord-to-hdf5  --input F.tfrecord --output F.hdf5 [--layout fixed|varlen]
    split-bins        --input FILE... --output-dir D [--bins 128,256,384,512] [--shards N]
    pick-eval         --input FILE... --output F.hdf5 [--count 10000]

stdout: JSON lines (one per finished task, or the report); errors: one line on stderr,
`error: <file>: <what>`, exit code 2 for bad input and 1 when the work failed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trainer.config import PathError
from trainer.data.prepare.errors import PrepareError, report_failure


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.fn(args)
    except PrepareError as e:
        return report_failure(e.exit_code, e.path, e.what)
    except PathError as e:  # the manifest's paths use a $VARIABLE this environment does not set
        return report_failure(2, None, str(e))
    except KeyboardInterrupt:
        return report_failure(130, None, "interrupted")


def load_plan(path: str):
    import pydantic
    import yaml

    from trainer.config import load_dataset_manifest
    from trainer.data.prepare.errors import BadInput
    from trainer.data.prepare.plan import Plan

    try:
        return Plan(load_dataset_manifest(path))
    except (OSError, yaml.YAMLError, pydantic.ValidationError) as e:
        raise BadInput(path, f"not a valid dataset manifest: {str(e).splitlines()[0]}") from None


def cmd_start(args) -> int:
    plan = load_plan(args.manifest)
    state = plan.start(force=args.force)
    print(json.dumps({"state": state, "root": str(plan.root), "stages": plan.stages(state)}))
    return 0


def cmd_run(args) -> int:
    from trainer.data.prepare.plan import group_range
    from trainer.data.prepare.stages import run_task

    plan = load_plan(args.manifest)
    for index in group_range(args.group, args.group_size, plan.task_count(args.stage)):
        print(json.dumps(run_task(plan, args.stage, index)), flush=True)
    return 0


def cmd_serve(args) -> int:
    """Tasks as they come: `STAGE INDEX` per line on stdin, a JSON line per finished task on stdout,
    until stdin closes. bertctl's local runner keeps one such process per worker for the whole build,
    so that neither a task nor a stage pays a Python start-up."""
    from trainer.data.prepare.stages import run_task

    plan = load_plan(args.manifest)
    for line in sys.stdin:
        if line.strip():
            stage, index = line.split()
            print(json.dumps(run_task(plan, stage, int(index))), flush=True)
    return 0


def cmd_verify(args) -> int:
    from trainer.data.prepare.verify import exit_code, print_report, verify

    plan = load_plan(args.manifest)
    checks = verify(plan, stats_files=args.stats_files)
    if args.json:
        print(json.dumps([c.as_json() for c in checks], indent=1))
    else:
        print_report(plan, checks, sys.stdout)
    return exit_code(checks)


# ---- the steps alone

def cmd_train_vocab(args) -> int:
    from trainer.data.prepare.vocab import train_vocab

    tokens = train_vocab(args.input, args.output, args.size, args.min_frequency, not args.cased)
    print(json.dumps({"vocab": args.output, "tokens": len(tokens)}))
    return 0


def cmd_text_to_hdf5(args) -> int:
    import random

    from trainer.config import DatasetOutput
    from trainer.data.prepare import stages
    from trainer.data.prepare.textfile import read_documents
    from trainer.data.prepare.vocab import WordPiece

    out = DatasetOutput(split="train", max_seq_length=args.max_seq_length, max_predictions=args.max_predictions, layout=args.layout)
    wordpiece = WordPiece(args.vocab, lower_case=not args.cased)
    documents = stages.tokenize_documents(read_documents(args.input, args.split_sentences), wordpiece)
    samples = stages.create_samples(documents, out, stages.special_ids(wordpiece), random.Random(args.seed),
                                    args.masked_lm_prob, args.dupe_factor, args.short_seq_prob)
    stages.save_shard(Path(args.output), samples, args.layout, out)
    print(json.dumps({"output": args.output, "samples": len(samples)}))
    return 0


def cmd_tfrecord_to_hdf5(args) -> int:
    from trainer.config import DatasetOutput
    from trainer.data.prepare import stages

    out = DatasetOutput(split="train", max_seq_length=args.max_seq_length, max_predictions=args.max_predictions, layout=args.layout)
    samples = stages.tfrecord_samples(Path(args.input), out)
    stages.save_shard(Path(args.output), samples, args.layout, out)
    print(json.dumps({"output": args.output, "samples": len(samples)}))
    return 0


def cmd_split_bins(args) -> int:
    from trainer.data.prepare.standalone import split_bins

    edges = [int(x) for x in args.bins.split(",")] if args.bins else None
    written = split_bins([Path(p) for p in args.input], Path(args.output_dir), edges, args.shards, args.layout)
    print(json.dumps({"output_dir": args.output_dir, "files": len(written), "samples": sum(written.values())}))
    return 0


def cmd_pick_eval(args) -> int:
    from trainer.data.prepare.standalone import pick_eval

    count = pick_eval([Path(p) for p in args.input], Path(args.output), args.count, args.layout)
    print(json.dumps({"output": args.output, "samples": count}))
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainer.data.prepare", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    def command(name, fn, help_):
        c = sub.add_parser(name, help=help_)
        c.set_defaults(fn=fn)
        return c

    c = command("start", cmd_start, "check and initialise the dataset root; print the plan")
    c.add_argument("--manifest", required=True)
    c.add_argument("--force", action="store_true", help="rebuild from scratch")
    c = command("run", cmd_run, "run a group of tasks of one stage")
    c.add_argument("--manifest", required=True)
    c.add_argument("--stage", required=True, choices=["corpus", "examples", "combine", "checkpoint", "finish"])
    c.add_argument("--group", type=int, required=True)
    c.add_argument("--group-size", type=int, default=1)
    c = command("serve", cmd_serve, "run the tasks that arrive on stdin, STAGE INDEX a line")
    c.add_argument("--manifest", required=True)
    c = command("verify", cmd_verify, "check a prepared dataset")
    c.add_argument("--manifest", required=True)
    c.add_argument("--json", action="store_true")
    c.add_argument("--stats-files", type=int, default=None,
                   help="statistics and digests from at most N files per output (evenly spread); every file is still validated")

    def sample_shape(c, layout="varlen"):
        c.add_argument("--max-seq-length", type=int, default=512)
        c.add_argument("--max-predictions", type=int, default=76)
        c.add_argument("--layout", choices=["fixed", "varlen"], default=layout)

    c = command("train-vocab", cmd_train_vocab, "learn a WordPiece vocabulary from text files")
    c.add_argument("--input", nargs="+", required=True)
    c.add_argument("--output", required=True)
    c.add_argument("--size", type=int, default=30522)
    c.add_argument("--min-frequency", type=int, default=2)
    c.add_argument("--cased", action="store_true")
    c = command("text-to-hdf5", cmd_text_to_hdf5, "one text file -> one HDF5 file of masked sentence pairs")
    c.add_argument("--input", required=True)
    c.add_argument("--vocab", required=True)
    c.add_argument("--output", required=True)
    sample_shape(c)
    c.add_argument("--masked-lm-prob", type=float, default=0.15)
    c.add_argument("--dupe-factor", type=int, default=10)
    c.add_argument("--short-seq-prob", type=float, default=0.1)
    c.add_argument("--seed", type=int, default=12345)
    c.add_argument("--split-sentences", action="store_true")
    c.add_argument("--cased", action="store_true")
    c = command("tfrecord-to-hdf5", cmd_tfrecord_to_hdf5, "one MLPerf TFRecord file -> one HDF5 file")
    c.add_argument("--input", required=True)
    c.add_argument("--output", required=True)
    sample_shape(c)
    c = command("split-bins", cmd_split_bins, "HDF5 files -> balanced shards per length bin")
    c.add_argument("--input", nargs="+", required=True)
    c.add_argument("--output-dir", required=True)
    c.add_argument("--bins", default="128,256,384,512", help="upper edges; empty for one flat folder")
    c.add_argument("--shards", type=int, default=1)
    c.add_argument("--layout", choices=["fixed", "varlen"], default="varlen")
    c = command("pick-eval", cmd_pick_eval, "HDF5 files -> one file of COUNT samples picked evenly")
    c.add_argument("--input", nargs="+", required=True)
    c.add_argument("--output", required=True)
    c.add_argument("--count", type=int, default=10000)
    c.add_argument("--layout", choices=["fixed", "varlen"], default="varlen")
    return p


if __name__ == "__main__":
    raise SystemExit(main())
