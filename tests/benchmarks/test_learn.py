"""The PPO step benchmark: a tiny preset's step on the 8 CPU devices, its FLOP count and the chips table."""
import os
import sys

import pytest

from searchrl import models, run_config
from searchrl.benchmarks import learn
from searchrl.rl.config import RLConfig

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "configs"))
import autosearch  # noqa: E402


def _config(remat: bool):
    config = autosearch.get_config("tiny")
    config.rollout.update(dict(max_prompt_tokens=32, max_len=96))
    config.train.batch_size = 4
    config.rl.update(dict(responses_per_prompt=2, minibatch_size=8, micro_batch_size=4, remat=remat))
    config.mesh.update(dict(data=2, fsdp=4, tensor=1))
    return run_config.parse(config)


@pytest.mark.parametrize("remat", [False, True])
def test_a_tiny_ppo_step_and_its_flops(remat):
    """The step runs; the FLOPs counted on its jaxpr are the model's (`model_flops`) plus what the backward
    passes of the two trained models recompute."""
    config = _config(remat)
    r = learn.run(config, steps=1)
    assert r["finite"] and r["rows"] == 8 and r["width"] == 96 and r["devices"] == 8 and r["step_s"] > 0
    assert r["mfu"] is None and r["hfu"] is None  # no peak FLOP/s figure for a CPU
    cfg = models.config_from_source(config.model)
    D, F, L, H, KV, hd, T = (cfg.hidden_size, cfg.intermediate_size, cfg.num_layers, cfg.num_heads,
                             cfg.num_kv_heads, cfg.head_dim, 96)
    # One forward pass through the layers, per token, by hand: the q/k/v/o and MLP matmuls, then attention.
    layers_forward = 2 * L * (D * H * hd + 2 * D * KV * hd + H * hd * D + 3 * D * F) + 4 * H * T * hd * L
    attention_forward = 4 * H * T * hd * L
    # Without remat a layer keeps its weight matmuls' outputs and recomputes attention; with remat it
    # recomputes every matmul but the last: the down projection's output is the next layer's input, kept.
    recomputed_per_model = layers_forward - 2 * L * F * D if remat else attention_forward
    recomputed = 2 * recomputed_per_model  # policy and critic, one epoch
    assert config.rl.ppo_epochs == 1
    # The head runs on the T - 1 positions that predict a token (model_flops counts T): within 0.1%.
    expected = r["model_tflop_per_step"] + 8 * T * recomputed / 1e12
    assert r["executed_tflop_per_step"] == pytest.approx(expected, rel=1e-3)


def test_model_flops_by_hand():
    """qwen2p5_3b (D 2048, F 11008, 36 layers, 16 heads, 2 kv heads, head_dim 128, vocab 151936), PPO with a
    critic and a reference, one epoch, one row of 1024 tokens."""
    cfg = models.get_preset("qwen2p5_3b")
    layers = 36 * (2048 * 128 * (2 * 16 + 2 * 2) + 3 * 2048 * 11008)  # 3.08e9 weights
    attention = 4 * 36 * 16 * 1024 * 128
    policy = 2 * (layers + 2048 * 151936) + attention
    critic = 2 * (layers + 2048) + attention
    rl = RLConfig(use_critic=True, use_reference=True, ppo_epochs=1)
    assert learn.model_flops(cfg, rl, 1, 1024) == 1024 * (2 * policy + critic + 3 * (policy + critic))
    grpo = RLConfig(use_critic=False, use_reference=True, ppo_epochs=2, advantage="grpo")
    assert learn.model_flops(cfg, grpo, 2, 1024) == 2 * 1024 * (2 * policy + 2 * 3 * policy)


def test_a_prompt_that_fills_the_rows_is_refused():
    with pytest.raises(ValueError, match=r"a prompt of 96 tokens \(rollout.max_prompt_tokens\) leaves no"):
        learn.synthetic_batch(rows=2, width=96, prompt=96, vocab=10, responses_per_prompt=1)
