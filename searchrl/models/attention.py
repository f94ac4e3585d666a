"""Grouped-query attention over [B, KV, G, T, head_dim] queries (G query heads per kv head) and
[B, KV, S, head_dim] keys/values, as plain batched matmuls per kv head.

`attention` is one masked softmax with a hand-written backward pass; `causal_attention` runs it on blocks of
queries, each against only the keys up to the block's end, which is exact when no query attends a later key
(training: no cache). On 2 CPU cores, one Qwen3 layer's attention forward+backward at batch 4 x 256 tokens
took 28 ms as XLA's autodiff of one block and 11 ms this way (PyTorch's fused causal kernel: 13 ms).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

_MASKED = -1e30  # score of a key that may not be attended (finite: fully masked rows stay NaN-free).
_MIN_QUERY_BLOCK = 32  # queries per block of `causal_attention` ...
_MAX_QUERY_BLOCKS = 16  # ... and at most this many blocks (longer sequences get longer blocks)


def _probs(q: jax.Array, keys: jax.Array, attend: jax.Array) -> jax.Array:
    """softmax(q·k / sqrt(head_dim)) over the keys `attend` [B, T, S] allows, float32 [B, KV, G, T, S]."""
    scores = jnp.einsum("bkgth,bksh->bkgts", q, keys, preferred_element_type=jnp.float32)
    scores = jnp.where(attend[:, None, None], scores / math.sqrt(q.shape[-1]), _MASKED)
    exp = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))
    return exp / jnp.sum(exp, axis=-1, keepdims=True)


@jax.custom_vjp
def attention(q: jax.Array, keys: jax.Array, values: jax.Array, attend: jax.Array) -> jax.Array:
    """Each query's softmax-weighted mean of the values [B, KV, G, T, head_dim], over the keys `attend`
    [B, T, S] (bool) allows. Fully masked queries get the mean of all values."""
    return jnp.einsum("bkgts,bksh->bkgth", _probs(q, keys, attend).astype(values.dtype), values)


def _attention_fwd(q, keys, values, attend):
    probs = _probs(q, keys, attend).astype(values.dtype)
    out = jnp.einsum("bkgts,bksh->bkgth", probs, values)
    return out, (q, keys, values, jnp.any(attend, axis=-1), probs, out)


def _attention_bwd(res, d_out):
    """The softmax's backward pass as FlashAttention writes it: d_scores = p * (dp - rowsum(d_out * out)),
    the row sum taken over head_dim rather than the keys."""
    q, keys, values, sees_a_key, probs, out = res
    f32 = jnp.float32
    d_probs = jnp.einsum("bkgth,bksh->bkgts", d_out, values, preferred_element_type=f32)
    row = jnp.sum(d_out.astype(f32) * out.astype(f32), axis=-1, keepdims=True)
    d_scores = probs.astype(f32) * (d_probs - row) / math.sqrt(q.shape[-1])
    # A masked score is a constant and gets no gradient: its weight is exactly 0, except in queries that
    # see no key at all (uniform weights), which are zeroed whole. Saves a [B, T] flag, not the mask.
    d_scores = jnp.where(sees_a_key[:, None, None, :, None], d_scores, 0.0).astype(q.dtype)
    d_q = jnp.einsum("bkgts,bksh->bkgth", d_scores, keys)
    d_keys = jnp.einsum("bkgts,bkgth->bksh", d_scores, q)
    d_values = jnp.einsum("bkgts,bkgth->bksh", probs, d_out)
    return d_q, d_keys, d_values, None


attention.defvjp(_attention_fwd, _attention_bwd)


def query_block(length: int) -> int:
    """Queries per block of `causal_attention` for `length` queries."""
    return max(_MIN_QUERY_BLOCK, -(-length // _MAX_QUERY_BLOCKS))


def causal_attention(q: jax.Array, keys: jax.Array, values: jax.Array, attend: jax.Array) -> jax.Array:
    """`attention` where query t attends no key after position t (`attend` must say so): each block of
    `query_block(T)` queries runs against the keys up to its last query, skipping what the mask would zero
    (about half the work on long sequences), and on blocks that stay in cache."""
    T = q.shape[3]
    block = query_block(T)
    outs = [attention(q[:, :, :, start:start + block], keys[:, :, :start + block],
                      values[:, :, :start + block], attend[:, start:start + block, :start + block])
            for start in range(0, T, block)]
    return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=3)
