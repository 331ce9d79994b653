#!/bin/bash
# Rendered by bertctl 0.1.0 from clusters/ci_slurm.yaml
# ci_slurm: CI's 2-node local Slurm, 2 CPU ranks per node, gloo, group exchange + bucket clipping
# 2 node(s) x 2 task(s) = 4 rank(s); 2 run(s), seeds 0, 1
# Submit and track:  bertctl submit --cluster ci_slurm --nexp 2
# By hand:  cd into an empty folder on a filesystem every node sees, then: sbatch <this file>
#           (run.yaml, task.sh, results/, logs/ and runs/ are written next to where it was submitted)
#SBATCH --job-name=bert-ci_slurm
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --cpus-per-task=1
#SBATCH --partition=debug
#SBATCH --time=00:30:00
#SBATCH --output=%j_0_log.out
#SBATCH --signal=USR2@30
#SBATCH --open-mode=append
#SBATCH --requeue
set -euo pipefail

EXP_DIR=$PWD      # bertctl submits with --chdir=<experiment dir>
NEXP=2
SEEDS=(0 1)
export EXP_DIR
export PYTHON=${BERTCTL_PYTHON:-python3}
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_ADDR
NTASKS=$((SLURM_JOB_NUM_NODES * 2))

# ---- node environment (exported to every rank)
export OMP_NUM_THREADS=1

mkdir -p "$EXP_DIR/results" "$EXP_DIR/logs" "$EXP_DIR/runs"

# ---- the resolved run configuration every rank reads: the whole recipe
cat > "$EXP_DIR/run.yaml" <<'BERTCTL_RUN_YAML_{digest}'
world_size: 4
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
  num_workers: 0
  eval_samples: 500
optim:
  lr: 0.02
  max_steps: 500
  clip: bucket
train:
  batch_size: 4
  global_batch_size: 16
  eval_batch_size: 100
  max_samples_termination: 8000
  target_accuracy: 0.13
  eval_every_samples: 800
  eval_start_samples: 800
  init_checkpoint: $BERTCTL_HOME/datasets/sample/phase1_checkpoint/model.pt
balance:
  stratified: true
  exchange_padding: group
  group_size: 2
runtime:
  unpad: true
  nccl_warmup_steps: 2
  num_threads: 1
mlperf:
  division: open
  status: research
  platform: 2xCPU
BERTCTL_RUN_YAML_{digest}

# Drop the page cache (root, or passwordless sudo for sysctl), as the MLPerf rules ask before each run.
DROP_CACHES='sync && if [ "$(id -u)" -eq 0 ]; then /sbin/sysctl -q vm.drop_caches=3; else sudo -n /sbin/sysctl -q vm.drop_caches=3; fi'

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
  num_workers: 0
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
  platform: 2xCPU
BERTCTL_PHASE1_YAML_{digest}

# ---- the per-rank launch
cat > "$EXP_DIR/task.sh" <<'BERTCTL_TASK_9868c8e97e870785'
#!/bin/bash
# One rank: the trainer. Rank and world come from Slurm's or torchrun's variables.
set -euo pipefail
exec "$PYTHON" -u -m trainer --config "$EXP_DIR/run.yaml" --out "$EXP_DIR" --run-index "$BERTCTL_RUN_INDEX" --seed "$BERTCTL_SEED"
BERTCTL_TASK_9868c8e97e870785

CONTAINER=()

on_every_node() { srun --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 "$@"; }

# ---- prerequisites, built once per machine (each step returns at once when its result exists)
step prepare srun --ntasks=1 --nodes=1 "${CONTAINER[@]}" "$PYTHON" -m orchestrator data prepare --dataset sample
step phase1 srun --ntasks=1 --nodes=1 "${CONTAINER[@]}" "$PYTHON" -u -m trainer --config "$EXP_DIR/phase1.yaml" --out "$EXP_DIR/phase1" --once

# ---- how this job runs one run's ranks (used by run_one below)
WHERE=" on $SLURM_JOB_NUM_NODES node(s)"
launch_ranks() {  # run $1 with seed $2: every rank of the allocation
  export MASTER_PORT=$((20000 + SLURM_JOB_ID % 2000 * 16 + $1 % 16))
  export BERTCTL_RUN_INDEX=$1 BERTCTL_SEED=$2
  srun -l --kill-on-bad-exit=1 --distribution=block \
    --ntasks="$NTASKS" --ntasks-per-node=2 "${CONTAINER[@]}" \
    bash "$EXP_DIR/task.sh"
}
# Requeue exactly the job that holds run $1: its array element in array mode (requeueing the array's
# own id would restart every element, running siblings included), else the job.
requeue_run() {
  [ "${SLURM_RESTART_COUNT:-0}" -lt 3 ] || return 1
  local job="$SLURM_JOB_ID"
  echo "run $1 saved a checkpoint on SIGUSR2/SIGTERM: requeueing job $job"
  scontrol requeue "$job"
}

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
    on_every_node bash -c "$DROP_CACHES" ||
      { echo "error: could not drop the page cache (needs root or sudo; node.clear_caches=log_only only logs it)" | tee -a "$log"; return 1; }
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
