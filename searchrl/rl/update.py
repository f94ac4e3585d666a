"""The sharded PPO update: epochs over shuffled minibatches, gradient accumulation over micro-batches, in
one jitted function.

Token alignment (as `models.token_logprobs`): index t of every [B, S] array is about token t. logprobs[t] is
log p(tokens[t] | tokens[:t]) under `log_softmax(logits / temperature)` (the sampler's convention),
values[t] is the critic's value of the state *before* token t (read from the hidden state at t-1, as verl),
index 0 is 0. loss_mask is > 0 on policy tokens only; positions are slots (arange(S): the rollout layout has
no holes).

Every loss is aggregated with `losses.agg_loss` over the *minibatch*: a micro-batch's aggregate is rescaled
by its share of the minibatch (tokens for token-mean, rows for the seq-mean modes), so the accumulated
gradient is exactly the full-minibatch gradient whatever the micro-batch size.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from searchrl import models
from searchrl.models.sharding import constrain
from searchrl.rl import losses
from searchrl.rl.optim import OptimConfig, apply_gradients, learning_rate, make_optimizer
from searchrl.rl.optim import default_config as optim_default_config
from searchrl.rl.train_state import StateLayout, TrainState, state_shardings

_ROWS = ("batch", "length")


class PPOBatch(NamedTuple):
    """One PPO iteration's data, [B, S] per token (host or device arrays)."""

    tokens: jax.Array  # int32
    attention_mask: jax.Array  # bool: the slot holds a token
    loss_mask: jax.Array  # bool or float: policy tokens (the only ones trained on)
    old_logprobs: jax.Array  # float32, sampler or `compute_old_logprobs_and_values`
    advantages: jax.Array  # float32
    returns: jax.Array | None = None  # float32, critic runs only
    old_values: jax.Array | None = None  # float32, critic runs only
    ref_logprobs: jax.Array | None = None  # float32, KL-loss runs only
    temperature: float | jax.Array = 1.0  # the sampler's `SamplingParams.logprob_temperature`


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    """Static settings of the update (hashable: one compiled program per config and batch shape)."""

    layout: StateLayout
    minibatch_size: int  # rows per optimizer step
    micro_batch_size: int  # rows per forward/backward pass (gradient accumulation)
    ppo_epochs: int = 1
    shuffle: bool = True
    policy_loss: str = "ppo"  # a name in losses.POLICY_LOSSES
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2  # > low: DAPO's clip-higher
    clip_ratio_c: float = 3.0  # dual clip
    loss_agg_mode: str = "token-mean"  # losses.AGG_MODES
    loss_max_length: int | None = None  # seq-mean-token-sum-norm's constant (None: S)
    value_clip: float = 0.5
    entropy_coef: float = 0.0
    kl_loss_coef: float = 0.0  # > 0: add kl_loss_coef * KL(pi || ref) to the policy loss (GRPO)
    kl_loss_type: str = "low_var_kl"
    compute_dtype: str = "float32"  # bfloat16 on accelerators: params are cast inside the loss
    remat: bool = False

    def __post_init__(self):
        if self.policy_loss not in losses.POLICY_LOSSES:
            raise ValueError(f"rl.policy_loss {self.policy_loss!r} is not one of "
                             f"{sorted(losses.POLICY_LOSSES)}")
        if self.loss_agg_mode not in losses.AGG_MODES:
            raise ValueError(f"rl.loss_agg_mode {self.loss_agg_mode!r} is not one of {losses.AGG_MODES}")
        if min(self.minibatch_size, self.micro_batch_size, self.ppo_epochs) < 1:
            raise ValueError("rl.minibatch_size, rl.micro_batch_size and rl.ppo_epochs must be >= 1")
        if self.minibatch_size % self.micro_batch_size:
            raise ValueError(f"rl.minibatch_size={self.minibatch_size} is not a multiple of "
                             f"rl.micro_batch_size={self.micro_batch_size}")
        if self.kl_loss_coef > 0 and not self.layout.reference:
            raise ValueError("rl.kl_loss_coef > 0 needs a reference model (rl.use_reference)")

    @classmethod
    def from_config(cls, rl: ml_collections.ConfigDict, model: models.ModelConfig) -> PPOConfig:
        """From the `config.rl` group (see `default_config`)."""
        layout = StateLayout(
            model=model,
            actor=OptimConfig.from_config(rl.actor, "rl.actor"),
            critic=OptimConfig.from_config(rl.critic, "rl.critic") if rl.use_critic else None,
            reference=bool(rl.use_reference),
            ref_dtype=rl.compute_dtype,
        )
        return cls(layout=layout, minibatch_size=rl.minibatch_size, micro_batch_size=rl.micro_batch_size,
                   ppo_epochs=rl.ppo_epochs, shuffle=rl.shuffle, policy_loss=rl.policy_loss,
                   clip_ratio_low=rl.clip_ratio_low, clip_ratio_high=rl.clip_ratio_high,
                   clip_ratio_c=rl.clip_ratio_c, loss_agg_mode=rl.loss_agg_mode,
                   loss_max_length=rl.loss_max_length or None, value_clip=rl.value_clip,
                   entropy_coef=rl.entropy_coef, kl_loss_coef=rl.kl_loss_coef, kl_loss_type=rl.kl_loss_type,
                   compute_dtype=rl.compute_dtype, remat=rl.remat)


def default_config() -> ml_collections.ConfigDict:
    """The `config.rl` fields `PPOConfig.from_config` reads, with verl's defaults."""
    rl = ml_collections.ConfigDict()
    rl.ppo_epochs = 1
    rl.minibatch_size = 8
    rl.micro_batch_size = 8
    rl.shuffle = True
    rl.policy_loss = "ppo"
    rl.clip_ratio_low = 0.2
    rl.clip_ratio_high = 0.2
    rl.clip_ratio_c = 3.0
    rl.loss_agg_mode = "token-mean"
    rl.loss_max_length = 0  # 0: the padded length S
    rl.value_clip = 0.5
    rl.entropy_coef = 0.0
    rl.use_critic = True  # False for critic-free estimators (GRPO, RLOO, REINFORCE++)
    rl.use_reference = False  # needed by the KL loss and the in-reward KL penalty
    rl.kl_loss_coef = 0.0
    rl.kl_loss_type = "low_var_kl"
    rl.compute_dtype = "float32"
    rl.remat = False
    rl.actor = optim_default_config(1e-6)
    rl.critic = optim_default_config(1e-5)
    return rl


def _cast(params: dict | None, dtype: str) -> dict | None:
    """Params in the compute dtype (a no-op for float32); gradients flow back to the float32 masters."""
    return None if params is None else jax.tree.map(lambda p: p.astype(dtype), params)


def _positions(tokens: jax.Array) -> jax.Array:
    return jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)


class _Forward(NamedTuple):
    """What a forward pass depends on (the scoring program is shared by configs that agree on it)."""

    layout: StateLayout
    dtype: str
    remat: bool


def _forward_of(config: PPOConfig) -> _Forward:
    return _Forward(config.layout, config.compute_dtype, config.remat)


def _policy_logprobs(fwd: _Forward, params: dict, tokens, mask, temperature, with_entropy: bool):
    logits = models.forward(fwd.layout.model, _cast(params, fwd.dtype), tokens, _positions(tokens), mask,
                            rules=fwd.layout.rules, remat=fwd.remat)[0]
    logprobs, entropy = models.logprobs_from_logits(logits / temperature, tokens)
    return (logprobs, entropy) if with_entropy else logprobs


def _state_values(fwd: _Forward, params: dict, tokens, mask) -> jax.Array:
    """Critic values aligned with tokens: index t holds V(tokens[:t]), index 0 is 0."""
    v = models.values(fwd.layout.model, _cast(params, fwd.dtype), tokens, _positions(tokens), mask,
                      rules=fwd.layout.rules, remat=fwd.remat)
    return jnp.concatenate([jnp.zeros_like(v[:, :1]), v[:, :-1]], axis=1)


def _policy_loss_kwargs(config: PPOConfig) -> dict:
    """The static options the configured policy loss accepts."""
    options = dict(clip_ratio_low=config.clip_ratio_low, clip_ratio_high=config.clip_ratio_high,
                   clip_ratio_c=config.clip_ratio_c, agg_mode=config.loss_agg_mode,
                   max_length=config.loss_max_length)
    accepted = inspect.signature(losses.POLICY_LOSSES[config.policy_loss]).parameters
    return {k: v for k, v in options.items() if k in accepted}


class _Share(NamedTuple):
    """A micro-batch's share of its minibatch: of the policy tokens, and of the loss normaliser."""

    tokens: jax.Array
    loss: jax.Array


def _share(config: PPOConfig, loss_mask: jax.Array, minibatch_tokens: jax.Array) -> _Share:
    """Token-mean losses normalise by policy tokens, the seq-mean modes by rows."""
    tokens = jnp.sum(loss_mask) / jnp.maximum(minibatch_tokens, 1.0)
    rows = loss_mask.shape[0] / config.minibatch_size
    return _Share(tokens, tokens if config.loss_agg_mode == "token-mean" else jnp.float32(rows))


def _loss(config: PPOConfig, policy: dict, critic: dict | None, x: dict, temperature, share: _Share):
    """(actor + critic loss of one micro-batch scaled to its minibatch share, metric contributions)."""
    mask, loss_mask = x["attention_mask"], x["loss_mask"].astype(jnp.float32)
    logp, entropy = _policy_logprobs(_forward_of(config), policy, x["tokens"], mask, temperature, True)
    pg_loss, pg_metrics = losses.POLICY_LOSSES[config.policy_loss](
        logp, x["old_logprobs"], x["advantages"], loss_mask, **_policy_loss_kwargs(config))
    ent, _ = losses.entropy_bonus(loss_mask, entropy=entropy, agg_mode=config.loss_agg_mode)
    actor_loss = pg_loss - config.entropy_coef * ent
    metrics = {"actor/pg_loss": pg_loss * share.loss, "actor/entropy": ent * share.loss}
    metrics.update({f"actor/{k}": v * share.tokens for k, v in pg_metrics.items()})
    if config.kl_loss_coef > 0:
        kl, _ = losses.kl_loss(logp, x["ref_logprobs"], loss_mask, estimator=config.kl_loss_type,
                               agg_mode=config.loss_agg_mode)
        actor_loss = actor_loss + config.kl_loss_coef * kl
        metrics["actor/kl_loss"] = kl * share.loss
    total = actor_loss * share.loss
    if critic is not None:
        v = _state_values(_forward_of(config), critic, x["tokens"], mask)
        vf_loss, vf_metrics = losses.value_loss(v, x["old_values"], x["returns"], loss_mask,
                                                clip_range=config.value_clip, agg_mode=config.loss_agg_mode)
        total = total + vf_loss * share.loss
        metrics["critic/vf_loss"] = vf_loss * share.loss
        metrics.update({f"critic/{k}": val * share.tokens for k, val in vf_metrics.items()})
        r, err = x["returns"], x["returns"] - v
        metrics.update({"_ev/n": jnp.sum(loss_mask), "_ev/r": jnp.sum(loss_mask * r),
                        "_ev/r2": jnp.sum(loss_mask * r * r), "_ev/e": jnp.sum(loss_mask * err),
                        "_ev/e2": jnp.sum(loss_mask * err * err)})
    return total, metrics


def _explained_variance(sums: dict) -> jax.Array:
    """1 - Var(returns - values) / Var(returns) over the minibatch's policy tokens, from accumulated sums."""
    n = jnp.maximum(sums["_ev/n"], 1.0)
    var_r = sums["_ev/r2"] / n - jnp.square(sums["_ev/r"] / n)
    var_e = sums["_ev/e2"] / n - jnp.square(sums["_ev/e"] / n)
    return 1.0 - var_e / jnp.maximum(var_r, 1e-8)


def _split(x: jax.Array, parts: int, rules) -> jax.Array:
    """[N, ...] -> [parts, N / parts, ...], rows of each part spread over the batch mesh axes."""
    y = x.reshape(parts, x.shape[0] // parts, *x.shape[1:])
    return constrain(y, (None,) + _ROWS[:y.ndim - 1], rules)


def _minibatch_step(config: PPOConfig, temperature, lrs, carry, mb: dict):
    """Accumulates gradients over the minibatch's micro-batches, then takes one optimizer step per model."""
    policy, critic, actor_opt, critic_opt = carry
    n_micro = config.minibatch_size // config.micro_batch_size
    minibatch_tokens = jnp.sum(mb["loss_mask"].astype(jnp.float32))
    grad_fn = jax.grad(functools.partial(_loss, config), argnums=(0, 1), has_aux=True)

    def micro_grads(x):
        return grad_fn(policy, critic, x, temperature, _share(config, x["loss_mask"], minibatch_tokens))

    def micro_step(acc, x):
        return jax.tree.map(jnp.add, acc, micro_grads(x)), None

    micro = jax.tree.map(lambda a: _split(a, n_micro, config.layout.rules), mb)
    zeros = jax.tree.map(jnp.zeros_like, jax.eval_shape(micro_grads, jax.tree.map(lambda a: a[0], micro)))
    ((policy_grads, critic_grads), sums), _ = jax.lax.scan(micro_step, zeros, micro)

    policy, actor_opt, actor_norm = apply_gradients(make_optimizer(config.layout.actor), policy, policy_grads,
                                                    actor_opt, lrs[0])
    metrics = {k: v for k, v in sums.items() if not k.startswith("_ev/")}
    metrics["actor/grad_norm"] = actor_norm
    if critic is not None:
        critic, critic_opt, critic_norm = apply_gradients(make_optimizer(config.layout.critic), critic,
                                                          critic_grads, critic_opt, lrs[1])
        metrics["critic/grad_norm"] = critic_norm
        metrics["critic/vf_explained_var"] = _explained_variance(sums)
    return (policy, critic, actor_opt, critic_opt), metrics


def _ppo_update(config: PPOConfig, state: TrainState, batch: PPOBatch) -> tuple[TrainState, dict]:
    rows = {k: v for k, v in batch._asdict().items() if k != "temperature" and v is not None}
    num_rows = batch.tokens.shape[0]
    n_mini = num_rows // config.minibatch_size
    key, shuffle_key = jax.random.split(jax.random.wrap_key_data(state.rng))
    lrs = (learning_rate(config.layout.actor)(state.step),
           learning_rate(config.layout.critic)(state.step) if config.layout.critic else None)

    def epoch(carry, epoch_key):
        order = jax.random.permutation(epoch_key, num_rows) if config.shuffle else jnp.arange(num_rows)
        minibatches = jax.tree.map(lambda a: _split(a[order], n_mini, config.layout.rules), rows)
        step = functools.partial(_minibatch_step, config, batch.temperature, lrs)
        return jax.lax.scan(step, carry, minibatches)

    carry = (state.policy, state.critic, state.actor_opt, state.critic_opt)
    (policy, critic, actor_opt, critic_opt), metrics = jax.lax.scan(
        epoch, carry, jax.random.split(shuffle_key, config.ppo_epochs))
    metrics = jax.tree.map(jnp.mean, metrics)
    metrics["actor/lr"] = jnp.asarray(lrs[0], jnp.float32)
    if config.layout.critic:
        metrics["critic/lr"] = jnp.asarray(lrs[1], jnp.float32)
    state = state._replace(step=state.step + 1, policy=policy, critic=critic, actor_opt=actor_opt,
                           critic_opt=critic_opt, rng=jax.random.key_data(key))
    return state, metrics


def batch_shardings(batch: PPOBatch, mesh: Mesh, config: PPOConfig) -> PPOBatch:
    """NamedShardings of a batch: [B, S] arrays sharded on B over the batch mesh axes, scalars replicated."""
    def sharding(x):
        if x is None:
            return None
        shape = jnp.shape(x)
        axes = _ROWS[:len(shape)] if shape else ()
        return models.logical_to_sharding(axes, mesh, config.layout.rules, shape)

    return PPOBatch(*(sharding(x) for x in batch))


def _check_batch(batch: PPOBatch, config: PPOConfig) -> None:
    """Clear host-side errors for a batch this config cannot train on."""
    shape = tuple(jnp.shape(batch.tokens))
    if len(shape) != 2:
        raise ValueError(f"PPOBatch.tokens must be [B, S], got shape {shape}")
    for name, x in batch._asdict().items():
        if name != "temperature" and x is not None and tuple(jnp.shape(x)) != shape:
            raise ValueError(f"PPOBatch.{name} has shape {tuple(jnp.shape(x))}, expected {shape} (as tokens)")
    if shape[0] % config.minibatch_size:
        raise ValueError(f"batch of {shape[0]} rows is not a multiple of "
                         f"rl.minibatch_size={config.minibatch_size}")
    needed = {"returns": config.layout.critic is not None, "old_values": config.layout.critic is not None,
              "ref_logprobs": config.kl_loss_coef > 0}
    for name, need in needed.items():
        if need and getattr(batch, name) is None:
            raise ValueError(f"PPOBatch.{name} is required by this config (critic or KL loss) but is None")


@functools.lru_cache(maxsize=None)
def _jitted_update(config: PPOConfig, mesh: Mesh, batch_layout: PPOBatch):
    shardings = state_shardings(config.layout, mesh)
    replicated = NamedSharding(mesh, PartitionSpec())
    return jax.jit(functools.partial(_ppo_update, config), in_shardings=(shardings, batch_layout),
                   out_shardings=(shardings, replicated), donate_argnums=0)


def update_fn(config: PPOConfig, mesh: Mesh, batch: PPOBatch):
    """The jitted (state, batch) -> (state, metrics) for this config, mesh and batch shape (cached)."""
    _check_batch(batch, config)
    return _jitted_update(config, mesh, batch_shardings(batch, mesh, config))


def ppo_update(state: TrainState, batch: PPOBatch, config: PPOConfig, mesh: Mesh) -> tuple[TrainState, dict]:
    """One PPO iteration: `ppo_epochs` epochs over shuffled minibatches (one optimizer step each, per model).

    `state` is donated. Returns the new state and a dict of scalar metrics (device arrays) averaged over the
    minibatches: actor/{pg_loss, entropy, pg_clipfrac, ppo_kl, ..., kl_loss, grad_norm, lr} and, with a
    critic, critic/{vf_loss, vf_clipfrac, vpred_mean, vf_explained_var, grad_norm, lr}.
    """
    batch = batch._replace(temperature=np.float32(batch.temperature))  # one dtype: no retrace per caller type
    fn = update_fn(config, mesh, batch)
    with jax.set_mesh(mesh):
        return fn(state, batch)


@functools.lru_cache(maxsize=None)
def _jitted_scoring(fwd: _Forward, mesh: Mesh, rows: NamedSharding):
    def score(state: TrainState, tokens, attention_mask, temperature):
        logprobs = _policy_logprobs(fwd, state.policy, tokens, attention_mask, temperature, False)
        values = None if state.critic is None else _state_values(fwd, state.critic, tokens, attention_mask)
        ref = None if state.ref is None else _policy_logprobs(fwd, state.ref, tokens, attention_mask,
                                                              temperature, False)
        return logprobs, values, ref

    replicated = NamedSharding(mesh, PartitionSpec())
    return jax.jit(score, in_shardings=(state_shardings(fwd.layout, mesh), rows, rows, replicated),
                   out_shardings=rows)


def compute_old_logprobs_and_values(state: TrainState, tokens: jax.Array, attention_mask: jax.Array,
                                    temperature: float, config: PPOConfig, mesh: Mesh):
    """(policy logprobs, critic values or None, reference logprobs or None), each [B, S] float32 and aligned
    as the module docstring says, from the state before the update."""
    rows = models.logical_to_sharding(_ROWS, mesh, config.layout.rules, jnp.shape(tokens))
    with jax.set_mesh(mesh):
        score = _jitted_scoring(_forward_of(config), mesh, rows)
        return score(state, tokens, attention_mask, np.float32(temperature))
