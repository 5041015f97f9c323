#!/usr/bin/env bash
# Multi-node DDP with torchrun: run this on every node, with the same MASTER_ADDR and NNODES and
# this node's NODE_RANK. Lightning reads the torchrun environment; the trainer file sets devices
# (GPUs per node) and num_nodes, which must equal NPROC_PER_NODE and NNODES.
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 docker/launch_torchrun.sh vision_cls fit \
#     -c configs/trainer/ddp_multinode_bf16.yaml -c configs/vision_cls/deit-base_rpc_8xb128-300e_imagenet-224.yaml --data.root /data/imagenet
set -euo pipefail
app="${1:?usage: launch_torchrun.sh <vision_cls|...> <fit|validate|test|predict> [LightningCLI args...]}"
shift
exec torchrun \
    --nnodes "${NNODES:?set NNODES}" \
    --node_rank "${NODE_RANK:?set NODE_RANK}" \
    --nproc_per_node "${NPROC_PER_NODE:-8}" \
    --master_addr "${MASTER_ADDR:?set MASTER_ADDR}" \
    --master_port "${MASTER_PORT:-29500}" \
    -m "kpca.${app}" "$@" --trainer.num_nodes "${NNODES}" --trainer.devices "${NPROC_PER_NODE:-8}"
