#!/usr/bin/env bash
# searchrl's speed figures on one GPU host, each against PyTorch/transformers on the same GPU in the same run:
# a bf16 training step (forward+backward) at two sizes, generation, and a 4-turn BM25 search rollout.
# Usage (from the repository root, after installing requirements-gpu.txt): bash launch/gpu_benchmarks.sh [OUT_DIR]
set -euo pipefail
OUT_DIR=${1:-runs/gpu_benchmarks}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT_DIR/gpu.csv"
python3 -m searchrl.benchmarks.model --preset bench_small --batch 16 --seq 1024 --rounds 5 --steps 2 --dtype bfloat16 --json \
  | tee "$OUT_DIR/model_bench_small.json"
python3 -m searchrl.benchmarks.model --preset qwen2p5_0p5b --batch 8 --seq 2048 --rounds 5 --steps 1 --dtype bfloat16 --json \
  | tee "$OUT_DIR/model_qwen2p5_0p5b.json"
python3 -m searchrl.benchmarks.rollout --preset bench_small --dtype bfloat16 --passages 100000 --json \
  | tee "$OUT_DIR/rollout.json"
