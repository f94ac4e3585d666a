"""Static-shape KV cache: a NamedTuple pytree that `decoder.forward` reads and extends.

Row b holds its keys/values in slots 0 .. length[b]-1; `valid` marks the slots that hold real tokens
(padding is written as holes that are never attended). Rows advance independently, so multi-turn extends of
different lengths need no re-packing. Writing past `max_len` is the caller's responsibility to avoid: keys
and values past the end are dropped, and `valid` (clamped by `lax.dynamic_update_slice`) would mark the last
slots.

Keys and values are stored [layers, batch, kv_heads, slots, head_dim]: one layer's [B, KV, S, hd] block is the
operand attention's dots read as is (no per-step transpose), and `write_layer` updates the stacked arrays in
place, so a decode step touches only the new slots instead of copying the cache.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from searchrl.models.config import ModelConfig
from searchrl.models.sharding import ShardingRules, logical_to_sharding


class KVCache(NamedTuple):
    """k, v: [L, B, KV, S, hd] (post-RoPE keys); valid: bool [B, S]; length: int32 [B] slots used per row."""

    k: jax.Array
    v: jax.Array
    valid: jax.Array
    length: jax.Array

    @classmethod
    def init(cls, cfg: ModelConfig, batch: int, max_len: int, dtype=jnp.float32) -> KVCache:
        """An empty cache of `max_len` slots per row."""
        shape = (cfg.num_layers, batch, cfg.num_kv_heads, max_len, cfg.head_dim)
        return cls(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype),
                   valid=jnp.zeros((batch, max_len), bool), length=jnp.zeros((batch,), jnp.int32))

    @staticmethod
    def logical_axes() -> KVCache:
        """Logical axis names of each field, for `cache_shardings`."""
        kv = ("layers", "batch", "kv_heads", "length", "head_dim")
        return KVCache(k=kv, v=kv, valid=("batch", "length"), length=("batch",))


def cache_shardings(cfg: ModelConfig, mesh: Mesh, rules: ShardingRules, batch: int, max_len: int) -> KVCache:
    """NamedSharding of each cache field (as a KVCache), for jit in/out shardings."""
    shapes = jax.eval_shape(lambda: KVCache.init(cfg, batch, max_len))
    return KVCache(*(logical_to_sharding(axes, mesh, rules, s.shape)
                     for axes, s in zip(KVCache.logical_axes(), shapes)))


def write_rows(buf: jax.Array, new: jax.Array, start: jax.Array, where: jax.Array | None = None) -> jax.Array:
    """buf[b, start[b] + t] = new[b, t] for every row b (buf [B, S, ...], new [B, T, ...], start [B]).

    With `where` (bool [B, T]), only the slots where it is true are written; the others keep their values.
    """
    def one(row, chunk, offset, keep):
        chunk = chunk.astype(row.dtype)
        if keep is not None:
            chunk = jnp.where(keep, chunk, jax.lax.dynamic_slice_in_dim(row, offset, chunk.shape[0]))
        return jax.lax.dynamic_update_slice_in_dim(row, chunk, offset, axis=0)

    return jax.vmap(one)(buf, new, start, where)


def write_layer(buf: jax.Array, layer: int | jax.Array, new: jax.Array, start: jax.Array) -> jax.Array:
    """buf[layer, b, :, start[b] + t] = new[b, t] (buf [L, B, KV, S, hd], new [B, T, KV, hd], start [B]).

    One scatter into the stacked array (updated in place under donation); slots past the end are dropped.
    """
    B, T = new.shape[:2]
    slots = start[:, None] + jnp.arange(T)
    return buf.at[layer, jnp.arange(B)[:, None], :, slots].set(
        new.astype(buf.dtype), mode="drop", indices_are_sorted=True, unique_indices=True)
