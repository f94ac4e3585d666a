#!/usr/bin/env bash
# A Cloud TPU pod slice: the same job on every worker (--worker=all), started detached (setsid nohup: a
# dropped ssh connection or a closed laptop does not stop it). JAX finds its peers through the TPU metadata
# (config.distributed.enabled); each worker serves retrieval locally (BM25 or CPU FAISS, its encoder on the
# CPU: the chips stay the trainer's), stopped when the worker's job ends; INDEX_DIR "-" runs no server (the
# config's own retriever: a search engine's API, SQL). Worker i logs to RUN_DIR/logs/worker_i.log (i its
# agent-worker-number) and keeps its job's pid in RUN_DIR/logs/worker_i.pid; RUN_DIR (default runs/TPU_NAME)
# also holds the retrieval servers' logs and pids; RETRIEVAL_FLAGS: flags for the servers (see
# retrieval_server.sh). It first runs `searchrl check` on worker 0 (every input the run needs, on a worker,
# with the pod's worker count from the TPU metadata; CHECK=0 skips it) and stops there when one is missing.
# The launch prints how to follow and stop the job.
# Usage: [RUN_DIR=DIR] [RETRIEVAL_FLAGS=...] [REMOTE_DIR=searchrl] \
#          bash launch/tpu_pod.sh TPU_NAME ZONE CONFIG INDEX_DIR|- [--config.x.y=value ...]
#        DRY_RUN=1 WORKERS=4 bash launch/tpu_pod.sh ...   (prints what each worker would run)
# Every worker holds the repository at REMOTE_DIR (relative to its home; default searchrl), its .venv made as
# the README's TPU install makes it, and the index, at the same paths.
set -euo pipefail
source "$(dirname "$0")/common.sh"
USAGE="usage: tpu_pod.sh TPU_NAME ZONE CONFIG INDEX_DIR|- [overrides ...]"
TPU=${1:?$USAGE}
ZONE=${2:?$USAGE}
CONFIG=${3:?$USAGE}
INDEX_DIR=${4:?$USAGE}
shift 4
RUN_DIR=${RUN_DIR:-runs/$TPU}
REMOTE_DIR=${REMOTE_DIR:-searchrl}
INDEX=()
[[ $INDEX_DIR == - ]] || INDEX=("--config.retrieval.index_dir=$INDEX_DIR")  # what the servers will serve
retrieval_lines launch/retrieval_server.sh "$INDEX_DIR" 8000
JOB=$(served "$(quoted python -m searchrl.main --config "$CONFIG" --config.distributed.enabled=True \
  "${REMOTE[@]}" "$@" train)")
METADATA=http://metadata.google.internal/computeMetadata/v1/instance/attributes
WORKER="\$(curl -s -H Metadata-Flavor:Google $METADATA/agent-worker-number)"  # this worker's number
LOGS=$RUN_DIR/logs
HOSTS="\$(curl -s -H Metadata-Flavor:Google $METADATA/worker-network-endpoints | tr , '\\n' | grep -c .)"
CHECK_LINE="cd $(quoted "$REMOTE_DIR") && source .venv/bin/activate && XLA_PYTHON_CLIENT_PREALLOCATE=false \
$(quoted python -m searchrl.check "$CONFIG" "${INDEX[@]}" "$@") --hosts=$HOSTS"
LINE="cd $(quoted "$REMOTE_DIR") && source .venv/bin/activate && export $(quoted RUN_DIR="$RUN_DIR") \
&& i=$WORKER && mkdir -p $(quoted "$LOGS") \
&& { setsid nohup bash -c $(quoted "$JOB") >$(quoted "$LOGS")/worker_\$i.log 2>&1 </dev/null & \
echo \$! >$(quoted "$LOGS")/worker_\$i.pid; echo \"worker \$i: started (pid \$!)\"; }"
SSH=(gcloud compute tpus tpu-vm ssh "$TPU" --zone "$ZONE")
launch() {
  if [[ "${CHECK:-1}" != 0 ]] && ! "${SSH[@]}" --worker=0 --command "$CHECK_LINE"; then
    echo "tpu_pod: the check on worker 0 failed (above); nothing started (CHECK=0 skips it)" >&2
    exit 1
  fi
  "${SSH[@]}" --worker=all --command "$LINE"
  local where
  where=$(quoted "$REMOTE_DIR/$LOGS")
  echo "follow worker 0: $(quoted "${SSH[@]}" --worker=0 --command "tail -f $where/worker_0.log")"
  echo "stop the job:    $(quoted "${SSH[@]}" --worker=all --command "for f in $where/worker_*.pid; do \
kill -- -\$(cat \"\$f\"); done")"
}
on_hosts "${WORKERS:-1}" "$LINE" launch
