#!/usr/bin/env bash
# The long GPU run (20-30 minutes): run launch/gpu_check.sh first (8 minutes: the paper shapes' decode steps,
# PPO micro-batch and attention kernels on one GPU, beside the cost model). This one measures searchrl against
# its peers on one GPU host, in one run:
#   - a bf16 training step (forward+backward) against PyTorch/transformers on the same GPU, at two sizes, and
#     each attention implementation (blockwise, cuDNN's, the Pallas Triton kernels) against the reference
#     attention at those shapes, and again alone at a Search-R1 shape (Qwen2.5-3B heads, 4 rows of 4096
#     tokens), with one sequence a row and with rows packed with several (blockwise over their block pairs);
#   - greedy generation against transformers' generate, and the decode steps' share of the HBM bandwidth;
#   - a 4-turn search rollout's host share, retrieving with FAISS on the GPU (dense), and with BM25;
#   - the long-tail rollout (episodes of 1 to 4 tool calls, a retriever with a remote server's latency):
#     continuous batching against lock step, episodes/s, decode slot utilisation and the device's idle share;
#   - the PPO step of a Qwen2.5-1.5B-shaped model (policy, critic and reference on this one GPU, bf16
#     compute and gradient checkpointing as configs/autosearch.py:paper, 32 rows of 2048 tokens): MFU and
#     peak GPU memory (a 3B one needs 128 GiB: more than an H100 has; gpu_check.sh times the 3B's share of
#     a paper micro-batch on one GPU). If it does not fit it leaves a {"failed": true} file.
# Usage (from the repository root, after installing requirements-gpu.txt): bash launch/gpu_benchmarks.sh [OUT_DIR]
set -euo pipefail
OUT_DIR=${1:-runs/gpu_benchmarks}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1
# JAX's allocator takes 75% of the GPU by default; the 1.5B PPO step below needs 67 GiB (compiled for h200:1
# by searchrl.benchmarks.aot).
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.95}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT_DIR/gpu.csv"
python3 -m searchrl.benchmarks.model --preset bench_small --batch 16 --seq 1024 --rounds 5 --steps 2 --dtype bfloat16 --json \
  | tee "$OUT_DIR/model_bench_small.json"
python3 -m searchrl.benchmarks.model --preset qwen2p5_0p5b --batch 8 --seq 2048 --rounds 5 --steps 1 --dtype bfloat16 --json \
  | tee "$OUT_DIR/model_qwen2p5_0p5b.json"
python3 -m searchrl.benchmarks.attention --preset qwen2p5_3b --batch 4 --seq 4096 --rounds 5 --calls 3 \
  --dtype bfloat16 --json | tee "$OUT_DIR/attention_qwen2p5_3b.json"
python3 -m searchrl.benchmarks.attention --preset qwen2p5_3b --batch 4 --seq 4096 --packed --rounds 5 \
  --calls 3 --dtype bfloat16 --json | tee "$OUT_DIR/attention_qwen2p5_3b_packed.json"
python3 -m searchrl.benchmarks.rollout --preset bench_small --dtype bfloat16 --passages 100000 --retriever dense --json \
  | tee "$OUT_DIR/rollout_dense.json"
python3 -m searchrl.benchmarks.rollout --preset bench_small --dtype bfloat16 --passages 100000 --parts b --json \
  | tee "$OUT_DIR/rollout_bm25.json"
PPO=(--config configs/autosearch.py:paper --config.train.batch_size=32 --config.rl.minibatch_size=32
     --config.rl.micro_batch_size=4 --config.rollout.max_prompt_tokens=512 --config.rollout.max_len=2048
     --steps 2 --json)
python3 -m searchrl.benchmarks.learn "${PPO[@]}" --config.model.preset=qwen2p5_1p5b \
  | tee "$OUT_DIR/learn_qwen2p5_1p5b.json" \
  || echo '{"preset": "qwen2p5_1p5b", "failed": true}' | tee "$OUT_DIR/learn_qwen2p5_1p5b.json"
