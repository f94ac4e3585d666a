"""Mesh, logical-axis rules, and the sharded forward pass on 8 fake CPU devices."""
import dataclasses
import functools

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from searchrl.models import (SAMPLE_RULES, TRAIN_RULES, AttentionConfig, Compute, KVCache, ShardingRules,
                             forward, get_preset, logical_to_sharding, logical_to_spec, make_mesh,
                             param_shardings, param_table, pool_sharding, unstack_layers, unstack_shardings,
                             value_params_from_policy)
from tests.models.model_helpers import global_pages, paged_cache, random_params, random_tokens

ATTENTION = AttentionConfig()  # the default: `MeshConfig.attention`
TRAIN = Compute(TRAIN_RULES, ATTENTION)  # a default run's training layout and attention
SAMPLE = Compute(SAMPLE_RULES, ATTENTION)  # and its sampling

MESH_SHAPE = {"data": 2, "fsdp": 2, "tensor": 2}


def test_make_mesh_sizes_and_errors():
    assert dict(make_mesh(-1, 1, 1).shape) == {"data": 8, "fsdp": 1, "tensor": 1}
    assert dict(make_mesh(data=-1, fsdp=2, tensor=2).shape) == MESH_SHAPE
    assert dict(make_mesh(data=1, fsdp=-1, tensor=4).shape) == {"data": 1, "fsdp": 2, "tensor": 4}
    assert make_mesh(data=2, fsdp=1, tensor=2).devices.size == 4  # a divisor of the device count is fine
    with pytest.raises(ValueError, match="does not divide the 8 devices"):
        make_mesh(data=3, fsdp=1, tensor=1)
    with pytest.raises(ValueError, match="at most one -1"):
        make_mesh(data=-1, fsdp=-1, tensor=1)


def test_logical_to_spec_rules():
    # Each mesh axis shards at most one dimension: activations keep `embed` whole under FSDP.
    assert logical_to_spec(("batch", "length", "embed"), TRAIN_RULES, MESH_SHAPE) == \
        P(("data", "fsdp"), None, None)
    assert logical_to_spec(("layers", "embed", "heads", "head_dim"), TRAIN_RULES, MESH_SHAPE) == \
        P(None, "fsdp", "tensor", None)
    assert logical_to_spec(("vocab", "embed"), SAMPLE_RULES, MESH_SHAPE) == P("tensor", None)
    # Divisibility fallback: 2 rows over data x fsdp (4) keep only data; 3 heads stay whole.
    assert logical_to_spec(("batch", "heads"), TRAIN_RULES, MESH_SHAPE, shape=(2, 3)) == P("data", None)
    # Mesh axes absent from the mesh are ignored.
    assert logical_to_spec(("batch",), TRAIN_RULES, {"data": 4}) == P("data")
    with pytest.raises(ValueError, match="'nope'"):
        logical_to_spec(("nope",), TRAIN_RULES, MESH_SHAPE)
    with pytest.raises(ValueError, match="unknown logical axes"):
        ShardingRules((("batch", "data"), ("widgets", "tensor")))


@pytest.mark.parametrize("value", [False, True])
def test_param_table_mirrors_params(value):
    cfg = dataclasses.replace(get_preset("tiny"), tie_word_embeddings=False)
    params = random_params(cfg)
    if value:
        params = value_params_from_policy(cfg, params, jax.random.key(0))
    table = param_table(cfg, value=value)
    leaves = jax.tree_util.tree_leaves_with_path(params)
    assert {tuple(k.key for k in path): x.shape for path, x in leaves} == \
        {path: spec.shape for path, spec in table.items()}
    assert (("value_head", "kernel") in table) == value and (("lm_head",) in table) != value


def _mesh_cfg(kv_heads: int = 1):
    # One KV head: `kv_heads` cannot split over tensor=2 and must fall back to replication.
    return dataclasses.replace(get_preset("tiny"), num_kv_heads=kv_heads, tie_word_embeddings=False)


# A Pallas kernel (interpreted) runs per shard (`sharded_attention`): with one key head for every query head
# (heads replicated) and with two (each device its heads).
PALLAS = AttentionConfig("pallas", kernel_block=4, interpret=True)
SHARDED_CASES = [(ATTENTION, 1), (PALLAS, 1), (PALLAS, 2)]


@pytest.mark.parametrize("attention,kv_heads", SHARDED_CASES, ids=["reference", "pallas", "pallas_2kv"])
def test_sharded_forward_equals_single_device(attention, kv_heads):
    cfg = _mesh_cfg(kv_heads)
    params = random_params(cfg)
    tokens = random_tokens(cfg, (8, 12), seed=0)
    mask = np.ones((8, 12), bool)
    mask[::3, :4] = False
    positions = np.maximum(np.cumsum(mask, 1) - 1, 0).astype(np.int32)
    plain = jax.jit(functools.partial(forward, cfg, compute=TRAIN, remat=False))
    ref = np.asarray(plain(params, tokens, positions, mask)[0])

    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    shardings = param_shardings(cfg, mesh, TRAIN_RULES)
    assert shardings["layers"]["k"].spec == P(None, "fsdp", None if kv_heads == 1 else "tensor", None)
    assert shardings["layers"]["q"].spec == P(None, "fsdp", "tensor", None)
    batch = logical_to_sharding(("batch", "length"), mesh, TRAIN_RULES)
    step = jax.jit(lambda p, t, pos, m: forward(cfg, p, t, pos, m, compute=Compute(TRAIN_RULES, attention),
                                                        remat=False)[0],
                   in_shardings=(shardings, batch, batch, batch))
    with jax.set_mesh(mesh):
        logits = step(jax.device_put(params, shardings), tokens, positions, mask)
    assert logits.sharding.spec == P(("data", "fsdp"), None, "tensor")  # activation constraints were applied
    np.testing.assert_allclose(np.asarray(logits), ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_sharded_cached_decode_equals_single_device(kv_heads):
    """Prefill then a decode step over the paged cache on a (data 2, tensor 4) mesh: each device writes and
    reads its own rows' pages (local page ids) and its own key heads where they split (2 key heads over
    tensor 4 do not: replicated), and gets what one device gets from the whole pool."""
    cfg = _mesh_cfg(kv_heads)
    params = unstack_layers(random_params(cfg))
    tokens = random_tokens(cfg, (4, 6), seed=1)
    positions = np.broadcast_to(np.arange(6, dtype=np.int32), (4, 6))
    mask = np.ones((4, 6), bool)
    mask[1, 4:] = False  # a shorter prompt

    def run(params, cache, step):
        _, _, cache = step(params, tokens[:, :5], positions[:, :5], mask[:, :5], cache)
        return np.asarray(step(params, tokens[:, 5:], positions[:, 5:], mask[:, 5:], cache)[0])

    plain = jax.jit(functools.partial(forward, cfg, compute=TRAIN, remat=False, unrolled=True))
    local = paged_cache(cfg, 4, 8, page_size=2, shards=2)
    ref = run(params, global_pages(local, 2), plain)

    mesh = make_mesh(data=2, fsdp=1, tensor=4)
    shardings = unstack_shardings(param_shardings(cfg, mesh, SAMPLE_RULES), cfg.num_layers)
    pool = pool_sharding(cfg, mesh, SAMPLE_RULES, 4)
    assert pool.spec == P(None, "data", None, None)  # neither 1 nor 2 key heads split over tensor 4
    batch = logical_to_sharding(("batch", "length"), mesh, SAMPLE_RULES)
    rows = logical_to_sharding(("batch",), mesh, SAMPLE_RULES)
    cache_sh = KVCache((pool,) * cfg.num_layers, (pool,) * cfg.num_layers, batch, rows)
    sharded = jax.jit(lambda p, t, pos, m, c: forward(cfg, p, t, pos, m, c, compute=SAMPLE, remat=False,
                                                      unrolled=True),
                      in_shardings=(shardings, batch, batch, batch, cache_sh), donate_argnums=4)
    with jax.set_mesh(mesh):
        out = run(jax.device_put(params, shardings), jax.device_put(local, cache_sh), sharded)
    np.testing.assert_allclose(out, ref, atol=1e-5, rtol=0)


def test_forward_without_mesh_has_no_constraints():
    cfg = get_preset("tiny")
    jaxpr = jax.make_jaxpr(functools.partial(forward, cfg, compute=TRAIN, remat=False))(
        random_params(cfg), np.zeros((1, 4), np.int32), np.zeros((1, 4), np.int32), np.ones((1, 4), bool))
    assert "sharding_constraint" not in str(jaxpr)
