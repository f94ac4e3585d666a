#!/usr/bin/env bash
# Starts the Search-R1-compatible retrieval server on this host (127.0.0.1 only) and waits until it answers.
# Usage: bash launch/retrieval_server.sh INDEX_DIR [PORT]   -> http://127.0.0.1:PORT/retrieve
set -euo pipefail
INDEX_DIR=${1:?usage: retrieval_server.sh INDEX_DIR [PORT]}
PORT=${2:-8000}
LOG=${LOG:-retrieval_server.$(hostname).log}
python -m searchrl.serving.serve --index "$INDEX_DIR" --host 127.0.0.1 --port "$PORT" >"$LOG" 2>&1 &
echo $! > "retrieval_server.$(hostname).pid"
for _ in $(seq 1 600); do
  if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; then echo "retrieval server up on port $PORT"; exit 0; fi
  sleep 1
done
echo "retrieval server did not come up; see $LOG" >&2
exit 1
