"""Token sampling: greedy, temperature, top-k, top-p, with the sampled token's log-probability.

The returned log-probability is taken under the temperature-scaled, *untruncated* distribution
`log_softmax(logits / temperature)` (temperature 1 when greedy): exactly what the trainer recomputes with
`searchrl.models.token_logprobs` on `logits / temperature`, so PPO's ratio starts at 1. Top-k/top-p only restrict
which tokens can be drawn, as in verl and vLLM's `logprobs` of the raw distribution.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from searchrl.rollout.config import SamplingParams


# How many of a row's highest logits (`jax.lax.top_k`) the nucleus is looked for in before sorting the vocabulary.
# 16 is the largest k XLA:GPU's TopK kernel serves (it lowers a larger one to a sort of the whole row); on XLA:CPU
# (2 cores) the top 16 of 8 x 151,936 logits take ~2 ms, sorting the rows ~250 ms. A wider nucleus sorts the batch.
PREFILTER = 16
# How far from top_p every candidate's mass before it must lie for the candidates alone to settle the nucleus. The
# sort's masses sum the softmax normaliser over the sorted row, the candidates' over the unsorted one: they differ
# in the last bits (at most 4e-7 over many random rows of up to 151,936 logits, 25 times less than this).
MASS_TOLERANCE = 1e-5


def _restrict(logits: jax.Array, top_k: int, top_p: float) -> jax.Array:
    """Sets logits outside the top-k / nucleus to -inf (at least one token always survives; a top_k above the
    vocabulary keeps it all). Ties with the last token kept are kept too.

    Both cut-offs come from the row's `max(PREFILTER, top_k)` highest logits (`jax.lax.top_k`), not from a sort of
    the vocabulary, which only rows whose nucleus is not settled by them need (`_nucleus_cutoff`).
    """
    vocab = logits.shape[-1]
    top_k = min(top_k, vocab)
    if top_k == 0 and top_p >= 1.0:
        return logits
    width = top_k if top_p >= 1.0 else min(vocab, max(PREFILTER, top_k))
    candidates = _highest(logits, width)
    if top_k > 0:
        kth = candidates[..., top_k - 1:top_k]
        logits, candidates = _cut(logits, kth), _cut(candidates, kth)
    if top_p < 1.0:
        logits = _cut(logits, _nucleus_cutoff(logits, candidates, top_p))
    return logits


def _highest(logits: jax.Array, k: int) -> jax.Array:
    """Each row's k highest logits, in decreasing order. Behind an optimization barrier: XLA turns a TopK whose
    result is sliced further into a sort of the whole row (8 x 151,936 logits on XLA:CPU: ~215 ms, not ~2 ms)."""
    return jax.lax.optimization_barrier(jax.lax.top_k(logits, k)[0])


def _cut(x: jax.Array, threshold: jax.Array) -> jax.Array:
    """`x` with the entries below `threshold` set to -inf."""
    return jnp.where(x < threshold, -jnp.inf, x)


def _nucleus_cutoff(logits: jax.Array, candidates: jax.Array, top_p: float) -> jax.Array:
    """The lowest logit [B, 1] of the nucleus of `logits` [B, V] (`_sorted_cutoff`), from `candidates` [B, W],
    each row's W highest logits in decreasing order, sorting the vocabulary only if some row needs it.

    A row's candidates settle its nucleus when their mass reaches top_p + MASS_TOLERANCE (so it ends among them)
    and no candidate's mass before it lies within MASS_TOLERANCE of top_p (so the sort's masses, a few ulps away,
    take the same tokens): the cut-off is then the sort's, bit for bit. Other rows get the sort's (`jax.lax.cond`
    on any such row, then a per-row choice, so that a row's result never depends on the rest of the batch).
    """
    if candidates.shape[-1] == logits.shape[-1]:
        return _sorted_cutoff(candidates, top_p)  # they are the whole row, sorted
    top = candidates[..., :1]
    probs = jnp.exp(candidates - top) / jnp.sum(jnp.exp(logits - top), axis=-1, keepdims=True)
    mass = jnp.cumsum(probs, axis=-1)
    before = mass - probs
    cutoff = _lowest_in_nucleus(candidates, before, top_p)
    unsettled = (mass[..., -1:] < top_p + MASS_TOLERANCE) | jnp.any(
        jnp.abs(before - top_p) < MASS_TOLERANCE, axis=-1, keepdims=True)
    return jax.lax.cond(jnp.any(unsettled), lambda: jnp.where(
        unsettled, _sorted_cutoff(jnp.sort(logits, axis=-1)[..., ::-1], top_p), cutoff), lambda: cutoff)


def _sorted_cutoff(sorted_logits: jax.Array, top_p: float) -> jax.Array:
    """The lowest logit [B, 1] of the nucleus, from each row's logits sorted in decreasing order [B, V]: the tokens
    whose mass before them (softmax probability of the tokens ahead) is < top_p."""
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    return _lowest_in_nucleus(sorted_logits, jnp.cumsum(probs, axis=-1) - probs, top_p)


def _lowest_in_nucleus(values: jax.Array, mass_before: jax.Array, top_p: float) -> jax.Array:
    """The lowest of `values` [B, N] whose `mass_before` is < top_p, per row [B, 1] (+inf if none)."""
    return jnp.min(jnp.where(mass_before < top_p, values, jnp.inf), axis=-1, keepdims=True)


def _argmax(x: jax.Array) -> jax.Array:
    """jnp.argmax over the last axis (first index of the maximum) as two plain reductions, max then min index.

    XLA:CPU runs these vectorised, several times faster than argmax's fused (value, index) reduction over a
    vocabulary-wide row. A row holding NaN yields the last index.
    """
    iota = jnp.arange(x.shape[-1], dtype=jnp.int32)
    return jnp.min(jnp.where(x == jnp.max(x, axis=-1, keepdims=True), iota, x.shape[-1] - 1), axis=-1)


def sample(logits: jax.Array, keys: jax.Array, params: SamplingParams) -> tuple[jax.Array, jax.Array]:
    """Draws one token per row from fp32 `logits` [B, V] with that row's key (`keys` [B]); returns (tokens
    int32 [B], logprobs fp32 [B]). A row's draw depends on its own key and logits only, not on the batch."""
    logits = logits.astype(jnp.float32)
    if params.temperature > 0:
        scaled = logits / params.temperature
        # Gumbel-max, the draw `jax.random.categorical` makes, with the faster argmax.
        restricted = _restrict(scaled, params.top_k, params.top_p)
        noise = jax.vmap(lambda key: jax.random.gumbel(key, restricted.shape[1:], restricted.dtype))(keys)
        tokens = _argmax(noise + restricted)
    else:
        scaled = logits
        tokens = _argmax(logits)
    logprobs = jax.nn.log_softmax(scaled, axis=-1)
    chosen = jnp.take_along_axis(logprobs, tokens[:, None], axis=-1)[:, 0]
    return tokens.astype(jnp.int32), chosen
