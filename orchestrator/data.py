"""`bertctl data prepare|verify|list` and `bertctl convert-checkpoint`: the control-plane side.

The manifest (datasets/<name>.yaml) is loaded, overridden with `-o key.path=value` and validated
here (trainer.config.DatasetManifest is torch-free); the work itself runs in trainer-side worker
processes, `python -m trainer.data.prepare`, so that this module never imports torch:

  locally     a pool of worker processes (--workers, default: one per core), stage after stage,
              one process per task, with a progress bar on a terminal and plain lines otherwise;
  on Slurm    one job array per stage, rendered from templates/data_prepare.sbatch.j2 and submitted
              with submitit, each stage depending on the previous one (afterok).

Both run the same tasks (`run --stage S --group J`), which write the same files. A worker reports
bad input as one line `error: <file>: <what>` and exit code 2; it is relayed as a UserError (exit 2),
a failure (exit 1) as WorkFailed.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from orchestrator import __version__, configfile, resources
from orchestrator.errors import UserError, WorkFailed
from trainer.config import DatasetManifest, PathError, expand_path

WORKER = ["-m", "trainer.data.prepare"]


# A validated manifest and where it came from.
LoadedManifest = configfile.LoadedFile


def manifest_files() -> dict[str, Path]:
    """Every known dataset by name; folders in $BERTCTL_DATASETS shadow shipped manifests."""
    return configfile.named_files("datasets")


def find_manifest(name: str) -> Path:
    return configfile.find_named_file("datasets", name, "dataset manifest", "--dataset")


def load_manifest(name: str, overrides: list[str] | tuple[str, ...] = ()) -> LoadedManifest:
    return configfile.load_named("datasets", name, overrides, DatasetManifest, "dataset", "--dataset")


# ---- talking to the workers

def worker_env() -> dict[str, str]:
    return {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}


def worker(args: list[str], where: str) -> subprocess.CompletedProcess:
    """Run a worker command to completion; its failure becomes UserError (exit 2) or WorkFailed."""
    proc = subprocess.run([sys.executable, *WORKER, *args], capture_output=True, text=True, env=worker_env())
    if proc.returncode not in (0,):
        raise worker_failure(proc.returncode, proc.stderr, where)
    return proc


def worker_failure(code: int, stderr: str, where: str) -> Exception:
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    if errors and code == 2:
        return UserError(errors[-1].removeprefix("error: "))
    if errors:
        return WorkFailed(f"{where} failed: {errors[-1].removeprefix('error: ')}")
    last = lines[-1] if lines else f"exit code {code}"
    return WorkFailed(f"{where} crashed (exit code {code}): {last}")


def write_manifest(loaded: LoadedManifest, folder: Path) -> Path:
    path = folder / "manifest.yaml"
    header = f"# resolved by bertctl {__version__} from {loaded.source}" + (
        f" with -o {' -o '.join(loaded.overrides)}" if loaded.overrides else "") + "\n"
    path.write_text(header.replace("\n", " ").rstrip() + "\n" + loaded.config.to_yaml(), encoding="utf-8")
    return path


def start(manifest_file: Path, force: bool) -> dict:
    """The worker's `start`: the root's state and the stages still to run."""
    args = ["start", "--manifest", str(manifest_file)] + (["--force"] if force else [])
    return json.loads(worker(args, "start").stdout)


# ---- bertctl data prepare

@dataclass
class Prepared:
    root: str
    state: str  # complete (nothing to do), built (locally), submitted (Slurm)
    job_ids: list[str]
    job_dir: Path | None = None


def prepare(loaded: LoadedManifest, cluster: str | None = None, workers: int | None = None, force: bool = False,
            wait: bool = False, say: Callable[[str], None] = lambda s: print(s, file=sys.stderr)) -> Prepared:
    check_inputs(loaded)
    slurm = None
    if cluster is not None:
        from orchestrator.clusters import load_cluster

        slurm = load_cluster(cluster)
        if slurm.config.executor != "slurm":
            slurm = None  # the local cluster: this machine
    if slurm is None:
        return prepare_locally(loaded, workers or os.cpu_count() or 1, force, say)
    return prepare_on_slurm(loaded, slurm, force, wait, say)


def check_inputs(loaded: LoadedManifest) -> None:
    """What can be said before any worker starts: inputs the manifest still needs."""
    m = loaded.config
    if m.source.kind != "python_stdlib":
        for split in [s for s in ("train", "eval") if any(o.split == s for o in m.outputs.values())]:
            if not getattr(m.source, split):
                what = "the training parts (a folder or a glob)" if split == "train" else "the eval file"
                raise UserError(f"not set: point it at {what} with -o source.{split}=PATH",
                                where=str(loaded.path), key=f"source.{split}")
    if m.source.kind == "text" and not m.vocab.file and not m.vocab.learn:
        raise UserError("not set: text sources need the vocabulary they are tokenized with: -o vocab.file=PATH",
                        where=str(loaded.path), key="vocab.file")
    ck = m.checkpoint
    if ck is not None and ck.tf_checkpoint and not ck.bert_config:
        raise UserError("not set: converting the checkpoint needs its bert_config.json: -o checkpoint.bert_config=PATH",
                        where=str(loaded.path), key="checkpoint.bert_config")


def prepare_locally(loaded: LoadedManifest, workers: int, force: bool, say) -> Prepared:
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bertctl-data-") as tmp:
        manifest_file = write_manifest(loaded, Path(tmp))
        plan = start(manifest_file, force)
        root = plan["root"]
        if not plan["stages"]:
            say(f"{loaded.config.name}: complete at {root} (bertctl data verify --dataset {loaded.config.name} checks it)")
            return Prepared(root, "complete", [])
        say(f"{loaded.config.name}: preparing at {root} with {workers} worker process(es)"
            + (" (continuing an interrupted build)" if plan["state"] == "partial" else ""))
        with progress_display(sys.stderr) as bar:
            for stage in plan["stages"]:
                run_stage_locally(manifest_file, stage["name"], stage["tasks"], workers, bar)
    say(summary(loaded, Path(root), time.perf_counter() - t0))
    return Prepared(root, "built", [])


def run_stage_locally(manifest_file: Path, stage: str, tasks: int, workers: int, bar) -> None:
    """The stage's tasks on `workers` long-lived worker processes (`serve`), each taking the next
    task as it finishes one; the first failure stops them all."""
    bar.begin(stage, tasks)
    queue = list(range(tasks))
    lock = threading.Lock()
    failed: list[Exception] = []
    procs: list[subprocess.Popen] = []

    def next_task() -> int | None:
        with lock:
            return queue.pop(0) if queue and not failed else None

    def drive(proc: subprocess.Popen, errors) -> None:
        while (index := next_task()) is not None:
            try:
                proc.stdin.write(f"{index}\n")
                proc.stdin.flush()
                line = proc.stdout.readline()
            except (BrokenPipeError, OSError):
                line = ""
            if not line:  # the worker stopped: bad input, a failure, or killed
                proc.stdin.close()
                code = proc.wait()
                errors.seek(0)
                stderr = errors.read()
                with lock:
                    if not failed:
                        failed.append(worker_failure(code, stderr, f"{stage} task {index}"))
                        for other in procs:
                            if other is not proc:
                                other.terminate()
                return
            bar.advance(stage, [json.loads(line)])
        proc.stdin.close()

    command = [sys.executable, *WORKER, "serve", "--manifest", str(manifest_file), "--stage", stage]
    # stderr to a file, not a pipe: a chatty worker must not block on a pipe nobody reads until the end
    error_files = [tempfile.TemporaryFile("w+") for _ in range(min(workers, tasks))]
    procs.extend(subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, text=True,
                                  env=worker_env()) for errors in error_files)
    try:
        threads = [threading.Thread(target=drive, args=(p, e)) for p, e in zip(procs, error_files)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for p in procs:
            if p.poll() is None:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
            p.stdout.close()
        for errors in error_files:
            errors.close()
    if failed:
        raise failed[0]
    bar.end(stage)


def summary(loaded: LoadedManifest, root: Path, seconds: float) -> str:
    try:
        record = json.loads((root / "prepared.json").read_text())
        counts = ", ".join(f"{name} {out['samples']}" for name, out in record["outputs"].items())
    except (OSError, ValueError, KeyError):
        counts = "?"
    return f"{loaded.config.name}: prepared at {root} in {seconds:.1f} s (samples: {counts})"


# ---- progress: a bar on a terminal, plain lines in batch logs

class progress_display:
    """Stage progress in tasks; a rich bar on a terminal, otherwise a line every 10 s and per stage."""

    PLAIN_EVERY_S = 10.0

    def __init__(self, stream):
        self.stream = stream
        self.tty = stream.isatty()
        self._rich = None
        self._task = None
        self._lock = threading.Lock()

    def __enter__(self):
        if self.tty:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._rich = Progress(TextColumn("{task.description:>9}"), BarColumn(), MofNCompleteColumn(),
                                  TextColumn("tasks"), TimeElapsedColumn(), console=Console(file=self.stream))
            self._rich.__enter__()
        return self

    def __exit__(self, *exc):
        if self._rich is not None:
            self._rich.__exit__(*exc)

    def begin(self, stage: str, total: int) -> None:
        self.stage, self.total, self.done, self.t0, self.last_line = stage, total, 0, time.perf_counter(), time.perf_counter()
        self.tokens = 0
        if self._rich is not None:
            self._task = self._rich.add_task(stage, total=total)

    def advance(self, stage: str, reports: list[dict]) -> None:
        with self._lock:
            self.done += 1
            self.tokens += sum(r.get("output_tokens", 0) for r in reports)
            if self._rich is not None:
                self._rich.update(self._task, completed=self.done)
            elif self.done < self.total and time.perf_counter() - self.last_line >= self.PLAIN_EVERY_S:
                self.last_line = time.perf_counter()
                print(f"  {stage}: {self.done}/{self.total} tasks, {self.last_line - self.t0:.0f} s", file=self.stream, flush=True)

    def end(self, stage: str) -> None:
        seconds = time.perf_counter() - self.t0
        rate = f", {self.tokens / seconds:,.0f} tokens/s" if self.tokens else ""
        if self._rich is None:
            print(f"  {stage}: {self.total} task(s) done in {seconds:.1f} s{rate}", file=self.stream, flush=True)


# ---- on Slurm: one job array per stage

def prepare_on_slurm(loaded: LoadedManifest, cluster, force: bool, wait: bool, say) -> Prepared:
    from orchestrator import submit as submission

    submission.require_slurm()
    job_dir = new_job_dir(loaded.config.name)
    manifest_file = write_manifest(loaded, job_dir)
    try:
        plan = start(manifest_file, force)
    except BaseException:
        shutil.rmtree(job_dir, ignore_errors=True)
        raise
    if not plan["stages"]:
        shutil.rmtree(job_dir, ignore_errors=True)
        say(f"{loaded.config.name}: complete at {plan['root']}")
        return Prepared(plan["root"], "complete", [])
    (job_dir / "logs").mkdir()
    names = [s["name"] for s in plan["stages"]]
    job_ids: list[str] = []
    for position, stage in enumerate(plan["stages"], start=1):
        script = render_stage(loaded, cluster, stage["name"], stage["tasks"], names, position,
                              after=job_ids[-1] if job_ids else None)
        (job_dir / f"{position}-{stage['name']}.sbatch").write_text(script)
        job_ids.append(submit_script(job_dir, script, cluster.config.container.kind))
    (job_dir / "jobs.json").write_text(json.dumps({"stages": names, "job_ids": job_ids, "root": plan["root"]}, indent=1))
    say(f"{loaded.config.name}: submitted {len(job_ids)} job array(s) ({', '.join(f'{n} {j}' for n, j in zip(names, job_ids))}); "
        f"scripts and logs in {job_dir}")
    if wait:
        wait_for_jobs(job_dir, names, job_ids, say)
        say(f"{loaded.config.name}: prepared at {plan['root']}")
    return Prepared(plan["root"], "submitted", job_ids, job_dir)


def new_job_dir(dataset: str) -> Path:
    folder = resources.bertctl_home() / "data-jobs" / f"{dataset}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
    folder.mkdir(parents=True)
    return folder


def array_groups(total: int, max_array_tasks: int) -> tuple[int, int]:
    """(array tasks, tasks per array task) so that there are at most `max_array_tasks` array tasks."""
    size = max(1, -(-total // max_array_tasks))
    return -(-total // size), size


def render_stage(loaded: LoadedManifest, cluster, stage: str, tasks: int, stages: list[str], position: int,
                 after: str | None) -> str:
    """The sbatch script of one stage: a pure function of its arguments."""
    from orchestrator.render import render_template

    c = cluster.config
    array_size, group_size = array_groups(tasks, loaded.config.prepare.array_tasks)
    return render_template(
        "data_prepare.sbatch.j2", version=__version__, source=loaded.source, overrides=list(loaded.overrides),
        dataset=loaded.config.name, stage=stage, stages=stages, position=position, tasks=tasks,
        array_size=array_size, group_size=group_size, after=after, c=c,
        sbatch_options=data_sbatch_options(c, loaded.config.name, stage, array_size, after),
        env=sorted(c.node.env.items()), mounts=",".join(f"{m.host}:{m.container}" for m in c.container.mounts),
        submit_command=shlex.join(["bertctl", "data", "prepare", "--dataset", loaded.config.name, "--cluster", c.name,
                                   *[w for o in loaded.overrides for w in ("-o", o)]]),
    )


def data_sbatch_options(c, dataset: str, stage: str, array_size: int, after: str | None) -> list[str]:
    """`#SBATCH` options of a data job: one CPU task per array element, the cluster's partition,
    account, time limit and extra flags (no GPUs, not exclusive)."""
    s = c.slurm
    opts = [
        ("job-name", f"data-{dataset}-{stage}"),
        ("array", f"0-{array_size - 1}"),
        ("ntasks", 1),
        ("cpus-per-task", c.resources.cpus_per_task or 1),
        ("partition", s.partition),
        ("account", s.account),
        ("time", s.time_limit),
        ("mem", s.mem if s.mem not in (None, "0") else None),
        ("output", f"logs/{stage}_%A_%a.out"),
        ("open-mode", "append"),
        ("dependency", f"afterok:{after}" if after else None),
        ("kill-on-invalid-dep", "yes" if after else None),
    ]
    lines = [f"--{k}={shlex.quote(str(v))}" for k, v in opts if v is not None]
    for flag in s.extra_sbatch:
        name, sep, value = flag.partition("=")
        lines.append(f"{name}={shlex.quote(value)}" if sep else name)
    return lines


def submit_script(job_dir: Path, script: str, container: str) -> str:
    from submitit.core.utils import FailedJobError

    from orchestrator.submit import ScriptSlurmExecutor, _environment

    (job_dir / "submitit").mkdir(exist_ok=True)
    executor = ScriptSlurmExecutor(job_dir / "submitit", script, job_dir)
    # without a container the job runs the Python that submitted it (sbatch passes the environment on)
    job_env = {"BERTCTL_PYTHON": sys.executable} if container == "none" else {}
    try:
        with _environment(job_env):
            return executor._submit_command("").job_id  # the command lives in our script
    except FailedJobError as e:
        raise UserError(f"sbatch refused the job: {str(e).strip().splitlines()[-1]}", where="sbatch") from None


def wait_for_jobs(job_dir: Path, stages: list[str], job_ids: list[str], say, poll_s: float = 2.0) -> None:
    """Until every stage's array has finished; a failed or cancelled stage is WorkFailed with its error."""
    from orchestrator import scheduler

    reported: dict[str, str] = {}
    while True:
        infos = scheduler.query_slurm(job_ids)
        for stage, job in zip(stages, job_ids):
            states = [i.state for key, i in infos.items() if key.split("_")[0] == job]
            if not states:
                continue
            summary = stage_state(states)
            if reported.get(stage) != summary:
                reported[stage] = summary
                say(f"  {stage} (job {job}): {summary}")
            if summary in ("FAILED", "CANCELLED", "TIMEOUT"):
                raise WorkFailed(f"stage {stage} (job {job}) {summary.lower()}: {first_error(job_dir, stage)}")
        if len(reported) == len(stages) and all(v == "COMPLETED" for v in reported.values()):
            return
        time.sleep(poll_s)


def stage_state(states: list) -> str:
    values = {s.value for s in states}
    for bad in ("FAILED", "TIMEOUT", "CANCELLED"):
        if bad in values:
            return bad
    if values == {"COMPLETED"}:
        return "COMPLETED"
    return "RUNNING" if "RUNNING" in values or "COMPLETED" in values else "PENDING"


def first_error(job_dir: Path, stage: str) -> str:
    for log in sorted((job_dir / "logs").glob(f"{stage}_*.out")):
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.startswith("error: ")]
        if lines:
            return f"{lines[-1].removeprefix('error: ')} (log: {log})"
    return f"see the logs in {job_dir / 'logs'}"


# ---- bertctl data verify / list, convert-checkpoint

def verify(loaded: LoadedManifest, as_json: bool = False, stats_files: int | None = None) -> tuple[int, str]:
    """(exit code, report): 0 when every check passes, 1 otherwise."""
    with tempfile.TemporaryDirectory(prefix="bertctl-data-") as tmp:
        manifest_file = write_manifest(loaded, Path(tmp))
        args = [sys.executable, *WORKER, "verify", "--manifest", str(manifest_file)]
        args += (["--json"] if as_json else []) + (["--stats-files", str(stats_files)] if stats_files else [])
        proc = subprocess.run(args, capture_output=True, text=True, env=worker_env())
    if proc.returncode not in (0, 1) or not proc.stdout.strip():  # failed checks come with a report; a crash without
        raise worker_failure(proc.returncode, proc.stderr, "verify")
    return proc.returncode, proc.stdout


def describe(path: Path) -> str:
    """One line for `bertctl data list`: name, source kind, outputs, description."""
    name = path.stem
    try:
        m = load_manifest(str(path)).config
    except UserError as e:
        return f"{name}\tinvalid\t{e}"
    return f"{name}\t{m.source.kind}\t{', '.join(m.outputs)}\t{m.description}"


def convert_checkpoint(tf_checkpoint: str, bert_config: str, output: str) -> str:
    out = Path(output).expanduser().resolve()
    try:
        worker_args = ["--tf-checkpoint", expand_path(tf_checkpoint), "--bert-config", expand_path(bert_config),
                       "--output", str(out)]
    except PathError as e:
        raise UserError(str(e)) from None
    proc = subprocess.run([sys.executable, "-m", "trainer.convert_checkpoint", *worker_args],
                          capture_output=True, text=True, env=worker_env())
    if proc.returncode != 0:
        raise worker_failure(proc.returncode, proc.stderr, "convert-checkpoint")
    return str(out)
