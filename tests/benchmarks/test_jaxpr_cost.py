"""Matmul FLOPs and bytes counted on jaxprs: hand-computed cases, XLA's own count where it is right (no
loops), loops at their trip counts, bytes per device from the inputs' shardings, Pallas kernels' declared
costs, one decode step of the real decoder against the transformer's textbook FLOP count and a packed PPO
micro-batch's forward and backward passes against the hand count of their matmuls."""
import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.sharding import NamedSharding, PartitionSpec

from searchrl import models
from searchrl.benchmarks.jaxpr_cost import MatmulCost, input_shards, matmul_cost, program_cost, shard_count
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
    assert matmul_cost(jax.make_jaxpr(loop)(square)).flops == 7 * 2 * 16**3  # its counter's bound: 7 trips


def test_cond_counts_its_most_expensive_branch():
    x = jnp.ones((4, 4))
    jaxpr = jax.make_jaxpr(lambda p, x: jax.lax.cond(p, lambda x: x @ x @ x, lambda x: x @ x, x))(True, x)
    assert matmul_cost(jaxpr).flops == 2 * (2 * 4**3)


def test_cost_arithmetic():
    assert MatmulCost(2, 3) + MatmulCost(1, 1) == MatmulCost(3, 4)
    assert MatmulCost(2, 3) * 0.5 == MatmulCost(1, 1.5)


@pytest.mark.parametrize("tied", [True, False])
def test_one_decode_step_of_the_decoder_is_the_textbook_count(tied):
    """Per row and layer: q, k, v and o projections, scores and values over the row's live pages (the paged
    attention loop's trips: `live` blocks of a page each here, a hint), the gated MLP; then the LM head. A
    decode chunk counts one step unless told its steps."""
    cfg = dataclasses.replace(models.get_preset("tiny"), tie_word_embeddings=tied)
    rows, slots, page, live = 3, 40, 8, 3
    attention = models.AttentionConfig(block_size=page)  # one page a step of the attention loop
    D, F, H, KV, hd, V, L = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
                             cfg.head_dim, cfg.vocab_size, cfg.num_layers)
    params = models.unstack_layers(models.init_params(cfg, jax.random.key(0)))
    pages, table = generate.owned_pages(rows, slots, page)
    state = generate.init_state(rows, slots, page, jax.random.key(1))._replace(pages=jnp.asarray(table))
    pool = models.KVPool.init(cfg, pages, page)
    spec = generate.DecodeSpec(8, slots - 1, SamplingParams(temperature=0.0), steps=4,
                               compute=models.Compute(models.SAMPLE_RULES, attention))
    stops, eos = (generate.stop_table([[5]]),), jnp.asarray([0], jnp.int32)
    traced = generate.decode_chunk.trace(cfg, params, pool, state, jnp.ones(rows, bool), stops, eos, spec)
    trips = {"paged_attention.reference": live}
    per_layer = 2 * D * (H + 2 * KV) * hd + 2 * 2 * H * hd * live * page + 2 * H * hd * D + 3 * 2 * D * F
    step = rows * (L * per_layer + 2 * D * V)
    assert matmul_cost(traced.jaxpr, trips=trips).flops == step
    assert matmul_cost(traced.jaxpr, trips=trips | {"generate.decode_chunk": 4}).flops == 4 * step
    weights = 4 * (L * (D * (H + 2 * KV) * hd + H * hd * D + 3 * D * F) + D * V)
    cache = 4 * 2 * L * rows * KV * live * page * hd
    assert matmul_cost(traced.jaxpr, trips=trips).bytes > weights + cache  # every weight, the live pages


def within(counted: float, hand: float, tolerance: float = 0.1) -> bool:
    return abs(counted - hand) <= tolerance * hand


def test_a_fori_loop_over_an_array_bound_counts_every_trip():
    """`fori_loop` with an array bound lowers to a `while` (`i < n`); n known when tracing gives its trips."""
    x, w = jnp.ones((8, 32)), jnp.ones((32, 32))

    def loop(x, w):
        return jax.lax.fori_loop(0, jnp.asarray(12), lambda i, x: x @ w, x)

    result = program_cost(jax.jit(loop).trace(x, w).jaxpr)
    assert result.cost.flops == 12 * 2 * 8 * 32 * 32
    assert result.cost.bytes == 12 * 4 * (8 * 32 + 32 * 32 + 8 * 32)
    assert result.assumed_loops == ()


def test_nested_loops_multiply_their_trip_counts():
    """A scan of 4 over a `while` of 3 trips (i from 2 to 5 in a nested jit, its bound computed there from an
    argument) over a `fori_loop` of 5: 60 matmuls."""
    x = jnp.ones((16, 16))

    @jax.jit
    def middle(x, n):
        return jax.lax.while_loop(lambda c: c[0] < n + 2, lambda c: (c[0] + 1, inner(c[1])), (2, x))[1]

    def inner(x):
        return jax.lax.fori_loop(0, jnp.asarray(5), lambda i, x: x @ x, x)

    def outer(x):
        return jax.lax.scan(lambda x, _: (middle(x, jnp.asarray(3)), None), x, length=4)[0]

    result = program_cost(jax.make_jaxpr(outer)(x))
    assert result.cost.flops == 4 * 3 * 5 * 2 * 16**3
    assert result.assumed_loops == ()


def blocks_to_live_length(x, k, lengths, block):
    """A blockwise attention-like loop: one [T, block] score matmul per key block up to the longest live
    length, a trip count computed from data."""
    trips = jnp.max(-(-lengths // block))

    def step(carry):
        i, acc = carry
        keys = jax.lax.dynamic_slice_in_dim(k, i * block, block, axis=0)
        return i + 1, acc + jnp.sum(x @ keys.T)

    return jax.lax.while_loop(lambda c: c[0] < trips, step, (jnp.int32(0), jnp.float32(0)))[1]


def test_a_loop_bounded_by_data_counts_what_its_hint_says():
    T, S, hd, block = 4, 128, 16, 16
    jaxpr = jax.make_jaxpr(blocks_to_live_length, static_argnums=3)(
        jnp.ones((T, hd)), jnp.ones((S, hd)), jnp.asarray([37, 70]), block)
    per_block = 2 * T * hd * block
    unhinted = program_cost(jaxpr)  # one trip, and the loop is reported as assumed
    assert unhinted.cost.flops == per_block
    (loop,) = unhinted.assumed_loops
    assert loop.name == "test_jaxpr_cost.blocks_to_live_length" and loop.bound is None and not loop.exact
    live = 70  # the stated live length: ceil(70 / 16) = 5 blocks
    hinted = program_cost(jaxpr, trips={loop.name: math.ceil(live / block)})
    assert hinted.cost.flops == 5 * per_block and hinted.assumed_loops == ()
    by_callable = program_cost(jaxpr, trips=lambda loop: 5 if loop.name.endswith("to_live_length") else None)
    assert by_callable.cost == hinted.cost


def test_a_loop_that_may_exit_early_counts_while_trips_unless_hinted():
    """A decode chunk's loop: at most 4 steps, ending once no row is active; it reports one step."""
    x = jnp.ones((8, 8))

    def chunk(x, active):
        def step(c):
            i, x, active = c
            return i + 1, x @ x, active & (i < 2)
        return jax.lax.while_loop(lambda c: (c[0] < 4) & jnp.any(c[2]), step, (0, x, active))[1]

    jaxpr = jax.make_jaxpr(chunk)(x, jnp.ones(3, bool))
    step = 2 * 8**3
    result = program_cost(jaxpr)
    (loop,) = result.assumed_loops
    assert (loop.bound, loop.exact, result.cost.flops) == (4, False, step)
    assert matmul_cost(jaxpr, while_trips=3).flops == 3 * step
    assert matmul_cost(jaxpr, trips=lambda loop: loop.bound).flops == 4 * step  # a whole chunk
    assert program_cost(jaxpr, trips={"test_jaxpr_cost.chunk": 1}).assumed_loops == ()


def test_shard_count_is_the_product_of_the_axes_an_array_is_split_over():
    mesh = {"data": 2, "fsdp": 4, "tensor": 2}
    assert shard_count(PartitionSpec(), mesh) == 1
    assert shard_count(PartitionSpec(("data", "fsdp"), "tensor"), mesh) == 16
    assert shard_count(PartitionSpec(None, "fsdp"), mesh) == 4


def test_a_replicated_weight_counts_whole_on_every_device():
    """x [B, D] rows over 8 devices times w [D, D] replicated: each device reads all of w, its eighth of x
    and writes its eighth of y; the old split of every byte over the devices read an eighth of w."""
    B, D = 64, 256
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    x = jax.ShapeDtypeStruct((B, D), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec("data")))
    w = jax.ShapeDtypeStruct((D, D), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec()))
    with jax.set_mesh(mesh):
        traced = jax.jit(lambda x, w: x @ w.T).trace(x, w)  # a transposed weight is still the weight
    assert input_shards((x, w)) == (8, 1)
    per_device = matmul_cost(traced.jaxpr, devices=8, in_shards=input_shards((x, w)))
    assert per_device.bytes == 4 * (D * D + 2 * B * D / 8)
    assert per_device.flops == 2 * B * D * D / 8
    assert per_device.bytes - matmul_cost(traced.jaxpr).bytes / 8 == 4 * D * D * 7 / 8
    with pytest.raises(ValueError, match="in_shards names 1 inputs"):
        matmul_cost(traced.jaxpr, devices=8, in_shards=(8,))


def test_a_shard_map_body_runs_on_every_device():
    """Its body has one device's shapes: the program's FLOPs are 8 bodies, one device's are one."""
    B, D = 64, 32
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    spec = (PartitionSpec("data"), PartitionSpec())
    jaxpr = jax.make_jaxpr(jax.shard_map(lambda x, w: x @ w, mesh=mesh, in_specs=spec, out_specs=spec[0]))(
        jnp.ones((B, D)), jnp.ones((D, D)))
    assert matmul_cost(jaxpr).flops == 2 * B * D * D
    one_device = matmul_cost(jaxpr, devices=8)
    assert one_device.flops == 2 * B * D * D / 8
    assert one_device.bytes == 4 * (B * D / 8 + D * D + B * D / 8)


def tiny_matmul_kernel(x, w, estimate):
    """x [32, 16] @ w [16, 16] by a Pallas kernel over 4 row blocks, in interpret mode."""
    def kernel(x_ref, w_ref, o_ref):
        o_ref[...] = x_ref[...] @ w_ref[...]

    rows = pl.BlockSpec((8, 16), lambda i: (i, 0))
    return pl.pallas_call(
        kernel, grid=(4,), in_specs=[rows, pl.BlockSpec((16, 16), lambda i: (0, 0))], out_specs=rows,
        out_shape=jax.ShapeDtypeStruct((32, 16), jnp.float32), interpret=True, cost_estimate=estimate,
        name="tiny_matmul")(x, w)


def test_a_pallas_kernel_counts_its_declared_cost_estimate():
    x, w = jnp.ones((32, 16)), jnp.ones((16, 16))
    flops, bytes_accessed = 2 * 32 * 16 * 16, 4 * (32 * 16 + 16 * 16 + 32 * 16)
    estimate = pl.CostEstimate(flops=flops, transcendentals=0, bytes_accessed=bytes_accessed)
    assert float(tiny_matmul_kernel(x, w, estimate)[0, 0]) == 16.0
    jaxpr = jax.make_jaxpr(tiny_matmul_kernel, static_argnums=2)(x, w, estimate)
    declared = program_cost(jaxpr)
    assert declared.cost == MatmulCost(flops, bytes_accessed) and declared.undeclared_kernels == ()
    assert matmul_cost(jaxpr, devices=2) == MatmulCost(flops / 2, bytes_accessed / 2)


def test_a_pallas_kernel_without_an_estimate_is_counted_from_its_grid_and_named():
    """Its body's matmul and its blocks (x's, w's, the output's), once per grid step."""
    x, w = jnp.ones((32, 16)), jnp.ones((16, 16))
    estimated = program_cost(jax.make_jaxpr(tiny_matmul_kernel, static_argnums=2)(x, w, None))
    assert estimated.cost == MatmulCost(4 * 2 * 8 * 16 * 16, 4 * 4 * (8 * 16 + 16 * 16 + 8 * 16))
    assert estimated.undeclared_kernels == ("tiny_matmul",)


def packed_micro_batch(cfg: models.ModelConfig, rows: int, width: int, block: int):
    """Tokens, positions, mask and segments (with block pairs) of `rows` packed rows of `width` slots: row 0
    holds sequences of 24 and 40 tokens, row 1 one of 50 then padding."""
    ids = np.asarray([[0] * 24 + [1] * 40, [0] * 50 + [1] * 14])
    valid = np.asarray([[True] * width, [True] * 50 + [False] * 14])
    positions = np.concatenate([np.arange(24), np.arange(40)])[None].repeat(rows, 0)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (rows, width))
    pairs = models.visible_block_pairs(ids, valid, block)
    return (jnp.asarray(tokens, jnp.int32), jnp.asarray(positions, jnp.int32), jnp.asarray(valid),
            models.Segments(jnp.asarray(ids, jnp.int32), jnp.asarray(pairs)))


def test_an_attention_loop_counts_all_its_key_blocks():
    """Blockwise attention over 40 tokens in blocks of 16: a `fori_loop` of ceil(40 / 16) = 3 blocks, each
    query's scores and values over 48 key slots (the last block re-reads 8), per layer."""
    cfg = models.get_preset("tiny")
    rows, T, block = 2, 40, 16
    D, F, H, KV, hd, V, L = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
                             cfg.head_dim, cfg.vocab_size, cfg.num_layers)
    params = models.init_params(cfg, jax.random.key(0))
    attention = models.AttentionConfig(impl="blockwise", block_size=block)
    compute = models.Compute(models.TRAIN_RULES, attention)
    result = program_cost(jax.make_jaxpr(lambda p, t: models.apply(cfg, p, t, compute=compute))(
        params, jnp.zeros((rows, T), jnp.int32)))
    layer = 2 * D * (H + 2 * KV) * hd + 2 * H * hd * D + 3 * 2 * D * F
    assert result.cost.flops == rows * T * (L * (layer + 2 * 2 * H * hd * 48) + 2 * D * V)
    assert result.assumed_loops == ()


def test_a_packed_ppo_micro_batch_is_three_forward_passes_of_matmuls():
    """The PPO loss over 2 packed rows of 64 tokens of the tiny decoder, blockwise attention over the rows'
    block pairs of 16 slots: its forward pass, and its forward and backward passes.

    Hand count: the weight matmuls are 2 x tokens x weights forward (the LM head on all but each row's last
    position), twice that backward (the input's gradient and the weight's); the attention matmuls are
    4 x H x hd x block^2 per block pair forward (scores, values), recomputed in the backward pass (only the
    weight matmuls' outputs are saved), then 10 x H x hd x block^2 backward (scores again, the probabilities'
    gradient, dq, dk, dv). Forward: weights + attention; with backward: 3 x weights + 4.5 x attention."""
    cfg = models.get_preset("tiny")
    rows, width, block = 2, 64, 16
    D, F, H, KV, hd, V, L = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
                             cfg.head_dim, cfg.vocab_size, cfg.num_layers)
    attention = models.AttentionConfig(impl="blockwise", block_size=block)
    tokens, positions, mask, segments = packed_micro_batch(cfg, rows, width, block)
    params = models.init_params(cfg, jax.random.key(0))

    def loss(params, old_logprobs, advantages):
        logprobs = models.token_logprobs(cfg, params, tokens, positions, mask, temperature=1.0,
                                         compute=models.Compute(models.TRAIN_RULES, attention), remat=False,
                                         logits_chunk=0, segments=segments)
        ratio = jnp.exp(logprobs - old_logprobs)
        clipped = jnp.minimum(ratio * advantages, jnp.clip(ratio, 0.8, 1.2) * advantages)
        return -jnp.sum(clipped * mask) / jnp.sum(mask)

    per_token = jnp.zeros((rows, width))
    forward = matmul_cost(jax.make_jaxpr(loss)(params, per_token, per_token)).flops
    both = matmul_cost(jax.make_jaxpr(jax.value_and_grad(loss))(params, per_token, per_token)).flops
    layer_weights = D * (H + 2 * KV) * hd + H * hd * D + 3 * D * F
    weights = 2 * (rows * width * L * layer_weights + rows * (width - 1) * D * V)
    attention_forward = L * rows * segments.block_pairs.shape[1] * 4 * H * hd * block**2
    assert within(forward, weights + attention_forward)
    assert within(both, 3 * weights + 4.5 * attention_forward)
    assert within(both, 3 * forward)
