#!/bin/bash
# Rendered by bertctl 0.1.0 from clusters/local.yaml
# local: this machine (local executor, CPU), small BERT on the embedded sample dataset
# 1 node(s) x 1 task(s) = 1 rank(s); 2 run(s), seeds 0, 1
# Submit and track:  bertctl submit --cluster local --nexp 2
# By hand:  bash <this file>   (run.yaml, results/, logs/ and runs/ are written next to it)
set -euo pipefail

EXP_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NEXP=2
SEEDS=(0 1)
export EXP_DIR
export PYTHON=${BERTCTL_PYTHON:-python3}
export BERTCTL_HOME=${BERTCTL_HOME:-$HOME/.bertctl}
# this shell's pid: every rank watches it and stops (checkpointing) when it is killed (trainer/loop/lifeline.py)
export BERTCTL_JOB_PID=$$
# the job's own exit status, for `bertctl status` (there is no scheduler to ask)
trap 'echo $? > "$EXP_DIR/job.exit"' EXIT
# SIGTERM to the job (`bertctl cancel`, a kill of its process group): the ranks checkpoint and stop, so the
# run is interrupted and `bertctl resume` continues it; this shell outlives them to record that, then stops
STOPPING=0
trap 'STOPPING=1' TERM

# ---- node environment (exported to every rank)
# (none configured)

mkdir -p "$EXP_DIR/results" "$EXP_DIR/logs" "$EXP_DIR/runs"

# ---- the resolved run configuration every rank reads: the whole recipe
cat > "$EXP_DIR/run.yaml" <<'BERTCTL_RUN_YAML_{digest}'
model:
  num_layers: 2
  hidden_size: 128
  num_heads: 2
  intermediate_size: 512
  vocab_size: 8192
  hidden_dropout: 0.0
  attention_dropout: 0.0
data:
  train_dir: $BERTCTL_HOME/datasets/sample/train
  eval_dir: $BERTCTL_HOME/datasets/sample/eval
  num_workers: 1
  eval_samples: 500
optim:
  lr: 0.02
  max_steps: 500
train:
  batch_size: 16
  global_batch_size: 16
  eval_batch_size: 100
  max_samples_termination: 8000
  target_accuracy: 0.13
  eval_every_samples: 800
  eval_start_samples: 800
  init_checkpoint: $BERTCTL_HOME/datasets/sample/phase1_checkpoint/model.pt
balance:
  stratified: true
runtime:
  unpad: true
  num_threads: 2
mlperf:
  division: open
  status: research
  platform: 1xCPU
BERTCTL_RUN_YAML_{digest}


# A preparatory step: its output goes to logs/NAME.log, its exit code to runs/NAME.exit.
step() {
  local name=$1 rc
  shift
  set +e
  "$@" 2>&1 | tee -a "$EXP_DIR/logs/$name.log"
  rc=${PIPESTATUS[0]}
  set -e
  echo "$rc" > "$EXP_DIR/runs/$name.exit"
  return "$rc"
}

# ---- phase 1, trained once per machine: it writes the checkpoint the runs start from
cat > "$EXP_DIR/phase1.yaml" <<'BERTCTL_PHASE1_YAML_{digest}'
model:
  num_layers: 2
  hidden_size: 128
  num_heads: 2
  intermediate_size: 512
  vocab_size: 8192
  hidden_dropout: 0.0
  attention_dropout: 0.0
data:
  train_dir: $BERTCTL_HOME/datasets/sample/train_128
  eval_dir: $BERTCTL_HOME/datasets/sample/eval
  max_seq_length: 128
  max_predictions_per_seq: 20
  num_workers: 1
  eval_samples: 1000
optim:
  lr: 0.01
  warmup_steps: 20
  max_steps: 200
train:
  batch_size: 32
  global_batch_size: 32
  eval_batch_size: 100
  max_samples_termination: 6400
  target_accuracy: 0.99
  eval_every_samples: 6400
  log_every_steps: 100
runtime:
  num_threads: 2
checkpoint:
  final_model: $BERTCTL_HOME/datasets/sample/phase1_checkpoint/model.pt
mlperf:
  division: open
  status: research
  platform: 1xCPU
BERTCTL_PHASE1_YAML_{digest}

# ---- prerequisites, built once per machine (each step returns at once when its result exists)
step prepare "$PYTHON" -m orchestrator data prepare --dataset sample
step phase1 "$PYTHON" -u -m trainer --config "$EXP_DIR/phase1.yaml" --out "$EXP_DIR/phase1" --once

# ---- how this machine runs one run's ranks (used by run_one below)
WHERE=""
CONTAINER=()
on_every_node() { "$@"; }  # this machine is the only node
launch_ranks() {  # run $1 with seed $2: 1 rank here
  export BERTCTL_RUN_INDEX=$1 BERTCTL_SEED=$2
  "$PYTHON" -u -m trainer --config "$EXP_DIR/run.yaml" --out "$EXP_DIR" --run-index "$BERTCTL_RUN_INDEX" --seed "$BERTCTL_SEED"
}
requeue_run() { return 1; }  # no scheduler to hand it back to: `bertctl resume` continues it

# One MLPerf run: clear caches, log cache_clear once per node, then all ranks. A run that finished is
# skipped; a run that saved a checkpoint on SIGUSR2/SIGTERM (exit 75) is requeued where the
# scheduler can, else marked interrupted for `bertctl resume`. (Called as `run_one || ...`, where bash
# ignores set -e: every step checks its own status.)
# The ranks' output into the run's log. tee ignores SIGTERM: a TERM to the whole job (`bertctl cancel`,
# scancel) reaches the ranks, which checkpoint and say so as they stop; a tee it killed would cut their
# output, and them, on SIGPIPE, mid-checkpoint.
keep_log() { trap '' TERM; exec tee -a "$1"; }
run_one() {
  local i=$1 seed=${SEEDS[$1]}
  local result="$EXP_DIR/results/result_$i.txt" log="$EXP_DIR/logs/run_$i.log"
  if [ -e "$EXP_DIR/runs/$i.exit" ]; then echo "run $i finished earlier (exit $(cat "$EXP_DIR/runs/$i.exit")): skipped"; return 0; fi
  rm -f "$EXP_DIR/runs/$i.interrupted"
  echo "=== run $i of $NEXP (seed $seed)$WHERE, $(date -Is)" | tee -a "$log"
  if [ ! -e "$EXP_DIR/runs/$i.started" ]; then
    rm -f "$result"
    # (one BLAS thread: mlperf_logging imports numpy, whose OpenBLAS would start one per core on every node)
    on_every_node "${CONTAINER[@]}" env OPENBLAS_NUM_THREADS=1 "$PYTHON" -m trainer.mlperf cache-clear --file "$result" ||
      { echo "error: could not log cache_clear to $result" | tee -a "$log"; return 1; }
    touch "$EXP_DIR/runs/$i.started"
  fi
  set +e
  # (the launching subshell outlives a SIGTERM too, to hand on the ranks' own exit status)
  { trap ':' TERM; launch_ranks "$i" "$seed"; } 2>&1 | keep_log "$log"
  local rc=${PIPESTATUS[0]}
  set -e
  if [ "$rc" -eq 75 ]; then
    requeue_run "$i" | tee -a "$log" && exit 0
    echo "=== run $i saved a checkpoint and stopped: \`bertctl resume\` continues it, $(date -Is)" | tee -a "$log"
    echo "$rc" > "$EXP_DIR/runs/$i.interrupted"
    return "$rc"
  fi
  echo "=== run $i exited with $rc, $(date -Is)" | tee -a "$log"
  echo "$rc" > "$EXP_DIR/runs/$i.exit"
  return "$rc"
}

# The runs, one after another; an interrupted run stops the loop (the machine is going away, or
# someone asked it to stop): the rest wait for `bertctl resume`.
failed=0
for ((i = 0; i < NEXP; i++)); do
  rc=0
  run_one "$i" || rc=$?
  [ "$rc" -eq 75 ] && { echo "run $i interrupted: stopping here"; exit 75; }
  [ "${STOPPING:-0}" -eq 1 ] && { echo "SIGTERM: stopping after run $i"; exit 143; }
  [ "$rc" -eq 0 ] || failed=$((failed + 1))
done
echo "$((NEXP - failed)) of $NEXP run(s) succeeded"
[ "$failed" -eq 0 ]
