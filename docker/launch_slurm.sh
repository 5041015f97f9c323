#!/usr/bin/env bash
# Multi-node DDP under SLURM: one task per GPU; Lightning detects the SLURM environment.
#   sbatch --nodes=2 docker/launch_slurm.sh vision_cls fit -c configs/trainer/ddp_multinode_bf16.yaml \
#     -c configs/vision_cls/deit-base_rpc_8xb128-300e_imagenet-224.yaml --data.root /data/imagenet
# Preemption and time limits: 120 s before the end SLURM sends SIGUSR1 to the tasks (not to this shell, hence
# no B: prefix); Lightning then saves <trainer.default_root_dir>/hpc_ckpt_<n>.ckpt and runs
# `scontrol requeue $SLURM_JOB_ID`. The requeued job runs this same command, and `fit` runs with
# --ckpt_path auto, so it resumes from the newest readable checkpoint of the experiment (a later --ckpt_path
# in the arguments wins). The log (kpca-<job id>.out) is appended to across requeues. The app starts through
# kpca.training.slurm_start, which holds SIGUSR1 from its first instruction: a signal during start-up requeues
# after the first batch, and one after the fit is discarded, where SIGUSR1's default action would end the job FAILED.
#SBATCH --job-name=kpca
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=10
#SBATCH --time=72:00:00
#SBATCH --signal=USR1@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=%x-%j.out
set -euo pipefail
usage="usage: sbatch launch_slurm.sh <vision_cls|language_model|segmentation> <fit|validate|test|predict> [LightningCLI args...]"
app="${1:?$usage}"
subcommand="${2:?$usage}"
shift 2
if [[ "$subcommand" == fit ]]; then
    set -- --ckpt_path auto "$@"
fi
exec srun python -m kpca.training.slurm_start "kpca.${app}" "$subcommand" "$@" \
    --trainer.num_nodes "${SLURM_JOB_NUM_NODES}" --trainer.devices "${SLURM_NTASKS_PER_NODE}"
