"""KL estimators, the in-reward penalty and the KL coefficient controllers."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from searchrl import run_config
from searchrl.rl import kl


@pytest.mark.parametrize("estimator,expected", [
    # Columns: (logp, ref) = (-1, -1.5) and (-2, -1).
    ("k1", [0.5, -1.0]),
    ("kl", [0.5, -1.0]),
    ("abs", [0.5, 1.0]),
    ("k2", [0.125, 0.5]),  # 0.5 * d^2
    ("mse", [0.125, 0.5]),
    ("k3", [math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1 - 1]),  # x = ref - logp: e^x - x - 1
    ("low_var_kl", [math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1 - 1]),
])
def test_estimators_hand_computed(estimator, expected):
    out = kl.kl_estimate(jnp.array([[-1.0, -2.0]]), jnp.array([[-1.5, -1.0]]), estimator)
    np.testing.assert_allclose(out, [expected], rtol=1e-6)


def test_k3_is_clamped_like_verl():
    # ref - logp = -50 -> clamped to -20 -> e^-20 + 19 ~ 19 -> clamped to 10; +50 -> e^20 - 21 -> 10.
    out = kl.kl_estimate(jnp.array([[0.0, -50.0]]), jnp.array([[-50.0, 0.0]]), "low_var_kl")
    np.testing.assert_array_equal(out, [[10.0, 10.0]])


def test_k1_and_k3_are_unbiased_for_kl():
    # E_{x~p}[k(log p(x), log q(x))] = KL(p || q) exactly for k1 and k3 (E_p[q/p] = 1), away from the clamps.
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.full(6, 5.0))
    q = rng.dirichlet(np.full(6, 5.0))
    true_kl = float(np.sum(p * np.log(p / q)))
    logp, logq = jnp.log(jnp.asarray(p, jnp.float32)), jnp.log(jnp.asarray(q, jnp.float32))
    for estimator in ("k1", "k3"):
        np.testing.assert_allclose(jnp.sum(p * kl.kl_estimate(logp, logq, estimator)), true_kl, rtol=1e-4)


def test_unknown_estimator():
    with pytest.raises(ValueError, match="kl_loss_type='k4' is not a known KL estimator"):
        kl.kl_estimate(jnp.zeros((1, 1)), jnp.zeros((1, 1)), "k4")
    # verl's kl_penalty names "full" (KL over the whole vocabulary) but raises NotImplementedError for it.
    with pytest.raises(NotImplementedError, match="rl.kl_reward_estimator 'full' needs every vocabulary"):
        kl.get_estimator("full", "rl.kl_reward_estimator")


@pytest.mark.parametrize("estimator,clip,expected_kl", [
    # Columns: (logp, ref) = (-1, -3), (-4, 0), (-2, -2), and a masked (0, -50). x = ref - logp = -2, 4, 0.
    ("kl", 0.0, [2.0, -4.0, 0.0]),  # verl's default algorithm.kl_penalty: logp - ref
    ("abs", 0.0, [2.0, 4.0, 0.0]),
    ("mse", 0.0, [2.0, 8.0, 0.0]),  # 0.5 * (logp - ref)^2
    # e^x - x - 1: e^-2 + 1 = 1.135335; e^4 - 5 = 49.598 -> verl's clamp to 10.
    ("low_var_kl", 0.0, [math.exp(-2.0) + 1.0, 10.0, 0.0]),
    # AutoSearch (algorithm.kl_penalty=low_var_kl) then clamps the penalty to [-5, 5] in apply_kl_penalty.
    ("low_var_kl", 5.0, [math.exp(-2.0) + 1.0, 5.0, 0.0]),
    ("kl", 3.0, [2.0, -3.0, 0.0]),
])
def test_kl_in_the_reward_hand_computed(estimator, clip, expected_kl):
    rewards = jnp.array([[0.0, 0.0, 1.0, 0.5]])
    logp = jnp.array([[-1.0, -4.0, -2.0, 0.0]])
    ref = jnp.array([[-3.0, 0.0, -2.0, -50.0]])
    mask = jnp.array([[1.0, 1.0, 1.0, 0.0]])
    penalty = jax.jit(kl.apply_kl_penalty, static_argnames=("estimator", "clip"))
    out, m = penalty(rewards, logp, ref, mask, 0.001, estimator=estimator, clip=clip)
    expected = [0.0 - 0.001 * expected_kl[0], -0.001 * expected_kl[1], 1.0 - 0.001 * expected_kl[2], 0.5]
    np.testing.assert_allclose(out, [expected], rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(m["kl"], sum(expected_kl) / 3, rtol=1e-6)


def test_apply_kl_penalty_hand_computed():
    # k1 = logp - ref: row 0 -> [0.5, -0.2, 0.3, (masked)], row 1 -> [0.1, (obs), 0.4, 0.0]
    rewards = jnp.array([[0.0, 0.0, 1.0, 9.0], [0.0, 0.0, 0.0, 2.0]])
    logp = jnp.array([[-1.0, -2.0, -0.5, -3.0], [-1.0, -1.0, -1.0, -1.0]])
    ref = jnp.array([[-1.5, -1.8, -0.8, 0.0], [-1.1, -5.0, -1.4, -1.0]])
    mask = jnp.array([[1, 1, 1, 0], [1, 0, 1, 1]], jnp.float32)
    penalty = jax.jit(kl.apply_kl_penalty, static_argnames=("estimator", "clip"))
    out, m = penalty(rewards, logp, ref, mask, 0.1, estimator="kl", clip=0.0)
    expected = [[-0.05, 0.02, 1.0 - 0.03, 9.0], [-0.01, 0.0, -0.04, 2.0]]  # masked positions untouched
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-7)
    # Row token-means: (0.5 - 0.2 + 0.3) / 3 = 0.2 and (0.1 + 0.4 + 0) / 3 = 1/6; batch mean = 0.18333.
    np.testing.assert_allclose(m["kl"], (0.2 + 1 / 6) / 2, rtol=1e-5)
    np.testing.assert_allclose(m["kl_coef"], 0.1, rtol=1e-6)


def test_adaptive_controller_hand_computed():
    ctrl = kl.adaptive_kl_controller(init_coef=0.1, target=6.0, horizon=10000)
    state = ctrl.init()
    update = jax.jit(ctrl.update, static_argnums=2)
    # kl 12: error = clip(12/6 - 1) = 0.2 -> coef * (1 + 0.2 * 256 / 10000) = 0.1 * 1.00512
    np.testing.assert_allclose(update(state, 12.0, 256).coef, 0.100512, rtol=1e-6)
    # kl 6.6: error 0.1 -> 0.1 * 1.00256
    np.testing.assert_allclose(update(state, 6.6, 256).coef, 0.100256, rtol=1e-6)
    # kl 0: error clipped to -0.2 -> 0.1 * 0.99488
    np.testing.assert_allclose(update(state, 0.0, 256).coef, 0.099488, rtol=1e-6)
    # At the target nothing changes; two steps compound.
    np.testing.assert_allclose(update(state, 6.0, 256).coef, 0.1, rtol=1e-6)
    np.testing.assert_allclose(update(update(state, 12.0, 256), 12.0, 256).coef, 0.1 * 1.00512**2, rtol=1e-6)


def test_fixed_controller_and_factory():
    ctrl = kl.make_kl_controller("fixed", 0.05)
    state = ctrl.init()
    assert ctrl.update(state, 100.0, 64) is state
    np.testing.assert_allclose(state.coef, 0.05)
    adaptive = kl.make_kl_controller("adaptive", 0.1, target=1.0, horizon=100)
    np.testing.assert_allclose(adaptive.update(adaptive.init(), 2.0, 10).coef, 0.1 * 1.02, rtol=1e-6)
    with pytest.raises(ValueError, match="needs both target and horizon"):
        kl.make_kl_controller("adaptive", 0.1, target=1.0)
    with pytest.raises(ValueError, match="horizon must be > 0"):
        kl.adaptive_kl_controller(0.1, target=1.0, horizon=0)
    with pytest.raises(ValueError, match="unknown KL controller kind 'pid'"):
        kl.make_kl_controller("pid", 0.1)


def test_an_unknown_controller_fails_when_the_config_is_parsed():
    """Even with kl_in_reward off, where the learn step never builds a controller."""
    config = run_config.experiment_config("search_r1")
    config.rl.kl_controller = "pid"
    assert not config.rl.kl_in_reward
    message = r"^config\.rl: rl\.kl_controller='pid' is not a known KL controller; known: \['adaptive', 'fixed'\]$"
    with pytest.raises(ValueError, match=message):
        run_config.parse(config)
    config.rl.kl_controller = "adaptive"
    assert run_config.parse(config).rl.kl_controller == "adaptive"
