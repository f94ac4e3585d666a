#!/usr/bin/env bash
# One GPU host: the retrieval server on this host (its own process, on the CPU: no GPU memory taken; see
# retrieval_server.sh), then training on all of the host's GPUs (mesh from the config, FSDP by default in the
# paper presets); the server is stopped when training ends. Its log and pid go under RUN_DIR (runs/retrieval);
# RETRIEVAL_FLAGS holds flags for the server (e.g. "--device=gpu:7" for a GPU query encoder);
# INDEX_DIR "-" starts no server (the config's own retriever: a search engine's API, SQL).
# Usage: [DRY_RUN=1] [RUN_DIR=DIR] [RETRIEVAL_FLAGS=...] \
#          bash launch/gpu_host.sh CONFIG INDEX_DIR|- [--config.x.y=value ...]
set -euo pipefail
source "$(dirname "$0")/common.sh"
CONFIG=${1:?usage: gpu_host.sh CONFIG INDEX_DIR [overrides ...]}
INDEX_DIR=${2:?usage: gpu_host.sh CONFIG INDEX_DIR [overrides ...]}
shift 2
export RUN_DIR=${RUN_DIR:-runs/retrieval}
retrieval_lines "$(dirname "$0")/retrieval_server.sh" "$INDEX_DIR" 8000
LINE=$(served "$(quoted python -m searchrl.main --config "$CONFIG" "${REMOTE[@]}" "$@" train)")
on_hosts 1 "$LINE" bash -c "$LINE"
