"""AdamW with global-norm clipping and a warmup (+ constant or cosine) learning-rate schedule, from a config.

The schedule is a function of the training iteration (`TrainState.step`, one per `ppo_update`), not of the
optimizer's own step count, as verl steps its LR scheduler once per update: the papers' `lr_warmup_steps` are
in training iterations although each iteration takes one optimizer step per minibatch. The optax transform is
therefore AdamW at unit learning rate; `apply_gradients` multiplies its output by the iteration's rate.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import optax

DECAYS = ("constant", "cosine")


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """One model's optimizer (hashable: part of the compiled update)."""

    lr: float  # peak learning rate (the papers: actor 1e-6, critic 1e-5)
    warmup_steps: int = 0  # linear warmup from 0 over this many training iterations
    decay: str = "constant"  # after warmup: "constant", or "cosine" down to min_lr_ratio * lr at decay_steps
    decay_steps: int = 0  # cosine only: iteration at which the rate reaches its floor (warmup included)
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.01  # decoupled (AdamW), on every parameter as torch.optim.AdamW in verl
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    clip_grad_norm: float = 1.0  # global-norm clipping threshold; 0 disables

    def __post_init__(self):
        if self.decay not in DECAYS:
            raise ValueError(f"optimizer decay {self.decay!r} is not one of {DECAYS}")
        if self.lr < 0 or self.warmup_steps < 0 or self.clip_grad_norm < 0:
            raise ValueError(f"optimizer lr, warmup_steps and clip_grad_norm must be >= 0: {self}")
        if self.decay == "cosine" and self.decay_steps <= self.warmup_steps:
            raise ValueError(f"cosine decay needs decay_steps ({self.decay_steps}) > warmup_steps "
                             f"({self.warmup_steps})")

    @classmethod
    def from_config(cls, group: ml_collections.ConfigDict, where: str) -> OptimConfig:
        """From a ConfigDict group (e.g. `config.rl.actor`); `where` names it in errors."""
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(group.keys()) - fields)
        if unknown:
            raise ValueError(f"{where}: unknown optimizer fields {unknown}; known: {sorted(fields)}")
        try:
            return cls(**group.to_dict())
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from None


def default_config(lr: float) -> ml_collections.ConfigDict:
    """A ConfigDict group with every `OptimConfig` field (defaults, peak rate `lr`)."""
    return ml_collections.ConfigDict(dataclasses.asdict(OptimConfig(lr=lr)))


def learning_rate(cfg: OptimConfig) -> optax.Schedule:
    """Training iteration -> learning rate."""
    if cfg.decay == "cosine":
        return optax.warmup_cosine_decay_schedule(0.0, cfg.lr, cfg.warmup_steps, cfg.decay_steps,
                                                  end_value=cfg.lr * cfg.min_lr_ratio)
    if cfg.warmup_steps == 0:
        return optax.constant_schedule(cfg.lr)
    return optax.join_schedules([optax.linear_schedule(0.0, cfg.lr, cfg.warmup_steps),
                                 optax.constant_schedule(cfg.lr)], [cfg.warmup_steps])


def make_optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
    """Clipping then AdamW at unit learning rate (see the module docstring)."""
    adamw = optax.adamw(1.0, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay)
    if cfg.clip_grad_norm == 0:
        return adamw
    return optax.chain(optax.clip_by_global_norm(cfg.clip_grad_norm), adamw)


def apply_gradients(tx: optax.GradientTransformation, params, grads, opt_state, lr: jax.Array):
    """One optimizer step at rate `lr`: (new params, new opt state, pre-clipping gradient global norm)."""
    updates, opt_state = tx.update(grads, opt_state, params)
    params = jax.tree.map(lambda p, u: p + (lr * u).astype(p.dtype), params, updates)
    return params, opt_state, optax.global_norm(grads).astype(jnp.float32)
