#!/usr/bin/env bash
# Multi-node DDP under SLURM: one task per GPU; Lightning detects the SLURM environment.
#   sbatch --nodes=2 docker/launch_slurm.sh vision_cls fit -c configs/trainer/ddp_multinode_bf16.yaml \
#     -c configs/vision_cls/deit-base_rpc_8xb128-300e_imagenet-224.yaml --data.root /data/imagenet
#SBATCH --job-name=kpca
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=10
#SBATCH --time=72:00:00
set -euo pipefail
app="${1:?usage: sbatch launch_slurm.sh <vision_cls|...> <fit|validate|test|predict> [LightningCLI args...]}"
shift
srun python -m "kpca.${app}" "$@" --trainer.num_nodes "${SLURM_JOB_NUM_NODES}" --trainer.devices "${SLURM_NTASKS_PER_NODE}"
