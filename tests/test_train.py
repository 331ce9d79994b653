"""The trainer end to end on CPU: it learns, its MLPerf log passes the official checker, 2 gloo
ranks reproduce 1 rank, a run interrupted by SIGUSR2 resumes to the same losses, bad input is one line."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from synthetic import CLOSED, tiny_run_config

from trainer.mlperf import log_cache_clear

REPO = Path(__file__).resolve().parent.parent


def trainer(*args: str, ranks: int = 1, **kw) -> subprocess.CompletedProcess:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"] if ranks > 1 \
        else [sys.executable]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run([*launcher, "-m", "trainer", *args], capture_output=True, text=True, env=env, timeout=300, **kw)


def losses(out: Path, run: int = 0) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "metrics" / f"run_{run}.jsonl").read_text().splitlines()]


def checker(log: Path, ruleset: str = "5.0.0", tmp: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "training",
                           "--ruleset", ruleset, "--log_output", str((tmp or log.parent) / "cc.log"), str(log)],
                          capture_output=True, text=True)


@pytest.fixture(scope="module")
def converged_run(tmp_path_factory):
    """A tiny model trained to the 0.720 target on the synthetic data, as the launcher runs it."""
    tmp = tmp_path_factory.mktemp("converged")
    config = tiny_run_config(tmp, runtime={"num_threads": 1}, **CLOSED)
    out = tmp / "out"
    log_cache_clear(out / "results" / "result_0.txt")  # the launcher's part
    proc = trainer("--config", str(config), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out / "results" / "result_0.txt", proc


def test_tiny_run_reaches_the_target_and_the_official_checker_says_success(converged_run, tmp_path):
    log, proc = converged_run
    assert "run_stop: success" in proc.stdout
    result = checker(log, tmp=tmp_path)
    assert result.returncode == 0 and result.stderr.strip().endswith("INFO - SUCCESS"), result.stderr[-1500:]
    events = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in log.read_text().splitlines()]
    keys = [e["key"] for e in events]
    assert keys[:3] == ["cache_clear", "init_start", "submission_benchmark"]
    assert keys.index("submission_division") < keys.index("init_stop") < keys.index("run_start") < keys.index("block_start")
    assert keys[-2:] == ["train_samples", "run_stop"] and events[-1]["metadata"]["status"] == "success"
    accuracies = [e for e in events if e["key"] == "eval_accuracy"]
    assert accuracies[-1]["value"] >= 0.72
    assert [e["metadata"]["epoch_num"] for e in accuracies] == [128 * (i + 1) for i in range(len(accuracies))]  # samples
    assert all(e["metadata"]["file"].startswith("trainer/") for e in events)  # no machine paths
    logged = {e["key"]: e["value"] for e in events}
    assert logged["submission_division"] == "closed" and logged["opt_name"] == "lamb" and logged["opt_lamb_epsilon"] == 1e-6


@pytest.mark.parametrize("key", ["opt_lamb_epsilon", "submission_division", "run_stop"])
def test_a_log_missing_a_required_key_fails_with_the_checkers_message(converged_run, tmp_path, key):
    log, _ = converged_run
    broken = tmp_path / "result_0.txt"
    broken.write_text("".join(line for line in log.read_text().splitlines(keepends=True) if f'"key": "{key}"' not in line))
    result = checker(broken, tmp=tmp_path)
    assert result.returncode == 1 and "ERROR - FAILED" in result.stderr
    expected = {"opt_lamb_epsilon": "Required EXACTLY_ONE occurrence of 'opt_lamb_epsilon' but found 0",
                "submission_division": "Required EXACTLY_ONE occurrence of 'submission_division' but found 0",
                "run_stop": "Required EXACTLY_ONE occurrence of 'run_stop' but found 0"}[key]
    assert expected in result.stderr


@pytest.mark.slow
def test_two_gloo_ranks_give_the_same_losses_as_one(tmp_path):
    # clipping after the allreduce sees the same gradient whatever the rank count (local clipping
    # does not, by design: each rank clips its own share)
    fixed = dict(optim={"max_steps": 25, "clip": "after_allreduce"}, train={"target_accuracy": 0.99}, mlperf={"division": "open"},
                 model={"hidden_dropout": 0.0, "attention_dropout": 0.0}, runtime={"num_threads": 1})
    one = tiny_run_config(tmp_path / "one", world_size=1, batch_size=8, data={"streams": 2}, **fixed)
    two = tiny_run_config(tmp_path / "two", world_size=2, batch_size=4, data={"streams": 2}, **fixed)
    single = trainer("--config", str(one), "--out", str(tmp_path / "one" / "out"))
    double = trainer("--config", str(two), "--out", str(tmp_path / "two" / "out"), ranks=2)
    assert single.returncode == 0, single.stderr[-2000:]
    assert double.returncode == 0, double.stderr[-2000:]
    a, b = losses(tmp_path / "one" / "out"), losses(tmp_path / "two" / "out")
    assert len(a) == len(b) == 25
    assert a[-1] < a[0] - 0.1  # it learned something
    for x, y in zip(a, b):
        assert y == pytest.approx(x, rel=1e-5)


@pytest.mark.slow
def test_sigusr2_checkpoints_and_resuming_reproduces_the_uninterrupted_losses(tmp_path):
    fixed = dict(optim={"max_steps": 40}, train={"target_accuracy": 0.99, "eval_every_samples": 80},
                 mlperf={"division": "open"}, runtime={"num_threads": 1})
    straight = tiny_run_config(tmp_path / "straight", **fixed)
    interrupted = tiny_run_config(tmp_path / "interrupted", **fixed)
    reference = trainer("--config", str(straight), "--out", str(tmp_path / "straight" / "out"))
    assert reference.returncode == 0, reference.stderr[-2000:]

    out = tmp_path / "interrupted" / "out"
    log_cache_clear(out / "results" / "result_0.txt")  # the launcher's part, once: a requeue keeps the log
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "trainer", "--config", str(interrupted), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    metrics = out / "metrics" / "run_0.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.exists() and len(metrics.read_text().splitlines()) >= 12):
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR2)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 75, stderr[-2000:]
    assert "checkpoint saved at update" in stdout
    saved = int((out / "checkpoints" / "run_0" / "latest").read_text().removeprefix("step_"))
    assert 12 <= saved < 40

    resumed = trainer("--config", str(interrupted), "--out", str(out))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resumed at update {saved}" in resumed.stdout
    assert losses(out) == losses(tmp_path / "straight" / "out")  # bit for bit
    log = out / "results" / "result_0.txt"  # one log across the requeue: init phase once, then both halves
    keys = [json.loads(line.split(":::MLLOG ", 1)[1])["key"] for line in log.read_text().splitlines()]
    assert [keys.count(k) for k in ("init_start", "global_batch_size", "run_start", "run_stop")] == [1, 1, 1, 1]
    result = checker(log, tmp=tmp_path)
    assert result.returncode == 0 and result.stderr.strip().endswith("INFO - SUCCESS"), result.stderr[-1500:]


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    config = tiny_run_config(tmp_path)
    raw = yaml.safe_load(config.read_text())

    def run_with(**changes):
        cfg = json.loads(json.dumps(raw))
        for key, value in changes.items():
            section, field = key.split("__")
            cfg.setdefault(section, {})[field] = value
        path = tmp_path / "bad.yaml"
        path.write_text(yaml.safe_dump(cfg))
        proc = trainer("--config", str(path), "--out", str(tmp_path / "out"))
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-1500:]
        return lines[0]

    assert "training data folder not found" in run_with(data__train_dir=str(tmp_path / "nowhere"))
    assert "runtime.device is cuda but this machine has no usable CUDA device" in run_with(runtime__device="cuda")
    assert "optim.lr: Input should be greater than 0" in run_with(optim__lr=-1)
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "part_00000.hdf5").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 100)
    assert "part_00000.hdf5: unreadable HDF5 shard" in run_with(data__train_dir=str(corrupt))
    from trainer.checkpoints.run import write_model
    from trainer.config import ModelConfig
    from trainer.model.bert import BertForPreTraining

    narrower = BertForPreTraining(ModelConfig(**{**raw["model"], "hidden_size": 32, "intermediate_size": 64}))
    wrong = write_model(tmp_path / "wrong.pt", narrower)  # a checkpoint of another model size
    message = run_with(train__init_checkpoint=str(wrong))
    assert "wrong.pt: tensor bert.embeddings.word_embeddings.weight has shape (64, 32), the model needs (64, 64)" in message
    world = trainer("--config", str(config), "--out", str(tmp_path / "out"), ranks=2)
    assert world.returncode != 0 and "made for 1 rank(s) (world_size) but the launcher started 2" in world.stderr


def test_once_skips_a_phase_whose_final_model_exists(tmp_path):
    final = tmp_path / "phase1" / "model.pt"
    config = tiny_run_config(tmp_path, checkpoint={"final_model": str(final)}, optim={"max_steps": 3},
                             train={"target_accuracy": 0.99}, mlperf={"division": "open"})
    built = trainer("--config", str(config), "--out", str(tmp_path / "out"), "--once")
    assert built.returncode == 0 and final.exists(), built.stderr[-1500:]
    assert set(torch.load(final, weights_only=True)) == {"model"}
    stamp = final.stat().st_mtime_ns
    again = trainer("--config", str(config), "--out", str(tmp_path / "out"), "--once")
    assert again.returncode == 0 and "exists: skipped" in again.stdout and final.stat().st_mtime_ns == stamp


def test_a_bad_run_yaml_and_a_built_phase_answer_before_torch_loads(tmp_path):
    """`python -m trainer` checks run.yaml and --once first (trainer/loop/entry.py): a mistyped key, or a
    phase 1 already built, costs no torch start-up (2-5 CPU-seconds a process)."""
    final = tmp_path / "phase1" / "model.pt"
    final.parent.mkdir()
    final.write_bytes(b"built earlier")
    good = tiny_run_config(tmp_path, checkpoint={"final_model": str(final)})
    bad = tmp_path / "bad.yaml"
    bad.write_text(good.read_text() + "foo: 1\n")
    probe = "import sys; from trainer.loop.entry import main; code = main(sys.argv[1:]); print('torch' in sys.modules); sys.exit(code)"
    for config, once, code, said in ((bad, [], 2, "foo: unknown key"), (good, ["--once"], 0, "exists: skipped")):
        proc = subprocess.run([sys.executable, "-c", probe, "--config", str(config), "--out", str(tmp_path / "out"), *once],
                              capture_output=True, text=True, cwd=REPO, timeout=120)
        assert proc.returncode == code and said in proc.stdout + proc.stderr, proc.stderr[-1500:]
        assert proc.stdout.strip().splitlines()[-1] == "False"  # torch was never imported
    assert not (tmp_path / "out").exists()


def test_special_files_and_negative_numbers_are_one_line_before_torch_loads(tmp_path):
    """A FIFO as --config once blocked forever, a folder or a negative --seed / --run-index was a traceback, and
    /dev/null as --out was blamed on the checkpoint pointer under it: each is one line and exit 2, in one process
    that never imports torch (a FIFO that blocked would time out)."""
    good = tiny_run_config(tmp_path)
    fifo = tmp_path / "run.fifo"
    os.mkfifo(fifo)
    out = ["--out", str(tmp_path / "out")]
    cases = [(["--config", str(fifo), *out], f"{fifo}: is a FIFO, not a regular file"),
             (["--config", str(tmp_path), *out], f"{tmp_path}: is a directory, not a regular file"),
             (["--config", "/dev/zero", *out], "/dev/zero: is a character device, not a regular file"),
             (["--config", str(good), "--seed", "-7", *out], "argument --seed: must be a whole number from 0, got '-7'"),
             (["--config", str(good), "--run-index", "-1", *out], "argument --run-index: must be a whole number from 0, got '-1'"),
             (["--config", str(good), "--seed", "\u0661", *out], "argument --seed: must be a whole number from 0"),
             (["--config", str(good), "--out", "/dev/null"], "/dev/null: --out must be a folder"),
             (["--config", str(good), "--out", str(fifo)], f"{fifo}: --out must be a folder")]
    probe = ("import contextlib, io, json, sys\nfrom trainer.loop.entry import main\nanswers = []\n"
             "for argv in json.loads(sys.argv[1]):\n    err = io.StringIO()\n    with contextlib.redirect_stderr(err):\n"
             "        try:\n            code = main(argv)\n        except SystemExit as e:\n            code = e.code\n"
             "    answers.append([code, err.getvalue()])\nprint(json.dumps([answers, 'torch' in sys.modules]))")
    proc = subprocess.run([sys.executable, "-c", probe, json.dumps([argv for argv, _ in cases])], capture_output=True,
                          text=True, cwd=REPO, timeout=60)
    answers, torch_loaded = json.loads(proc.stdout)
    for (argv, said), (code, err) in zip(cases, answers):
        assert code == 2 and err.count("\n") == 1 and err.startswith("error: ") and said in err, (argv, err)
    assert not torch_loaded and not (tmp_path / "out").exists()


@pytest.mark.parametrize("limit", ["max_steps", "max_samples"])
def test_packed_steps_read_their_sequence_counts_only_where_a_decision_needs_them(tmp_path, monkeypatch, limit):
    """With packing a step's global sequence count is only known on the device; reading it back
    every step would stall the GPU's queue. The loop reads the unread counts only when an
    evaluation or the sample limit may be due (or to report), and still evaluates and stops at the
    same steps as exact per-step counting would: at max_steps, or at a sample limit that no step
    boundary hits exactly."""
    from gloo import free_port

    from trainer.config import load_run_config
    from trainer.loop.entry import RunArgs
    from trainer.loop.state import UnreadSamples
    from trainer.loop.train import Trainer
    from trainer.parallel import distributed

    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    config = tiny_run_config(tmp_path, balance={"packing": True, "pack_sequences": 2, "pack_average": 2, "pack_window": 64},
                             runtime={"unpad": True}, optim={"max_steps": 30 if limit == "max_steps" else 1000},
                             train={"global_batch_size": 16, "log_every_steps": 1000, "eval_every_samples": 90,
                                    "max_samples_termination": 100_000 if limit == "max_steps" else 301,
                                    "target_accuracy": 0.99})
    trainer = Trainer(load_run_config(str(config)), RunArgs(config=str(config), out=str(tmp_path / "out")))
    per_step, evaluated_at, reads = [], [], []
    next_micro_batches, evaluate, read = trainer.next_micro_batches, trainer.evaluate, UnreadSamples.read

    def counting_batches():
        batches = next_micro_batches()
        per_step.append(sum(b.num_sequences for b in batches))
        return batches

    def recording_evaluate():
        evaluated_at.append(trainer.state.samples)
        evaluate()

    def counted_read(self):
        reads.append(len(self.counts))
        return read(self)

    monkeypatch.setattr(trainer, "next_micro_batches", counting_batches)
    monkeypatch.setattr(trainer, "evaluate", recording_evaluate)
    monkeypatch.setattr(UnreadSamples, "read", counted_read)
    try:
        assert trainer.run() == 0
    finally:
        trainer.close()
        distributed.close()
    total, next_eval, expected_evals, steps = 0, 90, [], 0
    for count in per_step:  # the loop's rules, with exact counts after every step
        total, steps = total + count, steps + 1
        if total >= next_eval:
            expected_evals.append(total)
            next_eval += 90
        if total >= 301 and limit == "max_samples":
            break
    assert steps == len(per_step) and trainer.state.samples == total == sum(per_step)
    assert len(per_step) == 30 if limit == "max_steps" else total - per_step[-1] < 301 <= total
    assert evaluated_at == expected_evals and len(expected_evals) >= 3
    assert sum(reads) == len(per_step) and len([r for r in reads if r]) < len(per_step) // 2  # many steps per read


def test_unread_sample_counts_add_up_exactly_past_float32s_integers():
    """The per-step counts are float32 (exact); their sum must not be: 257 x 65,535 = 16,842,495
    is odd and above 2**24, where float32 keeps only even integers."""
    from trainer.loop.state import UnreadSamples

    unread = UnreadSamples(per_step=65_536)
    for _ in range(257):
        unread.add(torch.tensor(65_535.0))
    assert unread.bound == 257 * 65_536 and unread.read() == 16_842_495 and unread.bound == 0
