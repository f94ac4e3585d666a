"""The jitted side of a rollout: append tokens to the paged KV cache (`extend`, `prefill`) and decode in chunks.

A rollout's keys and values live in a `models.KVPool` (pages, on every device of the mesh; the host hands
them out: `searchrl.rollout.pages`), its rows' bookkeeping in a `GenState`: each row's page table, live length
and token buffers [B, S]. Row b holds its tokens in slots 0 .. length[b]-1 (prompt, then policy turns and
observations, no holes), slot s's keys in page `pages[b, s // page_size]`, so a token's RoPE position is its
slot and the trainer recomputes log-probabilities with one causal forward pass over `GenState.tokens`. Every
call takes the pool and the state and returns both (donated): the pool is updated in place, a step reads
only the pages of the rows it computes.

Invariant between calls: every token a row holds is in the cache, except that an *active* row also holds one
sampled token ("pending", at slot `length`) that the next decode step writes. A row stops one step after its
last token was sampled (the step that writes it), so a stopped row's cache is complete and `extend` simply
appends. The host gives a row the pages its writes need before each call; a row it could not give pages to is
held out of a decode chunk (`allowed`), never written past its pages.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from searchrl import models
from searchrl.rollout.config import SamplingParams
from searchrl.rollout.sampling import sample


class GenState(NamedTuple):
    """Every row's bookkeeping through a rollout (a pytree; donated to every call). The keys and values are
    in the `models.KVPool` beside it."""

    pages: jax.Array  # [B, n] int32: the row's page table (local page ids; `searchrl.rollout.pages`)
    length: jax.Array  # [B] int32: slots in the cache
    tokens: jax.Array  # [B, S] int32: every token at its cache slot (and the pending one)
    sampled: jax.Array  # [B, S] bool: sampled by the policy
    logprobs: jax.Array  # [B, S] fp32: sampler log-probability of policy tokens, 0 elsewhere
    pending: jax.Array  # [B] bool: the row holds a sampled token not yet in the cache
    active: jax.Array  # [B] bool: the row is generating its current turn
    turn_start: jax.Array  # [B] int32: slot of the current turn's first sampled token
    key: jax.Array  # [B] keys: a row's token at slot s is drawn with fold_in(key[b], s) (`_row_keys`)
    decoded: jax.Array  # [B] int32: tokens the row's decode steps wrote so far (the engine's utilisation)
    branch: jax.Array  # [B] bool: the row runs a side branch (`DecodeSpec.branch`), not an episode's turn

    def cache(self, pool: models.KVPool) -> models.KVCache:
        """The cache the decoder reads: `pool` and these rows' page tables and lengths."""
        return models.KVCache(pool.k, pool.v, self.pages, self.length)


@dataclasses.dataclass(frozen=True)
class TurnLimits:
    """How a row's turn is sampled and where it stops (besides its stop sequences and EOS)."""

    max_turn_tokens: int  # a turn stops after this many sampled tokens
    max_len: int  # a row stops when its trajectory reaches this many tokens
    sampling: SamplingParams = SamplingParams()


@dataclasses.dataclass(frozen=True)
class DecodeSpec(TurnLimits):
    """Static settings of a decode chunk: its steps, the episodes' turns (the inherited `TurnLimits`) and the
    side branches' (`branch`, for rows with `GenState.branch`; None: no row is one)."""

    steps: int = dataclasses.field(kw_only=True)  # decode steps per chunk (one lax.while_loop)
    branch: TurnLimits | None = dataclasses.field(default=None, kw_only=True)
    # the state's layout under a mesh (`state_logical_axes`) and the attention: a `Placement`'s `sample`
    compute: models.Compute = dataclasses.field(kw_only=True)


def stop_table(stop_sequences: Sequence[Sequence[int]]) -> jax.Array:
    """Right-aligns token-id stop sequences into an int32 [n, L] table, -1 where a shorter sequence has no token."""
    if not stop_sequences or any(len(s) == 0 for s in stop_sequences):
        raise ValueError(f"Stop sequences must be non-empty token-id lists, got {stop_sequences!r}.")
    width = max(len(s) for s in stop_sequences)
    table = np.full((len(stop_sequences), width), -1, np.int32)
    for i, seq in enumerate(stop_sequences):
        table[i, width - len(seq):] = seq
    return jnp.asarray(table)


def state_logical_axes() -> GenState:
    """The logical axes of each `GenState` field: rows over the mesh's data axes (`models.rows_sharding`)."""
    rows, slots = ("batch",), ("batch", "length")
    return GenState(pages=slots, length=rows, tokens=slots, sampled=slots, logprobs=slots, pending=rows,
                    active=rows, turn_start=rows, key=rows, decoded=rows, branch=rows)


def _placed(state: GenState, rules: models.ShardingRules) -> GenState:
    """`state` constrained to its layout under `rules` when a mesh is set (`jax.set_mesh`); else `state`."""
    return jax.tree.map(lambda axes, x: models.constrain(x, axes, rules), state_logical_axes(), state,
                        is_leaf=lambda axes: type(axes) is tuple)


def init_state(batch: int, slots: int, page_size: int, key: jax.Array, first_row: jax.Array | int = 0
               ) -> GenState:
    """An empty batch of `slots` token slots per row (page tables of ceil(slots / page_size) entries); these
    are rows `first_row` .. of a global batch.

    Row b samples with `fold_in(key, first_row + b)` and draws each token from that key folded with the
    token's slot: a row's samples depend on the rollout key, its global row index and its own history only. A
    batch split over processes (or side branches, or a different chunking of decode steps, or other pages)
    samples the same tokens.
    """
    return GenState(
        pages=jnp.zeros((batch, -(-slots // page_size)), jnp.int32),
        length=jnp.zeros((batch,), jnp.int32),
        tokens=jnp.zeros((batch, slots), jnp.int32),
        sampled=jnp.zeros((batch, slots), bool),
        logprobs=jnp.zeros((batch, slots), jnp.float32),
        pending=jnp.zeros((batch,), bool),
        active=jnp.zeros((batch,), bool),
        turn_start=jnp.zeros((batch,), jnp.int32),
        key=_episode_keys(key, first_row + jnp.arange(batch)),
        decoded=jnp.zeros((batch,), jnp.int32),
        branch=jnp.zeros((batch,), bool),
    )


def owned_pages(batch: int, slots: int, page_size: int) -> tuple[int, np.ndarray]:
    """(pool pages, page tables [batch, ceil(slots / page_size)]) of a batch whose rows each hold the pages
    of their first `slots` slots, in order: a batch run without the host's `PagePool` (benchmarks, compiles)."""
    width = -(-slots // page_size)
    return batch * width, np.arange(batch * width, dtype=np.int32).reshape(batch, width)


def _episode_keys(key: jax.Array, episodes: jax.Array) -> jax.Array:
    """The sampling key of each episode [B] of a rollout with key `key`: its draws depend on it alone."""
    return jax.vmap(jax.random.fold_in, (None, 0))(key, episodes)


@functools.partial(jax.jit, static_argnames=("batch", "slots", "page_size", "rules"))
def new_state(batch: int, slots: int, page_size: int, key: jax.Array, first_row: jax.Array,
              rules: models.ShardingRules) -> GenState:
    """`init_state` created on device, in its layout under a mesh (`state_logical_axes`)."""
    return _placed(init_state(batch, slots, page_size, key, first_row), rules)


def _row_keys(state: GenState, slot: jax.Array) -> jax.Array:
    """Each row's key for the token it samples into `slot` [B] (see `init_state`)."""
    return jax.vmap(jax.random.fold_in)(state.key, slot)


def _record_samples(state: GenState, rows: jax.Array, tokens: jax.Array, logprobs: jax.Array) -> GenState:
    """Puts freshly sampled tokens of `rows` into the buffers at their pending slot."""
    slot = state.length
    return state._replace(
        tokens=models.write_rows(state.tokens, tokens[:, None], slot, rows[:, None]),
        sampled=models.write_rows(state.sampled, jnp.ones_like(rows)[:, None], slot, rows[:, None]),
        logprobs=models.write_rows(state.logprobs, logprobs[:, None], slot, rows[:, None]),
        pending=state.pending | rows,
    )


@functools.partial(jax.jit, static_argnames=("cfg", "sampling", "compute"), donate_argnums=(2, 3))
def extend(
    cfg: models.ModelConfig,
    params,
    pool: models.KVPool,
    state: GenState,
    rows: jax.Array | None,
    chunk: jax.Array,
    chunk_len: jax.Array,
    start_turn: jax.Array,
    sampling: SamplingParams,
    compute: models.Compute,
    joins: jax.Array | None = None,
) -> tuple[models.KVPool, GenState]:
    """Appends `chunk[k, :chunk_len[k]]` (right-padded [K, T]) to row `rows[k]` (distinct indices; None: every
    row, K = B), then starts a policy turn on the rows where `start_turn` [K] is true. `params` are the
    unrolled ones (`models.unstack_layers`); the rows hold the pages their new tokens go to.

    With `rows`, only those K rows are computed: appending one row's observation costs one row's forward,
    not the batch's. Under a mesh, `rows` are local indices, K / d of them for each of the d blocks of rows
    (`_take_rows`): a row is computed on its own device, beside its pages. Rows must not hold a pending
    token, unless their `chunk_len` is 0 (they are left as they were). Starting a turn samples its first
    token from the logits at the row's last appended token.

    `joins` [B] (-1: none) starts rows that computed nothing on another's prompt (a GRPO group's responses,
    prefilled once): row b takes the tokens of the k-th computed row (k = `joins[b]`, local under a mesh,
    on the same device), whose pages it shares (`PagePool.fork`), and samples its first token, with its own
    key, from that row's logits: the very logits it would compute itself.
    """
    rules = compute.rules
    if rows is None:
        pool, state, logits = _extend(cfg, params, pool, state, chunk, chunk_len, start_turn, sampling,
                                      compute)
    else:
        pool, part, logits = _extend(cfg, params, pool, _take_rows(state, rows, rules), chunk, chunk_len,
                                     start_turn, sampling, compute)
        state = _put_rows(state, rows, part, rules)
    if joins is not None:
        state = _by_device(functools.partial(_start_joined, sampling=sampling), rules, state.tokens.shape[0])(
            state, joins, rows, logits)
    return pool, _placed(state, rules)


def _start_joined(state: GenState, joins: jax.Array, computed: jax.Array | None, logits: jax.Array,
                  sampling: SamplingParams) -> GenState:
    """`extend`'s `joins`: rows b with `joins[b]` = k >= 0 become copies of the k-th computed row (row
    `computed[k]`; row k if every row was) in tokens and length, and start their turn from `logits[k]`,
    drawn with their own keys. Nothing runs without joins."""
    def start(state: GenState) -> GenState:
        joined, k = joins >= 0, jnp.maximum(joins, 0)
        source = k if computed is None else computed[k]

        def copy(x: jax.Array) -> jax.Array:
            return jnp.where(joined.reshape((-1,) + (1,) * (x.ndim - 1)), x[source], x)

        length = copy(state.length)
        turn = state._replace(length=length, tokens=copy(state.tokens), sampled=copy(state.sampled),
                              logprobs=copy(state.logprobs))
        tokens, logprobs = sample(logits[k], _row_keys(turn, length), sampling)
        turn = _record_samples(turn._replace(pending=state.pending & ~joined), joined, tokens, logprobs)
        return turn._replace(active=state.active | joined, turn_start=jnp.where(joined, length, state.turn_start))

    return jax.lax.cond(jnp.any(joins >= 0), start, lambda state: state, state)


def _extend(cfg: models.ModelConfig, params, pool: models.KVPool, state: GenState, chunk: jax.Array,
            chunk_len: jax.Array, start_turn: jax.Array, sampling: SamplingParams, compute: models.Compute
            ) -> tuple[models.KVPool, GenState, jax.Array]:
    """`extend` on every row of `state`; also the logits [K, V] its rows' first tokens were drawn from."""
    start = state.length
    real = jnp.arange(chunk.shape[1])[None, :] < chunk_len[:, None]
    positions = start[:, None] + jnp.arange(chunk.shape[1])[None, :]
    hidden, cache = models.backbone(cfg, params, chunk, positions, real, state.cache(pool), compute=compute,
                                    remat=False, unrolled=True)
    state = state._replace(
        length=cache.length,
        tokens=models.write_rows(state.tokens, chunk, start, real),
        sampled=models.write_rows(state.sampled, jnp.zeros_like(real), start, real),
        logprobs=models.write_rows(state.logprobs, jnp.zeros(chunk.shape, jnp.float32), start, real),
    )
    last = jnp.take_along_axis(hidden, jnp.maximum(chunk_len - 1, 0)[:, None, None], axis=1)[:, 0]
    logits = models.lm_logits(cfg, params, last)
    tokens, logprobs = sample(logits, _row_keys(state, cache.length), sampling)
    state = _record_samples(state, start_turn, tokens, logprobs)
    return models.KVPool(cache.k, cache.v), state._replace(
        active=state.active | start_turn, turn_start=jnp.where(start_turn, cache.length, state.turn_start)), logits


def _row_index(axes: tuple[str, ...], rows: jax.Array) -> tuple:
    """The index selecting `rows` of a `GenState` field with logical `axes` (its "batch" axis)."""
    return (slice(None),) * axes.index("batch") + (rows,)


def _by_device(fn, rules: models.ShardingRules, batch: int):
    """`fn(state, rows, *more)` (rows: local row indices) run on each device's block of rows under a mesh
    (`shard_map`: a row never leaves its device), as is without one."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return fn
    spec = jax.sharding.PartitionSpec(models.row_axes(dict(mesh.shape), rules, batch))
    return jax.shard_map(fn, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)


def _take_rows(state: GenState, rows: jax.Array, rules: models.ShardingRules) -> GenState:
    """The state of `rows` [K] alone: a batch of K rows (under a mesh, each device's share of `rows` are
    indices into its own rows)."""
    def take(state, rows):
        return jax.tree.map(lambda axes, x: x[_row_index(axes, rows)], state_logical_axes(), state,
                            is_leaf=lambda axes: type(axes) is tuple)

    return _by_device(take, rules, state.tokens.shape[0])(state, rows)


def _put_rows(state: GenState, rows: jax.Array, part: GenState, rules: models.ShardingRules) -> GenState:
    """`state` with `rows` [K] (distinct; local under a mesh, as `_take_rows`) replaced by the K rows of
    `part`."""
    def put(state, rows, part):
        return jax.tree.map(lambda axes, x, y: x.at[_row_index(axes, rows)].set(y, unique_indices=True),
                            state_logical_axes(), state, part, is_leaf=lambda axes: type(axes) is tuple)

    return _by_device(put, rules, state.tokens.shape[0])(state, rows, part)


def _stopped(state: GenState, stops: jax.Array, eos_ids: jax.Array, written: jax.Array) -> jax.Array:
    """Whether each row's tokens, ending at slot `written`, end with a stop sequence or EOS inside the current turn."""
    width = stops.shape[1]
    offsets = jnp.arange(width) - (width - 1)
    slots = written[:, None] + offsets[None, :]  # [B, W], the last W slots up to `written`
    window = jnp.take_along_axis(state.tokens, jnp.maximum(slots, 0), axis=1)
    in_turn = slots >= state.turn_start[:, None]
    match = (stops[None] == -1) | ((stops[None] == window[:, None]) & in_turn[:, None])  # [B, n, W]
    last_token = jnp.take_along_axis(state.tokens, written[:, None], axis=1)[:, 0]
    return jnp.any(jnp.all(match, axis=-1), axis=-1) | jnp.isin(last_token, eos_ids)


@functools.partial(jax.jit, static_argnames=("cfg", "spec"), donate_argnums=(2, 3))
def decode_chunk(
    cfg: models.ModelConfig,
    params,
    pool: models.KVPool,
    state: GenState,
    allowed: jax.Array,
    stops: tuple[jax.Array, ...],
    eos_ids: jax.Array,
    spec: DecodeSpec,
) -> tuple[models.KVPool, GenState]:
    """Runs at most `spec.steps` decode steps in one `lax.while_loop`, exiting early once no row may go on.

    Each step writes the pending token of every active row that is `allowed` [B] (the host gave it pages for
    the chunk) into the cache, ends the row's turn if that token completes a stop sequence (`stops`: the
    episodes' table, then the side branches' with `spec.branch`) or EOS or exhausts a budget, and otherwise
    samples the next pending token; a side-branch row (`GenState.branch`) by the branch's limits and
    sampling. `params` are the unrolled ones (`models.unstack_layers`): each layer's weights and pages are
    read in place.
    """
    kinds = (spec,) if spec.branch is None else (spec, spec.branch)

    def by_kind(state: GenState, values: list[jax.Array]) -> jax.Array:
        return values[0] if len(values) == 1 else jnp.where(state.branch, values[1], values[0])

    def step(carry):
        i, pool, state = carry
        rows = state.active & allowed
        written = state.length
        token = jnp.take_along_axis(state.tokens, written[:, None], axis=1)
        hidden, cache = models.backbone(cfg, params, token, written[:, None], rows[:, None], state.cache(pool),
                                        compute=spec.compute, remat=False, unrolled=True)
        state = state._replace(length=cache.length, pending=state.pending & ~rows,
                               decoded=state.decoded + rows.astype(jnp.int32))
        turn_tokens = cache.length - state.turn_start
        done = by_kind(state, [_stopped(state, table, eos_ids, written) | (turn_tokens >= kind.max_turn_tokens)
                               | (cache.length >= kind.max_len) for kind, table in zip(kinds, stops)])
        go_on = rows & ~done
        logits, keys = models.lm_logits(cfg, params, hidden[:, 0]), _row_keys(state, cache.length)
        drawn = [sample(logits, keys, kind.sampling) for kind in kinds]
        tokens, logprobs = (by_kind(state, [d[j] for d in drawn]) for j in (0, 1))
        state = _record_samples(state, go_on, tokens, logprobs)
        return i + 1, models.KVPool(cache.k, cache.v), state._replace(active=go_on | (state.active & ~rows))

    def cond(carry):
        i, _, state = carry
        return (i < spec.steps) & jnp.any(state.active & allowed)

    _, pool, state = jax.lax.while_loop(cond, step, (jnp.int32(0), pool, state))
    return pool, _placed(state, spec.compute.rules)


@functools.partial(jax.jit, donate_argnums=(0,))
def truncate(state: GenState, length: jax.Array) -> GenState:
    """Drops every token of row b from slot `length[b]` on (e.g. text found a stop earlier than token ids did).

    Only stopped rows may be truncated. Later writes overwrite the dropped slots (the host may take back the
    pages past the new length).
    """
    keep = jnp.arange(state.tokens.shape[1])[None, :] < length[:, None]
    return state._replace(length=jnp.minimum(state.length, length), sampled=state.sampled & keep,
                          logprobs=jnp.where(keep, state.logprobs, 0.0))


@functools.partial(jax.jit, static_argnames=("rules",), donate_argnums=(0,))
def reset_rows(state: GenState, rows: jax.Array, key: jax.Array, episodes: jax.Array, start: jax.Array,
               branch: jax.Array, rules: models.ShardingRules) -> GenState:
    """Empties `rows` [B] bool for new episodes, or for side branches (`branch` [B] bool) forked from their
    episode at slot `start` [B] (its pages hold the slots before; 0 for an episode): length `start`,
    buffers cleared, and the key of episode `episodes[b]` of the rollout with key `key` (as `init_state`
    gives row `first_row + b`; folded with 1 for a branch, whose draws are then independent of the
    episode's), so an episode or a branch samples the same tokens whichever row (and pages) it runs in. The
    other rows keep their state."""
    def clear(x):
        return jnp.where(rows.reshape(rows.shape + (1,) * (x.ndim - 1)), jnp.zeros((), x.dtype), x)

    keys = _episode_keys(key, episodes)
    keys = jnp.where(branch, jax.vmap(jax.random.fold_in, (0, None))(keys, 1), keys)
    return _placed(state._replace(
        length=jnp.where(rows, start, state.length), tokens=clear(state.tokens), sampled=clear(state.sampled),
        logprobs=clear(state.logprobs), pending=state.pending & ~rows, active=state.active & ~rows,
        turn_start=clear(state.turn_start), key=jnp.where(rows, keys, state.key),
        branch=jnp.where(rows, branch, state.branch),
    ), rules)


@functools.partial(jax.jit, static_argnames=("rules",), donate_argnums=(0,))
def set_pages(state: GenState, pages: jax.Array, rules: models.ShardingRules) -> GenState:
    """`state` with the page tables the host assigned (`searchrl.rollout.pages`)."""
    return _placed(state._replace(pages=pages), rules)


@functools.partial(jax.jit, static_argnames=("batch", "rules"), donate_argnums=(0,))
def copy_pages(pool: models.KVPool, source: jax.Array, target: jax.Array, batch: int,
               rules: models.ShardingRules) -> models.KVPool:
    """`pool` (beside a `batch`-row state) with page `target[i]` of every layer a copy of page `source[i]`:
    the copy-on-write of a fork's partial last page. Under a mesh the pairs are local ids, an equal share for
    each block of rows, copied on its own device; a target past the pool is skipped."""
    def copy(pool, source, target):
        return jax.tree.map(lambda x: x.at[:, target].set(x[:, source], mode="drop"), pool)

    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return copy(pool, source, target)
    shape = dict(mesh.shape)
    spec = models.pool_spec(shape, rules, batch, pool.k[0].shape[0])
    pairs = jax.sharding.PartitionSpec(models.row_axes(shape, rules, batch))
    return jax.shard_map(copy, mesh=mesh, in_specs=(spec, pairs, pairs), out_specs=spec,
                         check_vma=False)(pool, source, target)


@functools.partial(jax.jit, static_argnames=("rules",), donate_argnums=(1,))
def move_rows(source: GenState, target: GenState, source_rows: jax.Array, target_rows: jax.Array,
              rules: models.ShardingRules) -> GenState:
    """`target` with its rows `target_rows` [K] (distinct; those past its rows left out) replaced by rows
    `source_rows` of `source`: episodes moved, page tables, buffers and keys with them (their pages stay where
    they are), between the decode batch and the parked rows. `decoded` counts a decode row's steps, not an
    episode's, so each side keeps its own."""
    moved = jax.tree.map(lambda axes, x, y: x.at[_row_index(axes, target_rows)].set(
        y[_row_index(axes, source_rows)], unique_indices=True, mode="drop"), state_logical_axes(), target, source,
        is_leaf=lambda axes: type(axes) is tuple)
    return _placed(moved._replace(decoded=target.decoded), rules)


@jax.jit
def progress(state: GenState) -> tuple[jax.Array, jax.Array]:
    """Copies of (active, decoded): read on the host while later calls take the state (donated)."""
    return jnp.copy(state.active), jnp.copy(state.decoded)


@jax.jit
def rows_of(state: GenState, rows: jax.Array) -> tuple[jax.Array, ...]:
    """What the host reads of `rows` [K] (global indices, repeats allowed): their tokens, sampled flags,
    log-probabilities, turn starts and lengths. The rows a chunk stopped, so the host never copies the
    others."""
    return tuple(x[rows] for x in (state.tokens, state.sampled, state.logprobs, state.turn_start, state.length))


@jax.jit
def copied(state: GenState) -> GenState:
    """A copy of `state` (the original stays donatable): where side branches run aside."""
    return jax.tree.map(jnp.copy, state)


def compiled_programs() -> int:
    """How many programs the rollout's jitted functions have compiled so far in this process."""
    functions = (extend, decode_chunk, truncate, reset_rows, set_pages, copy_pages, progress, move_rows, copied,
                 rows_of)
    return sum(f._cache_size() for f in functions)
