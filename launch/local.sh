#!/usr/bin/env bash
# This machine, retrieval in-process from a local index: one process on all of its devices (CPU or GPUs), or
# PROCESSES=N CPU processes with DEVICES (default 4) devices each (set in XLA_FLAGS), joined by JAX's
# distributed runtime on 127.0.0.1 as the hosts of a cluster would be (the multi-host path, on one machine).
# A miniature's world (the datasets, index and tokenizer of configs/{autosearch,deepretrieval,rpl}.py:tiny, under
# its workdir) is built first if it is not there (`searchrl.main world`), so that a fresh clone trains (from
# random weights, as the run says: the cold starts are the demo's), and everything the run needs is checked
# (`searchrl check`; CHECK=0 skips it); DRY_RUN=1 prints the hosts' commands only.
# Usage: [PROCESSES=N] [DRY_RUN=1] bash launch/local.sh CONFIG [--config.x.y=value ...]
set -euo pipefail
source "$(dirname "$0")/common.sh"
CONFIG=${1:?usage: local.sh CONFIG [overrides ...]}
shift
PROCESSES=${PROCESSES:-1}
if [[ "${DRY_RUN:-0}" != 1 ]]; then
  JAX_PLATFORMS=cpu python -m searchrl.main --config "$CONFIG" "$@" world
fi
if ((PROCESSES == 1)); then
  preflight "$CONFIG" "$@"
  LINE=$(quoted python -m searchrl.main --config "$CONFIG" "$@" train)
  on_hosts 1 "$LINE" bash -c "$LINE"
  exit
fi
FREE_PORT='import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
PORT=${PORT:-$(python -c "$FREE_PORT")}
FLAGS=$(echo "${XLA_FLAGS:-}" | sed -E 's/ *--xla_force_host_platform_device_count=[0-9]+//g')
JAX_PLATFORMS=cpu XLA_FLAGS="$FLAGS --xla_force_host_platform_device_count=${DEVICES:-4}" \
  preflight "$CONFIG" --hosts "$PROCESSES" "$@"
lines=()
for ((i = 0; i < PROCESSES; i++)); do
  lines+=("$(quoted env JAX_PLATFORMS=cpu \
    XLA_FLAGS="$FLAGS --xla_force_host_platform_device_count=${DEVICES:-4}" \
    python -m searchrl.main --config "$CONFIG" "$@" --config.distributed.enabled=True \
    --config.distributed.coordinator_address=127.0.0.1:"$PORT" \
    --config.distributed.num_processes="$PROCESSES" --config.distributed.process_id="$i" train)")
done
if [[ "${DRY_RUN:-0}" == 1 ]]; then
  for i in "${!lines[@]}"; do echo "host $i: ${lines[$i]}"; done
  exit 0
fi
pids=()
for line in "${lines[@]}"; do bash -c "$line" & pids+=($!); done
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
# The first process to fail stops the others (they would wait for it at the next collective).
for _ in "${pids[@]}"; do wait -n || exit $?; done
