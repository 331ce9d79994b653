#!/bin/bash
# Rendered by bertctl 0.1.0 from datasets/sample.yaml
# Dataset sample, stage examples (2 of 4: corpus, examples, combine, finish) on cluster ci_slurm:
# 9 task(s) in 9 array task(s) of up to 1; a task whose files exist is skipped.
# By hand:  cd into the job folder (it holds manifest.yaml and logs/), then: sbatch <this file>
# Submit and track:  bertctl data prepare --dataset sample --cluster ci_slurm
#SBATCH --job-name=data-sample-examples
#SBATCH --array=0-8
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=1
#SBATCH --partition=debug
#SBATCH --time=00:30:00
#SBATCH --output=logs/examples_%A_%a.out
#SBATCH --open-mode=append
set -euo pipefail

JOB_DIR=$PWD      # bertctl submits with --chdir=<job folder>
export BERTCTL_HOME=${BERTCTL_HOME:-$HOME/.bertctl}
# one thread per task: the parallelism is the array
export TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1
# ---- node environment (exported to every task)
export OMP_NUM_THREADS=1
# a failing task leaves its error here as JSON, for `bertctl data prepare --wait` to report
export BERTCTL_ERROR_FILE="$JOB_DIR/errors/examples_${SLURM_ARRAY_TASK_ID}.json"
FIRST=$((SLURM_ARRAY_TASK_ID * 1))
echo "dataset sample: stage examples, tasks $FIRST.. (array task $SLURM_ARRAY_TASK_ID) on $(hostname), $(date -Is)"

PYTHON=${BERTCTL_PYTHON:-python3}
exec "$PYTHON" -m trainer.data.prepare run --manifest "$JOB_DIR/manifest.yaml" \
  --stage examples --group "$SLURM_ARRAY_TASK_ID" --group-size 1
