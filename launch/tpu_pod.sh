#!/usr/bin/env bash
# A Cloud TPU pod slice: the same command on every worker (--worker=all); JAX finds its peers through the TPU
# metadata (config.distributed.enabled), each worker serves retrieval locally (BM25 or CPU FAISS).
# Usage: bash launch/tpu_pod.sh TPU_NAME ZONE CONFIG INDEX_DIR [--config.x.y=value ...]
#        DRY_RUN=1 WORKERS=4 bash launch/tpu_pod.sh ...   (prints what each worker would run)
# (the repository, its requirements-tpu.txt install and the index must already be on every worker, same path)
set -euo pipefail
source "$(dirname "$0")/common.sh"
TPU=${1:?usage: tpu_pod.sh TPU_NAME ZONE CONFIG INDEX_DIR [overrides ...]}
ZONE=${2:?}
CONFIG=${3:?}
INDEX_DIR=${4:?}
shift 4
LINE="cd ~/searchrl && source .venv/bin/activate \
&& $(quoted bash launch/retrieval_server.sh "$INDEX_DIR" 8000) \
&& $(quoted python -m searchrl.main --config "$CONFIG" --config.distributed.enabled=True --config.retrieval.kind=remote \
   --config.retrieval.url=http://127.0.0.1:8000/retrieve "$@" train)"
on_hosts "${WORKERS:-1}" "$LINE" \
  gcloud compute tpus tpu-vm ssh "$TPU" --zone "$ZONE" --worker=all --command "$LINE"
