"""AdamW with global-norm clipping and a warmup (+ constant, cosine or linear) learning-rate schedule, from a
config.

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
    """Training iteration -> learning rate. "linear" is transformers' get_linear_schedule_with_warmup (trl's
    SFTTrainer default): lr * (decay_steps - i) / (decay_steps - warmup_steps) after warmup, with a floor."""
    if cfg.decay != "constant" and cfg.decay_steps <= cfg.warmup_steps:
        raise ValueError(f"{cfg.decay} decay needs decay_steps ({cfg.decay_steps}) > warmup_steps "
                         f"({cfg.warmup_steps}): set the optimizer's decay_steps.")
    if cfg.decay == "cosine":
        return optax.warmup_cosine_decay_schedule(0.0, cfg.lr, cfg.warmup_steps, cfg.decay_steps,
                                                  end_value=cfg.lr * cfg.min_lr_ratio)
    after = (optax.constant_schedule(cfg.lr) if cfg.decay == "constant" else
             optax.linear_schedule(cfg.lr, cfg.lr * cfg.min_lr_ratio, cfg.decay_steps - cfg.warmup_steps))
    if cfg.warmup_steps == 0:
        return after
    return optax.join_schedules([optax.linear_schedule(0.0, cfg.lr, cfg.warmup_steps), after],
                                [cfg.warmup_steps])


def make_optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
    """Clipping then AdamW at unit learning rate (see the module docstring)."""
    adamw = optax.adamw(1.0, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay,
                        mu_dtype=jnp.dtype(cfg.mu_dtype) if cfg.mu_dtype else None)
    if cfg.clip_grad_norm == 0:
        return adamw
    return optax.chain(optax.clip_by_global_norm(cfg.clip_grad_norm), adamw)


def apply_gradients(tx: optax.GradientTransformation, params, grads, opt_state, lr: jax.Array):
    """One optimizer step at rate `lr`: (new params, new opt state, pre-clipping gradient global norm)."""
    updates, opt_state = tx.update(grads, opt_state, params)
    params = jax.tree.map(lambda p, u: p + (lr * u).astype(p.dtype), params, updates)
    return params, opt_state, optax.global_norm(grads).astype(jnp.float32)
