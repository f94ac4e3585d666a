"""Policy, value, entropy and reference-KL losses on [B, T] token arrays, each returning (loss, metrics).

Conventions follow verl's `verl/trainer/ppo/core_algos.py` (agg_loss, compute_policy_loss_vanilla,
compute_value_loss, compute_entropy_loss, kl loss in dp_actor). Policy losses are registered by name in
`POLICY_LOSSES`, each as a `PolicyLoss` whose `run` shows which `RLConfig` field feeds which option.
A trainer combines them as verl does:
`pg_loss - entropy_coef * entropy + kl_coef * kl_loss` for the actor, `value_loss` for the critic.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from searchrl.registry import Registry
from searchrl.rl.advantages import as_mask, check_shapes, masked_mean, masked_sum
from searchrl.rl.config import RLConfig
from searchrl.rl.kl import kl_estimate

Metrics = dict[str, jax.Array]

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
LOG_RATIO_CLAMP = 20.0  # as verl: log(pi / pi_old) clamped to [-20, 20] before exp


def agg_loss(loss_mat: jax.Array, mask: jax.Array, mode: str, max_length: int | None = None) -> jax.Array:
    """[B, T] per-token losses to a scalar, as verl's agg_loss (0.6.1 on) given the whole batch.

    token-mean: mean over all policy tokens of the batch. seq-mean-token-sum: mean over rows of each row's
    token sum. seq-mean-token-mean: mean over rows of each row's token mean. Both seq means count only the
    rows with a policy token, so fully masked rows change nothing. seq-mean-token-sum-norm (Dr.GRPO): the
    sum of the row sums / max_length, a constant (default T, the mask's width; pass the generation budget so
    it stays fixed when T is a padded bucket), not divided by the number of rows. A batch without policy
    tokens gives 0 in every mode (verl 0.7: NaN).
    """
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss aggregation mode {mode!r}; known: {list(AGG_MODES)}")
    check_shapes(loss_mat.shape, mask=mask)
    if mode == "token-mean":
        return masked_mean(loss_mat, mask)
    row_sum = masked_sum(loss_mat, mask, axis=-1)
    if mode == "seq-mean-token-sum-norm":
        return jnp.sum(row_sum) / (loss_mat.shape[-1] if max_length is None else max_length)
    rows = nonempty_rows(mask)
    if mode == "seq-mean-token-sum":
        return masked_mean(row_sum, rows)
    return masked_mean(masked_mean(loss_mat, mask, axis=-1), rows)


def nonempty_rows(mask: jax.Array) -> jax.Array:
    """[B] bool: the rows of a [B, T] mask with at least one policy token (the seq-mean modes' rows)."""
    return jnp.any(as_mask(mask) > 0, axis=-1)


class PolicyLoss(NamedTuple):
    """A registered policy loss: `run(logp, old_logp, advantages, mask, rl)` -> (loss, metrics), and the
    `rl` fields it reads (any other policy-loss option set away from its default would have no effect)."""

    run: Callable[[jax.Array, jax.Array, jax.Array, jax.Array, RLConfig], tuple[jax.Array, Metrics]]
    options: tuple[str, ...] = ()


POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss", "config.rl.policy_loss")


def ppo_policy_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float,
    loss_agg_mode: str,
    loss_max_length: int | None,
) -> tuple[jax.Array, Metrics]:
    """PPO clipped surrogate with dual clip, as verl's compute_policy_loss_vanilla.

        ratio = exp(clip(logp - old_logp, -20, 20))
        l = max(-A * ratio, -A * clip(ratio, 1 - low, 1 + high))
        l = min(l, -A * clip_ratio_c) where A < 0     (dual clip, Ye et al. 2020)

    clip_ratio_high > clip_ratio_low is DAPO's clip-higher; loss_max_length as agg_loss's max_length.
    Metrics: pg_clipfrac (tokens where the clipped term is taken), pg_clipfrac_lower (dual clip taken),
    ppo_kl (mean old_logp - logp) and ppo_kl_k3 (low-variance k3 of the same KL).
    """
    if clip_ratio_c <= 1.0:
        raise ValueError(f"ppo_policy_loss: clip_ratio_c must be > 1.0 for dual clip, got {clip_ratio_c}")
    logp = jnp.asarray(logp, jnp.float32)
    old_logp = jnp.asarray(old_logp, jnp.float32)
    advantages = jnp.asarray(advantages, jnp.float32)
    check_shapes(logp.shape, old_logp=old_logp, advantages=advantages, mask=mask)

    log_ratio = jnp.clip(logp - old_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = jnp.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * jnp.clip(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    clip_loss = jnp.maximum(unclipped, clipped)
    dual_bound = -advantages * clip_ratio_c
    negative = advantages < 0
    losses = jnp.where(negative, jnp.minimum(clip_loss, dual_bound), clip_loss)

    metrics = {
        "pg_clipfrac": masked_mean((clipped > unclipped).astype(jnp.float32), mask),
        "pg_clipfrac_lower": masked_mean((negative & (clip_loss > dual_bound)).astype(jnp.float32), mask),
        "ppo_kl": masked_mean(-log_ratio, mask),
        "ppo_kl_k3": masked_mean(kl_estimate(old_logp, logp, "k3"), mask),
    }
    return agg_loss(losses, mask, loss_agg_mode, loss_max_length), metrics


POLICY_LOSSES.register("ppo")(PolicyLoss(
    lambda logp, old_logp, advantages, mask, rl: ppo_policy_loss(
        logp, old_logp, advantages, mask,
        clip_ratio_low=rl.clip_ratio_low, clip_ratio_high=rl.clip_ratio_high,
        clip_ratio_c=rl.clip_ratio_c, loss_agg_mode=rl.loss_agg_mode,
        loss_max_length=rl.loss_max_length or None),  # 0: the padded length
    ("clip_ratio_low", "clip_ratio_high", "clip_ratio_c", "loss_agg_mode", "loss_max_length")))


def value_loss(
    values: jax.Array,
    old_values: jax.Array,
    returns: jax.Array,
    mask: jax.Array,
    *,
    value_clip: float,
    loss_agg_mode: str,
) -> tuple[jax.Array, Metrics]:
    """Clipped value loss 0.5 * agg(max((v - R)^2, (clip(v, v_old - c, v_old + c) - R)^2)).

    As verl's compute_value_loss; vf_clipfrac is the fraction of policy tokens where the clipped error is
    the larger one.
    """
    values = jnp.asarray(values, jnp.float32)
    old_values = jnp.asarray(old_values, jnp.float32)
    returns = jnp.asarray(returns, jnp.float32)
    check_shapes(values.shape, old_values=old_values, returns=returns, mask=mask)
    clipped_values = jnp.clip(values, old_values - value_clip, old_values + value_clip)
    unclipped_err = jnp.square(values - returns)
    clipped_err = jnp.square(clipped_values - returns)
    loss = 0.5 * agg_loss(jnp.maximum(unclipped_err, clipped_err), mask, loss_agg_mode)
    metrics = {
        "vf_clipfrac": masked_mean((clipped_err > unclipped_err).astype(jnp.float32), mask),
        "vpred_mean": masked_mean(values, mask),
    }
    return loss, metrics


def entropy_from_logits(logits: jax.Array) -> jax.Array:
    """Per-token categorical entropy logsumexp(z) - sum(softmax(z) * z) over the last axis, as verl."""
    logits = jnp.asarray(logits, jnp.float32)
    return jax.nn.logsumexp(logits, axis=-1) - jnp.sum(jax.nn.softmax(logits, axis=-1) * logits, axis=-1)


def entropy_bonus(
    mask: jax.Array,
    *,
    loss_agg_mode: str,
    logits: jax.Array | None = None,
    entropy: jax.Array | None = None,
) -> tuple[jax.Array, Metrics]:
    """Aggregated per-token entropy (from [B, T, V] logits, or a given [B, T] entropy), as verl's
    compute_entropy_loss. It is a bonus: the trainer subtracts entropy_coef times it from the policy loss.
    """
    if (logits is None) == (entropy is None):
        raise ValueError("entropy_bonus: pass exactly one of logits ([B, T, V]) or entropy ([B, T])")
    token_entropy = entropy_from_logits(logits) if entropy is None else jnp.asarray(entropy, jnp.float32)
    ent = agg_loss(token_entropy, mask, loss_agg_mode)
    return ent, {"entropy": ent}


def kl_loss(
    logp: jax.Array,
    ref_logp: jax.Array,
    mask: jax.Array,
    *,
    kl_loss_type: str,
    loss_agg_mode: str,
) -> tuple[jax.Array, Metrics]:
    """KL to the reference policy as a loss term (GRPO's use_kl_loss), as verl's dp_actor: agg of the
    per-token estimate; the trainer adds kl_coef times it to the policy loss.
    """
    loss = agg_loss(kl_estimate(logp, ref_logp, kl_loss_type), mask, loss_agg_mode)
    return loss, {"kl_loss": loss}

