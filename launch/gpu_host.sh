#!/usr/bin/env bash
# One GPU host: the retrieval server on this host (dense e5 + FAISS on its own process), then training on all of
# the host's GPUs (mesh from the config, FSDP by default in the paper presets).
# Usage: [DRY_RUN=1] bash launch/gpu_host.sh CONFIG INDEX_DIR [--config.x.y=value ...]
set -euo pipefail
source "$(dirname "$0")/common.sh"
CONFIG=${1:?usage: gpu_host.sh CONFIG INDEX_DIR [overrides ...]}
INDEX_DIR=${2:?usage: gpu_host.sh CONFIG INDEX_DIR [overrides ...]}
shift 2
SERVER=$(quoted bash "$(dirname "$0")/retrieval_server.sh" "$INDEX_DIR" 8000)
TRAIN=$(quoted python -m searchrl.main --config "$CONFIG" --config.retrieval.kind=remote \
  --config.retrieval.url=http://127.0.0.1:8000/retrieve "$@" train)
serve_and_train() {
  bash -c "$SERVER"
  trap 'kill "$(cat "retrieval_server.$(hostname).pid")"' EXIT
  bash -c "$TRAIN"
}
on_hosts 1 "$SERVER && $TRAIN" serve_and_train
