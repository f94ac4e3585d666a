"""Attention over the paged KV cache: the reference against dense attention over each row's own key slots
(decode and extend, rows of every length, grouped heads), its independence of where a row's pages lie and of
the other rows, of garbage outside a row's live slots and of the pool's and page table's sizes, and each
Pallas kernel (interpreted) against it."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from searchrl.models import paged_attention as paged_lib
from searchrl.models.config import AttentionConfig
from searchrl.models.paged_attention import PAGED_ATTENTION, paged_attention, runs_here

B, H, KV, HD, PAGE = 4, 4, 2, 8, 4  # two query heads per key head; pages of 4 slots
POOL, N = 24, 5  # pages in the pool, page table entries a row (20 slots)
LENGTHS = np.array([0, 4, 7, 13])  # an empty row, exactly one page, part of a second page, four pages
F32_TOL = 1e-5
REFERENCE = AttentionConfig()


def _live(lengths: np.ndarray) -> np.ndarray:
    return -(-np.asarray(lengths) // PAGE)


def _rows(rng: np.random.Generator, kv: int = KV, n: int = N) -> np.ndarray:
    """Float32 [2, B, kv, n * PAGE, HD]: the keys and values of each row's slots (finite everywhere)."""
    return rng.standard_normal((2, B, kv, n * PAGE, HD)).astype(np.float32)


def _table(rng: np.random.Generator, lengths: np.ndarray, pool: int = POOL, n: int = N) -> np.ndarray:
    """Int32 [B, n]: distinct random pages for the rows' live pages, random free pages after them."""
    live = _live(lengths)
    order = rng.permutation(pool)
    held, free = np.split(order, [live.sum()])
    table = rng.choice(free, (B, n)).astype(np.int32)
    for b, start in enumerate(np.cumsum(live) - live):
        table[b, :live[b]] = held[start:start + live[b]]
    return table


def _pool(rows: np.ndarray, table: np.ndarray, lengths: np.ndarray, pool: int = POOL,
          fill: float = np.nan) -> np.ndarray:
    """Float32 [2, kv, pool, PAGE, HD]: each row's live pages (every slot of them, past its length too) at the
    pages its table names; `fill` in every other page."""
    pages = np.full((2, rows.shape[2], pool, PAGE, HD), fill, np.float32)
    for b, live in enumerate(_live(lengths)):
        for j in range(live):
            pages[:, :, table[b, j]] = rows[:, b, :, j * PAGE:(j + 1) * PAGE]
    return pages


def _dense(q: np.ndarray, rows: np.ndarray, query_slot: np.ndarray, lengths: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray]:
    """(float64 [B, T, H, HD] attention of q over each row's own slots, materialised; bool [B, T]: whether
    the query has a key to attend, the outputs defined)."""
    keys, values = (np.repeat(x.astype(np.float64), q.shape[2] // rows.shape[2], axis=1) for x in rows)
    slots = np.arange(keys.shape[2])
    visible = (slots < lengths[:, None, None]) & (slots <= query_slot[:, :, None])  # [B, T, S]
    scores = np.einsum("bthd,bhsd->bhts", q, keys) / math.sqrt(HD)
    scores = np.where(visible[:, None], scores, -np.inf)
    seen = visible.any(axis=-1)
    probs = np.exp(scores - np.where(seen[:, None], scores.max(axis=-1), 0)[..., None])
    probs /= np.maximum(probs.sum(axis=-1, keepdims=True), 1e-300)
    return np.einsum("bhts,bhsd->bthd", probs, values), seen


def _run(config: AttentionConfig, q, pages, table, query_slot, lengths) -> np.ndarray:
    out = jax.jit(lambda *a: paged_attention(*a, config))(q, pages[0], pages[1], table, query_slot, lengths)
    return np.asarray(out)


def _query_slots(lengths: np.ndarray, T: int) -> np.ndarray:
    """Int32 [B, T]: the last T slots of each row (an extend of T tokens; decode for T = 1)."""
    return (lengths[:, None] - T + np.arange(T)).astype(np.int32)


@pytest.mark.parametrize("T", [1, 5], ids=["decode", "extend"])
@pytest.mark.parametrize("heads", [(4, 2), (4, 1)], ids=["group2", "group4"])
def test_reference_matches_dense_attention(T, heads):
    """Decode and an extend of 5 tokens over rows of every length: dense attention's output."""
    H_, KV_ = heads
    rng = np.random.default_rng(T)
    lengths = LENGTHS if T == 1 else np.array([0, 8, 11, 20])  # a row of whole pages, one of all its slots
    rows, table = _rows(rng, KV_), _table(rng, lengths)
    q = rng.standard_normal((B, T, H_, HD)).astype(np.float32)
    query_slot = _query_slots(lengths, T)
    out = _run(REFERENCE, q, _pool(rows, table, lengths), table, query_slot, lengths)
    expected, seen = _dense(q, rows, query_slot, lengths)
    assert out.shape == q.shape and out.dtype == np.float32 and np.isfinite(out).all()
    np.testing.assert_allclose(out[seen], expected[seen], atol=F32_TOL, rtol=F32_TOL)
    assert seen[1:].all() and not seen[0].any()  # the empty row's queries have no key to attend


def test_reference_queries_before_the_rows_end():
    """Queries at slots before a row's last live slot (and a query at slot -1) see only the slots up to their
    own."""
    rng = np.random.default_rng(3)
    rows, table = _rows(rng), _table(rng, LENGTHS)
    q = rng.standard_normal((B, 3, H, HD)).astype(np.float32)
    query_slot = np.array([[-1, 0, 2], [0, 1, 3], [2, 4, 6], [3, 9, 12]], np.int32)
    out = _run(REFERENCE, q, _pool(rows, table, LENGTHS), table, query_slot, LENGTHS)
    expected, seen = _dense(q, rows, query_slot, LENGTHS)
    np.testing.assert_allclose(out[seen], expected[seen], atol=F32_TOL, rtol=F32_TOL)
    assert np.isfinite(out).all()


def test_reference_keeps_the_query_dtype():
    rng = np.random.default_rng(4)
    rows, table = _rows(rng), _table(rng, LENGTHS)
    q = jnp.asarray(rng.standard_normal((B, 1, H, HD)), jnp.bfloat16)
    out = _run(REFERENCE, q, _pool(rows, table, LENGTHS), table, _query_slots(LENGTHS, 1), LENGTHS)
    assert out.dtype == jnp.bfloat16 and np.isfinite(out.astype(np.float32)).all()


def test_a_rows_output_depends_on_its_own_pages_alone():
    """Row 2's slots, held in other physical pages, at another batch index, beside other rows (of other
    lengths: the loop runs another number of steps), give the same output bit for bit."""
    rng = np.random.default_rng(5)
    rows = _rows(rng)
    q = rng.standard_normal((B, 2, H, HD)).astype(np.float32)
    lengths = LENGTHS.astype(np.int32)
    table = _table(rng, lengths)
    query_slot = _query_slots(lengths, 2)
    out = _run(REFERENCE, q, _pool(rows, table, lengths), table, query_slot, lengths)

    other_rows, other_q = _rows(rng), rng.standard_normal(q.shape).astype(np.float32)
    other_rows[:, 0], other_q[0] = rows[:, 2], q[2]
    other_lengths = np.array([7, 20, 1, 0], np.int32)
    other_table = _table(rng, other_lengths, pool=POOL + 8)
    other_slot = _query_slots(other_lengths, 2)
    moved = _run(REFERENCE, other_q, _pool(other_rows, other_table, other_lengths, POOL + 8), other_table,
                 other_slot, other_lengths)
    assert not np.array_equal(other_table[0, :2], table[2, :2])
    np.testing.assert_array_equal(moved[0], out[2])


def test_garbage_outside_live_slots_changes_nothing():
    """NaN in free pages and in a last page's slots past the row's length, random entries past a row's live
    pages: the same output as a clean cache (zeros there, entries 0), bit for bit."""
    rng = np.random.default_rng(6)
    rows = _rows(rng)
    table = _table(rng, LENGTHS)
    q = rng.standard_normal((B, 1, H, HD)).astype(np.float32)
    query_slot = _query_slots(LENGTHS, 1)
    slots = np.arange(rows.shape[3])
    clean_rows = np.where(slots[None, None, None, :, None] < LENGTHS[None, :, None, None, None], rows, 0)
    clean_table = np.where(np.arange(N) < _live(LENGTHS)[:, None], table, 0).astype(np.int32)
    clean = _run(REFERENCE, q, _pool(clean_rows, clean_table, LENGTHS, fill=0.0), clean_table, query_slot,
                 LENGTHS)
    dirty_rows = np.where(slots[None, None, None, :, None] < LENGTHS[None, :, None, None, None], rows, np.nan)
    dirty = _run(REFERENCE, q, _pool(dirty_rows, table, LENGTHS), table, query_slot, LENGTHS)
    assert np.isfinite(dirty).all()
    np.testing.assert_array_equal(dirty, clean)


@pytest.mark.parametrize("pages_a_step,trips", [(1, 4), (2, 2), (N, 1)])
def test_work_follows_the_live_pages(monkeypatch, pages_a_step, trips):
    """A while loop of as many steps as the longest row has blocks of live pages (`block_size` slots a
    step): the same steps and the same output bit for bit from a larger pool and longer page tables holding
    the same live slots; none when no row has a live slot (and a finite output)."""
    steps = []
    page_step = paged_lib._page_step

    def counted(*args):
        jax.debug.callback(lambda: steps.append(1))
        return page_step(*args)

    monkeypatch.setattr(paged_lib, "_page_step", counted)
    config = AttentionConfig(block_size=pages_a_step * PAGE)
    rng = np.random.default_rng(7)
    rows = _rows(rng, n=2 * N)
    table = _table(rng, LENGTHS)
    q = rng.standard_normal((B, 1, H, HD)).astype(np.float32)
    query_slot = _query_slots(LENGTHS, 1)
    pages = _pool(rows, table, LENGTHS)
    jaxpr = str(jax.make_jaxpr(lambda *a: paged_attention(*a, config))(
        q, pages[0], pages[1], table, query_slot, LENGTHS))
    assert "while[" in jaxpr and "scan[" not in jaxpr
    out = _run(config, q, pages, table, query_slot, LENGTHS)
    assert len(steps) == trips == -(-_live(LENGTHS).max() // pages_a_step)
    wide = np.concatenate([table, rng.integers(0, 3 * POOL, (B, N)).astype(np.int32)], axis=1)
    larger = _run(config, q, _pool(rows, wide, LENGTHS, pool=3 * POOL), wide, query_slot, LENGTHS)
    assert len(steps) == 2 * trips
    np.testing.assert_array_equal(larger, out)
    empty = np.zeros(B, np.int32)
    nothing = _run(config, q, np.full_like(pages, np.nan), table, _query_slots(empty, 1), empty)
    assert len(steps) == 2 * trips and np.isfinite(nothing).all()


def test_unknown_implementation_names_the_field():
    with pytest.raises(ValueError, match="config.mesh.attention.paged"):
        paged_attention(*(None,) * 6, AttentionConfig(paged="nope"))
    assert {"reference", "pallas_gpu", "pallas_tpu"} <= set(PAGED_ATTENTION)


def test_backends():
    assert runs_here("reference")
    assert runs_here("pallas_gpu") == (jax.default_backend() == "gpu")
    assert runs_here("pallas_tpu", interpreted=True) == (jax.default_backend() in ("cpu", "tpu"))


def _bfloat16_exact(x: np.ndarray) -> np.ndarray:
    """x rounded to bfloat16's values, kept float32 ("pallas_tpu" reads keys and values as bfloat16)."""
    return np.asarray(jnp.asarray(x).astype(jnp.bfloat16).astype(jnp.float32))


KERNELS = [(name, block) for name in ("pallas_gpu", "pallas_tpu") for block in (4, 8)]


@pytest.mark.parametrize("name,kernel_block", KERNELS,
                         ids=[f"{name}_{block // PAGE}pages" for name, block in KERNELS])
@pytest.mark.parametrize("heads", [(4, 2), (16, 2)], ids=["group2", "group8"])  # the TPU kernel's two layouts
def test_kernel_decode_matches_reference(name, kernel_block, heads):
    """Decode over rows of every length (an empty one, free pages NaN, random entries past the live pages),
    blocks of one or two pages, a query before its row's end: the reference's output within float32
    rounding; an extend (T > 1) is the reference's."""
    if not runs_here(name, interpreted=True):
        pytest.skip(f"{name} does not run on {jax.default_backend()}")
    H_, KV_ = heads
    config = AttentionConfig(paged=name, kernel_block=kernel_block, interpret=True)
    rng = np.random.default_rng(kernel_block)
    rows, table = _bfloat16_exact(_rows(rng, KV_)), _table(rng, LENGTHS)
    pages = _pool(rows, table, LENGTHS)
    q = rng.standard_normal((B, 1, H_, HD)).astype(np.float32)
    query_slot = _query_slots(LENGTHS, 1)
    query_slot[3, 0] = 9  # before the end of its row's 13 slots
    out = _run(config, q, pages, table, query_slot, LENGTHS)
    expected = _run(REFERENCE, q, pages, table, query_slot, LENGTHS)
    assert out.shape == q.shape and np.isfinite(out).all()
    np.testing.assert_allclose(out[1:], expected[1:], atol=F32_TOL, rtol=F32_TOL)  # row 0 has no key

    extend = rng.standard_normal((B, 3, H_, HD)).astype(np.float32)
    slots = _query_slots(LENGTHS, 3)
    np.testing.assert_array_equal(_run(config, extend, pages, table, slots, LENGTHS),
                                  _run(REFERENCE, extend, pages, table, slots, LENGTHS))
