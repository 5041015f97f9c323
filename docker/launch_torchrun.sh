#!/usr/bin/env bash
# Multi-node DDP with torchrun: run this on every node with the same NNODES, MASTER_ADDR, MASTER_PORT and
# RDZV_ID. The nodes meet at the c10d rendezvous on MASTER_ADDR:MASTER_PORT (the node at MASTER_ADDR hosts it),
# which numbers them, so no NODE_RANK is needed. When a worker fails, torchrun restarts the whole worker group
# (up to MAX_RESTARTS times); `fit` runs with --ckpt_path auto, so the restarted group resumes from the newest
# readable checkpoint of the experiment (a later --ckpt_path in the arguments wins). Lightning reads the torchrun
# environment; this script sets the trainer's num_nodes to NNODES and devices (GPUs per node) to NPROC_PER_NODE.
#   NNODES=2 NPROC_PER_NODE=8 MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 RDZV_ID=deit-base-rpc \
#     docker/launch_torchrun.sh vision_cls fit -c configs/trainer/ddp_multinode_bf16.yaml \
#     -c configs/vision_cls/deit-base_rpc_8xb128-300e_imagenet-224.yaml --data.root /data/imagenet
# On CPU (gloo), add --trainer.accelerator cpu --trainer.strategy ddp.
set -euo pipefail
usage="usage: launch_torchrun.sh <vision_cls|language_model|segmentation> <fit|validate|test|predict> [LightningCLI args...]"
app="${1:?$usage}"
subcommand="${2:?$usage}"
shift 2
if [[ "$subcommand" == fit ]]; then
    set -- --ckpt_path auto "$@"
fi
# torchrun shares its rendezvous TCPStore with the workers by default, and the keys of a dead worker group
# outlive it: after a restart the new workers may read the old addresses and fail to connect
# (pytorch/pytorch#135712). A store of their own per worker group (as before torch 2.4) avoids it.
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE="${TORCH_DISABLE_SHARE_RDZV_TCP_STORE:-1}"
nnodes="${NNODES:?set NNODES}"
nproc="${NPROC_PER_NODE:-8}"
exec torchrun \
    --nnodes "$nnodes" \
    --nproc-per-node "$nproc" \
    --rdzv-backend c10d \
    --rdzv-endpoint "${MASTER_ADDR:?set MASTER_ADDR}:${MASTER_PORT:-29500}" \
    --rdzv-id "${RDZV_ID:-kpca}" \
    --max-restarts "${MAX_RESTARTS:-3}" \
    -m "kpca.${app}" "$subcommand" "$@" --trainer.num_nodes "$nnodes" --trainer.devices "$nproc"
