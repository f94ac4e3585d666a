"""Grouped-query attention of the decoder, one function per implementation (`ATTENTION`, selected by
`AttentionConfig.impl`).

Every implementation takes the same compact description of which keys a query sees, never a [T, S] mask:
key slot s is attended by query t of row b iff `key_valid[b, s] and s <= query_slot[b, t]`. Without a cache
that is causal attention over the row's unmasked tokens (query_slot = t); with one, each query sees the valid
cache slots up to its own (query_slot = length[b] + t). Packed rows (several sequences in one row, no cache,
T == S) add `segment_ids` [B, T]: then query t also needs `segment_ids[b, s] == segment_ids[b, t]`; the
decoder passes them as `Segments`, with the block pairs that an implementation in `SKIPS_BLOCKS` restricts
its work to. A query with no such key gets a finite, unspecified output (scores of masked keys are
`MASKED`, never -inf, so no row of the softmax is 0 / 0).

Shapes: q [B, T, H, hd]; k, v [B, KV, S, hd] (the cache's layout: H is a multiple of KV, each group of
H / KV query heads shares a key head); the output is [B, T, H, hd] in v's dtype.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

import searchrl.models.attention_pallas  # noqa: F401  (registers the Pallas kernels)
from searchrl.models.attention_base import ATTENTION, BACKEND, MASKED, PALLAS_KERNELS, SKIPS_BLOCKS, Segments
from searchrl.models.config import AttentionConfig
from searchrl.models.sharding import ShardingRules, logical_to_spec


def attend_mask(key_valid: jax.Array, query_slot: jax.Array, slots: jax.Array,
                segments: tuple[jax.Array, jax.Array] | None = None) -> jax.Array:
    """Bool [B, T, n]: whether each query may attend each of the key slots `slots` [n] (key_valid [B, n]);
    `segments` = (the queries' segment ids [B, T], the keys' [B, n]) of packed rows."""
    allowed = key_valid[:, None, :] & (slots[None, None, :] <= query_slot[:, :, None])
    if segments is None:
        return allowed
    query_segment, key_segment = segments
    return allowed & (query_segment[:, :, None] == key_segment[:, None, :])


def _both(segment_ids: jax.Array | None) -> tuple[jax.Array, jax.Array] | None:
    """Packed rows' segment ids as (queries', keys'): the same array, since a packed row has no cache."""
    return None if segment_ids is None else (segment_ids, segment_ids)


def _grouped(q: jax.Array, kv_heads: int) -> jax.Array:
    """q [B, T, H, hd] as [B, KV, G, T, hd]: each key head's query heads, each head's rows contiguous
    (XLA:CPU's backward pass then transposes less than with [B, KV, T, G, hd])."""
    B, T, H, hd = q.shape
    return jnp.transpose(q.reshape(B, T, kv_heads, H // kv_heads, hd), (0, 2, 3, 1, 4))


def _ungrouped(out: jax.Array) -> jax.Array:
    """[B, KV, G, T, hd] back to [B, T, H, hd]."""
    B, KV, G, T, hd = out.shape
    return jnp.transpose(out, (0, 3, 1, 2, 4)).reshape(B, T, KV * G, hd)


@ATTENTION.register("reference")
def reference(q: jax.Array, k: jax.Array, v: jax.Array, key_valid: jax.Array, query_slot: jax.Array,
              config: AttentionConfig, segment_ids: jax.Array | None = None) -> jax.Array:
    """Float32 scores [B, KV, G, T, S] and their softmax, materialised: the definition the others are tested
    against (and the HF parity tests' math). Per key head both dots are plain batched matmuls over the cache's
    own layout, so no transposed copy of the keys/values is made."""
    del config
    qg = _grouped(q, k.shape[1])
    scores = jnp.einsum("bkgth,bksh->bkgts", qg, k, preferred_element_type=jnp.float32)
    scores = scores / math.sqrt(q.shape[-1])
    allowed = attend_mask(key_valid, query_slot, jnp.arange(k.shape[2]), _both(segment_ids))
    scores = jnp.where(allowed[:, None, None], scores, MASKED)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return _ungrouped(jnp.einsum("bkgts,bksh->bkgth", probs, v))


@ATTENTION.register("blockwise")
def blockwise(q: jax.Array, k: jax.Array, v: jax.Array, key_valid: jax.Array, query_slot: jax.Array,
              config: AttentionConfig, segment_ids: jax.Array | None = None,
              block_pairs: jax.Array | None = None) -> jax.Array:
    """Online softmax over blocks of `config.block_size` key slots (flash attention in plain XLA): the scores
    of one block, [B, KV, G, T, block] float32, are all that live at once, in the forward pass and in the
    backward pass (`_flash`, which recomputes them from q, k and each query's softmax statistics). The
    portable implementation: every backend compiles it. Packed rows with `block_pairs` (`Segments`) compute
    only those pairs of query and key blocks (`_sparse_flash`): no work across sequences or on padding."""
    if block_pairs is not None:
        return _block_sparse(q, k, v, key_valid, query_slot, segment_ids, block_pairs, config.block_size)
    block = min(config.block_size, k.shape[2])
    return _ungrouped(_flash(_grouped(q, k.shape[1]), k, v, key_valid, query_slot.astype(jnp.int32),
                             segment_ids, block))


SKIPS_BLOCKS.add("blockwise")


@ATTENTION.register("dot_product")
def dot_product(q: jax.Array, k: jax.Array, v: jax.Array, key_valid: jax.Array, query_slot: jax.Array,
                config: AttentionConfig, segment_ids: jax.Array | None = None) -> jax.Array:
    """`jax.nn.dot_product_attention` with cuDNN's fused kernel (GPU only; bfloat16 or float16, head_dim a
    multiple of 8 up to 128). Its API cannot express this rule in O(T + S): causal masking assumes query t is
    key slot t and the sequence lengths assume a valid prefix, but rows are left-padded and a cache has holes
    and per-row lengths. So it is given the dense bool mask [B, 1, T, S], which cuDNN turns into an additive
    bias of q's dtype: no [B, H, T, S] float32 scores or softmax, but one [B, T, S] bias a row."""
    del config
    return _dot_product(q, k, v, key_valid, query_slot, segment_ids, "cudnn")


BACKEND["dot_product"] = "gpu"


def _dot_product(q: jax.Array, k: jax.Array, v: jax.Array, key_valid: jax.Array, query_slot: jax.Array,
                 segment_ids: jax.Array | None, implementation: str) -> jax.Array:
    """`dot_product` through jax.nn.dot_product_attention's `implementation` ("cudnn" or "xla")."""
    mask = attend_mask(key_valid, query_slot, jnp.arange(k.shape[2]), _both(segment_ids))[:, None]
    k, v = (jnp.swapaxes(x, 1, 2).astype(q.dtype) for x in (k, v))  # [B, S, KV, hd]
    return jax.nn.dot_product_attention(q, k, v, mask=mask, implementation=implementation).astype(v.dtype)


def _block_scores(qg: jax.Array, k: jax.Array, key_valid: jax.Array, query_slot: jax.Array,
                  segment_ids: jax.Array | None, start: jax.Array, first: jax.Array, block: int) -> jax.Array:
    """Float32 scores [B, KV, G, T, block] of the key slots start .. start + block - 1: MASKED where a query
    may not attend, -inf on slots below `first` (an earlier block's, re-read by the last, clamped block), so
    they count for nothing even in a row with no key to attend."""
    slots = start + jnp.arange(block)
    keys = jax.lax.dynamic_slice_in_dim(k, start, block, axis=2)
    valid = jax.lax.dynamic_slice_in_dim(key_valid, start, block, axis=1)
    segments = None if segment_ids is None else (
        segment_ids, jax.lax.dynamic_slice_in_dim(segment_ids, start, block, axis=1))
    scores = jnp.einsum("bkgth,bksh->bkgts", qg, keys, preferred_element_type=jnp.float32)
    scores = jnp.where(attend_mask(valid, query_slot, slots, segments)[:, None, None],
                       scores / math.sqrt(qg.shape[-1]), MASKED)
    return jnp.where(slots >= first, scores, -jnp.inf)


def _block_start(i: jax.Array, block: int, slots: int) -> tuple[jax.Array, jax.Array]:
    """(start, first) of block i: its slots start at min(i * block, slots - block) so that every block is
    whole; `first` = i * block is the first slot no earlier block covered."""
    first = i * block
    return jnp.minimum(first, slots - block), first


def _trips(slots: int, block: int) -> jax.Array:
    """The number of blocks, as an array: `fori_loop` then lowers to a while loop, not to a scan. Under the
    decoder's remat and layer scan, JAX would partially evaluate a scan and stack per-block residuals
    ([blocks, ..., T, block]: the whole score mask); a while loop is never split, and `_flash`'s own
    backward pass recomputes what it needs."""
    return jnp.asarray(-(-slots // block), jnp.int32)


def _softmax_step(carry: tuple[jax.Array, jax.Array, jax.Array], scores: jax.Array, values: jax.Array
                  ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One key block of the online softmax: (max, sum of exp(score - max), the weighted values so far), of
    shapes [..., G, T] and [..., G, T, hd], updated with the block's scores [..., G, T, s] of values
    [..., s, hd]."""
    m, l, acc = carry
    m_new = jnp.maximum(m, scores.max(axis=-1))
    p = jnp.exp(scores - m_new[..., None])
    scale = jnp.exp(m - m_new)
    pv = jnp.einsum("...gts,...sh->...gth", p.astype(values.dtype), values,
                    preferred_element_type=jnp.float32)
    return m_new, l * scale + p.sum(axis=-1), acc * scale[..., None] + pv


def _block_gradients(scores: jax.Array, m: jax.Array, l: jax.Array, delta: jax.Array, d_out: jax.Array,
                     q: jax.Array, keys: jax.Array, values: jax.Array
                     ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """FlashAttention-2's gradients (dq, dk, dv) through one key block, float32: the probabilities recomputed
    from the block's scores [..., G, T, s] and the saved statistics (max m, sum l); masked slots pass no
    gradient to q or k (as `where`)."""
    p = jnp.exp(scores - m[..., None]) / l[..., None]
    dp = jnp.einsum("...gth,...sh->...gts", d_out, values, preferred_element_type=jnp.float32)
    ds = jnp.where(scores > MASKED, p * (dp - delta[..., None]), 0.0) / math.sqrt(q.shape[-1])
    return (jnp.einsum("...gts,...sh->...gth", ds, keys, preferred_element_type=jnp.float32),
            jnp.einsum("...gts,...gth->...sh", ds, q, preferred_element_type=jnp.float32),
            jnp.einsum("...gts,...gth->...sh", p, d_out))


def _flash_forward(qg: jax.Array, k: jax.Array, v: jax.Array, key_valid: jax.Array, query_slot: jax.Array,
                   segment_ids: jax.Array | None, block: int
                   ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """(output [B, KV, G, T, hd] in v's dtype, (max, sum of exp(score - max)) of each query's scores, both
    [B, KV, G, T] float32). The two are kept apart: in a row with no key to attend, log(sum) is lost in
    MASKED + log(sum) at float32's precision."""
    S = k.shape[2]
    shape = qg.shape[:-1]

    def step(i, carry):
        start, first = _block_start(i, block, S)
        scores = _block_scores(qg, k, key_valid, query_slot, segment_ids, start, first, block)
        return _softmax_step(carry, scores, jax.lax.dynamic_slice_in_dim(v, start, block, axis=2))

    init = (jnp.full(shape, MASKED, jnp.float32), jnp.zeros(shape, jnp.float32),
            jnp.zeros((*shape, v.shape[-1]), jnp.float32))
    m, l, acc = jax.lax.fori_loop(0, _trips(S, block), step, init)
    return (acc / l[..., None]).astype(v.dtype), (m, l)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _flash(qg: jax.Array, k: jax.Array, v: jax.Array, key_valid: jax.Array, query_slot: jax.Array,
           segment_ids: jax.Array | None, block: int) -> jax.Array:
    """Attention of grouped queries qg [B, KV, G, T, hd] over k, v [B, KV, S, hd], block by block."""
    return _flash_forward(qg, k, v, key_valid, query_slot, segment_ids, block)[0]


def _flash_fwd(qg, k, v, key_valid, query_slot, segment_ids, block):
    out, stats = _flash_forward(qg, k, v, key_valid, query_slot, segment_ids, block)
    return out, (qg, k, v, key_valid, query_slot, segment_ids, out, stats)


def _flash_bwd(block, residuals, d_out):
    """FlashAttention-2's backward pass: per key block, the probabilities are recomputed from the saved
    softmax statistics; dq accumulates over blocks, each block's dk and dv are added into their slots."""
    qg, k, v, key_valid, query_slot, segment_ids, out, (m, l) = residuals
    S = k.shape[2]
    d_out = d_out.astype(jnp.float32)
    delta = jnp.sum(d_out * out.astype(jnp.float32), axis=-1)  # [B, KV, G, T]

    def step(i, carry):
        dq, dk, dv = carry
        start, first = _block_start(i, block, S)
        scores = _block_scores(qg, k, key_valid, query_slot, segment_ids, start, first, block)
        keys, values = (jax.lax.dynamic_slice_in_dim(x, start, block, axis=2) for x in (k, v))
        dq_b, dk_b, dv_b = _block_gradients(scores, m, l, delta, d_out, qg, keys, values)
        return dq + dq_b, _add_block(dk, start, dk_b, 2), _add_block(dv, start, dv_b, 2)

    init = tuple(jnp.zeros(x.shape, jnp.float32) for x in (qg, k, v))
    dq, dk, dv = jax.lax.fori_loop(0, _trips(S, block), step, init)
    return dq.astype(qg.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


def _add_block(buf: jax.Array, start: jax.Array, x: jax.Array, axis: int) -> jax.Array:
    """`buf` with `x` added into its entries start .. start + len(x) - 1 along `axis`."""
    block = x.shape[axis]
    return jax.lax.dynamic_update_slice_in_dim(
        buf, jax.lax.dynamic_slice_in_dim(buf, start, block, axis=axis) + x, start, axis=axis)


def _blocks_of(start: jax.Array, block: int, arrays: tuple[jax.Array, ...], axes: tuple[int, ...]
               ) -> tuple[jax.Array, ...]:
    """Each of `arrays` sliced to `block` entries from `start` along its axis in `axes`."""
    return tuple(jax.lax.dynamic_slice_in_dim(x, start, block, axis) for x, axis in zip(arrays, axes))


def _pair_scores(q: jax.Array, k: jax.Array, key_valid: jax.Array, query_slot: jax.Array, query_ids,
                 key_ids, key_slots: jax.Array, live: jax.Array) -> jax.Array:
    """Float32 scores [KV, G, bq, bk] of one row's query block q [KV, G, bq, hd] against key block k
    [KV, bk, hd]: MASKED where the query may not attend, -inf everywhere for a padding pair."""
    scores = jnp.einsum("kgth,ksh->kgts", q, k, preferred_element_type=jnp.float32) / math.sqrt(q.shape[-1])
    allowed = (key_valid[None] & (key_slots[None] <= query_slot[:, None])
               & (key_ids[None] == query_ids[:, None]))
    return jnp.where(live, jnp.where(allowed, scores, MASKED), -jnp.inf)


def _sparse_forward(qg, k, v, key_valid, query_slot, ids, pairs, block):
    """One row's (output [KV, G, T, hd] in v's dtype, (max, sum of exp(score - max)) [KV, G, T]): the online
    softmax of `_flash_forward`, over the row's block pairs only. A query block no pair names gets output
    0 (its queries have no key)."""
    def step(carry, pair):
        q_start, k_start = jnp.maximum(pair, 0) * block  # a padding pair (-1, -1) reads block 0
        q, qs, qi, *stats = _blocks_of(q_start, block, (qg, query_slot, ids, *carry), (2, 0, 0, 2, 2, 2))
        keys, values, valid, ki = _blocks_of(k_start, block, (k, v, key_valid, ids), (1, 1, 0, 0))
        scores = _pair_scores(q, keys, valid, qs, qi, ki, k_start + jnp.arange(block), pair[0] >= 0)
        updated = _softmax_step(tuple(stats), scores, values)
        return tuple(jax.lax.dynamic_update_slice_in_dim(x, u, q_start, axis=2)
                     for x, u in zip(carry, updated)), None

    shape = qg.shape[:-1]
    init = (jnp.full(shape, MASKED, jnp.float32), jnp.zeros(shape, jnp.float32),
            jnp.zeros((*shape, v.shape[-1]), jnp.float32))
    (m, l, acc), _ = jax.lax.scan(step, init, pairs)
    return (acc / jnp.where(l > 0, l, 1.0)[..., None]).astype(v.dtype), (m, l)


@functools.partial(jax.custom_vjp, nondiff_argnums=(7,))
def _sparse_flash(qg, k, v, key_valid, query_slot, ids, pairs, block):
    """`_flash` of packed rows over their block pairs: qg [B, KV, G, T, hd], k, v [B, KV, T, hd], T a
    multiple of `block`. A `scan` over each row's pairs (their number is static)."""
    return _sparse_flash_fwd(qg, k, v, key_valid, query_slot, ids, pairs, block)[0]


def _sparse_flash_fwd(qg, k, v, key_valid, query_slot, ids, pairs, block):
    out, stats = jax.vmap(_sparse_forward, in_axes=(0,) * 7 + (None,))(qg, k, v, key_valid, query_slot, ids,
                                                                         pairs, block)
    return out, (qg, k, v, key_valid, query_slot, ids, pairs, out, stats)


def _sparse_backward(qg, k, v, key_valid, query_slot, ids, pairs, out, stats, d_out, block):
    """One row's (dq, dk, dv): `_flash_bwd` over the row's block pairs."""
    m, l = stats
    d_out = d_out.astype(jnp.float32)
    delta = jnp.sum(d_out * out.astype(jnp.float32), axis=-1)
    l = jnp.where(l > 0, l, 1.0)  # a query block no pair names (a padding pair reads it: p = 0 / 1)

    def step(carry, pair):
        dq, dk, dv = carry
        q_start, k_start = jnp.maximum(pair, 0) * block
        q, do, m_b, l_b, delta_b, qs, qi = _blocks_of(
            q_start, block, (qg, d_out, m, l, delta, query_slot, ids), (2, 2, 2, 2, 2, 0, 0))
        keys, values, valid, ki = _blocks_of(k_start, block, (k, v, key_valid, ids), (1, 1, 0, 0))
        scores = _pair_scores(q, keys, valid, qs, qi, ki, k_start + jnp.arange(block), pair[0] >= 0)
        dq_b, dk_b, dv_b = _block_gradients(scores, m_b, l_b, delta_b, do, q, keys, values)
        return (_add_block(dq, q_start, dq_b, 2), _add_block(dk, k_start, dk_b, 1),
                _add_block(dv, k_start, dv_b, 1)), None

    init = tuple(jnp.zeros(x.shape, jnp.float32) for x in (qg, k, v))
    (dq, dk, dv), _ = jax.lax.scan(step, init, pairs)
    return dq.astype(qg.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


def _sparse_flash_bwd(block, residuals, d_out):
    qg, k, v, key_valid, query_slot, ids, pairs, out, stats = residuals
    grads = jax.vmap(_sparse_backward, in_axes=(0,) * 10 + (None,))(
        qg, k, v, key_valid, query_slot, ids, pairs, out, stats, d_out, block)
    return (*grads, None, None, None, None)


_sparse_flash.defvjp(_sparse_flash_fwd, _sparse_flash_bwd)


def _block_sparse(q: jax.Array, k: jax.Array, v: jax.Array, key_valid: jax.Array, query_slot: jax.Array,
                  ids: jax.Array, pairs: jax.Array, block: int) -> jax.Array:
    """Packed rows' attention over their block pairs (`Segments`), the rows padded to whole blocks."""
    T = q.shape[1]
    pad = -T % block
    qg = jnp.pad(_grouped(q, k.shape[1]), ((0, 0),) * 3 + ((0, pad), (0, 0)))
    k, v = (jnp.pad(x, ((0, 0), (0, 0), (0, pad), (0, 0))) for x in (k, v))
    rows = ((0, 0), (0, pad))
    out = _sparse_flash(qg, k, v, jnp.pad(key_valid, rows), jnp.pad(query_slot.astype(jnp.int32), rows),
                        jnp.pad(ids.astype(jnp.int32), rows, constant_values=-1), pairs.astype(jnp.int32),
                        block)
    return _ungrouped(out[:, :, :, :T])


def pair_block(config: AttentionConfig) -> int:
    """The block size of the `Segments.block_pairs` that `config`'s implementation reads; 0 if it computes
    every block (then packed rows need no pairs)."""
    return config.block_size if config.impl in SKIPS_BLOCKS else 0


def attention(q: jax.Array, k: jax.Array, v: jax.Array, key_valid: jax.Array, query_slot: jax.Array,
              config: AttentionConfig, segments: Segments | None = None) -> jax.Array:
    """Attention by the implementation `config.impl` names (see the module docstring)."""
    impl = ATTENTION.get(config.impl)
    if segments is None:
        return impl(q, k, v, key_valid, query_slot, config)
    if config.impl in SKIPS_BLOCKS and segments.block_pairs is not None and segments.block_pairs.shape[1]:
        return impl(q, k, v, key_valid, query_slot, config, segments.ids, block_pairs=segments.block_pairs)
    return impl(q, k, v, key_valid, query_slot, config, segments.ids)


def sharded_attention(q: jax.Array, k: jax.Array, v: jax.Array, key_valid: jax.Array, query_slot: jax.Array,
                      config: AttentionConfig, segments: Segments | None, rules: ShardingRules
                      ) -> jax.Array:
    """`attention` in the decoder's layout under a mesh (`jax.set_mesh`). XLA partitions the plain-XLA
    implementations itself, but not a Pallas kernel (a custom call): that runs under `shard_map`, each device
    on its own rows and, where queries and keys split alike, its own heads (`rules`: rows over the data axes,
    heads over the tensor axis)."""
    mesh = jax.sharding.get_abstract_mesh()
    if config.impl not in PALLAS_KERNELS or mesh.empty:
        return attention(q, k, v, key_valid, query_slot, config, segments)
    shape = dict(mesh.shape)
    rows = logical_to_spec(("batch",), rules, shape, q.shape[:1])[0]
    heads, kv_heads = (logical_to_spec((name,), rules, shape, (n,))[0]
                       for name, n in (("heads", q.shape[2]), ("kv_heads", k.shape[1])))
    if heads != kv_heads:  # a key head's query heads would sit on other devices: every device takes all
        heads = kv_heads = None
    per_row = PartitionSpec(rows, None)
    segment_ids = None if segments is None else segments.ids  # the kernels compute every block
    specs = (PartitionSpec(rows, None, heads, None), PartitionSpec(rows, kv_heads, None, None),
             PartitionSpec(rows, kv_heads, None, None), per_row, per_row,
             None if segment_ids is None else per_row)

    def local(q, k, v, key_valid, query_slot, segment_ids):
        return ATTENTION.get(config.impl)(q, k, v, key_valid, query_slot, config, segment_ids)

    return jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=specs[0], check_vma=False)(
        q, k, v, key_valid, query_slot, segment_ids)
