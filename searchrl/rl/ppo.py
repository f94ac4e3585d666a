"""PPO (and GRPO, RLOO, REINFORCE++) readable in one file: `learn(state, batch)` is one RL step as ONE jitted,
sharded program (two with the reference in host memory, `rl.offload_reference`: the scoring pass, then the
rest, which never holds the reference on the devices).

    score the rollout (policy log-probs, critic values, reference log-probs; in micro-batches)
    -> KL penalty in the reward (optional; the coefficient's controller steps in the state)
    -> advantages (an estimator from `advantages.ADVANTAGES`), whitened
    -> `ppo_epochs` epochs over minibatches (shuffled, or in order as verl): gradient accumulation over
       micro-batches, one optimizer step per minibatch per model.

Token alignment (as `models.token_logprobs`): index t of every [B, S] array is about token t. logprobs[t] is
log p(tokens[t] | tokens[:t]) under `log_softmax(logits / temperature)` (the sampler's convention),
values[t] is the critic's value of the state *before* token t (read from the hidden state at t-1, as verl),
index 0 is 0. loss_mask is > 0 on policy tokens only; positions are slots (arange(S): the rollout layout has
no holes).

Every loss is aggregated with `losses.agg_loss` over the *minibatch*: a micro-batch's aggregate is rescaled
by its share of the minibatch (policy tokens for token-mean, rows with a policy token for seq-mean-token-sum
and -mean; seq-mean-token-sum-norm is a sum and adds up as it is), so the accumulated gradient is exactly the
full-minibatch gradient whatever the micro-batch size. verl's dp_actor aggregates each micro-batch on its
own and scales it by 1 / (micro-batches per minibatch): the same result with one micro-batch per minibatch,
a result that depends on the micro-batch size with more.

Non-finite values are never applied: non-finite rewards skip the whole update, and the first minibatch whose
losses, gradients or stepped params (a non-finite learning rate, an overflow) are non-finite skips its
optimizer steps and every later one of the update (the earlier minibatches stay applied: undoing them would
need a copy of the whole state, twice its memory). A minibatch steps the critic before it computes the
actor's gradients (`_minibatch_step`), so a critic step is skipped for its own non-finite values, the
actor's for either model's. verl skips a non-finite step per model and goes on with the next minibatch;
searchrl stops the update there. The step counter and RNG advance either way; the metric `train/nonfinite`
is 1 on such a step.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from searchrl import models
from searchrl.models.sharding import constrain
from searchrl.registry import Registry
from searchrl.rl import advantages as adv_lib
from searchrl.rl import kl as kl_lib
from searchrl.rl import losses
from searchrl.rl.config import RLConfig
from searchrl.rl.optim import apply_gradients, learning_rate, make_optimizer
from searchrl.rl.packing import Packing
from searchrl.rl.train_state import StateSpec, TrainState, abstract_train_state, state_shardings

_ROWS = ("batch", "length")


class Batch(NamedTuple):
    """One RL step's rollout, [B, S] per token (host or device arrays): what `learn` consumes."""

    tokens: jax.Array  # int32
    attention_mask: jax.Array  # bool: the slot holds a token
    loss_mask: jax.Array  # float32: 1 on policy tokens (the only ones trained on)
    sampler_logprobs: jax.Array  # float32: the sampler's log-probs of the policy tokens
    token_rewards: jax.Array  # float32: the env's turn rewards on each turn's last token
    group_ids: jax.Array  # int32 [B]: rows sampled from the same prompt share an id (GRPO, RLOO)
    temperature: float | jax.Array = 1.0  # the sampler's `SamplingParams.logprob_temperature`
    packing: Packing | None = None  # run the models on these packed rows (`packing.pack`), else on the B rows
    anchor_ids: jax.Array | None = None  # int32: each policy token's anchor state (GiGPO, `anchor_state_ids`)


class PPOBatch(NamedTuple):
    """The update's data, [B, S] per token: a scored `Batch` with its advantages."""

    tokens: jax.Array  # int32
    attention_mask: jax.Array  # bool
    loss_mask: jax.Array  # bool or float: policy tokens
    old_logprobs: jax.Array  # float32, from `score`
    advantages: jax.Array  # float32
    returns: jax.Array | None = None  # float32, critic runs only
    old_values: jax.Array | None = None  # float32, critic runs only
    ref_logprobs: jax.Array | None = None  # float32, KL-loss runs only
    temperature: float | jax.Array = 1.0
    packing: Packing | None = None


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    """The static settings of a learn step (hashable: one compiled program per config and batch shape)."""

    rl: RLConfig
    spec: StateSpec
    compute: models.Compute  # how the models compute: a `Placement`'s `train` (its rules: `spec.rules`)

    @classmethod
    def create(cls, rl: RLConfig, model: models.ModelConfig, compute: models.Compute) -> PPOConfig:
        """Checks the names in `rl` and the options it sets against the functions they pick; the state laid
        out by `compute.rules`."""
        _check_unused(rl, "advantage", adv_lib.ADVANTAGES)
        _check_unused(rl, "policy_loss", losses.POLICY_LOSSES)
        for field in ("kl_reward_estimator", "kl_loss_type"):
            kl_lib.get_estimator(getattr(rl, field), f"rl.{field}")
        if rl.loss_agg_mode not in losses.AGG_MODES:
            raise ValueError(f"rl.loss_agg_mode={rl.loss_agg_mode!r} is not one of {losses.AGG_MODES}")
        if adv_lib.ADVANTAGES.get(rl.advantage).needs_critic and not rl.use_critic:
            raise ValueError(f"rl.advantage={rl.advantage!r} needs a critic: set rl.use_critic=True.")
        spec = StateSpec(model=model, actor=rl.actor, critic=rl.critic if rl.use_critic else None,
                             reference=rl.use_reference, ref_dtype=rl.compute_dtype,
                             offload_reference=rl.offload_reference, rules=compute.rules)
        return cls(rl, spec, compute)


def _check_unused(rl: RLConfig, field: str, registry: Registry) -> None:
    """An error if an option some entry of `registry` reads (its `options`) but the entry `rl.<field>` names
    does not is set away from its default: a setting that would have no effect is an error, not silently
    dropped."""
    reads = registry.get(getattr(rl, field)).options
    options = sorted({option for name in registry for option in registry.get(name).options})
    defaults = RLConfig()
    unused = [f"rl.{option}" for option in options
              if option not in reads and getattr(rl, option) != getattr(defaults, option)]
    if unused:
        raise ValueError(f"{unused} would have no effect with rl.{field}={getattr(rl, field)!r}; "
                         "leave them at their defaults.")


def _cast(params: dict | None, dtype: str) -> dict | None:
    """Params in the compute dtype (a no-op for float32); gradients flow back to the float32 masters."""
    return None if params is None else jax.tree.map(lambda p: p.astype(dtype), params)


class _Rows(NamedTuple):
    """The rows a model pass runs on, [R, W], and where its sequences are in them: with `starts` [Q] (packed
    rows), sequence q's slot s is flat slot starts[q] + s; without, sequence q is row q (W = S)."""

    tokens: jax.Array
    attention_mask: jax.Array
    positions: jax.Array
    segments: models.Segments | None = None
    starts: jax.Array | None = None


def _padded_rows(tokens: jax.Array, mask: jax.Array) -> _Rows:
    """One sequence a row, at positions 0 .. S-1."""
    return _Rows(tokens, mask, jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape))


def _packed_rows(tokens: jax.Array, sources: jax.Array, starts: jax.Array, block_pairs: jax.Array) -> _Rows:
    """The batch's tokens [B, S] laid out as a micro-batch's packed rows (`Packing.sources` [R, W], `.starts`
    and `.block_pairs`): a sequence's segment is its batch row, its positions restart at 0."""
    width = tokens.shape[1]
    packed = jnp.take(tokens.reshape(-1), sources, mode="fill", fill_value=0)
    segments = models.Segments(sources // width, block_pairs)
    return _Rows(packed, sources < tokens.size, sources % width, segments, starts)


def _per_sequence(rows: _Rows, x: jax.Array, width: int) -> jax.Array:
    """A per-token output [R, W] of a model pass on `rows` as the sequences' rows [Q, width]. A packed
    sequence's index 0 reads the previous sequence's last slot: it is 0, as in a row of its own."""
    if rows.starts is None:
        return x
    slots = jnp.arange(width)
    y = jnp.take(x.reshape(-1), rows.starts[:, None] + slots, mode="fill", fill_value=0)
    return jnp.where(slots > 0, y, jnp.zeros_like(y))


def _policy_logprobs(config: PPOConfig, params: dict, rows: _Rows, width: int, temperature,
                     with_entropy: bool):
    """Log-probs [Q, width] (and entropies, with `with_entropy`) of the sequences in `rows`."""
    out = models.token_logprobs(config.spec.model, _cast(params, config.rl.compute_dtype), rows.tokens,
                                rows.positions, rows.attention_mask, with_entropy=with_entropy,
                                temperature=temperature, compute=config.compute, remat=config.rl.remat,
                                logits_chunk=config.rl.logits_chunk, segments=rows.segments)
    if with_entropy:
        return tuple(_per_sequence(rows, x, width) for x in out)
    return _per_sequence(rows, out, width)


def _state_values(config: PPOConfig, params: dict, rows: _Rows, width: int) -> jax.Array:
    """Critic values [Q, width] of the sequences in `rows`: index t holds V(tokens[:t]), index 0 is 0."""
    v = models.values(config.spec.model, _cast(params, config.rl.compute_dtype), rows.tokens, rows.positions,
                      rows.attention_mask, compute=config.compute, remat=config.rl.remat,
                      segments=rows.segments)
    return _per_sequence(rows, jnp.concatenate([jnp.zeros_like(v[:, :1]), v[:, :-1]], axis=1), width)


class _Share(NamedTuple):
    """A micro-batch's share of its minibatch: of the policy tokens, and of the loss normaliser."""

    tokens: jax.Array
    loss: jax.Array


def _counts(loss_mask: jax.Array) -> _Share:
    """(policy tokens, rows with a policy token): the normalisers of token-mean and the seq-mean modes."""
    return _Share(jnp.sum(loss_mask), jnp.sum(losses.nonempty_rows(loss_mask)).astype(jnp.float32))


def _share(config: PPOConfig, loss_mask: jax.Array, minibatch: _Share) -> _Share:
    """`loss_mask`'s share of the `minibatch` counts; seq-mean-token-sum-norm, a sum, needs no rescaling."""
    mine = _counts(loss_mask)
    tokens = mine.tokens / jnp.maximum(minibatch.tokens, 1.0)
    if config.rl.loss_agg_mode == "token-mean":
        return _Share(tokens, tokens)
    if config.rl.loss_agg_mode == "seq-mean-token-sum-norm":
        return _Share(tokens, jnp.float32(1.0))
    return _Share(tokens, mine.loss / jnp.maximum(minibatch.loss, 1.0))


def _rows(x: dict, tokens: jax.Array | None) -> _Rows:
    """A micro-batch's model rows: its packed rows of the batch's `tokens` where it has `sources`, else its
    own [Q, S] rows."""
    if "sources" in x:
        return _packed_rows(tokens, x["sources"], x["starts"], x["block_pairs"])
    return _padded_rows(x["tokens"], x["attention_mask"])


def _actor_loss(config: PPOConfig, policy: dict, x: dict, temperature, share: _Share,
                tokens: jax.Array | None = None):
    """(the actor's loss of one micro-batch scaled to its minibatch share, metric contributions). `x` holds
    the micro-batch's per-token arrays [Q, S] (and its packed rows of the batch's `tokens`, `_rows`)."""
    loss_mask, rows, width = x["loss_mask"].astype(jnp.float32), _rows(x, tokens), x["loss_mask"].shape[1]
    logp, entropy = _policy_logprobs(config, policy, rows, width, temperature, True)
    pg_loss, pg_metrics = losses.POLICY_LOSSES.get(config.rl.policy_loss).run(
        logp, x["old_logprobs"], x["advantages"], loss_mask, config.rl)
    ent, _ = losses.entropy_bonus(loss_mask, entropy=entropy, loss_agg_mode=config.rl.loss_agg_mode)
    actor_loss = pg_loss - config.rl.entropy_coef * ent
    metrics = {"actor/pg_loss": pg_loss * share.loss, "actor/entropy": ent * share.loss}
    metrics.update({f"actor/{k}": v * share.tokens for k, v in pg_metrics.items()})
    if config.rl.kl_loss_coef > 0:
        kl, _ = losses.kl_loss(logp, x["ref_logprobs"], loss_mask, kl_loss_type=config.rl.kl_loss_type,
                               loss_agg_mode=config.rl.loss_agg_mode)
        actor_loss = actor_loss + config.rl.kl_loss_coef * kl
        metrics["actor/kl_loss"] = kl * share.loss
    return actor_loss * share.loss, metrics


def actor_loss(config: PPOConfig, policy: dict, x: dict, temperature, tokens: jax.Array | None = None
               ) -> jax.Array:
    """The actor's loss of one micro-batch `x` (as `_actor_loss`) taken as its whole minibatch: what one
    device computes and differentiates a micro-batch (the GPU check times it)."""
    return _actor_loss(config, policy, x, temperature, _Share(jnp.float32(1.0), jnp.float32(1.0)), tokens)[0]


def _critic_loss(config: PPOConfig, critic: dict, x: dict, share: _Share, tokens: jax.Array | None = None):
    """(the critic's loss of one micro-batch scaled to its minibatch share, metric contributions); `x` and
    `tokens` as in `_actor_loss`."""
    loss_mask, rows, width = x["loss_mask"].astype(jnp.float32), _rows(x, tokens), x["loss_mask"].shape[1]
    v = _state_values(config, critic, rows, width)
    vf_loss, vf_metrics = losses.value_loss(v, x["old_values"], x["returns"], loss_mask,
                                            value_clip=config.rl.value_clip,
                                            loss_agg_mode=config.rl.loss_agg_mode)
    metrics = {"critic/vf_loss": vf_loss * share.loss}
    metrics.update({f"critic/{k}": val * share.tokens for k, val in vf_metrics.items()})
    return vf_loss * share.loss, metrics


def _split(x: jax.Array, parts: tuple[int, ...], rules) -> jax.Array:
    """[N, ...] -> [*parts, N / prod(parts), ...], rows of each part spread over the batch mesh axes."""
    y = x.reshape(*parts, -1, *x.shape[1:])
    return constrain(y, (None,) * len(parts) + _ROWS[:x.ndim], rules)


def all_finite(tree) -> jax.Array:
    """Whether every floating-point value of `tree` is finite (a bool scalar; True for an empty tree)."""
    arrays = [jnp.asarray(x) for x in jax.tree.leaves(tree)]
    flags = [jnp.all(jnp.isfinite(x)) for x in arrays if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack(flags)) if flags else jnp.bool_(True)


def _keep_if(ok: jax.Array, new, old):
    """`new` where `ok`, else `old` (pytrees of the same structure); elementwise, so it fuses into the
    update that made `new` (no extra copy of the state)."""
    return jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, old)


def _accumulated_grads(loss: Callable, params: dict, micro: dict) -> tuple[dict, dict]:
    """(gradients, metrics) of `loss(params, x) -> (loss, metrics)` summed over the micro-batches of `micro`
    ([micro-batches, ...] each)."""
    grad_fn = jax.grad(loss, has_aux=True)

    def micro_step(acc, x):
        return jax.tree.map(jnp.add, acc, grad_fn(params, x)), None

    zeros = jax.tree.map(jnp.zeros_like, jax.eval_shape(grad_fn, params, jax.tree.map(lambda a: a[0], micro)))
    return jax.lax.scan(micro_step, zeros, micro)[0]


def _minibatch_step(config: PPOConfig, temperature, lrs, tokens: jax.Array, carry, micro: dict):
    """Accumulates gradients over the minibatch's micro-batches (`micro`: [micro-batches, ...] each, packed
    rows of the batch's `tokens` or rows of their own), then takes one optimizer step per model, unless this
    or an earlier minibatch of the update (or the rewards) were non-finite: `carry` ends with that flag. A
    step whose new params are not finite (from finite gradients: a non-finite rate) is not kept either.

    The critic goes first: its gradients are applied, and freed, before the actor's are made, so one model's
    float32 gradients live at a time (what lets a 3B policy and critic train on two 80 GB GPUs). Its step
    is kept unless its own losses or gradients (or an earlier minibatch's) are non-finite; the actor's also
    needs the critic's to be finite."""
    *before, ok = carry
    policy, critic, actor_opt, critic_opt = before
    minibatch = _counts(micro["loss_mask"].astype(jnp.float32))

    def share(x: dict) -> _Share:
        return _share(config, x["loss_mask"], minibatch)

    metrics = {}
    if critic is not None:
        grads, metrics = _accumulated_grads(
            lambda params, x: _critic_loss(config, params, x, share(x), tokens), critic, micro)
        stepped = apply_gradients(make_optimizer(config.spec.critic), critic, grads, critic_opt, lrs[1])
        metrics["critic/grad_norm"] = stepped[2]
        ok = ok & all_finite(metrics) & all_finite(stepped[0])
        critic, critic_opt = _keep_if(ok, stepped[:2], (critic, critic_opt))
        policy, critic = jax.lax.optimization_barrier((policy, critic))  # the actor's pass after this step
    grads, actor_metrics = _accumulated_grads(
        lambda params, x: _actor_loss(config, params, x, temperature, share(x), tokens), policy, micro)
    stepped = apply_gradients(make_optimizer(config.spec.actor), policy, grads, actor_opt, lrs[0])
    actor_metrics["actor/grad_norm"] = stepped[2]
    ok = ok & all_finite(actor_metrics) & all_finite(stepped[0])
    policy, actor_opt = _keep_if(ok, stepped[:2], (policy, actor_opt))
    return (policy, critic, actor_opt, critic_opt, ok), metrics | actor_metrics


def _ppo_update(config: PPOConfig, state: TrainState, batch: PPOBatch,
                finite_inputs: jax.Array | bool = True) -> tuple[TrainState, dict]:
    """The update; `finite_inputs` False (non-finite rewards) skips every optimizer step."""
    arrays = {k: v for k, v in batch._asdict().items()
              if k not in ("temperature", "packing") and v is not None}
    rl, num_rows = config.rl, batch.tokens.shape[0]
    parts = (num_rows // rl.minibatch_size, rl.minibatch_size // rl.micro_batch_size)
    key, shuffle_key = _update_keys(state.rng)
    lrs = (learning_rate(config.spec.actor)(state.step),
           learning_rate(config.spec.critic)(state.step) if config.spec.critic else None)

    def padded(order):  # [minibatches, micro-batches, rows, ...]
        return jax.tree.map(lambda a: _split(a[order], parts, config.spec.rules), arrays)

    def packed(packing: Packing):  # the same, each micro-batch's sequences with their packed rows
        per_token = {k: v for k, v in arrays.items() if k not in ("tokens", "attention_mask")}
        sequences = {k: jnp.take(a, packing.sequences, axis=0, mode="fill", fill_value=0)
                     for k, a in per_token.items()}
        return sequences | {"sources": packing.sources, "starts": packing.starts,
                            "block_pairs": packing.block_pairs}

    def epoch(carry, xs):
        step = functools.partial(_minibatch_step, config, batch.temperature, lrs, batch.tokens)
        return jax.lax.scan(step, carry, padded(xs) if batch.packing is None else packed(xs))

    carry = (state.policy, state.critic, state.actor_opt, state.critic_opt, jnp.asarray(finite_inputs))
    epochs = _orders(config, shuffle_key, num_rows) if batch.packing is None else batch.packing
    (policy, critic, actor_opt, critic_opt, finite), metrics = jax.lax.scan(epoch, carry, epochs)
    metrics = jax.tree.map(jnp.mean, metrics)
    metrics["train/nonfinite"] = 1.0 - finite.astype(jnp.float32)
    metrics["actor/lr"] = jnp.asarray(lrs[0], jnp.float32)
    if config.spec.critic:
        metrics["critic/lr"] = jnp.asarray(lrs[1], jnp.float32)
    state = state._replace(step=state.step + 1, policy=policy, critic=critic, actor_opt=actor_opt,
                           critic_opt=critic_opt, rng=jax.random.key_data(key))
    return state, metrics


def _update_keys(rng: jax.Array) -> jax.Array:
    """(the state's next RNG key, the key of this update's shuffles) from the state's RNG data."""
    return jax.random.split(jax.random.wrap_key_data(rng))


def _orders(config: PPOConfig, shuffle_key: jax.Array, rows: int) -> jax.Array:
    """[ppo_epochs, rows]: each epoch's batch rows in update order, shuffled with `rl.shuffle`."""
    if not config.rl.shuffle:
        return jnp.broadcast_to(jnp.arange(rows), (config.rl.ppo_epochs, rows))
    return jnp.stack([jax.random.permutation(k, rows) for k in jax.random.split(shuffle_key,
                                                                               config.rl.ppo_epochs)])


@functools.lru_cache(maxsize=None)
def _orders_program(config: PPOConfig, rows: int) -> Callable:
    return jax.jit(lambda rng: _orders(config, _update_keys(rng)[1], rows))


def update_orders(state: TrainState, rows: int, config: PPOConfig) -> np.ndarray:
    """[ppo_epochs, rows]: the batch rows of each epoch of `state`'s next update in the order it takes them
    (consecutive `rl.minibatch_size` make a minibatch), on the host: the orders `packing.pack` lays out."""
    return np.asarray(jax.device_get(_orders_program(config, rows)(state.rng)))


def batch_shardings(batch: NamedTuple, mesh: Mesh, config: PPOConfig) -> NamedTuple:
    """NamedShardings of a batch (a `Batch` or `PPOBatch`): arrays sharded on their rows over the batch mesh
    axes, scalars and the packing replicated."""
    def sharding(x):
        if x is None:
            return None
        if isinstance(x, Packing):
            return Packing(*(NamedSharding(mesh, PartitionSpec()) for _ in x))
        return models.rows_sharding(jnp.shape(x), mesh, config.spec.rules)

    return type(batch)(*(sharding(x) for x in batch))


def _check_rows(batch: NamedTuple, config: PPOConfig) -> None:
    """Clear host-side errors for [B, S] fields whose shapes disagree, or a B the minibatches do not
    divide."""
    name = type(batch).__name__
    shape = tuple(jnp.shape(batch.tokens))
    if len(shape) != 2:
        raise ValueError(f"{name}.tokens must be [B, S], got shape {shape}")
    for field, x in batch._asdict().items():
        expected = shape[:1] if field == "group_ids" else shape
        if field not in ("temperature", "packing") and x is not None and tuple(jnp.shape(x)) != expected:
            raise ValueError(f"{name}.{field} has shape {tuple(jnp.shape(x))}, expected {expected}")
    if shape[0] % config.rl.minibatch_size:
        raise ValueError(f"batch of {shape[0]} rows is not a multiple of "
                         f"rl.minibatch_size={config.rl.minibatch_size}")
    packing = getattr(batch, "packing", None)
    if packing is not None:
        epochs, minibatches = config.rl.ppo_epochs, shape[0] // config.rl.minibatch_size
        sources, sequences = tuple(packing.sources.shape), tuple(packing.sequences.shape)
        if (sources[:2], sequences) != ((epochs, minibatches), (*sources[:3], config.rl.micro_batch_size)) \
                or sources[-1] < shape[1]:
            raise ValueError(f"{name}.packing has sources {sources} and sequences {sequences}; expected "
                             f"[{epochs}, {minibatches}, K, rows, W >= {shape[1]}] and "
                             f"[{epochs}, {minibatches}, K, {config.rl.micro_batch_size}] (`packing.pack` "
                             "for this config and batch)")


def _check_update_batch(batch: PPOBatch, config: PPOConfig) -> None:
    _check_rows(batch, config)
    needed = {"returns": config.spec.critic is not None, "old_values": config.spec.critic is not None,
              "ref_logprobs": config.rl.kl_loss_coef > 0}
    for name, need in needed.items():
        if need and getattr(batch, name) is None:
            raise ValueError(f"PPOBatch.{name} is required by this config (critic or KL loss) but is None")


@functools.lru_cache(maxsize=None)
def _sharded(fn: Callable, config: PPOConfig, mesh: Mesh, batch_specs: NamedTuple, donate: bool,
             reference: bool = True):
    """`fn(config, state, batch)` jitted over the state's and the batch's shardings (a state without its
    reference unless `reference`). With `donate`, it returns (new state, scalar metrics) and the state is
    donated; without, [B, S] arrays sharded like the tokens. Arguments `fn` does not read stay arguments,
    so a program's memory report (`searchrl.benchmarks.aot`) counts the whole state beside it."""
    shardings = state_shardings(config.spec, mesh)
    shardings = shardings if reference else shardings._replace(ref=None)
    out = (shardings, NamedSharding(mesh, PartitionSpec())) if donate else batch_specs.tokens
    return jax.jit(functools.partial(fn, config), in_shardings=(shardings, batch_specs), out_shardings=out,
                   donate_argnums=0 if donate else (), keep_unused=True)


def _program(fn: Callable, batch: NamedTuple, config: PPOConfig, mesh: Mesh, donate: bool,
             reference: bool = True) -> tuple[Callable, NamedTuple, NamedTuple]:
    """`fn` jitted for batches shaped like `batch` (once per config, mesh and batch shape), `batch` as it
    takes it, and its shardings."""
    batch = batch._replace(temperature=np.float32(batch.temperature))  # one dtype: no retrace per caller type
    shardings = batch_shardings(batch, mesh, config)
    return _sharded(fn, config, mesh, shardings, donate, reference), batch, shardings


def _run(fn: Callable, state: TrainState, batch: NamedTuple, config: PPOConfig, mesh: Mesh, donate: bool,
         reference: bool = True):
    """`fn` on (state, batch); host arrays of `batch` are put on the mesh explicitly."""
    jitted, batch, shardings = _program(fn, batch, config, mesh, donate, reference)
    batch = jax.tree.map(lambda x, s: x if isinstance(x, jax.Array) else jax.device_put(x, s), batch,
                         shardings)
    with jax.set_mesh(mesh):
        return jitted(state, batch)


def ppo_update(state: TrainState, batch: PPOBatch, config: PPOConfig, mesh: Mesh) -> tuple[TrainState, dict]:
    """The update alone: `ppo_epochs` epochs over minibatches (one optimizer step each, per model).

    `state` is donated. Returns the new state and a dict of scalar metrics (device arrays) averaged over the
    minibatches: actor/{pg_loss, entropy, pg_clipfrac, ppo_kl, ..., kl_loss, grad_norm, lr}, with a
    critic, critic/{vf_loss, vf_clipfrac, vpred_mean, grad_norm, lr}, and train/nonfinite (1: a non-finite
    loss or gradient stopped the update, see the module docstring).
    """
    _check_update_batch(batch, config)
    return _run(_ppo_update, state, batch, config, mesh, donate=True)


def _score(config: PPOConfig, state: TrainState, tokens, attention_mask, temperature,
           packing: Packing | None = None):
    """(policy log-probs, critic values or None, reference log-probs or None) of the rollout, [B, S] each,
    computed `rl.micro_batch_size` rows at a time, or on the first epoch's packed micro-batches of
    `packing` (each sequence once)."""
    rows, width = tokens.shape
    ref_params = state.ref
    if config.spec.reference_on_host:  # in host memory: a device copy for this pass
        ref_params = jax.device_put(ref_params, jax.memory.Space.Device)

    def one(x):
        model_rows = _rows(x, tokens)
        logprobs = _policy_logprobs(config, state.policy, model_rows, width, temperature, False)
        values = None if state.critic is None else _state_values(config, state.critic, model_rows, width)
        ref = None if ref_params is None else _policy_logprobs(config, ref_params, model_rows, width,
                                                               temperature, False)
        return logprobs, values, ref

    if packing is None:
        parts = rows // config.rl.micro_batch_size if rows % config.rl.micro_batch_size == 0 else 1
        split = {"tokens": tokens, "attention_mask": attention_mask}
        scored = jax.lax.map(one, {k: _split(x, (parts,), config.spec.rules) for k, x in split.items()})
        return jax.tree.map(lambda y: y.reshape(rows, *y.shape[2:]), scored)
    first = {name: getattr(packing, name)[0] for name in ("sources", "starts", "block_pairs")}
    scored = jax.lax.map(one, {k: x.reshape(x.shape[0] * x.shape[1], *x.shape[2:]) for k, x in first.items()})
    sequences = packing.sequences[0].reshape(-1)  # B (no sequence) is dropped
    return jax.tree.map(lambda y: jnp.zeros((rows, width), y.dtype).at[sequences].set(
        y.reshape(-1, width), mode="drop"), scored)


class _Tokens(NamedTuple):
    tokens: jax.Array
    attention_mask: jax.Array
    temperature: float | jax.Array


def _score_tokens(config: PPOConfig, state: TrainState, batch: _Tokens):
    return _score(config, state, batch.tokens, batch.attention_mask, batch.temperature)


def score(state: TrainState, tokens: jax.Array, attention_mask: jax.Array, temperature: float,
          config: PPOConfig, mesh: Mesh):
    """`learn`'s scoring pass alone: (policy log-probs, critic values or None, reference log-probs or None),
    each [B, S] float32 and aligned as the module docstring says."""
    batch = _Tokens(tokens, attention_mask, temperature)
    _check_rows(batch, config)
    return _run(_score_tokens, state, batch, config, mesh, donate=False)


def explained_variance(returns: jax.Array, values: jax.Array, mask: jax.Array) -> jax.Array:
    """1 - Var(returns - values) / (Var(returns) + 1e-5) over the policy tokens, as verl's
    vf_explained_var."""
    return 1.0 - adv_lib.masked_var(returns - values, mask) / (adv_lib.masked_var(returns, mask) + 1e-5)


# A `Batch` with its scoring pass's outputs: what the step after scoring reads.
_ScoredBatch = collections.namedtuple("_ScoredBatch", (*Batch._fields, "logprobs", "values", "ref_logprobs"))


def _score_batch(config: PPOConfig, state: TrainState, batch: Batch):
    return _score(config, state, batch.tokens, batch.attention_mask, batch.temperature, batch.packing)


def _learn(config: PPOConfig, state: TrainState, batch: Batch) -> tuple[TrainState, dict]:
    """One RL step (the module docstring's pipeline), pure."""
    return _learn_scored(config, state, _ScoredBatch(*batch, *_score_batch(config, state, batch)))


def _learn_scored(config: PPOConfig, state: TrainState, scored: _ScoredBatch) -> tuple[TrainState, dict]:
    """The step after its scoring pass, pure: KL penalty, advantages, PPO epochs (the reference's log-probs
    are in `scored`: `state.ref` is not read)."""
    rl = config.rl
    batch = Batch(*scored[:len(Batch._fields)])
    logprobs, values, ref = scored.logprobs, scored.values, scored.ref_logprobs
    mask = batch.loss_mask.astype(jnp.float32)
    rewards, metrics, kl_state = batch.token_rewards, {}, state.kl
    if rl.kl_in_reward:
        rewards, kl = kl_lib.apply_kl_penalty(rewards, logprobs, ref, mask, state.kl.coef,
                                              rl.kl_reward_estimator, rl.kl_reward_clip)
        controller = kl_lib.make_kl_controller(rl.kl_controller, rl.kl_coef, rl.kl_target, rl.kl_horizon)
        kl_state = controller.update(state.kl, kl["kl"], batch.tokens.shape[0])
        metrics |= {"rollout/kl": kl["kl"], "rollout/kl_coef": kl["kl_coef"]}
    advantages, returns = adv_lib.compute_advantages(
        rl, adv_lib.AdvantageInputs(rewards, mask, values, batch.group_ids, batch.anchor_ids))
    if rl.whiten_advantages:
        advantages = adv_lib.masked_whiten(advantages, mask)
    critic = values is not None
    new_state, update_metrics = _ppo_update(config, state, PPOBatch(
        batch.tokens, batch.attention_mask, mask, logprobs, advantages, returns=returns if critic else None,
        old_values=values, ref_logprobs=ref, temperature=batch.temperature, packing=batch.packing),
        all_finite(rewards))
    state = new_state._replace(kl=_keep_if(update_metrics["train/nonfinite"] == 0, kl_state, state.kl))
    gap = jnp.where(mask > 0, jnp.abs(logprobs - batch.sampler_logprobs), 0.0)
    metrics |= update_metrics | {"rollout/logprob_gap_max": jnp.max(gap)}
    if critic:
        metrics["critic/vf_explained_var"] = explained_variance(returns, values, mask)
    return state, metrics


def learn(state: TrainState, batch: Batch, config: PPOConfig, mesh: Mesh) -> tuple[TrainState, dict]:
    """One RL step on a rollout batch as one jitted, sharded program: score -> KL penalty -> advantages ->
    PPO epochs. `state` is donated. Returns the new state and scalar metrics (device arrays): `ppo_update`'s,
    rollout/{logprob_gap_max, kl, kl_coef} and critic/vf_explained_var. Non-finite rewards (KL penalty
    included) skip the update and keep the KL controller's state; train/nonfinite is then 1.

    With the reference in host memory (`rl.offload_reference`), the scoring pass is a program of its own
    (it copies the reference to the devices) and the rest another, given the state without its reference:
    the PPO epochs then never hold it (verl, too, scores with the reference in a pass of its own)."""
    _check_rows(batch, config)
    if not config.spec.reference_on_host:
        return _run(_learn, state, batch, config, mesh, donate=True)
    scored = _ScoredBatch(*batch, *_run(_score_batch, state, batch, config, mesh, donate=False))
    new_state, metrics = _run(_learn_scored, state._replace(ref=None), scored, config, mesh, donate=True,
                              reference=False)
    return new_state._replace(ref=state.ref), metrics


def learn_programs(batch: Batch, config: PPOConfig, mesh: Mesh) -> dict[str, tuple[Callable, tuple]]:
    """`learn`'s jitted programs for batches shaped like `batch` (arrays or `jax.ShapeDtypeStruct`s), each
    with its abstract (state, batch) arguments, for ahead-of-time lowering (`searchrl.benchmarks.aot`) under
    `jax.set_mesh(mesh)`: {"learn": the step} or, with the reference in host memory, {"score": its scoring
    pass, "learn": the rest}."""
    _check_rows(batch, config)
    state = abstract_train_state(config.spec, mesh)
    if not config.spec.reference_on_host:
        program, batch = _program(_learn, batch, config, mesh, donate=True)[:2]
        return {"learn": (program, (state, batch))}
    score_program, batch, shardings = _program(_score_batch, batch, config, mesh, donate=False)
    per_token = jax.ShapeDtypeStruct(batch.tokens.shape, jnp.float32, sharding=shardings.tokens)
    scored = _ScoredBatch(*batch, per_token, per_token if config.spec.critic else None, per_token)
    program, scored = _program(_learn_scored, scored, config, mesh, donate=True, reference=False)[:2]
    return {"score": (score_program, (state, batch)), "learn": (program, (state._replace(ref=None), scored))}
