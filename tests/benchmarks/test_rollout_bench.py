"""The rollout benchmark: bytes per decode step by hand, and a search rollout over dense retrieval."""
import dataclasses

import jax

from searchrl import models
from searchrl.benchmarks import rollout as rollout_bench
from searchrl.rollout.config import RolloutConfig


def test_a_decode_step_moves_every_weight_and_its_block_of_pages():
    cfg = dataclasses.replace(models.get_preset("tiny"), tie_word_embeddings=False)
    params = models.unstack_layers(models.init_params(cfg, jax.random.key(0)))
    batch, prompt_len, new_tokens = 4, 20, 7
    D, F, L, H, KV, hd, V = (cfg.hidden_size, cfg.intermediate_size, cfg.num_layers, cfg.num_heads,
                             cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size)
    # float32 throughout: the matmul weights (q, k, v, o, gate, up, down, LM head) ...
    weights = 4 * (L * (D * H * hd * 2 + D * KV * hd * 2 + 3 * D * F) + D * V)
    # ... and each layer's keys and values in the block of pages its attention reads a step: the 27 tokens
    # live at the end fill 2 pages, one block of `block_size` slots ...
    slots = models.AttentionConfig().block_size
    assert 2 * RolloutConfig.page_size <= slots
    cache = 4 * 2 * L * batch * slots * KV * hd
    # One token's activations per row, in and out of each matmul: per layer q/k/v's input and outputs, o's,
    # gate/up/down's, the attention scores (both ways: the scores' output and the mixing's input), the query
    # read and its mixed values written by the attention's one step (both pages in one block) ...
    per_layer = ((3 * D + H * hd + 2 * KV * hd) + (H * hd + D) + (2 * D + 2 * F + F + D)
                 + 2 * H * slots + 2 * H * hd)
    activations = 4 * batch * (L * per_layer + D + V)
    step_bytes = rollout_bench.decode_step_bytes(cfg, params, batch, prompt_len, new_tokens)
    assert step_bytes == weights + cache + activations


def test_a_search_rollout_with_dense_retrieval_and_a_random_encoder(monkeypatch):
    """Part (b) on a FAISS index (on the CPU here) with a random MiniLM-shaped encoder, as on a GPU host
    without the packaged model: every turn searches, no program compiles after warm-up."""
    monkeypatch.setattr(rollout_bench, "default_encoder", lambda: None)
    r = rollout_bench.bench_search_rollout("tiny", batch=2, passages=200, turns=2, rollouts=1,
                                           dtype="float32", retriever="dense")
    assert r["retriever"].startswith("dense (IndexFlat, encoder ") and r["retriever"].endswith("/encoder)")
    assert r["searches"] == 2 * 2 and r["compiles_after_warmup"] == 0 and 0 < r["host_fraction"] < 1


def test_the_long_tail_part_on_a_tiny_model():
    """Part (d), shrunk: both schedules run the same episodes of 1-4 searches; nothing compiles after the
    warm-up (speed is the benchmark's to measure, not the test's)."""
    r = rollout_bench.bench_long_tail("tiny", episodes=6, rows=2, extend_rows=1, parked_rows=2, passages=200,
                                      latency_ms=1, rounds=1, dtype="float32")
    mix = r["long_tail_calls_mix"]  # shares rounded to 3 decimals
    assert r["long_tail_compiles_after_warmup"] == 0 and abs(sum(mix) - 1) < 0.01
    for name in ("continuous", "lockstep"):
        assert 0 < r[f"long_tail_{name}_utilisation"] <= 1 and r[f"long_tail_{name}_episodes_per_s"] > 0
