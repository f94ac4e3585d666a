"""AdamW with global-norm clipping and a warmup (+ constant or cosine) learning-rate schedule, from a config.

The schedule is a function of the training iteration (`TrainState.step`, one per `ppo_update`), not of the
optimizer's own step count, as verl steps its LR scheduler once per update: the papers' `lr_warmup_steps` are
in training iterations although each iteration takes one optimizer step per minibatch. The optax transform is
therefore AdamW at unit learning rate; `apply_gradients` multiplies its output by the iteration's rate.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from searchrl.rl.config import OptimConfig


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
