#!/bin/bash
# Rendered by bertctl 0.1.0 from datasets/mlperf_wiki.yaml with -o source.train=/data/tfrecords
# Dataset mlperf_wiki, stage combine (2 of 3: examples, combine, finish) on cluster nvidia_dgxa100_8x8:
# 129 task(s) in 129 array task(s) of up to 1; a task whose files exist is skipped.
# By hand:  cd into the job folder (it holds manifest.yaml and logs/), then: sbatch --dependency=afterok:JOBID <this file>
# Submit and track:  bertctl data prepare --dataset mlperf_wiki --cluster nvidia_dgxa100_8x8 -o source.train=/data/tfrecords
#SBATCH --job-name=data-mlperf_wiki-combine
#SBATCH --array=0-128
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=1
#SBATCH --time=01:15:00
#SBATCH --output=logs/combine_%A_%a.out
#SBATCH --open-mode=append
#SBATCH --dependency=afterok:1234
#SBATCH --kill-on-invalid-dep=yes
#SBATCH --network=sharp
set -euo pipefail

JOB_DIR=$PWD      # bertctl submits with --chdir=<job folder>
export BERTCTL_HOME=${BERTCTL_HOME:-$HOME/.bertctl}
# one thread per task: the parallelism is the array
export TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1
# ---- node environment (exported to every task)
export NCCL_TOPO_FILE=/workspace/bert/dgxa100_nic_affinity.xml
# a failing task leaves its error here as JSON, for `bertctl data prepare --wait` to report
export BERTCTL_ERROR_FILE="$JOB_DIR/errors/combine_${SLURM_ARRAY_TASK_ID}.json"
FIRST=$((SLURM_ARRAY_TASK_ID * 1))
echo "dataset mlperf_wiki: stage combine, tasks $FIRST.. (array task $SLURM_ARRAY_TASK_ID) on $(hostname), $(date -Is)"

exec srun --ntasks=1 --container-image=mlperf-nvidia:language_model --container-mounts="$JOB_DIR:$JOB_DIR",/raid/datasets/bert/hdf5/4320_shards:/workspace/data_phase2,/raid/datasets/bert/hdf5/eval_4320_shard:/workspace/evaldata,/raid/datasets/bert/checkpoints/checkpoint_phase1:/workspace/phase1 --container-workdir=/workspace/bert \
  python3 -m trainer.data.prepare run --manifest "$JOB_DIR/manifest.yaml" \
  --stage combine --group "$SLURM_ARRAY_TASK_ID" --group-size 1
