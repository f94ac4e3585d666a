"""Losses against hand-computed cases, and gradient sanity via jax.grad."""
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from searchrl.rl import losses
from searchrl.rl.config import RLConfig

LOSS_MAT = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
LOSS_MASK = jnp.array([[1, 1, 0], [1, 0, 0]], jnp.float32)


@pytest.mark.parametrize("mode,max_length,expected", [
    ("token-mean", None, (1 + 2 + 4) / 3),  # mean over the 3 policy tokens
    ("seq-mean-token-sum", None, (3 + 4) / 2),  # row sums 3 and 4, mean over rows
    ("seq-mean-token-mean", None, (1.5 + 4) / 2),  # row means 1.5 and 4
    ("seq-mean-token-sum-norm", None, (3 + 4) / 3),  # sum of the row sums / T = 3 (verl)
    ("seq-mean-token-sum-norm", 10, (3 + 4) / 10),  # constant normaliser (Dr.GRPO's max tokens)
])
def test_agg_loss_hand_computed(mode, max_length, expected):
    np.testing.assert_allclose(losses.agg_loss(LOSS_MAT, LOSS_MASK, mode, max_length), expected, rtol=1e-6)


def test_agg_loss_unknown_mode():
    with pytest.raises(ValueError, match="unknown loss aggregation mode 'mean'"):
        losses.agg_loss(LOSS_MAT, LOSS_MASK, "mean")


# Five policy tokens and one masked one; old_logp = -1, logp = -1 + log(ratio).
RATIOS = [1.1, 1.5, 0.5, 1.1, 4.0, 50.0]
ADVS = [1.0, 1.0, -1.0, -1.0, -1.0, 2.0]
PPO_MASK = jnp.array([[1, 1, 1, 1, 1, 0]], jnp.float32)
OLD_LOGP = jnp.full((1, 6), -1.0)
LOGP = OLD_LOGP + jnp.log(jnp.array([RATIOS]))
# verl's clip 0.2 on both sides, dual clip c = 3, token-mean.
PPO = dict(clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0, loss_agg_mode="token-mean",
           loss_max_length=None)


def test_ppo_hand_computed():
    # clip 0.2, dual clip c = 3:
    # t0 A=+1 r=1.1: max(-1.1, -1.1) = -1.1                    not clipped
    # t1 A=+1 r=1.5: max(-1.5, -1.2) = -1.2                    clipped
    # t2 A=-1 r=0.5: max(0.5, 0.8) = 0.8, min(0.8, 3) = 0.8    clipped
    # t3 A=-1 r=1.1: max(1.1, 1.1) = 1.1                       not clipped
    # t4 A=-1 r=4.0: max(4.0, 1.2) = 4.0, min(4.0, 3) = 3.0    dual-clipped
    # token-mean = (-1.1 - 1.2 + 0.8 + 1.1 + 3.0) / 5 = 0.52; clipfrac 2/5; lower 1/5.
    ppo_loss = jax.jit(functools.partial(losses.ppo_policy_loss, **PPO))
    loss, m = ppo_loss(LOGP, OLD_LOGP, jnp.array([ADVS]), PPO_MASK)
    np.testing.assert_allclose(loss, 0.52, rtol=1e-5)
    np.testing.assert_allclose(m["pg_clipfrac"], 0.4, rtol=1e-6)
    np.testing.assert_allclose(m["pg_clipfrac_lower"], 0.2, rtol=1e-6)
    r = np.array(RATIOS[:5], np.float64)
    np.testing.assert_allclose(m["ppo_kl"], np.mean(-np.log(r)), rtol=1e-5)  # mean(old_logp - logp)
    np.testing.assert_allclose(m["ppo_kl_k3"], np.mean(r - np.log(r) - 1), rtol=1e-5)


def test_ppo_seq_aggregation_uses_agg_loss():
    # Same per-token losses as above; one row: seq-mean-token-sum = 2.6, seq-mean-token-sum-norm = 2.6 / 6.
    loss, _ = losses.ppo_policy_loss(
        LOGP, OLD_LOGP, jnp.array([ADVS]), PPO_MASK, **PPO | {"loss_agg_mode": "seq-mean-token-sum"})
    np.testing.assert_allclose(loss, 2.6, rtol=1e-5)
    loss, _ = losses.ppo_policy_loss(
        LOGP, OLD_LOGP, jnp.array([ADVS]), PPO_MASK, **PPO | {"loss_agg_mode": "seq-mean-token-sum-norm"})
    np.testing.assert_allclose(loss, 2.6 / 6, rtol=1e-5)


def test_ppo_gradient_is_zero_where_clipped():
    def loss_fn(logp):
        return losses.ppo_policy_loss(logp, OLD_LOGP, jnp.array([ADVS]), PPO_MASK, **PPO)[0]

    grad = np.asarray(jax.grad(loss_fn)(LOGP))[0]
    # Unclipped tokens: d/dlogp (-A * exp(logp - old)) / 5 = -A * r / 5: t0 -> -0.22, t3 -> +0.22.
    np.testing.assert_allclose(grad[[0, 3]], [-0.22, 0.22], rtol=1e-5)
    # Clipped (t1, t2), dual-clipped (t4) and masked (t5) tokens get no gradient.
    np.testing.assert_array_equal(grad[[1, 2, 4, 5]], 0.0)


def test_ppo_clip_higher():
    # A=+1, r=1.25: symmetric 0.2 clips to 1.2 (loss -1.2); DAPO's high = 0.28 leaves it (loss -1.25).
    logp, old, a, mask = jnp.log(jnp.array([[1.25]])), jnp.zeros((1, 1)), jnp.ones((1, 1)), jnp.ones((1, 1))
    np.testing.assert_allclose(losses.ppo_policy_loss(logp, old, a, mask, **PPO)[0], -1.2, rtol=1e-6)
    np.testing.assert_allclose(
        losses.ppo_policy_loss(logp, old, a, mask, **PPO | {"clip_ratio_high": 0.28})[0], -1.25,
        rtol=1e-6)


def test_ppo_rejects_bad_dual_clip_and_shapes():
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1.0"):
        losses.ppo_policy_loss(LOGP, OLD_LOGP, jnp.array([ADVS]), PPO_MASK, **PPO | {"clip_ratio_c": 1.0})
    with pytest.raises(ValueError, match="advantages has shape \\(1, 5\\)"):
        losses.ppo_policy_loss(LOGP, OLD_LOGP, jnp.array([ADVS[:5]]), PPO_MASK, **PPO)
    registered = losses.POLICY_LOSSES.get("ppo").run(LOGP, OLD_LOGP, jnp.array([ADVS]), PPO_MASK, RLConfig())
    np.testing.assert_array_equal(registered[0], losses.ppo_policy_loss(
        LOGP, OLD_LOGP, jnp.array([ADVS]), PPO_MASK, **PPO)[0])  # RLConfig's defaults are verl's


def test_value_loss_hand_computed_and_gradient():
    # clip 0.2 around old values; t4 is masked.
    # t0 v=1.0 old=0.5 R=2.0: clipped v = 0.7; errors 1.0 vs 1.69 -> 1.69 (clipped error larger)
    # t1 v=2.0 old=2.1 R=1.0: inside the range; 1.0
    # t2 v=0.0 old=0.0 R=0.3: 0.09
    # t3 v=1.0 old=0.5 R=0.0: clipped v = 0.7; errors 1.0 vs 0.49 -> 1.0 (unclipped larger)
    # loss = 0.5 * (1.69 + 1.0 + 0.09 + 1.0) / 4 = 0.4725; vf_clipfrac = 1/4
    values = jnp.array([[1.0, 2.0, 0.0, 1.0, 5.0]])
    old = jnp.array([[0.5, 2.1, 0.0, 0.5, 0.0]])
    returns = jnp.array([[2.0, 1.0, 0.3, 0.0, 0.0]])
    mask = jnp.array([[1, 1, 1, 1, 0]], bool)
    loss, m = losses.value_loss(values, old, returns, mask, value_clip=0.2, loss_agg_mode="token-mean")
    np.testing.assert_allclose(loss, 0.4725, rtol=1e-5)
    np.testing.assert_allclose(m["vf_clipfrac"], 0.25, rtol=1e-6)
    np.testing.assert_allclose(m["vpred_mean"], 1.0, rtol=1e-6)
    grad = jax.grad(lambda v: losses.value_loss(v, old, returns, mask, value_clip=0.2,
                                                loss_agg_mode="token-mean")[0])(values)
    # d/dv 0.5 * (v - R)^2 / 4 = (v - R) / 4 on unclipped tokens; 0 where the clipped error wins, 0 if masked.
    np.testing.assert_allclose(grad, [[0.0, 0.25, -0.075, 0.25, 0.0]], rtol=1e-5, atol=1e-7)


def test_entropy_from_logits_and_bonus():
    # Uniform over 4 -> log 4; p = [1/4, 3/4] (logits 0, log 3) -> -(0.25 ln 0.25 + 0.75 ln 0.75);
    # near one-hot -> 0.
    two = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    logits = jnp.array([[[0.0, 0.0, 0.0, 0.0],
                         [0.0, math.log(3.0), -1e9, -1e9],
                         [100.0, 0.0, 0.0, 0.0]]])
    ent = losses.entropy_from_logits(logits)
    np.testing.assert_allclose(ent, [[math.log(4), two, 0.0]], rtol=1e-5, atol=1e-6)
    mask = jnp.array([[1, 1, 0]], jnp.float32)
    bonus, m = losses.entropy_bonus(mask, logits=logits, loss_agg_mode="token-mean")
    np.testing.assert_allclose(bonus, (math.log(4) + two) / 2, rtol=1e-5)
    np.testing.assert_allclose(losses.entropy_bonus(mask, entropy=ent, loss_agg_mode="token-mean")[0], bonus,
                               rtol=1e-6)
    assert m["entropy"] is bonus
    with pytest.raises(ValueError, match="exactly one of logits"):
        losses.entropy_bonus(mask, loss_agg_mode="token-mean")


def test_kl_loss_low_var_and_k1():
    # k3 with ref - logp = -0.5: e^-0.5 + 0.5 - 1 = 0.1065307; second token 0; masked third token ignored.
    logp = jnp.array([[-1.0, -2.0, -3.0]])
    ref = jnp.array([[-1.5, -2.0, 0.0]])
    mask = jnp.array([[1, 1, 0]], jnp.float32)
    loss, m = losses.kl_loss(logp, ref, mask, kl_loss_type="low_var_kl", loss_agg_mode="token-mean")
    np.testing.assert_allclose(loss, (math.exp(-0.5) - 0.5) / 2, rtol=1e-5)
    k1, _ = losses.kl_loss(logp, ref, mask, kl_loss_type="k1", loss_agg_mode="token-mean")
    np.testing.assert_allclose(k1, 0.25, rtol=1e-6)
    assert m["kl_loss"] is loss
