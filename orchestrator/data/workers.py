"""Talking to the trainer-side data workers (`python -m trainer.data.prepare`, `python -m
trainer.checkpoints.convert`), which do the work so that the control plane never imports torch.

A worker that fails writes its error as a JSON record to the file named in $BERTCTL_ERROR_FILE
(`exit_code`, `file`, `message`); exit code 2 is bad input (a UserError here, exit 2), any other a
failure (WorkFailed, exit 1). A worker that dies without a record (killed, crashed) is reported
with its exit code and the last line it wrote, as it wrote it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from orchestrator.errors import UserError, WorkFailed
from trainer.data.prepare.errors import ERROR_FILE_VARIABLE

WORKER = ["-m", "trainer.data.prepare"]


def worker_env(error_file: Path | None = None) -> dict[str, str]:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    if error_file is not None:
        env[ERROR_FILE_VARIABLE] = str(error_file)
    return env


def run_worker(args: list[str], where: str, module: list[str] = WORKER, ok_codes: tuple[int, ...] = (0,)
               ) -> subprocess.CompletedProcess:
    """Run a worker command to completion; its failure becomes UserError (exit 2) or WorkFailed."""
    with tempfile.TemporaryDirectory(prefix="bertctl-worker-") as tmp:
        error_file = Path(tmp) / "error.json"
        proc = subprocess.run([sys.executable, *module, *args], capture_output=True, text=True,
                              env=worker_env(error_file))
        if proc.returncode not in ok_codes:
            raise failure(proc.returncode, read_error(error_file), proc.stderr, where)
    return proc


def read_error(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def failure(code: int, record: dict | None, stderr: str, where: str) -> Exception:
    """The exception for a failed worker: from its error record, else from how it died."""
    if record is not None:
        message = f"{record['file']}: {record['message']}" if record.get("file") else record["message"]
        if record.get("exit_code") == 2:
            return UserError(message)
        return WorkFailed(f"{where} failed: {message}")
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    return WorkFailed(f"{where} crashed (exit code {code}): {lines[-1] if lines else 'no output'}")


def start(manifest_file: Path, force: bool) -> dict:
    """The worker's `start`: the root's state and the stages still to run."""
    args = ["start", "--manifest", str(manifest_file)] + (["--force"] if force else [])
    return json.loads(run_worker(args, "start").stdout)


def verify(manifest_file: Path, as_json: bool, stats_files: int | None) -> tuple[int, str]:
    """(exit code, report): 0 when every check passes, 1 otherwise."""
    args = ["verify", "--manifest", str(manifest_file)]
    args += (["--json"] if as_json else []) + (["--stats-files", str(stats_files)] if stats_files else [])
    proc = run_worker(args, "verify", ok_codes=(0, 1))
    if not proc.stdout.strip():
        raise WorkFailed(f"verify ended with exit code {proc.returncode} and no report")
    return proc.returncode, proc.stdout


def convert_checkpoint(tf_checkpoint: str, bert_config: str, output: Path) -> None:
    args = ["--tf-checkpoint", tf_checkpoint, "--bert-config", bert_config, "--output", str(output)]
    run_worker(args, "convert-checkpoint", module=["-m", "trainer.checkpoints.convert"])
