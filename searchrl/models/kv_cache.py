"""The paged KV cache: a pool of fixed-size pages per device, and each row's page table.

Keys and values live in a `KVPool`: per layer, [kv_heads, pages, page_size, head_dim] (the layout JAX's Pallas
paged-attention kernels read), one array a layer, so a step reads and updates each layer's pool in place (no
slice of a stacked array, no copy). Row b holds its key slot s in page `pages[b, s // page_size]` at offset
`s % page_size`; its slots 0 .. length[b]-1 are live. Pages are handed out and taken back by the host
(`searchrl.rollout.pages`): a row holds as many pages as its live tokens need, so memory follows the tokens a
batch holds, not rows x max length, and rows may share pages (forks).

Under a mesh the pool's pages are split over the mesh axes that split the rows (`row_axes`): device d holds the
pages of the rows it holds, and a page table names pages of its own device (local ids), so writes and attention
(`attend`) run per device under `shard_map`, never moving a page between devices.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from searchrl.models.config import AttentionConfig, ModelConfig
from searchrl.models.paged_attention import paged_attention
from searchrl.models.sharding import ShardingRules, logical_to_spec


class KVPool(NamedTuple):
    """k, v: per layer [KV, P, page_size, hd] (post-RoPE keys, values); P pages in all (over every device)."""

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]

    @classmethod
    def init(cls, cfg: ModelConfig, pages: int, page_size: int, dtype=jnp.float32) -> KVPool:
        shape = (cfg.num_kv_heads, pages, page_size, cfg.head_dim)
        return cls(k=tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_layers)),
                   v=tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_layers)))

    @property
    def page_size(self) -> int:
        return self.k[0].shape[2]


class KVCache(NamedTuple):
    """What a forward pass over cached rows reads: the pool, each row's page table [B, n] int32 (local page
    ids) and its live slots [B] int32."""

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]
    pages: jax.Array
    length: jax.Array

    @property
    def slots(self) -> int:
        """The most key slots a row can address."""
        return self.pages.shape[1] * self.k[0].shape[2]


def row_axes(mesh_shape: dict[str, int], rules: ShardingRules, batch: int) -> str | tuple[str, ...] | None:
    """The mesh axes a batch of `batch` rows is split over under `rules` (the pool's pages split alike)."""
    return logical_to_spec(("batch",), rules, mesh_shape, (batch,))[0]


def row_shards(mesh_shape: dict[str, int], rules: ShardingRules, batch: int) -> int:
    """How many blocks of rows (and pools of pages) a batch of `batch` rows is split into."""
    axes = row_axes(mesh_shape, rules, batch)
    names = () if axes is None else (axes,) if isinstance(axes, str) else axes
    return math.prod(mesh_shape[a] for a in names)


def pool_spec(mesh_shape: dict[str, int], rules: ShardingRules, batch: int, kv_heads: int) -> PartitionSpec:
    """Each layer's pool beside a `batch`-row state: pages with the rows, heads as `rules` split them."""
    kv = logical_to_spec(("kv_heads",), rules, mesh_shape, (kv_heads,))[0]
    return PartitionSpec(kv, row_axes(mesh_shape, rules, batch), None, None)


def pool_sharding(cfg: ModelConfig, mesh: Mesh, rules: ShardingRules, batch: int) -> NamedSharding:
    """The sharding of each layer's pool beside a `batch`-row state: pages with the rows, heads as the
    sampling rules split them."""
    return NamedSharding(mesh, pool_spec(dict(mesh.shape), rules, batch, cfg.num_kv_heads))


def write_pages(pool: jax.Array, new: jax.Array, pages: jax.Array, start: jax.Array, count: jax.Array
                ) -> jax.Array:
    """pool (one layer's [KV, P, page, hd]) with row b's first count[b] entries of `new` [B, T, KV, hd] at its
    slots start[b] .. (through its page table `pages` [B, n]); the other entries are dropped, so a row
    writes only into pages it holds. Each head's entry is written on its own (a scatter of head_dim
    vectors): XLA:TPU then keeps the pool in the layout the Pallas kernel reads, where a scatter of whole
    [KV, hd] tokens made it copy the pool around every layer's attention."""
    P, page = pool.shape[1], pool.shape[2]
    T = new.shape[1]
    slot = start[:, None] + jnp.arange(T)
    held = jnp.take_along_axis(pages, jnp.minimum(slot // page, pages.shape[1] - 1), axis=1)
    target = jnp.where(jnp.arange(T)[None, :] < count[:, None], held, P)  # P: out of range, dropped
    heads = jnp.arange(pool.shape[0])[:, None, None]
    return pool.at[heads, target[None], (slot % page)[None]].set(jnp.moveaxis(new, 2, 0).astype(pool.dtype),
                                                                  mode="drop")


def _attend_local(q, k, v, k_pool, v_pool, pages, start, count, config):
    """`attend` on one device's rows and pages."""
    k_pool, v_pool = (write_pages(p, x, pages, start, count) for p, x in ((k_pool, k), (v_pool, v)))
    kv_length = jnp.where(count > 0, start + count, 0)  # a row appending nothing attends nothing
    query_slot = start[:, None] + jnp.arange(q.shape[1], dtype=start.dtype)
    out = paged_attention(q, k_pool, v_pool, pages, query_slot, kv_length, config)
    return out, k_pool, v_pool


def attend(q: jax.Array, k: jax.Array, v: jax.Array, k_pool: jax.Array, v_pool: jax.Array, pages: jax.Array,
           start: jax.Array, count: jax.Array, config: AttentionConfig, rules: ShardingRules
           ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Appends each row's first count[b] new keys and values (k, v [B, T, KV, hd]) at its slots start[b] ..
    into one layer's pools, then attends its queries q [B, T, H, hd] (query t at slot start[b] + t) over its
    live slots, reading only the pages that hold them (`paged_attention`). Returns (output [B, T, H, hd],
    k_pool, v_pool). A row with count 0 is left as it was; its output is unspecified.

    Under a mesh (`jax.set_mesh`) each device writes and reads its own rows' pages (`shard_map`): page ids
    are local, and XLA could not know that a gather by them stays on the device."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return _attend_local(q, k, v, k_pool, v_pool, pages, start, count, config)
    shape = dict(mesh.shape)
    rows = row_axes(shape, rules, q.shape[0])
    heads, kv_heads = (logical_to_spec((name,), rules, shape, (n,))[0]
                       for name, n in (("heads", q.shape[2]), ("kv_heads", k.shape[2])))
    if heads != kv_heads:  # a key head's query heads would sit on other devices: every device takes all
        heads = kv_heads = None
    pool = PartitionSpec(kv_heads, rows, None, None)
    new = PartitionSpec(rows, None, kv_heads, None)
    per_row = PartitionSpec(rows)
    specs = (PartitionSpec(rows, None, heads, None), new, new, pool, pool, PartitionSpec(rows, None), per_row,
             per_row)
    return jax.shard_map(lambda *a: _attend_local(*a, config), mesh=mesh, in_specs=specs,
                         out_specs=(specs[0], pool, pool), check_vma=False)(
        q, k, v, k_pool, v_pool, pages, start, count)


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
