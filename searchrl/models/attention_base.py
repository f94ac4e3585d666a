"""What every attention implementation module shares: the registry `ATTENTION` that `AttentionConfig.impl`
selects from, the score of a masked key, the backend each accelerator-only implementation needs, and packed
rows' `Segments` with the block pairs that hold their visible (query, key) pairs (listed on the host).
(`searchrl.models.attention` holds the implementations in plain XLA and the visibility rule they all follow;
`searchrl.models.attention_pallas` the Pallas kernels.)"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import numpy as np

from searchrl.registry import Registry

MASKED = -1e30  # score of a key that may not be attended (finite: fully masked rows stay NaN-free).

# (q, k, v, key_valid, query_slot, config, segment_ids[, block_pairs]) -> output
Attention = Callable[..., jax.Array]
ATTENTION: Registry[Attention] = Registry("attention implementation", "config.mesh.attention.impl")


class Segments(NamedTuple):
    """The sequences of packed rows (no cache, T == S): query t sees key s only if ids[b, s] == ids[b, t].

    `block_pairs` [B, P, 2] (optional) are, per row, the (query block, key block) pairs that hold every
    visible (query, key) pair (`visible_block_pairs`, blocks of `attention.pair_block` slots), then (-1, -1)
    to P. An implementation in `SKIPS_BLOCKS` computes only those blocks; the others read the ids alone.
    Queries with no visible key stay unspecified either way."""

    ids: jax.Array  # int [B, T]
    block_pairs: jax.Array | None = None  # int32 [B, P, 2]


def visible_block_pairs(ids: np.ndarray, valid: np.ndarray, block: int, multiple: int = 1) -> np.ndarray:
    """Int32 [R, P, 2]: per packed row (host arrays: segment ids [R, W] and whether each slot holds a token),
    the (query block, key block) pairs of `block` slots with a visible (query, key) pair, sorted, then
    (-1, -1) up to P, the most any row has rounded up to a multiple of `multiple`. Query block i needs key
    blocks from the one holding the first slot of the earliest segment among its queries up to i (keys come
    at or before their query, in its segment); a block of padding alone needs none."""
    pairs = []
    for row_ids, row_valid in zip(np.asarray(ids), np.asarray(valid, bool)):
        slots = np.flatnonzero(row_valid)
        known, first = np.unique(row_ids[slots], return_index=True)  # each segment's first slot
        earliest = np.full(round_up(len(row_ids), block), np.iinfo(np.int64).max)
        earliest[slots] = slots[first[np.searchsorted(known, row_ids[slots])]]
        lowest = earliest.reshape(-1, block).min(axis=1) // block
        pairs.append([(i, j) for i, lo in enumerate(lowest) if lo <= i for j in range(lo, i + 1)])
    padded = np.full((len(pairs), round_up(max(map(len, pairs), default=0), multiple), 2), -1, np.int32)
    for row, p in enumerate(pairs):
        padded[row, :len(p)] = np.reshape(p, (-1, 2))
    return padded


def round_up(n: int, multiple: int) -> int:
    """n rounded up to a multiple of `multiple`."""
    return -(-n // multiple) * multiple


# Implementations that compile only for one backend ("gpu" or "tpu"), and those of them that are Pallas
# kernels: custom calls XLA cannot partition (`attention.sharded_attention`), which CPU runs interpreted.
BACKEND: dict[str, str] = {}
PALLAS_KERNELS: set[str] = set()
# Implementations that compute only the `Segments.block_pairs` of packed rows.
SKIPS_BLOCKS: set[str] = set()


def runs_here(name: str, interpreted: bool = False) -> bool:
    """Whether implementation `name` compiles for this process's backend (or, with `interpreted`, runs here
    at all: on CPU, interpreted)."""
    here = jax.default_backend()
    return BACKEND.get(name) in (None, here) or (interpreted and here == "cpu" and name in PALLAS_KERNELS)
