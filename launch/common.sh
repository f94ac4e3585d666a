# Sourced by the launch scripts: each builds the command line every host runs, then `on_hosts` runs it here
# or, with DRY_RUN=1, prints it for each host and runs nothing.

# Quotes a command line for `bash -c` (and for reading it back): `quoted ARG ...`.
quoted() {
  local line
  line=$(printf '%q ' "$@")
  echo "${line% }"
}

# `on_hosts N COMMAND_LINE RUNNER ...`: DRY_RUN=1 prints "host i: COMMAND_LINE" for i < N; otherwise runs
# RUNNER ... (which starts COMMAND_LINE on every host: srun, gcloud, or bash -c here).
on_hosts() {
  local hosts=$1 line=$2
  shift 2
  if [[ "${DRY_RUN:-0}" == 1 ]]; then
    for ((i = 0; i < hosts; i++)); do echo "host $i: $line"; done
    return 0
  fi
  "$@"
}

# `retrieval_lines SCRIPT INDEX_DIR PORT`: sets SERVE (starts this host's retrieval server with SCRIPT, the
# launcher's path to retrieval_server.sh, passing it the serve flags in RETRIEVAL_FLAGS, e.g.
# RETRIEVAL_FLAGS="--device=gpu:7") and STOP (stops it; the launchers run it at exit), quoted for `bash -c`.
# Both find the server's log and pid under RUN_DIR, which the launchers export.
# INDEX_DIR "-": no server (SERVE and STOP empty), the config's own retriever (a search engine's API, SQL).
# REMOTE: the trainer's flags that point it at the server (none for "-").
retrieval_lines() {
  local flags=()
  SERVE="" STOP="" REMOTE=()
  [[ $2 == - ]] && return 0
  read -ra flags <<<"${RETRIEVAL_FLAGS:-}"
  SERVE=$(quoted bash "$1" "$2" "$3" "${flags[@]}")
  STOP=$(quoted bash "$1" stop "$3")
  REMOTE=(--config.retrieval.kind=remote "--config.retrieval.url=http://127.0.0.1:$3/retrieve")
}

# `served TRAIN_LINE`: the line a host runs: its retrieval server (SERVE), stopped at exit, then TRAIN_LINE;
# TRAIN_LINE alone when there is no server.
served() {
  if [[ -n $SERVE ]]; then echo "$SERVE && trap $(quoted "$STOP") EXIT && $1"; else echo "$1"; fi
}
