"""Supervised fine-tuning (the cold start before RL): masked next-token NLL on policy tokens only.

A training example is a list of (text, is_policy) segments — prompt, turns, observations — tokenised one segment
at a time, exactly as the rollout engine tokenises prompts and observations, so the token boundaries the policy
learns are the ones it will meet when it samples.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from tqdm import tqdm

from searchrl import distributed, models
from searchrl.shapes import padded_width
from searchrl.rl.config import OptimConfig, SFTConfig
from searchrl.rl.optim import apply_gradients, learning_rate, make_optimizer
from searchrl.rl.train_state import StateSpec, state_shardings

Segments = Sequence[tuple[str, bool]]
_ROWS = PartitionSpec(("data", "fsdp"))  # a minibatch's rows: data-parallel over the mesh


def encode(tokenizer: Any, examples: Sequence[Segments], max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded int32 tokens [N, max_len] and float32 loss masks (1 on policy tokens).

    An example longer than `max_len` is an error (silently cutting a trajectory would teach a truncated answer).
    """
    tokens = np.zeros((len(examples), max_len), np.int32)
    mask = np.zeros((len(examples), max_len), np.float32)
    for i, segments in enumerate(examples):
        ids, policy = [], []
        for text, is_policy in segments:
            piece = tokenizer.encode(text, add_special_tokens=False)
            ids += piece
            policy += [float(is_policy)] * len(piece)
        if len(ids) > max_len:
            raise ValueError(f"SFT example {i} has {len(ids)} tokens > max_len={max_len}.")
        tokens[i, :len(ids)], mask[i, :len(ids)] = ids, policy
    return tokens, mask


def nll(cfg: models.ModelConfig, params: dict, tokens: jax.Array, loss_mask: jax.Array,
        compute: models.Compute) -> jax.Array:
    """Mean negative log-likelihood of the policy tokens (`loss_mask` > 0) given their prefixes, under the
    model's own distribution (temperature 1), computed as `compute` says (activations' layout, attention),
    no layer recomputed and the logits of all positions at once."""
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    logprobs = models.token_logprobs(cfg, params, tokens, positions, _attention(tokens, loss_mask),
                                     temperature=1.0, compute=compute, remat=False, logits_chunk=0)
    return -jnp.sum(logprobs * loss_mask) / jnp.maximum(jnp.sum(loss_mask), 1.0)


def _attention(tokens: jax.Array, loss_mask: jax.Array) -> jax.Array:
    """Every slot up to a row's last policy token attends (prompt and observations included)."""
    last = jnp.max(jnp.where(loss_mask > 0, jnp.arange(tokens.shape[1]), -1), axis=1, keepdims=True)
    return jnp.arange(tokens.shape[1])[None, :] <= last


@functools.lru_cache(maxsize=None)
def _train_step(cfg: models.ModelConfig, optim: OptimConfig, mesh: Mesh, compute: models.Compute):
    """The jitted, sharded SFT step, its optimizer and the state's shardings (params and moments as in RL
    training, laid out by the training `compute.rules`)."""
    tx, schedule = make_optimizer(optim), learning_rate(optim)
    shardings = state_shardings(StateSpec(model=cfg, actor=optim, rules=compute.rules), mesh)
    rows = NamedSharding(mesh, _ROWS)
    replicated = NamedSharding(mesh, PartitionSpec())

    def step(params, opt_state, i, tokens, loss_mask):
        loss, grads = jax.value_and_grad(functools.partial(nll, cfg))(params, tokens, loss_mask, compute)
        params, opt_state, grad_norm = apply_gradients(tx, params, grads, opt_state, schedule(i))
        return params, opt_state, loss, grad_norm

    jitted = jax.jit(step, in_shardings=(shardings.policy, shardings.actor_opt, replicated, rows, rows),
                     out_shardings=(shardings.policy, shardings.actor_opt, replicated, replicated),
                     donate_argnums=(0, 1))
    return jitted, tx, shardings


def minibatches(config: SFTConfig, examples: int) -> Iterator[np.ndarray]:
    """Each step's example indices, -1 for a row that holds none: `config.steps` seeded random minibatches,
    or with `config.epochs`, shuffled passes (as a torch DataLoader with shuffle=True) that each hold every
    example once, the last minibatch of a pass filled up with empty rows so that every step has one shape."""
    rng = np.random.default_rng(config.seed)
    if config.epochs <= 0:
        for _ in range(config.steps):
            yield rng.choice(examples, config.batch_size, replace=False)
        return
    per_epoch = config.steps_per_epoch(examples)
    for i in range(config.num_steps(examples)):
        if i % per_epoch == 0:
            rows = np.full(per_epoch * config.batch_size, -1)
            rows[:examples] = rng.permutation(examples)
        yield rows[(i % per_epoch) * config.batch_size:][:config.batch_size]


def train(cfg: models.ModelConfig, params: dict, tokens: np.ndarray, loss_mask: np.ndarray,
          config: SFTConfig, mesh: Mesh, compute: models.Compute,
          on_epoch_end: Callable[[int, dict], None] | None = None) -> tuple[dict, list[float]]:
    """AdamW steps on `minibatches` (`config.steps` or `config.epochs`), sharded over `mesh` and computed as
    the training `compute` says (a `Placement`'s `train`: its layout and attention); returns the params
    and the loss per step. With epochs, `on_epoch_end(epoch, params)` runs after each whole epoch (from 1),
    before the next step reuses the params' buffers. Across processes, every process passes the
    same examples and feeds its own rows of each minibatch."""
    if len(tokens) < config.batch_size:
        raise ValueError(f"SFT needs at least batch_size={config.batch_size} examples, got {len(tokens)}.")
    rows_parallel = mesh.shape["data"] * mesh.shape["fsdp"]
    if config.batch_size % rows_parallel:
        raise ValueError(f"SFT batch_size={config.batch_size} must be a multiple of the mesh's data x fsdp size "
                         f"({rows_parallel}): config.sft.batch_size or config.mesh.")
    step, tx, shardings = _train_step(cfg, config.schedule(len(tokens)), mesh, compute)
    # Placed as the step returns them, so that the first step compiles the same program as the others.
    params = jax.device_put(jax.tree.map(lambda p: p.astype(jnp.float32), params), shardings.policy)
    opt_state = jax.device_put(tx.init(params), shardings.actor_opt)
    lengths = tokens.shape[1] - np.argmax(loss_mask[:, ::-1] > 0, axis=1)  # through each row's last policy token
    mine = distributed.local_rows(mesh, config.batch_size, _ROWS)  # the minibatch rows this process feeds
    per_epoch = config.steps_per_epoch(len(tokens))
    losses = []
    with jax.set_mesh(mesh):
        batches = minibatches(config, len(tokens))
        for i, rows in enumerate(tqdm(batches, total=config.num_steps(len(tokens)), desc="sft",
                                      disable=jax.process_index() != 0)):
            width = padded_width(int(lengths[rows[rows >= 0]].max()), tokens.shape[1], buckets=8)
            full = (rows[mine] >= 0)[:, None]  # an empty row: padding tokens and no loss
            batch = distributed.host_local_batch_to_global(
                mesh, (tokens[rows[mine], :width] * full, loss_mask[rows[mine], :width] * full), _ROWS)
            params, opt_state, loss, _ = step(params, opt_state, np.int32(i), *batch)
            losses.append(float(loss))
            if on_epoch_end is not None and config.epochs > 0 and (i + 1) % per_epoch == 0:
                on_epoch_end((i + 1) // per_epoch, params)
    return params, losses


def fine_tune(cfg: models.ModelConfig, params: dict, tokenizer: Any, examples: Sequence[Segments],
              config: SFTConfig, placement: models.Placement,
              on_epoch_end: Callable[[int, dict], None] | None = None) -> tuple[dict, list[float]]:
    """`train` on `examples` as `encode` tokenises them (`config.max_len` tokens each), on the placement's
    mesh in its training layout: the params and the loss per step."""
    tokens, loss_mask = encode(tokenizer, examples, config.max_len)
    return train(cfg, params, tokens, loss_mask, config, placement.mesh, placement.train, on_epoch_end)
