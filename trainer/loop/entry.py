"""`python -m trainer`'s front door, torch-free: the arguments, the run configuration checked, and the
--once skip, before the run (trainer/loop/train.py::train) imports torch. A mistyped run.yaml or a
phase already built answers in a fraction of a second instead of after torch's start-up (2-5 CPU-seconds)."""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
from pathlib import Path

from trainer.config.paths import expand_path
from trainer.config.regular import require_regular
from trainer.loop.run_args import RunArgs, fail

# what an OSError on a path of the user's (output folder, final model) means when it cannot take the run's files
UNWRITABLE = {errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EDQUOT, errno.ENOTDIR, errno.ENOENT, errno.EISDIR}


class OneLineParser(argparse.ArgumentParser):
    """argparse, with a bad argument said in one line (argparse adds its usage: two)."""

    def error(self, message: str):
        raise SystemExit(fail(f"{self.prog}: {message}"))


def whole_number(text: str) -> int:
    """A whole number from 0 (a run index, a seed): `-1` is refused here, not a traceback in numpy's seeding."""
    if not text.isascii() or not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"must be a whole number from 0, got {text[:40]!r}")
    return int(text)


def parse_args(argv: list[str] | None) -> RunArgs:
    parser = OneLineParser(prog="python -m trainer", description="One rank of a BERT pretraining run.")
    parser.add_argument("--config", required=True, help="run.yaml written by bertctl")
    parser.add_argument("--out", help="output folder (default: the config's folder)")
    parser.add_argument("--run-index", type=whole_number, default=0, help="run N of an experiment: writes result_N.txt")
    parser.add_argument("--seed", type=whole_number, help="default: train.seed + run index")
    parser.add_argument("--once", action="store_true",
                        help="skip the run when checkpoint.final_model already exists (phase 1, built once per machine)")
    ns = parser.parse_args(argv)
    return RunArgs(config=ns.config, out=ns.out or str(Path(ns.config).parent), run_index=ns.run_index, seed=ns.seed,
                   once=ns.once)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import yaml
    from pydantic import ValidationError

    from trainer.config import RunConfig, first_problem, load_run_config

    try:  # a FIFO or a folder as the config is one OSError, never a block (trainer/config/regular.py)
        cfg = load_run_config(str(require_regular(args.config)))
    except FileNotFoundError:
        return fail(f"{args.config}: run configuration not found")
    except OSError as e:  # NotRegularFile's strerror says what it is instead; or unreadable
        return fail(f"{args.config}: {e.strerror}")
    except ValidationError as e:
        key, message = first_problem(e, RunConfig)
        return fail(f"{args.config}: {key}: {message}")
    except (yaml.YAMLError, TypeError, UnicodeDecodeError) as e:
        return fail(f"{args.config}: not a run configuration ({str(e).splitlines()[0]})")
    if Path(args.out).exists() and not Path(args.out).is_dir():  # /dev/null, a FIFO, a file: no folder for the run
        return fail(f"{args.out}: --out must be a folder (the run writes results/, checkpoints/ and metrics/ in it)")
    try:
        with built_once(cfg.checkpoint.final_model, args.once) as needed:
            if not needed:
                return 0
            from trainer.loop.train import train  # torch from here on

            return train(cfg, args)
    except OSError as e:
        if e.errno not in UNWRITABLE:
            raise
        return fail(f"{e.filename or args.out}: {e.strerror}")  # a path of the user's that cannot take the run's files


@contextlib.contextmanager
def built_once(final_model: str | None, once: bool):
    """With --once: yields False when the final model exists, else trains under a lock on it, so two
    jobs on one machine never build it twice (the second waits, then finds it)."""
    if not once or not final_model:
        yield True
        return
    path = Path(expand_path(final_model))
    if path.exists():
        print(f"{path} exists: skipped (delete it to train again)", flush=True)
        yield False
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            print(f"{path} was built meanwhile: skipped", flush=True)
            yield False
        else:
            yield True
