#!/bin/bash
# Rendered by bertctl 0.1.0 from clusters/nvidia_dgxh100_1x8.yaml
# nvidia_dgxh100_1x8: NVIDIA MLPerf BERT recipe, 1x8 H100, LAMB, packs of up to 3 averaging 2 (batch 768), stock PyTorch image
# 1 node(s) x 8 task(s) = 8 rank(s); 10 run(s), seeds 0, 1, 2, 3, 4, 5, 6, 7, 8, 9
# Submit and track:  bertctl submit --cluster nvidia_dgxh100_1x8 --nexp 10
# By hand:  cd into an empty folder on a filesystem every node sees, then: sbatch <this file>
#           (run.yaml, task.sh, results/, logs/ and runs/ are written next to where it was submitted)
#SBATCH --job-name=bert-nvidia_dgxh100_1x8
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --time=04:15:00
#SBATCH --mem=0
#SBATCH --output=%j_0_log.out
#SBATCH --signal=USR2@90
#SBATCH --open-mode=append
#SBATCH --exclusive
#SBATCH --requeue
set -euo pipefail

EXP_DIR=$PWD      # bertctl submits with --chdir=<experiment dir>
NEXP=10
SEEDS=(0 1 2 3 4 5 6 7 8 9)
export EXP_DIR
export PYTHON=python3
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_ADDR
NTASKS=$((SLURM_JOB_NUM_NODES * 8))

# ---- node environment (exported to every rank)
# (none configured)

mkdir -p "$EXP_DIR/results" "$EXP_DIR/logs" "$EXP_DIR/runs"

# ---- the resolved run configuration every rank reads: the whole recipe
cat > "$EXP_DIR/run.yaml" <<'BERTCTL_RUN_YAML_{digest}'
world_size: 8
data:
  train_dir: /workspace/data_phase2
  eval_dir: /workspace/evaldata
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
  init_checkpoint: /workspace/phase1/model.ckpt-28252.pt
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
  platform: 1xNVIDIA DGX H100
BERTCTL_RUN_YAML_{digest}

# Drop the page cache (root, or passwordless sudo for sysctl), as the MLPerf rules ask before each run.
DROP_CACHES='sync && if [ "$(id -u)" -eq 0 ]; then /sbin/sysctl -q vm.drop_caches=3; else sudo -n /sbin/sysctl -q vm.drop_caches=3; fi'

# ---- the per-rank launch
cat > "$EXP_DIR/task.sh" <<'BERTCTL_TASK_b819e2e2362d7df0'
#!/bin/bash
# One rank: CPU/memory/IB binding, then the trainer. Rank and world come from Slurm's or torchrun's variables.
set -euo pipefail
exec "$PYTHON" -m trainer.launch.binding --cpu exclusive --mem node --ib none --tasks-per-node 8 -- "$PYTHON" -u -m trainer --config "$EXP_DIR/run.yaml" --out "$EXP_DIR" --run-index "$BERTCTL_RUN_INDEX" --seed "$BERTCTL_SEED"
BERTCTL_TASK_b819e2e2362d7df0

# ---- container (pyxis/enroot): created once per node, reused by name by every later step
IMAGE='nvcr.io#nvidia/pytorch:24.09-py3'
srun --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 --container-image="$IMAGE" --container-name=language_model true
CONTAINER=(--container-name=language_model --container-mounts="$EXP_DIR:$EXP_DIR",/raid/datasets/bert/hdf5/4320_shards:/workspace/data_phase2,/raid/datasets/bert/hdf5/eval_4320_shard:/workspace/evaldata,/raid/datasets/bert/checkpoints/checkpoint_phase1:/workspace/phase1 --container-workdir=/workspace/bert)
# ---- a stock image: the bertctl that submitted this job (the wheel in wheels/), installed once for the
# whole job on the shared experiment folder and put first on every rank's path; then the image (the
# same on every node) is checked once for every package bertctl needs (they are listed if some are missing)
srun --ntasks=1 --nodes=1 "${CONTAINER[@]}" "$PYTHON" -m pip install --quiet --no-deps --no-index --target "$EXP_DIR/site" "$EXP_DIR"/wheels/bertctl-*.whl
export PYTHONPATH="$EXP_DIR/site${PYTHONPATH:+:$PYTHONPATH}"
srun --ntasks=1 --nodes=1 "${CONTAINER[@]}" "$PYTHON" -m trainer.launch.image_check

on_every_node() { srun --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 "$@"; }

# ---- how this job runs one run's ranks (used by run_one below)
WHERE=" on $SLURM_JOB_NUM_NODES node(s)"
launch_ranks() {  # run $1 with seed $2: every rank of the allocation
  export MASTER_PORT=$((20000 + SLURM_JOB_ID % 2000 * 16 + $1 % 16))
  export BERTCTL_RUN_INDEX=$1 BERTCTL_SEED=$2
  srun -l --kill-on-bad-exit=1 --distribution=block \
    --ntasks="$NTASKS" --ntasks-per-node=8 "${CONTAINER[@]}" \
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
