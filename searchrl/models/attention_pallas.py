"""Pallas attention kernels, registered in `ATTENTION` beside the plain-XLA implementations of
`searchrl.models.attention` (whose docstring states the visibility rule and the shapes all of them share).

- "pallas": searchrl's own flash attention, forward and backward (FlashAttention-2: one kernel for dq, one for
  dk and dv), with the rule itself in the kernel, so it serves every case: training rows (padded or packed),
  extend and decode against a cache with per-row lengths and holes. Written for Triton (GPU); on CPU it runs
  in Pallas' interpret mode. It equals "reference" everywhere, fully masked queries included. Each program
  holds a head's whole keys and values in shared memory, so it compiles for GPUs only at short lengths (at
  8,548 slots of 128 dimensions an H100 compile asks for 3.2 MB of its 227 KB).
- "pallas_mha": JAX's Triton flash attention (`pallas.ops.gpu.attention.mha`, causal with segment ids) for
  rows without a cache, "blockwise" for the cache (GPU).
- "pallas_tpu": JAX's TPU flash attention (`pallas.ops.tpu.flash_attention`, causal with separate query and
  key segment ids) for rows without a cache, "blockwise" for the cache (TPU).

The library kernels know causal masking by position (key s for query t iff s <= t) and segment ids, not
`query_slot`: they are used when T == S, which only rows without a cache (or an empty cache exactly T slots
long) have, and there query_slot[b, t] = t. Invalid keys get a segment id no valid query has. Both then equal
the reference for every valid query with a key to attend (the ones a loss reads); the outputs of padding
queries are unspecified, as the module docstring of `attention` allows. Segment ids are >= 0 (0: padding).

Kernels need aligned shapes, so each wrapper pads (padded key slots count for nothing): "pallas" and
"pallas_mha" the lengths to a multiple of the tile (`AttentionConfig.kernel_block`), "pallas" the head
dimension to a power of two of at least 16 (Triton's smallest dot; `mha` pads its own); "pallas_tpu" both to
multiples of 128. Key heads: "pallas" maps each query head to its key head in the kernels' index maps; the
library kernels get the key heads repeated.

With `AttentionConfig.interpret` (what CPU can run) the kernels run in Pallas' interpret mode: "pallas" and
"pallas_mha" as plain XLA loops, "pallas_tpu" in the TPU simulator (`force_tpu_interpret_mode`, far slower).
Interpretation checks the arithmetic and the indexing, not what a compiler accepts (Triton's or Mosaic's
shape rules) nor speed.
"""
from __future__ import annotations

import contextlib
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.gpu import attention as gpu_attention
from jax.experimental.pallas.ops.tpu import flash_attention as tpu_attention

from searchrl.models.attention_base import ATTENTION, BACKEND, MASKED, PALLAS_KERNELS, round_up
from searchrl.models.config import AttentionConfig

UNSEEN = jnp.iinfo(jnp.int32).max  # slot of an invalid key: after every query's slot
TPU_TILE = 128  # the TPU kernel's tile: its lengths and head dimension are padded to multiples of it


def _tile(n: int, block: int) -> int:
    """Rows per tile along a length of n: `block`, or less for a short length (down to 16, a Triton dot's
    smallest side), a power of two."""
    return min(block, max(16, pl.next_power_of_2(n)))


def _pad(x: jax.Array, axis: int, size: int, value=0) -> jax.Array:
    """x padded with `value` at the end of `axis` to `size`."""
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    return jnp.pad(x, widths, constant_values=value)


def _scores(q: jax.Array, k_ref, kpos_ref, kseg_ref, query_slot: jax.Array, query_segment: jax.Array,
            start: jax.Array, block: int, scale: float, slots: int) -> tuple[jax.Array, jax.Array]:
    """(float32 scores [bq, block] of the key slots start .. start + block - 1, whether each is visible):
    MASKED where the query may not attend, -inf on the padding slots past `slots` (they count for nothing,
    even in a row with no key to attend)."""
    span = pl.ds(start, block)
    keys = k_ref[span, :]
    s = jnp.dot(q, keys.T, preferred_element_type=jnp.float32) * scale
    visible = ((kpos_ref[span][None, :] <= query_slot[:, None])
               & (kseg_ref[span][None, :] == query_segment[:, None]))
    s = jnp.where(visible, s, MASKED)
    return jnp.where((start + jnp.arange(block) < slots)[None, :], s, -jnp.inf), visible


def _key_blocks(query_slot: jax.Array, m: jax.Array, block: int, blocks: int) -> tuple[jax.Array, jax.Array]:
    """(the key blocks that may hold a visible key, all of them if some query has none): a query sees no
    slot after its own, so blocks past the tile's last slot only matter to queries with no key at all, whose
    output (as the reference's) averages every slot's value."""
    reach = jnp.clip(jax.lax.div(jnp.max(query_slot), block) + 1, 0, blocks)
    return reach, jnp.where(jnp.min(m) > MASKED, reach, blocks)


def _forward_kernel(q_ref, k_ref, v_ref, kpos_ref, kseg_ref, slot_ref, seg_ref, o_ref, m_ref, l_ref, *,
                    scale: float, slots: int, block: int):
    """One query tile of one head: the online softmax over the key blocks; writes the output and each
    query's (max score, sum of exp(score - max))."""
    q, query_slot, query_segment = q_ref[...], slot_ref[...], seg_ref[...]
    blocks = k_ref.shape[0] // block

    def step(j, carry):
        m, l, acc = carry
        s, _ = _scores(q, k_ref, kpos_ref, kseg_ref, query_slot, query_segment, j * block, block, scale,
                       slots)
        m_new = jnp.maximum(m, s.max(axis=-1))
        p = jnp.exp(s - m_new[:, None])
        rescale = jnp.exp(m - m_new)
        values = v_ref[pl.ds(j * block, block), :]
        pv = jnp.dot(p.astype(values.dtype), values, preferred_element_type=jnp.float32)
        return m_new, l * rescale + p.sum(axis=-1), acc * rescale[:, None] + pv

    rows = q.shape[0]
    carry = (jnp.full((rows,), MASKED, jnp.float32), jnp.zeros((rows,), jnp.float32),
             jnp.zeros(q.shape, jnp.float32))
    reach, _ = _key_blocks(query_slot, carry[0], block, blocks)
    carry = jax.lax.fori_loop(0, reach, step, carry)
    _, end = _key_blocks(query_slot, carry[0], block, blocks)
    m, l, acc = jax.lax.fori_loop(reach, end, step, carry)
    o_ref[...] = (acc / l[:, None]).astype(o_ref.dtype)
    m_ref[...], l_ref[...] = m, l


def _dq_kernel(q_ref, k_ref, v_ref, kpos_ref, kseg_ref, slot_ref, seg_ref, do_ref, m_ref, l_ref, delta_ref,
               dq_ref, *, scale: float, slots: int, block: int):
    """dq of one query tile of one head, over the same key blocks as the forward pass."""
    q, query_slot, query_segment = q_ref[...], slot_ref[...], seg_ref[...]
    do, m, l, delta = do_ref[...], m_ref[...], l_ref[...], delta_ref[...]

    def step(j, dq):
        s, visible = _scores(q, k_ref, kpos_ref, kseg_ref, query_slot, query_segment, j * block, block,
                             scale, slots)
        p = jnp.exp(s - m[:, None]) / l[:, None]
        span = pl.ds(j * block, block)
        keys, values = k_ref[span, :], v_ref[span, :]
        dp = jnp.dot(do, values.T, preferred_element_type=jnp.float32)
        ds = jnp.where(visible, p * (dp - delta[:, None]), 0.0) * scale
        return dq + jnp.dot(ds.astype(keys.dtype), keys, preferred_element_type=jnp.float32)

    end = _key_blocks(query_slot, m, block, k_ref.shape[0] // block)[1]
    dq_ref[...] = jax.lax.fori_loop(0, end, step, jnp.zeros(q.shape, jnp.float32)).astype(dq_ref.dtype)


def _dkv_kernel(q_ref, k_ref, v_ref, kpos_ref, kseg_ref, slot_ref, seg_ref, do_ref, m_ref, l_ref, delta_ref,
                dk_ref, dv_ref, *, scale: float, slots: int, block: int, query_block: int):
    """dk and dv of one key block from one query head (summed over the head's group outside), over the
    query tiles that see the block or have no key at all."""
    start = pl.program_id(2) * block
    span = pl.ds(start, block)
    keys, values = k_ref[span, :], v_ref[span, :]

    def step(i, carry):
        rows = pl.ds(i * query_block, query_block)
        query_slot, m = slot_ref[rows], m_ref[rows]

        def accumulate(carry):
            dk, dv = carry
            q, do = q_ref[rows, :], do_ref[rows, :]
            s, visible = _scores(q, k_ref, kpos_ref, kseg_ref, query_slot, seg_ref[rows], start, block,
                                 scale, slots)
            p = jnp.exp(s - m[:, None]) / l_ref[rows][:, None]
            dv = dv + jnp.dot(p.astype(do.dtype).T, do, preferred_element_type=jnp.float32)
            dp = jnp.dot(do, values.T, preferred_element_type=jnp.float32)
            ds = jnp.where(visible, p * (dp - delta_ref[rows][:, None]), 0.0) * scale
            return dk + jnp.dot(ds.astype(q.dtype).T, q, preferred_element_type=jnp.float32), dv

        needed = (jnp.max(query_slot) >= start) | (jnp.min(m) <= MASKED)
        return jax.lax.cond(needed, accumulate, lambda c: c, carry)

    zeros = jnp.zeros(keys.shape, jnp.float32)
    dk, dv = jax.lax.fori_loop(0, q_ref.shape[0] // query_block, step, (zeros, zeros))
    dk_ref[...], dv_ref[...] = dk, dv


class _Tiling(NamedTuple):
    """The static side of a kernel call: softmax scale, real key slots, tile sizes, key-head group size."""

    scale: float
    slots: int
    query_block: int
    key_block: int
    group: int
    interpret: bool


def _specs(tiling: _Tiling, q_shape: tuple[int, ...], k_shape: tuple[int, ...], per_key_block: bool):
    """Block specs of (q, k, v, key pos, key segment, query slot, query segment) and of a per-query tensor
    [B, H, Tp, hd] and statistic [B, H, Tp]: tiled along the queries (grid (B, H, query tiles)), or whole
    (grid (B, H, key blocks), `per_key_block`). The keys are whole either way; a head reads its group's."""
    _, _, Tp, hd = q_shape
    S = k_shape[2]
    rows = Tp if per_key_block else tiling.query_block
    tile = (lambda b, h, i: (b, h, 0, 0)) if per_key_block else (lambda b, h, i: (b, h, i, 0))
    stat = (lambda b, h, i: (b, h, 0)) if per_key_block else (lambda b, h, i: (b, h, i))
    query = (lambda b, h, i: (b, 0)) if per_key_block else (lambda b, h, i: (b, i))
    keys = pl.BlockSpec((None, None, S, hd), lambda b, h, i: (b, h // tiling.group, 0, 0))
    key_info = pl.BlockSpec((None, S), lambda b, h, i: (b, 0))
    query_info = pl.BlockSpec((None, rows), query)
    per_query = pl.BlockSpec((None, None, rows, hd), tile)
    return ([per_query, keys, keys, key_info, key_info, query_info, query_info], per_query,
            pl.BlockSpec((None, None, rows), stat))


def _forward(tiling: _Tiling, q, k, v, kpos, kseg, slot, seg):
    """(output [B, H, Tp, hd], max [B, H, Tp], sum [B, H, Tp]) of the laid-out operands."""
    B, H, Tp, _ = q.shape
    inputs, tile, stat = _specs(tiling, q.shape, k.shape, per_key_block=False)
    kernel = functools.partial(_forward_kernel, scale=tiling.scale, slots=tiling.slots,
                               block=tiling.key_block)
    stats = jax.ShapeDtypeStruct((B, H, Tp), jnp.float32)
    return pl.pallas_call(
        kernel, grid=(B, H, Tp // tiling.query_block), in_specs=inputs, out_specs=[tile, stat, stat],
        out_shape=[jax.ShapeDtypeStruct(q.shape, v.dtype), stats, stats], interpret=tiling.interpret,
        name="searchrl_attention_forward")(q, k, v, kpos, kseg, slot, seg)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(tiling: _Tiling, q, k, v, kpos, kseg, slot, seg) -> jax.Array:
    """The kernels' attention of laid-out, padded operands: q [B, H, Tp, hd], k, v [B, KV, Sp, hd], key
    slots (or UNSEEN) and segments [B, Sp], query slots and segments [B, Tp]."""
    return _forward(tiling, q, k, v, kpos, kseg, slot, seg)[0]


def _flash_fwd(tiling, q, k, v, kpos, kseg, slot, seg):
    out, m, l = _forward(tiling, q, k, v, kpos, kseg, slot, seg)
    return out, (q, k, v, kpos, kseg, slot, seg, out, m, l)


def _flash_bwd(tiling, residuals, d_out):
    """dq by query tiles, then dk and dv by key blocks per query head, summed over each key head's group."""
    q, k, v, kpos, kseg, slot, seg, out, m, l = residuals
    B, H, Tp, _ = q.shape
    KV, Sp = k.shape[1], k.shape[2]
    delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)
    operands = (q, k, v, kpos, kseg, slot, seg, d_out, m, l, delta)
    common = dict(scale=tiling.scale, slots=tiling.slots, block=tiling.key_block)
    inputs, tile, stat = _specs(tiling, q.shape, k.shape, per_key_block=False)
    dq = pl.pallas_call(
        functools.partial(_dq_kernel, **common), grid=(B, H, Tp // tiling.query_block),
        in_specs=[*inputs, tile, stat, stat, stat], out_specs=tile,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        interpret=tiling.interpret, name="searchrl_attention_dq")(*operands)
    inputs, tile, stat = _specs(tiling, q.shape, k.shape, per_key_block=True)
    key_tile = pl.BlockSpec((None, None, tiling.key_block, k.shape[3]), lambda b, h, j: (b, h, j, 0))
    grads = jax.ShapeDtypeStruct((B, H, Sp, k.shape[3]), jnp.float32)
    dk, dv = pl.pallas_call(
        functools.partial(_dkv_kernel, **common, query_block=tiling.query_block),
        grid=(B, H, Sp // tiling.key_block),
        in_specs=[*inputs, tile, stat, stat, stat], out_specs=[key_tile, key_tile], out_shape=[grads, grads],
        interpret=tiling.interpret, name="searchrl_attention_dkv")(*operands)
    dk, dv = (x.reshape(B, KV, H // KV, Sp, -1).sum(axis=2) for x in (dk, dv))
    return dq, dk.astype(k.dtype), dv.astype(v.dtype), None, None, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


@ATTENTION.register("pallas")
def pallas(q: jax.Array, k: jax.Array, v: jax.Array, key_valid: jax.Array, query_slot: jax.Array,
           config: AttentionConfig, segment_ids: jax.Array | None = None) -> jax.Array:
    """searchrl's flash attention kernels (see the module docstring) in tiles of `config.kernel_block`:
    every case. Key heads are shared through the kernels' index maps (no repeated keys or values); the
    tiles past the last query's slot are skipped unless some query has no key."""
    B, T, H, hd = q.shape
    KV, S = k.shape[1], k.shape[2]
    bq, bk = _tile(T, config.kernel_block), _tile(S, config.kernel_block)
    Tp, Sp, hdp = round_up(T, bq), round_up(S, bk), max(16, pl.next_power_of_2(hd))
    tiling = _Tiling(1 / math.sqrt(hd), S, bq, bk, H // KV, config.interpret)
    if segment_ids is None:
        query_segment, key_segment = jnp.zeros((B, T), jnp.int32), jnp.zeros((B, S), jnp.int32)
    else:
        query_segment = key_segment = segment_ids.astype(jnp.int32)
    kpos = _pad(jnp.where(key_valid, jnp.arange(S, dtype=jnp.int32), UNSEEN), 1, Sp, UNSEEN)
    # Padding queries repeat the row's last query: they add no key block to the tile.
    slot, seg = (jnp.pad(x.astype(jnp.int32), ((0, 0), (0, Tp - T)), mode="edge")
                 for x in (query_slot, query_segment))
    qt = _pad(_pad(jnp.swapaxes(q, 1, 2), 2, Tp), 3, hdp)
    kt, vt = (_pad(_pad(x, 2, Sp), 3, hdp) for x in (k, v))
    out = _flash(tiling, qt, kt, vt, kpos, _pad(key_segment, 1, Sp), slot, seg)
    return jnp.swapaxes(out[:, :, :T, :hd], 1, 2)


BACKEND["pallas"] = "gpu"
PALLAS_KERNELS.add("pallas")


def _library_segments(key_valid: jax.Array, segment_ids: jax.Array | None, length: int
                       ) -> tuple[jax.Array, jax.Array]:
    """(queries', keys') segment ids [B, length] of rows without a cache padded to `length`, for a kernel
    that knows only causal masking and segments: an invalid or padding key gets -1 - its slot, an id no
    valid query has."""
    key_valid = _pad(key_valid, 1, length, False)
    queries = (jnp.zeros(key_valid.shape, jnp.int32) if segment_ids is None
               else _pad(segment_ids.astype(jnp.int32), 1, length))
    return queries, jnp.where(key_valid, queries, -1 - jnp.arange(length, dtype=jnp.int32))


def _repeat_heads(x: jax.Array, group: int) -> jax.Array:
    """Keys or values [B, KV, S, hd] as [B, H, S, hd]: each key head repeated for its query heads (the
    gradient sums back over them)."""
    return jnp.repeat(x, group, axis=1)


@ATTENTION.register("pallas_mha")
def pallas_mha(q: jax.Array, k: jax.Array, v: jax.Array, key_valid: jax.Array, query_slot: jax.Array,
               config: AttentionConfig, segment_ids: jax.Array | None = None) -> jax.Array:
    """JAX's Triton flash attention (`mha`, causal, tiles of `config.kernel_block`) for a row without a cache
    (T == S); "blockwise" against a cache. `mha` takes one segment-id array for queries and keys, so an
    invalid key's unique id also isolates the invalid query in its slot: padding queries are unspecified."""
    B, T, H, hd = q.shape
    if T != k.shape[2]:
        return ATTENTION.get("blockwise")(q, k, v, key_valid, query_slot, config, segment_ids)
    block = _tile(T, config.kernel_block)
    Tp = round_up(T, block)
    ids = _library_segments(key_valid, segment_ids, Tp)[1]
    k, v = (jnp.swapaxes(_repeat_heads(x, H // k.shape[1]), 1, 2) for x in (k, v))
    sizes = gpu_attention.BlockSizes(block, block, block, block, block, block)
    out = gpu_attention.mha(*(_pad(x, 1, Tp) for x in (q, k, v)), ids, sm_scale=1 / math.sqrt(hd),
                            causal=True, block_sizes=sizes, interpret=config.interpret)
    return out[:, :T].astype(v.dtype)


BACKEND["pallas_mha"] = "gpu"
PALLAS_KERNELS.add("pallas_mha")


@ATTENTION.register("pallas_tpu")
def pallas_tpu(q: jax.Array, k: jax.Array, v: jax.Array, key_valid: jax.Array, query_slot: jax.Array,
               config: AttentionConfig, segment_ids: jax.Array | None = None) -> jax.Array:
    """JAX's TPU flash attention (causal, separate query and key segment ids, tiles of 128) for a row without
    a cache (T == S); "blockwise" against a cache."""
    B, T, H, hd = q.shape
    if T != k.shape[2]:
        return ATTENTION.get("blockwise")(q, k, v, key_valid, query_slot, config, segment_ids)
    Tp, hdp = round_up(T, TPU_TILE), round_up(hd, TPU_TILE)
    queries, keys = _library_segments(key_valid, segment_ids, Tp)
    qt = _pad(_pad(jnp.swapaxes(q, 1, 2), 2, Tp), 3, hdp)
    kt, vt = (_pad(_pad(_repeat_heads(x, H // k.shape[1]), 2, Tp), 3, hdp) for x in (k, v))
    out = _tpu_flash(qt, kt, vt, queries, keys, 1 / math.sqrt(hd), config.interpret)
    return jnp.swapaxes(out[:, :, :T, :hd], 1, 2).astype(v.dtype)


BACKEND["pallas_tpu"] = "tpu"
PALLAS_KERNELS.add("pallas_tpu")


def _tpu_flash_call(scale: float, q, k, v, queries, keys) -> jax.Array:
    return tpu_attention.flash_attention(q, k, v, segment_ids=tpu_attention.SegmentIds(queries, keys),
                                         causal=True, sm_scale=scale)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _tpu_flash(q, k, v, queries, keys, scale: float, interpreted: bool) -> jax.Array:
    """`flash_attention` of laid-out operands, its forward and backward kernels both traced in TPU interpret
    mode when `interpreted` (the library kernel has no interpret argument; the mode is read when a kernel is
    traced, and its backward pass is traced outside this call)."""
    return _tpu_flash_fwd(q, k, v, queries, keys, scale, interpreted)[0]


def _tpu_mode(interpreted: bool):
    return pltpu.force_tpu_interpret_mode() if interpreted else contextlib.nullcontext()


def _tpu_flash_fwd(q, k, v, queries, keys, scale, interpreted):
    with _tpu_mode(interpreted):
        out, backward = jax.vjp(functools.partial(_tpu_flash_call, scale), q, k, v, queries, keys)
    return out, backward


def _tpu_flash_bwd(scale, interpreted, backward, d_out):
    del scale
    with _tpu_mode(interpreted):
        return backward(d_out)[:3] + (None, None)


_tpu_flash.defvjp(_tpu_flash_fwd, _tpu_flash_bwd)
