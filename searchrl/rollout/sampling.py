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


def _restrict(logits: jax.Array, top_k: int, top_p: float) -> jax.Array:
    """Sets logits outside the top-k / nucleus to -inf (at least one token always survives)."""
    if top_k > 0:
        kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    if top_p < 1.0:
        sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]
        probs = jax.nn.softmax(sorted_logits, axis=-1)
        mass_before = jnp.cumsum(probs, axis=-1) - probs
        cutoff = jnp.min(jnp.where(mass_before < top_p, sorted_logits, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits < cutoff, -jnp.inf, logits)
    return logits


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
