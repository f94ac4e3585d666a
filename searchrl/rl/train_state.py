"""The RL train state: policy, optional critic and frozen reference, optimizer states, RNG, KL coefficient.

`TrainState` is a plain pytree (checkpointed whole by `searchrl.checkpoint`). `StateSpec` is its static
description (hashable); from it come the state's shardings over a mesh, an abstract (shape + sharding) state
to restore a checkpoint onto, and the sharded initial state.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from searchrl import models
from searchrl.models.sharding import ShardingRules
from searchrl.rl.kl import KLState
from searchrl.rl.optim import OptimConfig, make_optimizer


class TrainState(NamedTuple):
    """Everything a training run carries from one PPO iteration to the next (a pytree)."""

    step: jax.Array  # int32 []: completed PPO updates, the learning-rate schedules' clock
    policy: dict  # float32 master params
    critic: dict | None  # value model params (None: no critic, e.g. GRPO)
    ref: dict | None  # frozen reference policy (None: no KL to a reference)
    actor_opt: optax.OptState
    critic_opt: optax.OptState | None
    rng: jax.Array  # uint32 raw key data (jax.random.key_data), so checkpoints hold plain arrays
    kl: KLState  # in-reward KL coefficient (see searchrl.rl.kl controllers)


@dataclasses.dataclass(frozen=True)
class StateSpec:
    """Which models a run trains or keeps, and how (hashable: a static argument of jitted functions)."""

    model: models.ModelConfig
    actor: OptimConfig
    critic: OptimConfig | None = None  # None: no value model
    reference: bool = False  # keep a frozen copy of the initial policy
    ref_dtype: str = "float32"  # the reference is only evaluated: store it in the compute dtype
    offload_reference: bool = False  # the reference in host memory (`RLConfig.offload_reference`)
    rules: ShardingRules = dataclasses.field(kw_only=True)  # the params' layout: `MeshConfig.train_rules`

    @property
    def reference_on_host(self) -> bool:
        """Whether the state holds a reference, in host memory."""
        return self.reference and self.offload_reference


def _init(spec: StateSpec, policy: dict, critic: dict | None, key_data: jax.Array, kl_coef: float
          ) -> TrainState:
    """The initial state (pure; jitted by `init_train_state`)."""
    key = jax.random.wrap_key_data(key_data)
    policy = jax.tree.map(lambda p: p.astype(jnp.float32), policy)
    if spec.critic is not None and critic is None:
        critic = models.value_params_from_policy(spec.model, policy, jax.random.fold_in(key, 0))
    critic = None if critic is None else jax.tree.map(lambda p: p.astype(jnp.float32), critic)
    ref = jax.tree.map(lambda p: p.astype(spec.ref_dtype), policy) if spec.reference else None
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        policy=policy,
        critic=critic,
        ref=ref,
        actor_opt=make_optimizer(spec.actor).init(policy),
        critic_opt=None if critic is None else make_optimizer(spec.critic).init(critic),
        rng=jax.random.key_data(jax.random.fold_in(key, 1)),
        kl=KLState(jnp.asarray(kl_coef, jnp.float32)),
    )


def _unsharded_abstract(spec: StateSpec) -> TrainState:
    policy = jax.eval_shape(lambda: models.init_params(spec.model, jax.random.key(0)))
    key_data = jax.ShapeDtypeStruct((2,), jnp.uint32)
    return jax.eval_shape(functools.partial(_init, spec, kl_coef=0.0), policy, None, key_data)


@functools.lru_cache(maxsize=None)
def state_shardings(spec: StateSpec, mesh: Mesh) -> TrainState:
    """NamedShardings of every state leaf: params per `param_shardings(rules)` (the reference's in pinned host
    memory with `offload_reference`), optimizer moments like their params, scalars and the RNG replicated."""
    abstract = _unsharded_abstract(spec)
    replicated = NamedSharding(mesh, PartitionSpec())
    policy = models.param_shardings(spec.model, mesh, spec.rules)
    critic = models.param_shardings(spec.model, mesh, spec.rules, value=True) if spec.critic else None

    def opt(cfg: OptimConfig | None, opt_state, params):
        if cfg is None:
            return None
        return optax.tree_map_params(make_optimizer(cfg), lambda _, s: s, opt_state, params,
                                     transform_non_params=lambda _: replicated)

    return TrainState(
        step=replicated,
        policy=policy,
        critic=critic,
        ref=_reference_shardings(spec, policy),
        actor_opt=opt(spec.actor, abstract.actor_opt, policy),
        critic_opt=opt(spec.critic, abstract.critic_opt, critic),
        rng=replicated,
        kl=KLState(replicated),
    )


def _reference_shardings(spec: StateSpec, policy: dict) -> dict | None:
    """The reference's shardings: the policy's, in pinned host memory with `spec.offload_reference`."""
    if not spec.reference_on_host:
        return policy if spec.reference else None
    return jax.tree.map(lambda s: s.with_memory_kind("pinned_host"), policy)


def abstract_train_state(spec: StateSpec, mesh: Mesh) -> TrainState:
    """ShapeDtypeStructs with shardings: the target to restore a checkpoint onto."""
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        _unsharded_abstract(spec), state_shardings(spec, mesh))


def init_train_state(spec: StateSpec, mesh: Mesh, policy: dict, key: jax.Array, *,
                     kl_coef: float, critic: dict | None = None) -> TrainState:
    """The sharded initial state from policy params (any dtype; kept as float32 master weights).

    Without `critic` params, a run with a critic starts its value model from the policy backbone
    (`models.value_params_from_policy`). The reference is a copy of `policy`. `key` is a typed PRNG key.
    Works unchanged across processes when `policy` (and `critic`) are global arrays.
    """
    if critic is not None and spec.critic is None:
        raise ValueError("init_train_state: critic params were given but the spec has no critic")
    init = _jitted_init(spec, mesh, critic is not None, float(kl_coef))
    return init(policy, critic, np.asarray(jax.random.key_data(key)))  # host data: the same on every process


@functools.lru_cache(maxsize=None)
def _jitted_init(spec: StateSpec, mesh: Mesh, given_critic: bool, kl_coef: float):
    shardings = state_shardings(spec, mesh)
    replicated = NamedSharding(mesh, PartitionSpec())
    return jax.jit(functools.partial(_init, spec, kl_coef=kl_coef),
                   in_shardings=(shardings.policy, shardings.critic if given_critic else None, replicated),
                   out_shardings=shardings)
