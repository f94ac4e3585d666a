"""KL to the reference policy: per-token estimators, the in-reward penalty, and KL-coefficient controllers.

Estimators follow verl's `kl_penalty` (core_algos.py; its names kl, abs, mse, low_var_kl and the k1/k2/k3
aliases) and Schulman's "Approximating KL divergence" note; verl's "full" (KL over the whole vocabulary) is
not implemented there either, and is refused here with that reason;
the controllers (`searchrl.rl.kl_controllers`, by name) follow Ziegler et al. 2019, as verl's
AdaptiveKLController / FixedKLController: a small pytree state and a pure update, so the coefficient can live
in a jitted train state.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from searchrl.registry import Registry
from searchrl.rl.advantages import as_mask, check_shapes, masked_mean
from searchrl.rl.kl_controllers import KL_CONTROLLERS, KLState

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


class KLController(NamedTuple):
    """init() -> KLState; update(state, current_kl, n_steps) -> KLState."""

    init: Callable[[], KLState]
    update: Callable[[KLState, jax.Array, int], KLState]


def make_kl_controller(
    kind: str, coef: float, target: float | None = None, horizon: float | None = None
) -> KLController:
    """The controller `kind` names in `KL_CONTROLLERS` (fixed, adaptive), starting at `coef`, as verl's
    get_kl_controller."""
    if kind not in KL_CONTROLLERS:
        raise ValueError(f"unknown KL controller kind {kind!r}; known: {KL_CONTROLLERS.names()}")
    update = KL_CONTROLLERS.get(kind)(target, horizon)
    return KLController(init=lambda: KLState(jnp.float32(coef)),
                        update=lambda state, kl, n_steps: update(state, jnp.asarray(kl, jnp.float32), n_steps))


def adaptive_kl_controller(init_coef: float, target: float, horizon: float) -> KLController:
    """Ziegler et al. 2019's adaptive coefficient (`kl_controllers.adaptive`)."""
    return make_kl_controller("adaptive", init_coef, target, horizon)
