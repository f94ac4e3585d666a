#!/usr/bin/env bash
# One process on this machine (CPU or its GPUs), retrieval in-process from a local index.
# Usage: bash launch/local.sh configs/autosearch.py:tiny [--config.x.y=value ...]
set -euo pipefail
CONFIG=${1:?usage: local.sh CONFIG [overrides ...]}
shift
exec python -m searchrl.main --config "$CONFIG" "$@" train
