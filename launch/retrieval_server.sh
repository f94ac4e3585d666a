#!/usr/bin/env bash
# The Search-R1-compatible retrieval server on this host (127.0.0.1 only), for the launchers and by hand.
# Usage: [RUN_DIR=DIR] bash launch/retrieval_server.sh INDEX_DIR [PORT] [--serve_flag=value ...]
#          starts it -> http://127.0.0.1:PORT/retrieve (PORT 8000 by default); the flags go to
#          `python -m searchrl.serving.serve`: --device=gpu:7, --faiss_gpu=replicate, --max_hits=300000, ...
#        [RUN_DIR=DIR] bash launch/retrieval_server.sh stop [PORT]
#          stops the servers this host started under RUN_DIR (the one on PORT, or all)
# Its log and pid are RUN_DIR/retrieval_server.HOST.PORT.{log,pid}; RUN_DIR is runs/retrieval by default.
# Starting refuses a port where something already listens (naming the index a retrieval server there serves),
# then waits until the server it started (that pid) answers /health with its index's fingerprint; on failure
# it stops its server and exits non-zero. JAX stays off accelerators (JAX_PLATFORMS=cpu) unless --device=
# names another platform, and never preallocates GPU memory (XLA_PYTHON_CLIENT_PREALLOCATE=false).
set -euo pipefail
RUN_DIR=${RUN_DIR:-runs/retrieval}
WAIT_S=${WAIT_S:-600}  # how long the index may take to load
HOST=$(hostname)

# `probe PORT`: "PID FINGERPRINT KIND INDEX" of the retrieval server on 127.0.0.1:PORT, "busy" when something
# else listens there; fails when nothing does.
probe() {
  python - "$1" <<'EOF'
import json, socket, sys, urllib.request
port = int(sys.argv[1])
try:
    socket.create_connection(("127.0.0.1", port), timeout=2).close()
except OSError:
    sys.exit(1)
try:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=3) as response:
        health = json.load(response)
    print(*(health.get(key, "?") for key in ("pid", "fingerprint", "kind", "index")))
except Exception:
    print("busy")
EOF
}

# `serving PROBE`: what a probe's answer says is on the port, in words.
serving() {
  if [[ $1 == busy ]]; then echo "something that is not a retrieval server listens there"; return; fi
  local pid fingerprint kind index
  read -r pid fingerprint kind index <<<"$1"
  echo "a retrieval server (pid $pid) serves the $kind index $index, fingerprint $fingerprint"
}

# `stop_pid PID`: SIGTERM, then SIGKILL after 15 s; only to a searchrl retrieval server (a pid file may be
# stale and its pid reused).
stop_pid() {
  [[ $(ps -o args= -p "$1" 2>/dev/null) == *searchrl.serving.serve* ]] || return 0
  kill "$1" 2>/dev/null || return 0
  for _ in $(seq 150); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
  kill -9 "$1" 2>/dev/null || true
}

stop() {
  local pid_file
  shopt -s nullglob
  for pid_file in "$RUN_DIR/retrieval_server.$HOST."${1:-*}".pid"; do
    stop_pid "$(<"$pid_file")"
    rm -f "$pid_file"
    echo "stopped the retrieval server of $pid_file"
  done
}

start() {
  local index_dir=$1 port=$2 fingerprint there pid device=cpu
  shift 2
  local log=$RUN_DIR/retrieval_server.$HOST.$port.log pid_file=$RUN_DIR/retrieval_server.$HOST.$port.pid
  fingerprint=$(JAX_PLATFORMS=cpu python -m searchrl.serving.serve --index "$index_dir" --print_fingerprint)
  if there=$(probe "$port"); then
    echo "port $port is in use: $(serving "$there"); not index $index_dir (fingerprint $fingerprint)." \
      "Stop it (RUN_DIR=... bash launch/retrieval_server.sh stop $port) or choose another port" >&2
    exit 1
  fi
  for arg in "$@"; do [[ $arg == --device=* ]] && device=${arg#--device=}; done
  local env_vars=(XLA_PYTHON_CLIENT_PREALLOCATE="${XLA_PYTHON_CLIENT_PREALLOCATE:-false}")
  [[ $device == cpu* ]] && env_vars+=(JAX_PLATFORMS=cpu)
  mkdir -p "$RUN_DIR"
  env "${env_vars[@]}" python -m searchrl.serving.serve --index "$index_dir" --host 127.0.0.1 --port "$port" \
    "$@" >"$log" 2>&1 &
  pid=$!
  echo "$pid" >"$pid_file"
  local deadline=$((SECONDS + WAIT_S))
  while ((SECONDS < deadline)); do
    if ! kill -0 "$pid" 2>/dev/null; then
      rm -f "$pid_file"
      echo "the retrieval server for $index_dir on port $port exited; the end of $log:" >&2
      tail -n 20 "$log" >&2
      exit 1
    fi
    if there=$(probe "$port"); then
      if [[ $there == "$pid $fingerprint "* ]]; then
        echo "retrieval server up on port $port (pid $pid, index $index_dir, fingerprint $fingerprint)"
        exit 0
      fi
      stop "$port"
      echo "port $port was taken while the server for $index_dir loaded: $(serving "$there")" >&2
      exit 1
    fi
    sleep 0.2
  done
  stop "$port"
  echo "the retrieval server for $index_dir did not come up on port $port in ${WAIT_S} s; see $log" >&2
  exit 1
}

if [[ ${1:-} == stop ]]; then
  stop "${2:-}"
else
  start "${1:?usage: retrieval_server.sh INDEX_DIR [PORT] [--serve_flag=value ...] | stop [PORT]}" \
    "${2:-8000}" "${@:3}"
fi
