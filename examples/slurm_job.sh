#!/bin/bash
# agentax train as one task per node under Slurm; a requeued job (preemption, node failure,
# `scontrol requeue`) resumes its own run directory instead of failing on "already exists".
#SBATCH --job-name=agentax
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=32
#SBATCH --requeue
#SBATCH --output=agentax-%j.log
#
# Usage: sbatch examples/slurm_job.sh RECIPE_OR_YAML [OVERRIDES...]
# RUNS_DIR must be on a file system every node sees (each node writes its shards of every
# checkpoint there). SRUN is how tasks are started (`srun` by default).
set -euo pipefail
RUNS_DIR=${RUNS_DIR:-/shared/runs}
SRUN=${SRUN-srun}
RUN_DIR="$RUNS_DIR/job-${SLURM_JOB_ID:?run this under sbatch (or set SLURM_JOB_ID)}"
if [ -f "$RUN_DIR/config.yaml" ]; then
  # The same job id again: a requeue. Continue from the newest complete checkpoint.
  exec $SRUN agentax train "$RUN_DIR"
fi
exec $SRUN agentax train "$@" run.runs_dir="$RUNS_DIR" run.name="job-$SLURM_JOB_ID"
