"""What every attention implementation module shares: the registry `ATTENTION` that `AttentionConfig.impl`
selects from, the score of a masked key, and the backend each accelerator-only implementation needs.
(`searchrl.models.attention` holds the implementations in plain XLA and the visibility rule they all follow;
`searchrl.models.attention_pallas` the Pallas kernels.)"""
from __future__ import annotations

from typing import Callable

import jax

from searchrl.registry import Registry

MASKED = -1e30  # score of a key that may not be attended (finite: fully masked rows stay NaN-free).

# (q, k, v, key_valid, query_slot, config, segment_ids) -> output
Attention = Callable[..., jax.Array]
ATTENTION: Registry[Attention] = Registry("attention implementation", "config.mesh.attention.impl")

# Implementations that compile only for one backend ("gpu" or "tpu"), and those of them that are Pallas
# kernels: custom calls XLA cannot partition (`attention.sharded_attention`), which CPU runs interpreted.
BACKEND: dict[str, str] = {}
PALLAS_KERNELS: set[str] = set()


def runs_here(name: str, interpreted: bool = False) -> bool:
    """Whether implementation `name` compiles for this process's backend (or, with `interpreted`, runs here
    at all: on CPU, interpreted)."""
    here = jax.default_backend()
    return BACKEND.get(name) in (None, here) or (interpreted and here == "cpu" and name in PALLAS_KERNELS)
