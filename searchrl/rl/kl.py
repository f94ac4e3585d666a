"""KL to the reference policy: per-token estimators, the in-reward penalty, and KL-coefficient controllers.

Estimators follow verl's `kl_penalty` (core_algos.py; its names kl, abs, mse, low_var_kl and the k1/k2/k3
aliases) and Schulman's "Approximating KL divergence" note; verl's "full" (KL over the whole vocabulary) is
not implemented there either, and is refused here with that reason;
the controllers follow Ziegler et al. 2019 (as verl's AdaptiveKLController / FixedKLController), written as
a small pytree state and a pure update so the coefficient can live in a jitted train state.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from searchrl.registry import Registry
from searchrl.rl.advantages import as_mask, check_shapes, masked_mean

Estimate = Callable[[jax.Array, jax.Array], jax.Array]
KL_ESTIMATORS: Registry[Estimate] = Registry("KL estimator", "config.rl.kl_reward_estimator / kl_loss_type")


@KL_ESTIMATORS.register("k1")
@KL_ESTIMATORS.register("kl")
def _k1(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
    return logp - ref_logp


@KL_ESTIMATORS.register("abs")
def _abs(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
    return jnp.abs(logp - ref_logp)


@KL_ESTIMATORS.register("k2")
@KL_ESTIMATORS.register("mse")  # verl: "mse" and "k2" are the same estimator
def _k2(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
    return 0.5 * jnp.square(logp - ref_logp)


@KL_ESTIMATORS.register("k3")
@KL_ESTIMATORS.register("low_var_kl")
def _k3(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
    """exp(ref - logp) - (ref - logp) - 1, with verl's clamps: log-ratio to [-20, 20], result to [-10, 10].

    The verl of Search-R1 and AutoSearch clamps the result only: the same values, since |log-ratio| > 20
    already gives more than 10."""
    log_ratio = jnp.clip(ref_logp - logp, -20.0, 20.0)
    return jnp.clip(jnp.exp(log_ratio) - log_ratio - 1.0, -10.0, 10.0)


def get_estimator(estimator: str, field: str | None = None) -> Estimate:
    """KL_ESTIMATORS' entry `estimator`; an unknown name is an error naming `field` (the setting), and
    verl's "full" one saying why it is not there."""
    if estimator == "full":
        raise NotImplementedError(
            f"{field or 'KL estimator'} 'full' needs every vocabulary entry's log-prob, not only the sampled "
            "token's; verl's kl_penalty does not implement it either")
    return KL_ESTIMATORS.get(estimator, field)


def kl_estimate(logp: jax.Array, ref_logp: jax.Array, estimator: str) -> jax.Array:
    """Per-token estimate of KL(pi || ref) from log-probs of tokens sampled from pi, as verl's kl_penalty."""
    estimate = get_estimator(estimator)
    logp = jnp.asarray(logp, jnp.float32)
    ref_logp = jnp.asarray(ref_logp, jnp.float32)
    check_shapes(logp.shape, ref_logp=ref_logp)
    return estimate(logp, ref_logp)


def apply_kl_penalty(
    rewards: jax.Array,
    logp: jax.Array,
    ref_logp: jax.Array,
    mask: jax.Array,
    beta: jax.Array | float,
    estimator: str,
    clip: float,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Token-level rewards minus beta * KL on policy tokens, as verl's ray_trainer apply_kl_penalty.

    `logp` is the sampling policy's log-prob of each token (verl's old_log_probs). `clip` > 0 clamps the
    per-token estimate to [-clip, clip] first, as AutoSearch's trainer does (ray_trainer_turn64.py: 5).
    The "kl" metric is the batch mean of per-row token-mean KL (after the clamp), which is what the adaptive
    controller consumes.
    """
    rewards = jnp.asarray(rewards, jnp.float32)
    check_shapes(rewards.shape, logp=logp, ref_logp=ref_logp, mask=mask)
    kl = jnp.where(as_mask(mask) > 0, kl_estimate(logp, ref_logp, estimator), 0.0)
    if clip > 0:
        kl = jnp.clip(kl, -clip, clip)
    current_kl = jnp.mean(masked_mean(kl, mask, axis=-1))
    beta = jnp.asarray(beta, jnp.float32)
    return rewards - beta * kl, {"kl": current_kl, "kl_coef": beta}


class KLState(NamedTuple):
    """The KL coefficient, a float32 scalar (a pytree, so it can sit in a jitted train state)."""

    coef: jax.Array


class KLController(NamedTuple):
    """init() -> KLState; update(state, current_kl, n_steps) -> KLState."""

    init: Callable[[], KLState]
    update: Callable[[KLState, jax.Array, int], KLState]


def fixed_kl_controller(coef: float) -> KLController:
    """A coefficient that never changes."""
    return KLController(init=lambda: KLState(jnp.float32(coef)), update=lambda state, kl, n_steps: state)


def adaptive_kl_controller(init_coef: float, target: float, horizon: float) -> KLController:
    """Ziegler et al. 2019: error = clip(kl / target - 1, -0.2, 0.2); coef *= 1 + error * n_steps / horizon.

    `n_steps` is the number of sequences the KL was measured on (verl passes the batch size).
    """
    if target <= 0:
        raise ValueError(f"adaptive KL controller: target must be > 0, got {target}")
    if horizon <= 0:
        raise ValueError(f"adaptive KL controller: horizon must be > 0, got {horizon}")

    def update(state: KLState, current_kl: jax.Array, n_steps: int) -> KLState:
        error = jnp.clip(jnp.asarray(current_kl, jnp.float32) / target - 1.0, -0.2, 0.2)
        return KLState(state.coef * (1.0 + error * n_steps / horizon))

    return KLController(init=lambda: KLState(jnp.float32(init_coef)), update=update)


def make_kl_controller(
    kind: str, coef: float, target: float | None = None, horizon: float | None = None
) -> KLController:
    """Controller from config fields, as verl's get_kl_controller: kind "fixed" or "adaptive"."""
    if kind == "fixed":
        return fixed_kl_controller(coef)
    if kind == "adaptive":
        if target is None or horizon is None:
            raise ValueError("adaptive KL controller needs both target and horizon")
        return adaptive_kl_controller(coef, target, horizon)
    raise ValueError(f"unknown KL controller kind {kind!r}; known: ['adaptive', 'fixed']")
