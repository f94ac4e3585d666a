#!/usr/bin/env bash
# The first thing to run on a lent GPU (one H100 or H200): searchrl's GPU check
# (searchrl/benchmarks/gpu_check.py), at most GPU_CHECK_LIMIT_S seconds (420) once its venv is ready:
# decode ms a step at the 3B and 7B presets' per-GPU shapes, a packed PPO micro-batch's forward and backward,
# the attention kernels against the reference, each beside the cost model. Writes OUT_DIR/gpu_check.json and
# gpu_check.md (after every check: a run stopped at the limit keeps the checks it finished). Nothing is
# downloaded but the venv's packages: the venv (.venv-gpu-check) is built from requirements.txt and
# requirements-gpu.txt's JAX line (again only when one of them changes), and the script stops at once, with
# one line, if a package cannot be installed or imported.
# Usage: [GPU_CHECK_SIZE=tiny] [GPU_CHECK_PYTHON=PATH] bash launch/gpu_check.sh [OUT_DIR]
#   GPU_CHECK_SIZE=tiny    the same checks at tiny shapes (what the test suite runs on CPU)
#   GPU_CHECK_PYTHON=PATH  run with this interpreter (its packages installed) instead of building the venv
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-runs/gpu_check}
VENV=${GPU_CHECK_VENV:-.venv-gpu-check}
REQS=(requirements.txt requirements-gpu.txt)
fail() { echo "gpu_check: $*" >&2; exit 1; }

# whether the venv was built after every requirement file last changed
built() {
  local r
  for r in "${REQS[@]}"; do [[ $VENV/.installed -nt $r ]] || return 1; done
}

PY=${GPU_CHECK_PYTHON:-$VENV/bin/python}
if [[ -z ${GPU_CHECK_PYTHON:-} ]] && ! built; then
  [[ -x $PY ]] || python3 -m venv "$VENV" >/dev/null || fail "python3 -m venv $VENV failed"
  LOG=$VENV/install.log
  # pip's own retries would spend minutes on a host that cannot reach its index; searchrl itself runs from
  # the checkout (python -m from the repository root)
  "$PY" -m pip install --quiet --retries 1 --timeout 15 -r requirements.txt \
      "$(grep '^jax\[cuda12\]' requirements-gpu.txt)" >"$LOG" 2>&1 \
    || fail "a package of requirements.txt or requirements-gpu.txt could not be installed:" \
            "$(grep -m1 ERROR "$LOG" || tail -n1 "$LOG")"
  touch "$VENV/.installed"
fi
"$PY" -c "import jax, flax, optax, ml_collections, numpy, searchrl.benchmarks.gpu_check" 2>/dev/null \
  || fail "$PY cannot import the check's packages:" \
          "$("$PY" -c 'import searchrl.benchmarks.gpu_check' 2>&1 | tail -n1)"

if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
fi
export PYTHONUNBUFFERED=1
status=0
timeout --kill-after=10 "${GPU_CHECK_LIMIT_S:-420}" "$PY" -m searchrl.benchmarks.gpu_check \
  --size "${GPU_CHECK_SIZE:-paper}" --out "$OUT_DIR" || status=$?
[[ $status != 124 ]] || fail "stopped at the time limit: $OUT_DIR/gpu_check.json holds the finished checks"
exit "$status"
