"""The `bertctl` command line. One small function per verb; heavy imports happen inside them.

stdout carries what the verb was asked for (a script, an experiment id, the status table or JSON,
a log), so it can be piped; prose, reports and progress go to stderr. Exit codes: 0 success, 1 the work failed, 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap

from orchestrator import __version__
from orchestrator.errors import UserError, WorkFailed
from orchestrator.help_text import DETAILS, EXAMPLES, verbs_by_task


def cmd_clusters(args: argparse.Namespace) -> int:
    from orchestrator.config.clusters import cluster_files, load_cluster

    for name in cluster_files():
        try:
            c = load_cluster(name).config
            print(f"{name}\t{c.executor}\t{c.resources.nodes}x{c.resources.tasks_per_node}\t{c.description}")
        except UserError as e:
            print(f"{name}\tinvalid\t-\t{e}")
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    from orchestrator.config.clusters import load_cluster
    from orchestrator.rendering.render import render

    cluster = load_cluster(args.cluster, args.override)
    sys.stdout.write(render(cluster, nexp=args.nexp, program="probe" if args.probe else "train"))
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    from orchestrator.config.clusters import load_cluster
    from orchestrator.jobs import submit as submission
    from orchestrator.rendering.render import render

    cluster = load_cluster(args.cluster, args.override)
    program = "probe" if args.probe else "train"
    if args.dry_run:
        sys.stdout.write(render(cluster, nexp=args.nexp, program=program))
        return 0
    if args.test_only:
        print(submission.test_only(cluster, args.nexp, program), file=sys.stderr)
        return 0
    return submit_and_report(cluster, args.nexp, program, args.follow)


def submit_and_report(cluster, nexp: int, program: str, follow: bool, note: str = "") -> int:
    """Submit; the experiment id on stdout as soon as the job exists, the rest on stderr."""
    from orchestrator.jobs import submit as submission

    exp = submission.submit(cluster, nexp, program)
    print(f"submitted {exp.id}{note}: {exp.nexp} run(s) on {exp.cluster}, job(s) {', '.join(exp.job_ids)}", file=sys.stderr)
    print(f"  follow it: bertctl status {exp.id}   bertctl logs {exp.id} -f", file=sys.stderr)
    print(exp.id, flush=True)
    if follow:
        from orchestrator.jobs.follow import follow as follow_experiment

        return follow_experiment(exp, stderr_console())
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from orchestrator import experiments
    from orchestrator.jobs import status

    damaged = []
    if args.experiment is not None:  # `status ""` is refused, not a listing of everything
        views = status.collect([experiments.find(args.experiment)])
    else:
        found, damaged = experiments.load_registry()
        views = status.recent(found, args.state, args.cluster, args.n)
        if args.state or args.cluster:  # a damaged record has no trustworthy state or cluster
            damaged = []
    if args.json:
        print(json.dumps({"experiments": [v.as_json() for v in views],
                          "damaged": [{"id": d.id, "path": str(d.path), "reason": d.reason} for d in damaged]}, indent=2))
    elif damaged:
        status.print_table(views, console(sys.stdout), damaged)
    elif not views:
        print(f"no experiments{' match' if args.state or args.cluster else ' yet'} in {experiments.registry_dir()}",
              file=sys.stderr)
    else:
        status.print_table(views, console(sys.stdout))
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    from orchestrator import experiments
    from orchestrator.jobs import logs

    return logs.show(experiments.find(args.experiment), args.run, args.rank, args.follow, grep=args.grep, last=args.n)


def cmd_cancel(args: argparse.Namespace) -> int:
    from orchestrator import experiments
    from orchestrator.jobs import lifecycle

    exp = experiments.find(args.experiment)
    if not lifecycle.cancel(exp):
        print(f"{exp.id} has already ended: nothing to cancel", file=sys.stderr)  # keep its real outcome
    else:
        print(f"cancelled {exp.id} (job(s) {', '.join(exp.job_ids)})", file=sys.stderr)
    print(exp.id)
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    from orchestrator import experiments
    from orchestrator.jobs import lifecycle

    exp = lifecycle.resume(experiments.find(args.experiment), args.run, force=args.force, restart=args.restart)
    print(f"resumed {exp.id}: job(s) {', '.join(exp.job_ids)}", file=sys.stderr)
    print(exp.id)
    if args.follow:
        from orchestrator.jobs.follow import follow

        return follow(exp, stderr_console())
    return 0


def cmd_rerun(args: argparse.Namespace) -> int:
    from orchestrator import experiments
    from orchestrator.jobs import lifecycle

    original = experiments.find(args.experiment)
    if not args.force:  # one scheduler question: a rerun beside a job that may still run is asked for, not guessed
        from orchestrator.jobs import status

        lifecycle.refuse_unknown(original, status.collect([original])[0], "rerunning it", force=False)
    cluster = lifecycle.rerun_cluster(original, args.override)
    return submit_and_report(cluster, args.nexp or original.nexp, original.program, args.follow,
                             note=f" (a rerun of {original.id})")


def cmd_diff(args: argparse.Namespace) -> int:
    from orchestrator import experiments
    from orchestrator.jobs import lifecycle

    a, b = experiments.find(args.first), experiments.find(args.second)
    differences = lifecycle.config_differences(a, b)
    results = {a.id: lifecycle.result_summary(a), b.id: lifecycle.result_summary(b)}
    if args.json:
        print(json.dumps({"config": [{"key": k, a.id: va, b.id: vb} for k, va, vb in differences],
                          "results": results}, indent=2, default=str))
        return 0
    from rich.table import Table

    out = console(sys.stdout)
    table = Table(title="resolved configuration: keys that differ", header_style="bold")
    for col in ("key", a.id, b.id):
        table.add_column(col, overflow="fold")
    for key, va, vb in differences:
        table.add_row(key, _cell(va), _cell(vb))
    if not differences:
        table.add_row("(none)", "", "")
    out.print(table)
    table = Table(title="results", header_style="bold")
    for col in ("", a.id, b.id):
        table.add_column(col, overflow="fold")
    for field in results[a.id]:
        table.add_row(field, _cell(results[a.id][field]), _cell(results[b.id][field]))
    out.print(table)
    return 0


def _cell(value) -> str:
    return "-" if value is None else (json.dumps(value) if isinstance(value, (list, dict)) else str(value))


def cmd_rehearsal(args: argparse.Namespace) -> int:
    from orchestrator import experiments
    from orchestrator.checks import rehearsal

    verdict = rehearsal.assess(experiments.find(args.experiment))
    if args.json:
        print(json.dumps(verdict.as_json(), indent=2))
    else:
        rehearsal.print_verdict(verdict, console(sys.stdout))
    return 0 if verdict.passed else 1


def cmd_compliance_check(args: argparse.Namespace) -> int:
    from orchestrator.results import resultset, verdict

    rs = resultset.load(args.experiment, args.results)
    report = verdict.assess(rs, ruleset=args.ruleset, werror=args.werror, with_score=not args.no_score)
    verdict.print_report(report, stderr_console())
    if args.json:
        print(json.dumps(report.as_json(), indent=2))
    return 0 if report.passed else 1


def cmd_package(args: argparse.Namespace) -> int:
    from pathlib import Path

    from orchestrator import experiments
    from orchestrator.results import package, resultset

    rs = resultset.from_experiment(experiments.find(args.experiment))
    try:
        verdict = package.package(rs, args.org, Path(args.out), ruleset=args.ruleset, system_id=args.system)
    except OSError as e:
        raise UserError(f"--out: cannot write the package under {args.out}: {e.strerror}") from None
    package.print_verdict(verdict, stderr_console())
    print(verdict.org_dir)
    return 0 if verdict.passed else 1


def cmd_plot(args: argparse.Namespace) -> int:
    from pathlib import Path

    from orchestrator.results import plot, resultset

    if args.out and Path(args.out).suffix.lower() != ".png":
        raise UserError(f"--out: the plot is a PNG file: the name must end in .png, got {args.out!r}")
    sets = resultset.load_many(args.experiment, args.results or [])
    target = Path(args.out) if args.out else plot.default_output(sets)
    try:
        out = plot.plot(sets, target)
    except OSError as e:
        raise UserError(f"--out: cannot write {target}: {e.strerror}") from None
    print(out)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from orchestrator import experiments
    from orchestrator.export import export

    print(export(experiments.find(args.experiment), run=args.run, checkpoint=args.checkpoint, to=args.to,
                 force=args.force, vocab=args.vocab, cased=args.cased))
    return 0


def cmd_data_prepare(args: argparse.Namespace) -> int:
    from orchestrator import data

    mine, the_clusters = data.split_overrides(args.override, with_cluster=args.cluster is not None)
    loaded = data.load_manifest(args.dataset, mine)
    result = data.prepare(loaded, cluster=args.cluster, workers=args.workers, force=args.force, wait=args.wait,
                          cluster_overrides=the_clusters)
    print(" ".join(result.job_ids) if result.state == "submitted" and not args.wait else result.root)
    return 0


def cmd_data_verify(args: argparse.Namespace) -> int:
    from orchestrator import data

    code, report = data.verify(data.load_manifest(args.dataset, args.override), args.json, args.stats_files)
    (sys.stdout if args.json else sys.stderr).write(report)
    return code


def cmd_data_list(args: argparse.Namespace) -> int:
    from orchestrator import data

    for path in data.manifest_files().values():
        print(data.describe(path))
    return 0


def cmd_convert_checkpoint(args: argparse.Namespace) -> int:
    from orchestrator import data

    print(data.convert_checkpoint(args.tf_checkpoint, args.bert_config, args.output))
    return 0


def add_data_verbs(verb) -> None:
    """`bertctl data prepare|verify|list` and `bertctl convert-checkpoint`."""
    p = verb("data", None, "prepare and verify datasets (see datasets/*.yaml)")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    def dataset_args(q: argparse.ArgumentParser, cluster_keys: bool = False) -> None:
        q.add_argument("--dataset", required=True, help="a dataset name (see `bertctl data list`) or a manifest YAML file")
        also = ("; with --cluster, a key that is not the manifest's (its first part is not one of its sections) "
                "overrides the cluster file, e.g. -o slurm.partition=cpu") if cluster_keys else ""
        q.add_argument("-o", dest="override", action="append", default=[], metavar="KEY.PATH=VALUE",
                       help=f"override one value of the manifest, e.g. -o source.train=/data/tfrecords (repeatable){also}")

    q = actions.add_parser("prepare", help="build a dataset (locally, or as Slurm job arrays with --cluster)",
                           description="Build a dataset: locally with parallel worker processes, or as one Slurm job "
                                       "array per stage. Finished files are kept: a second call returns at once. "
                                       "stdout: the dataset folder (or the job ids when submitted without --wait).")
    q.set_defaults(fn=cmd_data_prepare)
    dataset_args(q, cluster_keys=True)
    q.add_argument("--cluster", help="run on this cluster's Slurm (a local-executor cluster runs here)")
    q.add_argument("--workers", type=_positive, help="local worker processes (default: one per core)")
    q.add_argument("--force", action="store_true", help="rebuild from scratch (removes what this dataset built before)")
    q.add_argument("--wait", action="store_true", help="with a Slurm cluster: stay until the job arrays end")
    q = actions.add_parser("verify", help="check a prepared dataset: counts, lengths, masking, NSP, checksums",
                           description="Check a prepared dataset; exit 0 when every check passes, 1 otherwise. "
                                       "The report goes to stderr (--json: to stdout as JSON).")
    q.set_defaults(fn=cmd_data_verify)
    dataset_args(q)
    q.add_argument("--json", action="store_true", help="the checks as JSON on stdout")
    q.add_argument("--stats-files", type=_positive, metavar="N", help="statistics from N files per output (large datasets)")
    q = actions.add_parser("list", help="the dataset manifests, one line each")
    q.set_defaults(fn=cmd_data_list)
    p = verb("convert-checkpoint", cmd_convert_checkpoint, "convert a TensorFlow BERT checkpoint to PyTorch (no TensorFlow needed)")
    p.add_argument("--tf-checkpoint", required=True, metavar="PREFIX", help="the checkpoint prefix, e.g. .../model.ckpt-28252")
    p.add_argument("--bert-config", required=True, metavar="JSON", help="bert_config.json")
    p.add_argument("--output", required=True, metavar="FILE", help="the PyTorch file to write ({'model': state_dict})")


def console(stream):
    """A rich console on `stream`; wide when it is not a terminal, so pipes and batch logs do not fold tables."""
    from rich.console import Console

    return Console(file=stream, width=None if stream.isatty() else 200)


def stderr_console():
    return console(sys.stderr)


def cmd_balance(argv: list[str]) -> int:
    """The simulator is the trainer's own balancing code, so it runs where that code lives
    (its options are its own: `bertctl balance --help`); `--cluster C` fills them from a cluster file."""
    import subprocess

    from orchestrator.checks.balance import simulator_arguments

    try:
        argv = simulator_arguments(argv)
    except UserError as e:
        say_line(f"bertctl: error: {e}")
        return 2
    return subprocess.call([sys.executable, "-m", "trainer.balance.simulate", *argv])


def cmd_preflight(args: argparse.Namespace) -> int:
    from orchestrator.checks import preflight
    from orchestrator.config.clusters import load_cluster

    if args.threshold is not None:
        preflight.check_threshold(args.threshold)  # before anything is submitted
    cluster = load_cluster(args.cluster, args.override)
    threshold = cluster.config.preflight.threshold if args.threshold is None else args.threshold
    preflight.check_settings(os.environ)
    exp, verdict = preflight.run(cluster, threshold, say_line)
    if args.json:
        print(preflight.strict_json(verdict.as_json()))
    else:
        preflight.print_tables(verdict, console(sys.stdout))
    say_line(f"figures: {exp.path / 'preflight.json'}")
    return 1 if verdict.failed else 0


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line naming the verb's --help, like every other bad input; and
    every verb's --help ends with its examples (EXAMPLES, by the words after `bertctl`)."""

    def __init__(self, *args, **kwargs):
        kwargs["formatter_class"] = argparse.RawDescriptionHelpFormatter  # the examples and the verb list keep their lines
        super().__init__(*args, **kwargs)
        examples = EXAMPLES.get(self.prog.removeprefix("bertctl").strip())
        if examples:
            self.epilog = "examples:\n" + "\n".join(f"  {example}" for example in examples)
        if self.description and "\n" not in self.description:  # raw now: wrap one-paragraph descriptions here
            self.description = textwrap.fill(self.description, 100)

    def error(self, message: str):
        say_line(f"bertctl: error: {message} (see `{self.prog} --help`)")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="bertctl", usage="%(prog)s [-h] [--version] VERB ...",
        epilog="Exit codes: 0 success, 1 the work failed, 2 bad input. See `bertctl VERB --help`.",
    )
    parser.add_argument("--version", action="version", version=f"bertctl {__version__}")
    # listed by task in the description (verbs_by_task), not by argparse's one flat list
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True, help=argparse.SUPPRESS, prog="bertctl")
    helps: dict[str, str] = {}

    def verb(name: str, fn, help_: str) -> argparse.ArgumentParser:
        helps[name] = help_
        p = verbs.add_parser(name, help=help_, description=DETAILS.get(name, help_))
        p.set_defaults(fn=fn)
        return p

    for name, fn, help_, arguments in VERBS:
        arguments(verb(name, fn, help_))
    add_data_verbs(verb)
    # listed here for --help; main() hands its arguments to the simulator untouched (its own --help)
    verb("balance", None, "simulate how evenly ranks are loaded, on the real length histogram")
    parser.description = verbs_by_task(helps)
    return parser


STATES = ("PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "INTERRUPTED", "UNKNOWN")


def experiment_arg(p: argparse.ArgumentParser, nargs: str | None = None,
                   help_: str = "an experiment id (or unique prefix, or `last`)") -> None:
    p.add_argument("experiment", nargs=nargs, help=help_).completer = complete_experiments


# ---- each verb's arguments, one function per verb (VERBS lists them in --help's order)

def cluster_args(p: argparse.ArgumentParser) -> None:
    """`render` and `submit`: the cluster, its overrides, the run count."""
    p.add_argument("--cluster", required=True,
                   help="a cluster name (see `bertctl clusters`) or a YAML file").completer = complete_clusters
    p.add_argument("-o", dest="override", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override one value of the cluster file, e.g. -o run.optim.lr=1e-3 (repeatable)"
                   ).completer = complete_keys
    p.add_argument("--nexp", type=_run_count, default=1, help="number of runs (MLPerf BERT needs 10)")
    p.add_argument("--probe", action="store_true",
                   help="run the launch-path probe instead of training: every rank reports rank, node and devices")


def no_args(p: argparse.ArgumentParser) -> None:
    """`clusters` takes none."""


def submit_args(p: argparse.ArgumentParser) -> None:
    cluster_args(p)
    p.add_argument("--dry-run", action="store_true", help="print the script that would be submitted, submit nothing")
    p.add_argument("--test-only", action="store_true", help="ask Slurm (sbatch --test-only) whether and when it would run")
    p.add_argument("--follow", action="store_true", help="stay and stream the runs' logs until the experiment ends")


def status_args(p: argparse.ArgumentParser) -> None:
    experiment_arg(p, nargs="?", help_="an experiment id (or unique prefix, or `last`); default: the newest ones")
    p.add_argument("--state", action="append", type=str.upper, metavar="STATE",
                   help="only experiments in this state (repeatable): " + ", ".join(STATES))
    p.add_argument("--cluster", help="only experiments on this cluster").completer = complete_clusters
    p.add_argument("-n", type=_positive, default=20, metavar="N", help="at most N experiments, newest first (default 20)")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout instead of the table")


def logs_args(p: argparse.ArgumentParser) -> None:
    experiment_arg(p)
    p.add_argument("--run", type=int, help="run index (default: the newest started run)")
    p.add_argument("--rank", type=int, help="only this rank's lines")
    p.add_argument("--grep", metavar="PATTERN", help="only lines matching this regular expression")
    p.add_argument("-n", type=_positive, metavar="N", help="only the last N lines (with -f: then keep following)")
    p.add_argument("-f", "--follow", action="store_true", help="keep streaming until the run ends")


def resume_args(p: argparse.ArgumentParser) -> None:
    experiment_arg(p)
    p.add_argument("--run", type=int, action="append", help="only this run (repeatable; default: every unfinished run)")
    p.add_argument("--follow", action="store_true", help="stay and stream the runs' logs until the experiment ends")
    p.add_argument("--force", action="store_true", help="resume even though the scheduler did not answer (state UNKNOWN)")
    p.add_argument("--restart", action="store_true", help="start the runs again from their beginning: their checkpoints, "
                   "MLPerf logs, metrics and TensorBoard curves are moved to EXP/set_aside/ (for a checkpoint or log a resume "
                   "refuses)")


def rerun_args(p: argparse.ArgumentParser) -> None:
    experiment_arg(p)
    p.add_argument("-o", dest="override", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="change one value of the resolved configuration (repeatable)").completer = complete_keys
    p.add_argument("--nexp", type=_run_count, help="number of runs (default: the original's)")
    p.add_argument("--follow", action="store_true", help="stay and stream the runs' logs until the experiment ends")
    p.add_argument("--force", action="store_true", help="rerun even though the scheduler did not answer about the original")


def diff_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("first", help="an experiment id (or unique prefix, or `last`)").completer = complete_experiments
    p.add_argument("second", help="an experiment id (or unique prefix, or `last`)").completer = complete_experiments
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")


def rehearsal_args(p: argparse.ArgumentParser) -> None:
    experiment_arg(p)
    p.add_argument("--json", action="store_true", help="one JSON object on stdout instead of the table")


def compliance_check_args(p: argparse.ArgumentParser) -> None:
    experiment_arg(p, nargs="?")
    p.add_argument("--results", metavar="DIR", help="instead of an experiment: an MLPerf result tree or a folder of result_*.txt")
    p.add_argument("--ruleset", help="the checker's ruleset (default: the experiment's, or a hint from the logs; "
                                     "5.0.0 is the newest that accepts BERT)")
    p.add_argument("--werror", action="store_true", help="the checker treats warnings as errors")
    p.add_argument("--no-score", action="store_true", help="check each log only: any number of runs, no score, no RCP")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout (the table still goes to stderr)")


def package_args(p: argparse.ArgumentParser) -> None:
    experiment_arg(p, help_="an experiment id (or unique prefix, or `last`) with 10 runs")
    p.add_argument("--org", required=True, help="the submitting organisation (the package's top folder)")
    p.add_argument("--out", required=True, metavar="DIR", help="folder to write ORG/ into")
    p.add_argument("--system", help="the system's id in the package (default: the cluster name)")
    p.add_argument("--ruleset", help="the package checker's ruleset (default: the experiment's, 5.0.0)")


def plot_args(p: argparse.ArgumentParser) -> None:
    experiment_arg(p, nargs="*", help_="experiment ids (or unique prefixes, or `last`); two or more are overlaid")
    p.add_argument("--results", metavar="DIR", action="append",
                   help="an MLPerf result tree or a folder of result_*.txt (repeatable; overlaid with any experiments)")
    p.add_argument("--out", metavar="PNG", help="where to write the PNG (default: convergence.png in the experiment; "
                   "for an overlay or --results, convergence_<names>.png here)")


def export_args(p: argparse.ArgumentParser) -> None:
    experiment_arg(p)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--run", type=int, help="the run whose final weights to export (default: the first run that "
                                               "converged, else the first that finished)")
    which.add_argument("--checkpoint", metavar="PATH", help="export this checkpoint instead, with the experiment's model "
                       "shape and vocabulary: a phase-1 or converted TensorFlow checkpoint ({'model': state_dict}) or a "
                       "run checkpoint (step_N/)")
    p.add_argument("--to", required=True, metavar="DIR", help="the Hugging Face model folder to write (absent or empty)")
    p.add_argument("--force", action="store_true", help="replace DIR when it holds an earlier export")
    p.add_argument("--vocab", metavar="FILE", help="the vocab.txt the training data was tokenized with (default: the one "
                                                   "the dataset's prepared.json records)")
    p.add_argument("--cased", action="store_true", help="the vocabulary is cased: the tokenizer keeps case and accents "
                                                         "(default: as the dataset's prepared.json records, else uncased)")


def preflight_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster", required=True,
                   help="a cluster name (see `bertctl clusters`) or a YAML file").completer = complete_clusters
    p.add_argument("-o", dest="override", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override one value of the cluster file (repeatable)").completer = complete_keys
    p.add_argument("--threshold", type=float, default=None, metavar="N",
                   help="flag a node N %% or more below the median node on any measure "
                        "(default: the cluster's preflight.threshold, 10 unless it says otherwise)")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout instead of the tables")


# (verb, its cmd_* function, its help, its arguments), in --help's order; `data`, `convert-checkpoint`
# (add_data_verbs) and `balance` follow
VERBS = [
    ("clusters", cmd_clusters, "list the cluster files, one line each", no_args),
    ("render", cmd_render, "print the exact script `submit` would submit", cluster_args),
    ("submit", cmd_submit, "submit an experiment of NEXP runs; prints its id", submit_args),
    ("status", cmd_status, "experiments and their runs: state, progress, last eval accuracy", status_args),
    ("logs", cmd_logs, "print or follow a run's log", logs_args),
    ("cancel", cmd_cancel, "cancel an experiment's job(s)", experiment_arg),
    ("resume", cmd_resume, "continue an experiment's interrupted or failed runs from their latest checkpoints", resume_args),
    ("rerun", cmd_rerun, "submit an experiment's resolved configuration again, as a new experiment", rerun_args),
    ("diff", cmd_diff, "two experiments side by side: the configuration keys that differ, and results", diff_args),
    ("rehearsal", cmd_rehearsal, "judge a launch probe (submit --probe): every rank's devices, binding, shards", rehearsal_args),
    ("compliance-check", cmd_compliance_check,
     "judge runs with the official MLPerf tools: checker per log, olympic score, RCP", compliance_check_args),
    ("package", cmd_package, "write an experiment as an MLPerf submission package and run the package checker", package_args),
    ("plot", cmd_plot, "draw accuracy, loss and throughput of every run as a PNG; overlay experiments", plot_args),
    ("export", cmd_export, "write a run's weights as a Hugging Face model folder; prints its path", export_args),
    ("preflight", cmd_preflight, "measure every node, flag the slow ones, predict the time to train", preflight_args),
]

# ---- shell completion (argcomplete): `eval "$(register-python-argcomplete bertctl)"`

def complete_clusters(prefix: str, **_) -> list[str]:
    from orchestrator.config.clusters import cluster_files

    return [name for name in cluster_files() if name.startswith(prefix)]


def complete_experiments(prefix: str, **_) -> list[str]:
    from orchestrator import experiments

    try:
        return [e.id for e in reversed(experiments.load_all()) if e.id.startswith(prefix)] + ["last"]
    except Exception:  # completion must never print a traceback into the user's shell
        return []


def complete_keys(prefix: str, **_) -> list[str]:
    """`-o` keys of the cluster schema, completed one level at a time (`run.` -> `run.optim.` ...)."""
    from orchestrator.config.clusters import ClusterConfig
    from orchestrator.config.configfile import schema_keys

    key = prefix.partition("=")[0]
    return [k for k in schema_keys(ClusterConfig) if k.startswith(key)]


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _run_count(text: str) -> int:
    from orchestrator.experiments import MAX_NEXP  # why this bound: see there

    value = _positive(text)
    if value > MAX_NEXP:
        raise argparse.ArgumentTypeError(f"at most {MAX_NEXP} runs per experiment (MLPerf BERT needs 10)")
    return value


def say_line(text: str) -> None:
    """One line on stderr, whatever the offending value contained (newlines, lone surrogates)."""
    line = "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in text)
    print(line.encode("utf-8", "backslashreplace").decode("utf-8"), file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["balance"]:
        return cmd_balance(argv[1:])
    parser = build_parser()
    if not argv:  # `bertctl` alone: what it can do, by task
        parser.print_help()
        return 0
    if "_ARGCOMPLETE" in os.environ:  # only when the shell asks for completions: keep --help instant
        import argcomplete

        argcomplete.autocomplete(parser)
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except UserError as e:
        # one line, whatever the offending value contained
        say_line(f"bertctl: error: {e}")
        return 2
    except WorkFailed as e:
        say_line(f"bertctl: {e}")
        return 1
    except KeyboardInterrupt:
        print("bertctl: interrupted", file=sys.stderr)
        return 130
