"""Matmul FLOPs and bytes counted on jaxprs: hand-computed cases, XLA's own count where it is right (no
loops), and one decode step of the real decoder against the transformer's textbook FLOP count."""
import dataclasses

import jax
import jax.numpy as jnp
import pytest

from searchrl import models
from searchrl.benchmarks.jaxpr_cost import MatmulCost, matmul_cost
from searchrl.rollout import generate
from searchrl.rollout.config import SamplingParams

ATTENTION = models.AttentionConfig()  # the default: `MeshConfig.attention`


def test_a_matmul_chain_matches_xla_cost_analysis():
    a, b, c = jnp.ones((8, 16)), jnp.ones((16, 32)), jnp.ones((32, 4))
    jitted = jax.jit(lambda a, b, c: (a @ b) @ c)
    cost = matmul_cost(jitted.trace(a, b, c).jaxpr)
    assert cost.flops == 2 * 8 * 16 * 32 + 2 * 8 * 32 * 4
    assert cost.bytes == 4 * ((8 * 16 + 16 * 32 + 8 * 32) + (8 * 32 + 32 * 4 + 8 * 4))
    assert cost.flops == jitted.lower(a, b, c).compile().cost_analysis()["flops"]


def test_batched_contraction_counts_batch_and_contracted_dims():
    x, y = jnp.ones((3, 5, 7)), jnp.ones((3, 7, 2))
    cost = matmul_cost(jax.make_jaxpr(lambda x, y: jnp.einsum("bij,bjk->bik", x, y))(x, y))
    assert cost.flops == 2 * 3 * 5 * 2 * 7


def test_loops_count_their_trip_counts_where_xla_counts_a_body_once():
    w, x = jnp.ones((10, 64, 64)), jnp.ones((32, 64))

    def layers(w, x):
        return jax.lax.scan(lambda x, wi: (jnp.tanh(x @ wi), None), x, w)[0].sum()

    forward = 2 * 32 * 64 * 64
    assert matmul_cost(jax.make_jaxpr(layers)(w, x)).flops == 10 * forward
    # Backward through the scan: each layer's input gradient and weight gradient, one matmul each.
    assert matmul_cost(jax.make_jaxpr(jax.grad(layers))(w, x)).flops == 3 * 10 * forward
    xla = jax.jit(layers).lower(w, x).compile().cost_analysis()["flops"]
    assert forward <= xla < 2 * forward  # one body (plus its tanh and the sum): why this module exists

    def loop(x):
        return jax.lax.while_loop(lambda c: c[0] < 7, lambda c: (c[0] + 1, c[1] @ c[1]), (0, x))[1]

    square = jnp.ones((16, 16))
    assert matmul_cost(jax.make_jaxpr(loop)(square), while_trips=7).flops == 7 * 2 * 16**3


def test_cond_counts_its_most_expensive_branch():
    x = jnp.ones((4, 4))
    jaxpr = jax.make_jaxpr(lambda p, x: jax.lax.cond(p, lambda x: x @ x @ x, lambda x: x @ x, x))(True, x)
    assert matmul_cost(jaxpr).flops == 2 * (2 * 4**3)


def test_cost_arithmetic():
    assert MatmulCost(2, 3) + MatmulCost(1, 1) == MatmulCost(3, 4)
    assert MatmulCost(2, 3) * 0.5 == MatmulCost(1, 1.5)


@pytest.mark.parametrize("tied", [True, False])
def test_one_decode_step_of_the_decoder_is_the_textbook_count(tied):
    """Per row and layer: q, k, v and o projections, scores and values over every cache slot, the gated MLP;
    then the LM head."""
    cfg = dataclasses.replace(models.get_preset("tiny"), tie_word_embeddings=tied)
    rows, slots = 3, 40
    D, F, H, KV, hd, V, L = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
                             cfg.head_dim, cfg.vocab_size, cfg.num_layers)
    params = models.init_params(cfg, jax.random.key(0))
    state = generate.init_state(cfg, rows, slots, jax.random.key(1))
    spec = generate.DecodeSpec(4, 8, slots - 1, SamplingParams(temperature=0.0), rules=models.SAMPLE_RULES,
                               attention=ATTENTION, unstack_layers=generate.unstacks_layers(jax.devices()))
    stops, eos = generate.stop_table([[5]]), jnp.asarray([0], jnp.int32)
    traced = generate.decode_chunk.trace(cfg, params, state, stops, eos, spec)
    per_layer = 2 * D * (H + 2 * KV) * hd + 2 * 2 * H * hd * slots + 2 * H * hd * D + 3 * 2 * D * F
    step = rows * (L * per_layer + 2 * D * V)
    assert matmul_cost(traced.jaxpr).flops == step
    assert matmul_cost(traced.jaxpr, while_trips=4).flops == 4 * step  # a chunk of 4 steps
    weights = 4 * (L * (D * (H + 2 * KV) * hd + H * hd * D + 3 * D * F) + D * V)
    cache = 4 * 2 * L * rows * KV * slots * hd
    assert matmul_cost(traced.jaxpr).bytes > weights + cache  # every weight and the whole cache are read
