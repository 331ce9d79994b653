"""What a process costs before it does any work: the floor under CI's time (issue 38).

    python benchmarks/process_startup.py [--repeats 5]

The test suite starts about two thousand processes (a bulk pass on 2026-11-28, counted at each
process's exit: ~93 trainers, ~280 bertctl calls, ~440 runs of the official checker), and on CI's two
cores CPU is what the suite waits for. Each line below starts fresh interpreters of this environment's
Python, `--repeats` times, and prints the median CPU-seconds (user + system, the process and its
children) and wall seconds, one process at a time on an otherwise idle machine:

- the interpreter alone, then `import torch`, then torch plus torch._dynamo: every process that builds
  a torch.optim optimizer imports torch._dynamo (Optimizer.add_param_group is wrapped by
  torch._disable_dynamo, which imports it on its first call);
- the trainer's imports, and the trainer's first step of work that needs torch: a model and its LAMB;
- `bertctl status` on an empty $BERTCTL_HOME, `bertctl --help`, and the official compliance checker's
  `--help` (what each of its per-log processes pays before reading the log).
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

BUILD_OPTIMIZER = """
import torch
from trainer.config import ModelConfig, OptimConfig
from trainer.model.bert import BertForPreTraining
from trainer.optim import build_optimizer
model = BertForPreTraining(ModelConfig(num_layers=2, hidden_size=128, num_heads=2, intermediate_size=512, vocab_size=8192))
build_optimizer(model, OptimConfig(name="lamb", lr=1e-2, max_steps=10), False, "cpu")
"""

CASES = {
    "python -c pass": ["-c", "pass"],
    "import torch": ["-c", "import torch"],
    "import torch, torch._dynamo": ["-c", "import torch, torch._dynamo"],
    "import trainer.loop.train (the trainer's modules)": ["-c", "import trainer.loop.train"],
    "a 2-layer BERT and its LAMB (imports torch._dynamo)": ["-c", BUILD_OPTIMIZER],
    "bertctl --help": ["-m", "orchestrator", "--help"],
    "bertctl status (no experiments)": ["-m", "orchestrator", "status"],
    "official compliance checker --help": ["-m", "mlperf_logging.compliance_checker", "--help"],
}


def cost(args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(CPU-seconds, wall seconds) of one fresh process running `python ARGS`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run([sys.executable, *args], cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    import torch

    print(f"# benchmarks/process_startup.py on {platform.node()}: {platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"# median of {args.repeats} fresh processes each; PYTHONDONTWRITEBYTECODE="
          f"{os.environ.get('PYTHONDONTWRITEBYTECODE', '(unset)')}")
    with tempfile.TemporaryDirectory(prefix="bertctl-startup-") as home:
        env = {**os.environ, "BERTCTL_HOME": home}
        for name, case in CASES.items():
            cost(case, env)  # once unmeasured: bytecode written, files in the page cache
            runs = [cost(case, env) for _ in range(args.repeats)]
            cpu = statistics.median(c for c, _ in runs)
            wall = statistics.median(w for _, w in runs)
            print(f"{name:55s} {cpu:6.2f} CPU-s {wall:6.2f} s wall")


if __name__ == "__main__":
    main()
