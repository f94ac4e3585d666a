"""Attention of queries over the paged KV cache (`searchrl.models.kv_cache`), reading only each row's live
pages: one function per implementation (`PAGED_ATTENTION`, selected by `AttentionConfig.paged`).

Shapes: q [B, T, H, hd]; k_pages, v_pages [KV, P, page_size, hd], one layer's pool (H is a multiple of KV:
query head h reads key head h // (H / KV)); page_table int32 [B, n], entry j the pool page holding row b's key
slots j * page_size .. (j + 1) * page_size - 1; query_slot int32 [B, T]; kv_length int32 [B]. Key slot s of
row b is attended by query t iff s < kv_length[b] and s <= query_slot[b, t]. Row b's pages are its entries
below ceil(kv_length[b] / page_size); the others may name any page (0 .. P - 1), and neither they nor what
those pages hold changes the result. Scores are scaled by 1 / sqrt(hd), the softmax is float32 and the output
[B, T, H, hd] has q's dtype; a query with no key to attend gets a finite, unspecified output.

- "reference": a while loop over the logical page index up to the most live pages any row has (the cost
  follows the live tokens, not P or n), one online-softmax step per page of every row. Every backend; the
  definition the kernels are tested against. The output of a query with a key to attend depends on its
  row's pages' contents and length alone, bit for bit (not on the other rows nor on which physical pages
  hold them).
- "pallas_gpu": JAX's Triton paged attention (`pallas.ops.gpu.paged_attention`) for a decode step (T == 1),
  "reference" otherwise (GPU).
- "pallas_tpu": JAX's TPU paged attention (`pallas.ops.tpu.paged_attention`) for a decode step, "reference"
  otherwise (TPU). The library kernel rounds keys and values to bfloat16: exact for a bfloat16 pool, not
  for a float32 one.

The library kernels know a length per row, not `query_slot`: a decode query gets length min(kv_length,
query_slot + 1), exact for one query. They take no score scale (q is scaled before) and read blocks of
max(page_size, `AttentionConfig.kernel_block`) key slots, so a row's last block may run past its live pages:
its table entries past them are pointed at its first page, so that the kernels never read a page the row
does not hold. Masked slots of the pages they read are multiplied by a probability of 0, so unlike
"reference" they need the slots past kv_length in a row's last live page to hold finite values (a cache
writes only finite keys and values). What compiles is not checked on CPU: Triton wants hd and page_size *
pages a block powers of two of at least 16; the TPU kernel's callers (vLLM) keep hd a multiple of 128 and
page_size one of 16. With `AttentionConfig.interpret` (what CPU can run) they run in Pallas' interpret mode,
"pallas_tpu" in the TPU simulator.
"""
from __future__ import annotations

import contextlib
import math
from typing import Callable

import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.gpu import paged_attention as gpu_paged
from jax.experimental.pallas.ops.tpu import paged_attention as tpu_paged

from searchrl.models.attention import _grouped, _softmax_step, _ungrouped, attend_mask
from searchrl.models.attention_base import MASKED, round_up
from searchrl.models.config import AttentionConfig
from searchrl.registry import Registry

# (q, k_pages, v_pages, page_table, query_slot, kv_length, config) -> output
PagedAttention = Callable[..., jax.Array]
PAGED_ATTENTION: Registry[PagedAttention] = Registry("paged attention implementation",
                                                     "config.mesh.attention.paged")
# The backend each implementation compiles for (absent: every one); CPU runs them all interpreted.
BACKEND: dict[str, str] = {"pallas_gpu": "gpu", "pallas_tpu": "tpu"}
GPU_SPLITS = 16  # the most partitions of a row's pages the Triton kernel reduces in parallel


def runs_here(name: str, interpreted: bool = False) -> bool:
    """Whether implementation `name` compiles for this process's backend (or, with `interpreted`, runs here
    at all: on CPU, interpreted)."""
    here = jax.default_backend()
    return BACKEND.get(name) in (None, here) or (interpreted and here == "cpu")


def paged_attention(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, page_table: jax.Array,
                    query_slot: jax.Array, kv_length: jax.Array, config: AttentionConfig) -> jax.Array:
    """Attention of q [B, T, H, hd] over each row's live pages (module docstring), by the implementation
    `config.paged` names."""
    return PAGED_ATTENTION.get(config.paged)(q, k_pages, v_pages, page_table, query_slot, kv_length, config)


def _live_pages(kv_length: jax.Array, page_size: int) -> jax.Array:
    """Int32 [B]: how many pages hold each row's live slots."""
    return -(-kv_length.astype(jnp.int32) // page_size)


def _page_step(qg: jax.Array, k_pages: jax.Array, v_pages: jax.Array, page_table: jax.Array,
               query_slot: jax.Array, kv_length: jax.Array, i: jax.Array, per_step: int,
               stats: tuple[jax.Array, jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The online softmax `stats` of grouped queries qg [B, KV, G, T, hd] updated with each row's logical pages
    i * per_step .. (i + 1) * per_step - 1 (`page_table` padded to a multiple of `per_step`): float32 scores
    [B, KV, G, T, per_step * page], MASKED where the query may not attend, and the values of slots past a
    row's length zeroed, so that no garbage there (NaN included) reaches the output."""
    page_size = k_pages.shape[2]
    pages = jax.lax.dynamic_slice_in_dim(page_table, i * per_step, per_step, axis=1)  # [B, per_step]
    width = per_step * page_size

    def gather(x):  # [KV, P, page, hd] -> [B, KV, per_step * page, hd]
        taken = jnp.take(x, pages, axis=1)  # [KV, B, per_step, page, hd]
        return jnp.swapaxes(taken, 0, 1).reshape(pages.shape[0], x.shape[0], width, x.shape[-1])

    keys, values = gather(k_pages), gather(v_pages)
    slots = i * width + jnp.arange(width, dtype=jnp.int32)
    live = slots[None, :] < kv_length[:, None]
    scores = jnp.einsum("bkgth,bksh->bkgts", qg, keys, preferred_element_type=jnp.float32)
    scores = jnp.where(attend_mask(live, query_slot, slots)[:, None, None], scores / math.sqrt(qg.shape[-1]),
                       MASKED)
    return _softmax_step(stats, scores, jnp.where(live[:, None, :, None], values, 0))


def pages_a_step(config: AttentionConfig, page_size: int) -> int:
    """Pages "reference" reads a loop step: `config.block_size` key slots of whole pages (a loop step costs
    more than a page on CPUs). Not bounded by a row's table: a row's sums then do not depend on how many
    slots it may use."""
    return max(1, config.block_size // page_size)


@PAGED_ATTENTION.register("reference")
def reference(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, page_table: jax.Array,
              query_slot: jax.Array, kv_length: jax.Array, config: AttentionConfig) -> jax.Array:
    """Online softmax over blocks of pages (`attention._flash_forward`'s, with a block of
    `config.block_size` key slots, whole pages, for its blocks) in a while loop of as many steps as the
    longest row has blocks of live pages. A row past its own pages reads some page of the pool and masks
    all of it: for a query with a key to attend, a step that changes none of its statistics (exactly: scale
    1, probabilities 0), so its output does not depend on how long the other rows are. Forward only
    (serving)."""
    kv_length, query_slot = kv_length.astype(jnp.int32), query_slot.astype(jnp.int32)
    page_size = k_pages.shape[2]
    per_step = pages_a_step(config, page_size)
    page_table = jnp.pad(page_table, ((0, 0), (0, -page_table.shape[1] % per_step)))
    qg = _grouped(q, k_pages.shape[0])
    shape = qg.shape[:-1]
    trips = -(-jnp.max(_live_pages(kv_length, page_size)) // per_step)

    def step(carry):
        i, stats = carry
        return i + 1, _page_step(qg, k_pages, v_pages, page_table, query_slot, kv_length, i, per_step, stats)

    init = (jnp.int32(0), (jnp.full(shape, MASKED, jnp.float32), jnp.zeros(shape, jnp.float32),
                           jnp.zeros((*shape, v_pages.shape[-1]), jnp.float32)))
    _, (_, l, acc) = jax.lax.while_loop(lambda carry: carry[0] < trips, step, init)
    # l >= 1 once a page was read (its largest score counts 1); 0 only when no row has a page to read.
    return _ungrouped(acc / jnp.maximum(l, 1.0)[..., None]).astype(q.dtype)


def _decode_length(query_slot: jax.Array, kv_length: jax.Array) -> jax.Array:
    """Int32 [B]: how many of its row's first slots a single query [B, 1] sees: min(kv_length, slot + 1)."""
    return jnp.maximum(jnp.minimum(kv_length, query_slot[:, 0] + 1), 0).astype(jnp.int32)


def _kernel_table(page_table: jax.Array, length: jax.Array, page_size: int, width: int) -> jax.Array:
    """page_table padded to `width` entries a row, each entry past the row's live pages (of `length` slots)
    replaced by its first page: a kernel's last block of pages then reads only pages the row holds."""
    table = jnp.pad(page_table.astype(jnp.int32), ((0, 0), (0, width - page_table.shape[1])))
    live = jnp.arange(width)[None, :] < _live_pages(length, page_size)[:, None]
    return jnp.where(live, table, table[:, :1])


def _pages_per_block(page_size: int, config: AttentionConfig) -> int:
    """Pages a kernel reads a step: `config.kernel_block` key slots, at least one page."""
    return max(1, config.kernel_block // page_size)


@PAGED_ATTENTION.register("pallas_gpu")
def pallas_gpu(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, page_table: jax.Array,
               query_slot: jax.Array, kv_length: jax.Array, config: AttentionConfig) -> jax.Array:
    """JAX's Triton paged attention for a decode step: a row's pages split into up to `GPU_SPLITS` partitions
    reduced in parallel, the group of query heads of a key head in one tile (padded to 16 heads); "reference"
    for T > 1."""
    if q.shape[1] != 1:
        return reference(q, k_pages, v_pages, page_table, query_slot, kv_length, config)
    page_size, n = k_pages.shape[2], page_table.shape[1]
    block = _pages_per_block(page_size, config)
    splits = min(GPU_SPLITS, -(-n // block))
    length = _decode_length(query_slot, kv_length)
    table = _kernel_table(page_table, length, page_size, round_up(n, splits * block))
    out = gpu_paged.paged_attention(q[:, 0] / math.sqrt(q.shape[-1]), k_pages, v_pages, table, length,
                                    pages_per_compute_block=block, k_splits=splits,
                                    interpret=config.interpret)
    return out[:, None]


def _tpu_mode(interpreted: bool):
    """The TPU simulator while a kernel is traced, when `interpreted` (the library kernel has no interpret
    argument)."""
    return pltpu.force_tpu_interpret_mode() if interpreted else contextlib.nullcontext()


@PAGED_ATTENTION.register("pallas_tpu")
def pallas_tpu(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, page_table: jax.Array,
               query_slot: jax.Array, kv_length: jax.Array, config: AttentionConfig) -> jax.Array:
    """JAX's TPU paged attention for a decode step (one program a row and key head, its live blocks of pages
    in a loop, the next block's pages copied in while one is computed); "reference" for T > 1."""
    if q.shape[1] != 1:
        return reference(q, k_pages, v_pages, page_table, query_slot, kv_length, config)
    page_size, n = k_pages.shape[2], page_table.shape[1]
    block = _pages_per_block(page_size, config)
    length = _decode_length(query_slot, kv_length)
    table = _kernel_table(page_table, length, page_size, round_up(n, block))
    with _tpu_mode(config.interpret):
        out = tpu_paged.paged_attention(q[:, 0] / math.sqrt(q.shape[-1]), k_pages, v_pages, length, table,
                                        pages_per_compute_block=block)
    return out[:, None]
