#!/bin/bash
# Rendered by bertctl 0.1.0 from clusters/local_1x8gpu.yaml
# local_1x8gpu: this machine with 8 GPUs (local executor, torchrun, NCCL), NVIDIA's H100 recipe on the prepared MLPerf set
# 1 node(s) x 8 task(s) = 8 rank(s); 2 run(s), seeds 0, 1
# Submit and track:  bertctl submit --cluster local_1x8gpu --nexp 2
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
world_size: 8
data:
  train_dir: $BERTCTL_HOME/datasets/mlperf_wiki/train
  eval_dir: $BERTCTL_HOME/datasets/mlperf_wiki/eval
optim:
  lr: 0.00096
  betas:
  - 0.60466
  - 0.85437
  weight_decay: 0.1
  max_steps: 3680
train:
  batch_size: 48
  global_batch_size: 768
  max_samples_termination: 4500000
  eval_every_samples: 150000
  eval_start_samples: 150000
  init_checkpoint: $BERTCTL_HOME/datasets/mlperf_wiki/phase1/model.ckpt-28252.pt
balance:
  packing: true
  pack_window: 65536
  pack_sequences: 3
  pack_average: 2.0
runtime:
  device: cuda
  backend: nccl
  precision: bf16
  unpad: true
  compile: true
  cuda_graph: true
mlperf:
  platform: 1x8 GPUs (local)
BERTCTL_RUN_YAML_{digest}


# ---- how this machine runs one run's ranks (used by run_one below)
WHERE=""
CONTAINER=()
on_every_node() { "$@"; }  # this machine is the only node
# The ranks start through torchrun, which runs each in a session of its own and takes the job's SIGTERM itself: it
# passes the signal on, waits for the ranks, then dies of it (exit 1), as it exits 1 whenever a rank does not exit 0.
# So each rank records its own exit status (rank_exit), and the run's is theirs when they all recorded the same (75:
# each saved its part of the checkpoint and stopped), torchrun's otherwise (a rank it killed, ranks that disagree).
# TORCH_ELASTIC_SHUTDOWN_TIMEOUT: how long torchrun waits for the ranks' checkpoint after passing a signal on, before
# it kills them (torch's default: 30 s; a torch older than 2.12 does not read it and waits 30 s)
export TORCH_ELASTIC_SHUTDOWN_TIMEOUT=600
rank_exit() {  # one rank's command; its exit status into $RANK_EXITS/$RANK (a SIGTERM is the rank's to answer)
  trap ':' TERM
  local rc=0
  "$@" || rc=$?
  echo "$rc" > "$RANK_EXITS/$RANK"
  return "$rc"
}
export -f rank_exit
launch_ranks() {  # run $1 with seed $2: 8 ranks here
  export BERTCTL_RUN_INDEX=$1 BERTCTL_SEED=$2 RANK_EXITS="$EXP_DIR/runs/$1.ranks"
  rm -rf "$RANK_EXITS" && mkdir -p "$RANK_EXITS" || return 1
  local rc=0 codes
  "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node=8 --no-python bash -c 'rank_exit "$@"' rank "$PYTHON" -u -m trainer --config "$EXP_DIR/run.yaml" --out "$EXP_DIR" --run-index "$BERTCTL_RUN_INDEX" --seed "$BERTCTL_SEED" || rc=$?
  codes=$(cat "$RANK_EXITS"/* 2>/dev/null | sort -u)
  if [ "$(ls "$RANK_EXITS" | wc -l)" -eq 8 ] && [[ $codes =~ ^[0-9]+$ ]]; then
    [ "$codes" -eq "$rc" ] || echo "torchrun exited with $rc; every rank with $codes: the run's exit status"
    return "$codes"
  fi
  return "$rc"
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
