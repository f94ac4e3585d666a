"""The sharded PPO learn step: mesh invariance, exact gradient accumulation, hand-derived first steps, PPO
clipping, scoring alignment, one compilation for repeated calls, and `learn` as the composition of its
stages."""
import dataclasses

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from searchrl import models
from searchrl.rl import advantages, kl, losses, optim, packing, ppo, train_state
from searchrl.rl.config import OptimConfig, RLConfig

ATTENTION = models.AttentionConfig()  # the default: `MeshConfig.attention`
TRAIN = models.Compute(models.TRAIN_RULES, ATTENTION)  # a default run's training layout and attention

CFG = dataclasses.replace(models.get_preset("tiny"), vocab_size=128)
B, S = 8, 16
ONE = models.make_mesh(1, 1, 1, devices=jax.devices()[:1])


def make_mesh_8():
    return models.make_mesh(2, 2, 2)


def rl_config(**overrides):
    rl = RLConfig(minibatch_size=4, micro_batch_size=2, ppo_epochs=2)
    # Adam divides by |g| + eps: with the default 1e-8, coordinates whose gradient is ~1e-8 turn float32
    # round-off of the gradient (different reduction orders across meshes) into visible parameter changes.
    optim = {"actor": dict(lr=1e-3, eps=1e-5), "critic": dict(lr=1e-3, eps=1e-5)}
    fields = {}
    for name, value in overrides.items():
        group, _, field = name.rpartition("__")
        (optim[group] if group else fields)[field] = value
    if not fields.get("use_critic", True):
        fields.setdefault("advantage", "grpo")  # critic-free (gae needs values)
    rl = dataclasses.replace(rl, actor=dataclasses.replace(rl.actor, **optim["actor"]),
                             critic=dataclasses.replace(rl.critic, **optim["critic"]), **fields)
    return ppo.PPOConfig.create(rl, CFG, TRAIN)


def make_data(seed: int = 0) -> dict:
    """Rows of different lengths (padding at the end) with policy turns of different lengths."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(9, S + 1, size=B)
    attention = np.arange(S)[None] < lengths[:, None]
    loss_mask = (np.arange(S)[None] >= 4) & attention & (rng.random((B, S)) < 0.8)
    return dict(
        tokens=rng.integers(0, CFG.vocab_size, (B, S)).astype(np.int32),
        attention_mask=attention,
        loss_mask=loss_mask.astype(np.float32),
        advantages=(rng.normal(size=(B, S)) * loss_mask).astype(np.float32),
        returns=(rng.normal(size=(B, S)) * loss_mask).astype(np.float32),
        noise=rng.normal(size=(B, S)).astype(np.float32),
    )


def new_state(config, mesh):
    params = models.init_params(CFG, jax.random.key(0))
    return train_state.init_train_state(config.spec, mesh, params, jax.random.key(1),
                                        kl_coef=config.rl.kl_coef)


def make_batch(config, data, temperature=1.0, logprob_shift=0.1):
    """A PPOBatch whose old logprobs are the initial policy's, shifted by noise so that some ratios clip."""
    state = new_state(config, ONE)
    logp, values, ref = ppo.score(state, data["tokens"], data["attention_mask"], temperature, config, ONE)
    old = np.asarray(logp) + logprob_shift * data["noise"] * data["loss_mask"]
    return ppo.PPOBatch(
        tokens=data["tokens"], attention_mask=data["attention_mask"], loss_mask=data["loss_mask"],
        old_logprobs=old, advantages=data["advantages"], temperature=temperature,
        returns=data["returns"] if values is not None else None,
        old_values=None if values is None else np.asarray(values),
        ref_logprobs=None if ref is None else np.asarray(ref) + 0.05 * data["noise"])


def host(tree):
    return jax.tree.map(np.asarray, tree)


def max_abs_diff(a, b) -> float:
    return max(jax.tree.leaves(jax.tree.map(lambda x, y: float(np.max(np.abs(x - y))), a, b)))


FULL = dict(use_reference=True, kl_loss_coef=0.1, entropy_coef=0.01)


def test_sharded_update_matches_single_device():
    config = rl_config(**FULL)
    batch = make_batch(config, make_data(0), temperature=0.8)
    mesh = make_mesh_8()
    state8, metrics8 = ppo.ppo_update(new_state(config, mesh), batch, config, mesh)
    state1, metrics1 = ppo.ppo_update(new_state(config, ONE), batch, config, ONE)
    q_spec = jax.sharding.PartitionSpec(None, "fsdp", "tensor", None)
    assert state8.policy["layers"]["q"].sharding.spec == q_spec
    assert len(state8.actor_opt[1][0].mu["embed"].sharding.device_set) == 8  # moments sharded like params
    start = host(new_state(config, ONE).policy)
    assert max_abs_diff(host(state1.policy), start) > 1e-3  # 4 Adam steps of lr 1e-3 really moved the params
    assert max_abs_diff(host(state8), host(state1)) < 1e-5
    assert 0 < float(metrics1["actor/pg_clipfrac"]) < 1
    for name in metrics1:
        np.testing.assert_allclose(metrics8[name], metrics1[name], rtol=1e-5, atol=1e-6, err_msg=name)
    assert int(state8.step) == 1 and not np.array_equal(state8.rng, new_state(config, ONE).rng)


@pytest.mark.parametrize("mode,critic", [("token-mean", True), ("seq-mean-token-sum", False)])
def test_gradient_accumulation_equals_full_minibatch(mode, critic):
    data = make_data(1)
    whole = rl_config(micro_batch_size=4, loss_agg_mode=mode, use_critic=critic, entropy_coef=0.01)
    accumulated = rl_config(micro_batch_size=2, loss_agg_mode=mode, use_critic=critic, entropy_coef=0.01)
    batch = make_batch(whole, data)
    # Micro-batches carry different numbers of policy tokens, so per-micro-batch normalisation would differ.
    per_row = data["loss_mask"].sum(1)
    assert len(set(per_row[:2].tolist() + per_row[2:4].tolist())) > 1
    state_w, metrics_w = ppo.ppo_update(new_state(whole, ONE), batch, whole, ONE)
    state_a, metrics_a = ppo.ppo_update(new_state(accumulated, ONE), batch, accumulated, ONE)
    assert max_abs_diff(host(state_w), host(state_a)) < 1e-6
    for name in metrics_w:  # losses and (pre-clipping) gradient norms: magnitudes, not just Adam's signs
        np.testing.assert_allclose(metrics_a[name], metrics_w[name], rtol=1e-5, atol=1e-7, err_msg=name)


def one_step_config(**overrides):
    return rl_config(use_critic=False, ppo_epochs=1, minibatch_size=B, micro_batch_size=4,
                     actor__weight_decay=0.0, actor__clip_grad_norm=0.0, actor__lr=1e-4, actor__eps=1e-3,
                     **overrides)


def reference_logprobs(params, data, temperature=1.0):
    """log_softmax(logits / temperature) of each next token, straight from the model's forward pass."""
    logits = models.forward(CFG, params, jnp.asarray(data["tokens"]),
                            jnp.broadcast_to(jnp.arange(S), (B, S)), jnp.asarray(data["attention_mask"]),
                            compute=TRAIN, remat=False)[0]
    return models.logprobs_from_logits(logits / temperature, jnp.asarray(data["tokens"]))[0]


def mean_logprob(params, data, temperature=1.0) -> float:
    return float(losses.masked_mean(reference_logprobs(params, data, temperature), data["loss_mask"]))


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_first_step_is_adam_on_the_policy_gradient(sign):
    """At ratio 1 the PPO gradient is the policy gradient -mean(A * grad log p); Adam's first step is
    -lr * g / (|g| + eps) (eps = 1e-3 keeps the gradient's magnitudes in it). Positive advantages raise the
    policy tokens' log-probabilities, negative ones lower them."""
    config = one_step_config()
    data = make_data(2)
    data["advantages"] = sign * data["loss_mask"]
    batch = make_batch(config, data, temperature=0.7, logprob_shift=0.0)
    params = host(new_state(config, ONE).policy)

    def reinforce(p):
        return -losses.masked_mean(data["advantages"] * reference_logprobs(p, data, 0.7), data["loss_mask"])

    grads = jax.jit(jax.grad(reinforce))(params)
    state, metrics = ppo.ppo_update(new_state(config, ONE), batch, config, ONE)
    eps = config.spec.actor.eps
    expected = jax.tree.map(lambda p, g: p - 1e-4 * g / (np.abs(g) + eps), params, grads)
    # Steps are up to lr = 1e-4; allow about one float32 ulp of each parameter: <= 4e-9 (4e-5 of a step) for
    # matrices, 1.2e-7 for norm weights ~1.
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2.5e-7, atol=4e-9), host(state.policy),
                 expected)
    np.testing.assert_allclose(metrics["actor/grad_norm"], float(jnp.sqrt(sum(
        jnp.sum(g * g) for g in jax.tree.leaves(grads)))), rtol=1e-5)
    before, after = mean_logprob(params, data, 0.7), mean_logprob(host(state.policy), data, 0.7)
    assert sign * (after - before) > 1e-3


def test_zero_advantages_leave_the_policy_unchanged():
    config = one_step_config()
    data = make_data(3)
    data["advantages"] = np.zeros((B, S), np.float32)
    batch = make_batch(config, data, logprob_shift=0.0)
    state, metrics = ppo.ppo_update(new_state(config, ONE), batch, config, ONE)
    assert float(metrics["actor/grad_norm"]) == 0.0
    assert max_abs_diff(host(state.policy), host(new_state(config, ONE).policy)) == 0.0


def test_clipped_ratios_give_zero_policy_gradient():
    """old_logprobs 5 nats below the current ones: ratio e^5 > 1 + clip with A > 0: every token clipped."""
    config = one_step_config()
    data = make_data(4)
    data["advantages"] = data["loss_mask"].copy()
    data["noise"] = -np.ones((B, S), np.float32)
    batch = make_batch(config, data, logprob_shift=5.0)
    state, metrics = ppo.ppo_update(new_state(config, ONE), batch, config, ONE)
    assert float(metrics["actor/pg_clipfrac"]) == 1.0
    assert float(metrics["actor/grad_norm"]) == 0.0
    assert max_abs_diff(host(state.policy), host(new_state(config, ONE).policy)) == 0.0


def test_scoring_alignment_and_reference():
    config = rl_config(use_reference=True)
    data = make_data(5)
    state = new_state(config, ONE)
    logp, values, ref = ppo.score(state, data["tokens"], data["attention_mask"], 0.5, config, ONE)
    params = host(state.policy)
    np.testing.assert_allclose(logp, reference_logprobs(params, data, 0.5), atol=1e-6)
    np.testing.assert_array_equal(ref, logp)  # the reference starts as the policy
    v = models.values(CFG, host(state.critic), jnp.asarray(data["tokens"]),
                      jnp.broadcast_to(jnp.arange(S), (B, S)), jnp.asarray(data["attention_mask"]),
                      compute=TRAIN, remat=False)
    np.testing.assert_allclose(values[:, 1:], v[:, :-1], atol=1e-6)  # value of the state before each token
    assert np.all(np.asarray(values[:, 0]) == 0) and np.all(np.asarray(logp[:, 0]) == 0)


def test_bfloat16_compute_keeps_float32_master_weights():
    config32 = one_step_config()
    config16 = one_step_config(compute_dtype="bfloat16")
    batch = make_batch(config32, make_data(6))
    state16, metrics16 = ppo.ppo_update(new_state(config16, ONE), batch, config16, ONE)
    _, metrics32 = ppo.ppo_update(new_state(config32, ONE), batch, config32, ONE)
    assert {x.dtype for x in jax.tree.leaves(state16.policy)} == {jnp.dtype(jnp.float32)}
    assert max_abs_diff(host(state16.policy), host(new_state(config16, ONE).policy)) > 5e-5  # it trained
    for name in ("actor/pg_loss", "actor/entropy", "actor/ppo_kl"):
        np.testing.assert_allclose(metrics16[name], metrics32[name], rtol=3e-2, atol=3e-3, err_msg=name)


def test_a_bfloat16_first_moment_is_adam_with_that_moment_rounded():
    """`OptimConfig.mu_dtype="bfloat16"`, by hand: two AdamW steps whose first moment is stored rounded to
    bfloat16 between them and decayed in bfloat16 (b1 too is rounded: optax's b1 * mu keeps mu's dtype);
    the new gradient's share and the update are float32."""
    cfg = OptimConfig(lr=1.0, mu_dtype="bfloat16", clip_grad_norm=0.0, weight_decay=0.01, eps=1e-8)
    rng = np.random.default_rng(0)
    p0, g1, g2 = (rng.normal(size=(64,)).astype(np.float32) for _ in range(3))
    tx, lr = optim.make_optimizer(cfg), np.float32(1e-2)
    p1, state, _ = optim.apply_gradients(tx, {"w": p0}, {"w": g1}, tx.init({"w": p0}), lr)
    p2, state, _ = optim.apply_gradients(tx, p1, {"w": g2}, state, lr)
    b1, b2, eps, wd = (np.float32(x) for x in (cfg.b1, cfg.b2, cfg.eps, cfg.weight_decay))

    def adam_step(p, m, v, t):
        update = (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
        return p - lr * (update + wd * p)

    m1, v1 = (1 - b1) * g1, (1 - b2) * g1 ** 2
    decayed = np.asarray(b1, ml_dtypes.bfloat16) * m1.astype(ml_dtypes.bfloat16)  # a bfloat16 product
    m2, v2 = decayed.astype(np.float32) + (1 - b1) * g2, b2 * v1 + (1 - b2) * g2 ** 2
    want = adam_step(adam_step(p0, m1, v1, 1), m2, v2, 2)
    np.testing.assert_allclose(np.asarray(p2["w"]), want, rtol=1e-6, atol=1e-7)
    mu, nu = state[0].mu["w"], state[0].nu["w"]
    assert mu.dtype == jnp.bfloat16 and nu.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(mu), m2.astype(ml_dtypes.bfloat16))
    with pytest.raises(ValueError, match="mu_dtype 'float16' is not one of"):
        OptimConfig(lr=1.0, mu_dtype="float16")


def test_learn_with_bfloat16_first_moments_on_a_mesh():
    """The PPO step with both models' first moments in bfloat16, on the (2, 2, 2) mesh: the state holds them
    so, and the params move as with float32 moments up to the moments' rounding."""
    mesh = make_mesh_8()
    batch = ppo.Batch(**short_rows_data(3), temperature=0.9)
    results = {}
    for dtype in ("", "bfloat16"):
        config = rl_config(**FULL, actor__mu_dtype=dtype, critic__mu_dtype=dtype)
        results[dtype] = ppo.learn(new_state(config, mesh), batch, config, mesh)[0]
    state = results["bfloat16"]
    for opt in (state.actor_opt, state.critic_opt):
        adam = opt[1][0]  # chain(clipping, adamw): adamw's scale_by_adam state, as in the mesh test above
        assert {x.dtype for x in jax.tree.leaves(adam.mu)} == {jnp.dtype(jnp.bfloat16)}
        assert {x.dtype for x in jax.tree.leaves(adam.nu)} == {jnp.dtype(jnp.float32)}
    start = host(new_state(config, ONE).policy)
    moved = max_abs_diff(host(results[""].policy), start)
    rounding = max_abs_diff(host(state.policy), host(results[""].policy))
    # A step's decayed moment is off by at most 2^-9 (stored) + 2^-9 (the bfloat16 product) + 0.17% (b1 in
    # bfloat16) of itself: under 0.6% of the update, so of the 4 steps' movement (here 0.4%).
    assert moved > 3e-3 and 0 < rounding < 0.006 * moved


def test_update_compiles_once():
    # The accumulation test may have compiled this config already: then there is still one program.
    config = rl_config(micro_batch_size=2, use_critic=False, loss_agg_mode="seq-mean-token-sum",
                       entropy_coef=0.01)
    state = new_state(config, ONE)
    for seed in range(3):
        batch = make_batch(config, make_data(seed))
        state, _ = ppo.ppo_update(state, batch, config, ONE)
    jitted = ppo._program(ppo._ppo_update, batch, config, ONE, donate=True)[0]
    assert jitted._cache_size() == 1
    assert int(state.step) == 3


def test_bad_batches_are_rejected_with_the_field_name():
    config = rl_config()
    data = make_data(0)
    base = dict(tokens=data["tokens"], attention_mask=data["attention_mask"], loss_mask=data["loss_mask"],
                old_logprobs=data["noise"], advantages=data["advantages"])
    state = new_state(config, ONE)
    with pytest.raises(ValueError, match="PPOBatch.returns is required"):
        ppo.ppo_update(state, ppo.PPOBatch(**base), config, ONE)
    with pytest.raises(ValueError, match=r"PPOBatch.advantages has shape \(8, 15\)"):
        bad = ppo.PPOBatch(**{**base, "advantages": data["advantages"][:, 1:]})
        ppo.ppo_update(state, bad, config, ONE)
    with pytest.raises(ValueError, match="not a multiple of rl.minibatch_size=4"):
        short = {k: v[:6] for k, v in base.items()}
        ppo.ppo_update(state, ppo.PPOBatch(**short, returns=short["advantages"],
                                                 old_values=short["advantages"]), config, ONE)
    with pytest.raises(ValueError, match="need a reference policy"):
        rl_config(kl_loss_coef=0.1)
    with pytest.raises(ValueError, match=r"RLConfig.logits_chunk=-1 is out of range: allowed \[0, inf\)"):
        rl_config(logits_chunk=-1)
    with pytest.raises(ValueError, match=r"rl.critic.decay='linear' needs rl.critic.decay_steps > "):
        RLConfig(critic=OptimConfig(lr=1e-5, decay="linear"))


def test_settings_that_would_have_no_effect_are_errors():
    with pytest.raises(ValueError, match=r"\['rl.lam'\] would have no effect with rl.advantage='grpo'"):
        rl_config(advantage="grpo", use_critic=False, lam=0.95)
    with pytest.raises(ValueError, match="rl.grpo_eps.*rl.advantage='gae'"):
        rl_config(grpo_eps=0.1)
    with pytest.raises(ValueError, match="needs a critic"):
        rl_config(use_critic=False, advantage="gae")
    with pytest.raises(ValueError, match="config.rl.advantage='gea' is not a known advantage estimator"):
        rl_config(advantage="gea")
    with pytest.raises(ValueError, match="rl.kl_loss_type='k4' is not a known KL estimator"):
        rl_config(kl_loss_type="k4")
    with pytest.raises(NotImplementedError, match="rl.kl_reward_estimator 'full'"):
        rl_config(use_reference=True, kl_in_reward=True, kl_reward_estimator="full")
    assert rl_config(advantage="grpo", use_critic=False, grpo_eps=0.1).rl.grpo_eps == 0.1


def learn_batch(data, seed=0):
    rng = np.random.default_rng(seed)
    last = data["attention_mask"].sum(1) - 1
    rewards = np.zeros((B, S), np.float32)
    rewards[np.arange(B), last] = rng.normal(size=B)
    return ppo.Batch(tokens=data["tokens"], attention_mask=data["attention_mask"],
                     loss_mask=data["loss_mask"], sampler_logprobs=np.zeros((B, S), np.float32),
                     token_rewards=rewards, group_ids=np.repeat(np.arange(B // 2, dtype=np.int32), 2),
                     temperature=0.9)


@pytest.mark.parametrize("overrides", [
    dict(use_reference=True, kl_in_reward=True, kl_reward_estimator="low_var_kl", kl_reward_clip=0.05,
         kl_controller="adaptive", kl_coef=0.05, lam=0.9, gamma=0.99),
    dict(advantage="grpo", use_critic=False, whiten_advantages=False),
])
def test_learn_is_score_then_kl_then_advantages_then_the_update(overrides):
    """The one jitted program equals its stages run one by one (as written in the module docstring)."""
    config = rl_config(**overrides)
    rl = config.rl
    data = make_data(7)
    batch = learn_batch(data)
    mask = jnp.asarray(data["loss_mask"])
    mesh = make_mesh_8()
    state = new_state(config, mesh)
    if rl.kl_in_reward:  # a reference that differs from the policy, so that the KL penalty is not zero
        state = state._replace(ref=jax.tree.map(lambda p: p * 1.5, state.ref))
    learned, metrics = ppo.learn(state, batch, config, mesh)

    state = new_state(config, ONE)
    if rl.kl_in_reward:
        state = state._replace(ref=jax.tree.map(lambda p: p * 1.5, state.ref))
    logp, values, ref = ppo.score(state, batch.tokens, batch.attention_mask, 0.9, config, ONE)
    rewards = jnp.asarray(batch.token_rewards)
    if rl.kl_in_reward:
        unclipped = kl.apply_kl_penalty(rewards, logp, ref, mask, state.kl.coef, "low_var_kl", 0.0)[1]["kl"]
        rewards, kl_metrics = kl.apply_kl_penalty(rewards, logp, ref, mask, state.kl.coef, "low_var_kl", 0.05)
        assert float(unclipped) > float(kl_metrics["kl"])  # the clamp is active (and learn applies it)
        np.testing.assert_allclose(metrics["rollout/kl_coef"], rl.kl_coef, rtol=1e-6)
        controller = kl.make_kl_controller("adaptive", rl.kl_coef, rl.kl_target, rl.kl_horizon)
        state = state._replace(kl=controller.update(state.kl, kl_metrics["kl"], B))
        np.testing.assert_allclose(metrics["rollout/kl"], kl_metrics["kl"], rtol=1e-4)
        assert float(kl_metrics["kl"]) > 1e-3
    adv, returns = advantages.compute_advantages(rl, advantages.AdvantageInputs(
        rewards, mask, values, jnp.asarray(batch.group_ids)))
    if rl.whiten_advantages:
        adv = advantages.masked_whiten(adv, mask)
    critic = values is not None
    expected, expected_metrics = ppo.ppo_update(state, ppo.PPOBatch(
        batch.tokens, batch.attention_mask, mask, logp, adv, returns=returns if critic else None,
        old_values=values, ref_logprobs=ref, temperature=0.9), config, ONE)
    assert max_abs_diff(host(learned), host(expected)) < 1e-5
    for name, value in expected_metrics.items():
        np.testing.assert_allclose(metrics[name], value, rtol=1e-4, atol=1e-6, err_msg=name)
    gap = np.abs(np.asarray(logp))[data["loss_mask"] > 0].max()  # the sampler log-probs were all 0
    np.testing.assert_allclose(metrics["rollout/logprob_gap_max"], gap, rtol=1e-5)
    if critic:
        r, v = np.asarray(returns)[data["loss_mask"] > 0], np.asarray(values)[data["loss_mask"] > 0]
        explained = 1 - np.var(r - v, ddof=1) / (np.var(r, ddof=1) + 1e-5)  # verl's vf_explained_var
        np.testing.assert_allclose(metrics["critic/vf_explained_var"], explained, rtol=1e-4)


def short_rows_data(seed: int = 0) -> dict:
    """Rows of 5 to 11 tokens in 16 slots (two of them often share a packed row), prompts of 3 tokens."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(5, 12, size=B)
    attention = np.arange(S)[None] < lengths[:, None]
    loss_mask = ((np.arange(S)[None] >= 3) & attention).astype(np.float32)
    rewards = np.zeros((B, S), np.float32)
    rewards[np.arange(B), lengths - 1] = rng.normal(size=B)
    rewards[np.arange(B), 3] = 0.5 * rng.normal(size=B)  # a turn reward mid-sequence
    return dict(tokens=rng.integers(0, CFG.vocab_size, (B, S)).astype(np.int32), attention_mask=attention,
                loss_mask=loss_mask, token_rewards=rewards,
                sampler_logprobs=(-rng.uniform(0, 3, (B, S)) * loss_mask).astype(np.float32),
                group_ids=np.repeat(np.arange(B // 2, dtype=np.int32), 2))


def test_pack_places_every_sequence_once_whole_and_within_budget():
    lengths = np.array([5, 11, 7, 16, 3, 9, 8, 2])
    orders = np.stack([np.arange(B), np.random.default_rng(0).permutation(B)])
    packed = packing.pack(lengths, orders, minibatch_size=4, sequences=2, rows=2, width=S)
    assert packed.sources.shape[:2] == (2, 2) and packed.sources.shape[3:] == (2, S)
    for e in range(2):
        seqs = packed.sequences[e]
        assert sorted(seqs[seqs < B].tolist()) == list(range(B))  # each sequence once an epoch
        for m in range(2):
            assert set(seqs[m][seqs[m] < B].tolist()) == set(orders[e, 4 * m:4 * m + 4].tolist())
            for k in range(packed.micro_batches):
                flat = packed.sources[e, m, k].reshape(-1)
                for b, start in zip(packed.sequences[e, m, k], packed.starts[e, m, k]):
                    if b < B:  # whole, in one packed row, in order
                        assert start % packed.width + lengths[b] <= packed.width
                        np.testing.assert_array_equal(flat[start:start + lengths[b]],
                                                      b * S + np.arange(lengths[b]))
                held = packed.sequences[e, m, k]
                assert np.sum(flat < B * S) == np.sum(lengths[held[held < B]])


def test_pack_widens_rows_where_that_takes_fewer_slots():
    """Two micro-batches of two rows of 256 slots hold 150 + 150 + 120 + 120 tokens (no two fit in a row);
    rows of 384 (17/16 of 256 in multiples of 128) hold them in one micro-batch: 768 slots, not 1,024. Rows
    widen only with block pairs (attention computing nothing across sequences)."""
    lengths = np.array([150, 120, 150, 120])
    orders = np.arange(4)[None]
    plan = packing.pack(lengths, orders, minibatch_size=4, sequences=4, rows=2, width=256, block=64)
    assert (plan.width, plan.micro_batches) == (384, 1)
    assert packing.packed_widths(256, block=64) == [256, 384] and packing.packed_widths(256, 0) == [256]
    assert packing.packed_widths(256, block=64, max_width=300) == [256]
    narrow = packing.pack(lengths, orders, minibatch_size=4, sequences=4, rows=2, width=256)
    assert (narrow.width, narrow.micro_batches) == (256, 2)
    for p in (plan, narrow):  # every sequence whole, each in its own segment of the batch's slots
        held = np.sort(p.sources[p.sources < 4 * 256])
        expected = np.concatenate([b * 256 + np.arange(n) for b, n in enumerate(lengths)])
        np.testing.assert_array_equal(held, expected)


@pytest.mark.parametrize("overrides", [
    dict(loss_agg_mode="token-mean", use_reference=True, kl_in_reward=True, lam=0.9, gamma=0.99,
         entropy_coef=0.01),
    dict(loss_agg_mode="seq-mean-token-mean", shuffle=False, micro_batch_size=4),
    dict(loss_agg_mode="seq-mean-token-sum", advantage="grpo", use_critic=False, use_reference=True,
         kl_loss_coef=0.1),
    dict(loss_agg_mode="seq-mean-token-sum-norm", advantage="grpo", use_critic=False, micro_batch_size=4),
])
def test_packed_learn_equals_padded_learn(overrides):
    """On the (2, 2, 2) mesh, `learn` on packed rows (segments, positions restarting, per-sequence
    advantages and loss aggregation) gives the padded layout's parameters, optimizer states and metrics."""
    _check_packed_learn_equals_padded_learn(rl_config(**overrides))


def test_packed_learn_over_block_pairs_of_wider_rows_equals_padded_learn():
    """The same with blockwise attention computing only the packed rows' block pairs, in packed rows of 24
    slots for a batch of 16."""
    config = rl_config(loss_agg_mode="token-mean", use_reference=True)
    blockwise = config.compute.with_attention(impl="blockwise", block_size=4)
    plan = _check_packed_learn_equals_padded_learn(dataclasses.replace(config, compute=blockwise), [24])
    assert plan.width == 24 and plan.block_pairs.shape[-2] > 0


def _check_packed_learn_equals_padded_learn(config: ppo.PPOConfig, widths: list[int] | None = None
                                            ) -> packing.Packing:
    mesh = make_mesh_8()
    data = short_rows_data(3)
    batch = ppo.Batch(**data, temperature=0.9)
    orders = ppo.update_orders(new_state(config, mesh), B, config)
    shards = mesh.shape["data"] * mesh.shape["fsdp"]
    plan = packing.pack(data["attention_mask"].sum(1), orders, config.rl.minibatch_size,
                        config.rl.micro_batch_size, shards, S, models.pair_block(config.compute.attention),
                        widths)
    assert np.sum(plan.sources < B * S) // config.rl.ppo_epochs == data["attention_mask"].sum()
    assert np.any(plan.starts[plan.sequences < B] % plan.width > 0)  # some row holds two sequences
    padded, padded_metrics = ppo.learn(new_state(config, mesh), batch, config, mesh)
    packed, packed_metrics = ppo.learn(new_state(config, mesh), batch._replace(packing=plan), config, mesh)
    scale = max(float(np.max(np.abs(x))) for x in jax.tree.leaves(host(padded.policy)))
    assert max_abs_diff(host(packed), host(padded)) < 1e-5 * scale
    assert padded_metrics.keys() == packed_metrics.keys()
    for name, value in padded_metrics.items():
        np.testing.assert_allclose(packed_metrics[name], value, rtol=1e-5, atol=1e-7, err_msg=name)
    return plan


def test_a_reference_in_host_memory_gives_the_same_step():
    """`rl.offload_reference` keeps the reference's params in pinned host memory (before and after the step)
    and changes no number of the step, on the (2, 2, 2) mesh."""
    mesh = make_mesh_8()
    data = short_rows_data(3)
    batch = ppo.Batch(**data, temperature=0.9)
    results = {}
    for offload in (False, True):
        config = rl_config(**FULL, offload_reference=offload)
        state = new_state(config, mesh)
        assert {x.sharding.memory_kind for x in jax.tree.leaves(state.ref)} == {
            "pinned_host" if offload else "device"}
        results[offload] = ppo.learn(state, batch, config, mesh)
        assert {x.sharding.memory_kind for x in jax.tree.leaves(results[offload][0].ref)} == {
            "pinned_host" if offload else "device"}
    (plain, plain_metrics), (offloaded, offloaded_metrics) = results[False], results[True]
    assert max_abs_diff(host(offloaded), host(plain)) == 0.0
    assert offloaded_metrics.keys() == plain_metrics.keys()
    for name, value in plain_metrics.items():
        np.testing.assert_array_equal(offloaded_metrics[name], value, err_msg=name)
