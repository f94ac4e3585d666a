"""The jitted rollout steps over the paged KV cache: `extend` on a subset of rows, `move_rows` between
batches, decode chunks whose rows sit out when the host holds them, and pages that neither their placement,
their number nor the rows' slots change."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from searchrl import models
from searchrl.rollout import generate
from searchrl.rollout.config import SamplingParams

RULES = models.SAMPLE_RULES
SAMPLE = models.Compute(RULES, models.AttentionConfig())  # a default run's sampling layout and attention
SAMPLING = SamplingParams(temperature=1.0)
PAGE = 4


def tiny():
    cfg = dataclasses.replace(models.get_preset("tiny"), vocab_size=64, tie_word_embeddings=False)
    return cfg, models.unstack_layers(models.init_params(cfg, jax.random.key(0)))


def paged(cfg, rows: int, slots: int = 48, key: int = 3, seed: int = 0, spare: int = 0
          ) -> tuple[models.KVPool, generate.GenState]:
    """An empty batch whose rows hold every page their slots need, scrambled over a pool with `spare` pages
    more than that."""
    width = -(-slots // PAGE)
    pages = np.random.default_rng(seed).permutation(rows * width + spare)[:rows * width].reshape(rows, width)
    state = generate.init_state(rows, slots, PAGE, jax.random.key(key))
    return (models.KVPool.init(cfg, rows * width + spare, PAGE),
            state._replace(pages=jnp.asarray(pages, jnp.int32)))


def prefilled(cfg, params, rows: int, key: int = 3, **kwargs) -> tuple[models.KVPool, generate.GenState]:
    """`rows` rows holding prompts of different lengths, each with a turn started (a pending token)."""
    pool, state = paged(cfg, rows, key=key, **kwargs)
    lengths = np.arange(rows, dtype=np.int32) % 5 + 3
    tokens = np.asarray(jax.random.randint(jax.random.key(key + 1), (rows, 8), 1, 64), np.int32)
    return generate.extend(cfg, params, pool, state, None, tokens, lengths, np.ones(rows, bool), SAMPLING,
                           SAMPLE)


def host(state: generate.GenState) -> generate.GenState:
    """The state as numpy arrays (keys as their data)."""
    def one(x):
        return np.asarray(jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x)

    return jax.tree.map(one, state)


def copied(tree):
    return jax.tree.map(jnp.copy, tree)


def test_extend_on_some_rows_computes_those_rows_and_leaves_the_others():
    """Appending to rows 3 and 1 of 5 (the order given, one of them appending nothing and starting no turn)
    gives those rows what a whole-batch extend gives them; the other rows and their pages are untouched, bit
    for bit."""
    cfg, params = tiny()
    pool, state = prefilled(cfg, params, 5)
    state = state._replace(active=jnp.zeros(5, bool), pending=jnp.zeros(5, bool))  # every turn ended
    chunk = np.asarray(jax.random.randint(jax.random.key(7), (5, 6), 1, 64), np.int32)
    lengths, start = np.asarray([0, 4, 0, 6, 0], np.int32), np.asarray([0, 1, 0, 0, 0], bool)
    whole_pool, whole = generate.extend(cfg, params, copied(pool), copied(state), None, chunk, lengths, start,
                                        SAMPLING, SAMPLE)
    rows = np.asarray([3, 1], np.int32)
    some_pool, some = generate.extend(cfg, params, copied(pool), copied(state), rows, chunk[rows],
                                      lengths[rows], start[rows], SAMPLING, SAMPLE)
    for got, want, before in zip(*(jax.tree.leaves(host(s)) for s in (some, whole, state))):
        np.testing.assert_allclose(got[rows], want[rows], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(got[[0, 2, 4]], before[[0, 2, 4]])
    others = np.asarray(state.pages)[[0, 2, 4]].ravel()
    for got, want, before in zip(*(jax.tree.leaves(p) for p in (some_pool, whole_pool, pool))):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(np.asarray(got)[:, others], np.asarray(before)[:, others])
    assert np.asarray(some.length).tolist() == (np.asarray(state.length) + lengths).tolist()
    assert np.asarray(some.active).tolist() == [False, True, False, False, False]


def test_move_rows_carries_an_episode_whole_and_keeps_each_rows_step_count():
    """A row moved into a parked batch and back into another row is the same row, bit for bit (page table,
    tokens, key), except `decoded`, which counts the decode row's steps and stays with each side."""
    cfg, params = tiny()
    _, state = prefilled(cfg, params, 4)
    _, parked = prefilled(cfg, params, 2, key=9)
    state = state._replace(decoded=jnp.arange(4, dtype=jnp.int32) + 10)
    parked = parked._replace(decoded=jnp.asarray([7, 8], jnp.int32))
    original = host(state)
    parked = generate.move_rows(state, parked, jnp.asarray([2]), jnp.asarray([1]), RULES)
    state = generate.move_rows(parked, state, jnp.asarray([1]), jnp.asarray([0]), RULES)
    assert np.asarray(parked.decoded).tolist() == [7, 8]
    assert np.asarray(state.decoded).tolist() == [10, 11, 12, 13]
    moved = host(state)
    for got, want in zip(jax.tree.leaves(moved._replace(decoded=None)),
                         jax.tree.leaves(original._replace(decoded=None))):
        np.testing.assert_array_equal(got[0], want[2])


def test_move_rows_moves_several_rows_at_once_and_leaves_out_targets_past_the_batch():
    """The engine moves a round's rows in one call of a fixed width, its unused pairs aimed past the target's
    rows: those change nothing."""
    cfg, params = tiny()
    _, state = prefilled(cfg, params, 4)
    _, parked = prefilled(cfg, params, 3, key=9)
    source, before = host(state), host(parked)
    parked = host(generate.move_rows(state, parked, jnp.asarray([3, 1, 0]), jnp.asarray([2, 0, 4]), RULES))
    for got, want, kept in zip(*(jax.tree.leaves(s._replace(decoded=None)) for s in (parked, source, before))):
        np.testing.assert_array_equal(got[[2, 0]], want[[3, 1]])
        np.testing.assert_array_equal(got[1], kept[1])
    assert np.asarray(parked.decoded).tolist() == np.asarray(before.decoded).tolist()


def _decoded(cfg, params, sampling: SamplingParams, **kwargs) -> generate.GenState:
    pool, state = prefilled(cfg, params, 3, **kwargs)
    spec = generate.DecodeSpec(6, 47, sampling, steps=6, compute=SAMPLE)
    stops, eos = (generate.stop_table([[63, 62]]),), jnp.asarray([0], jnp.int32)
    return host(generate.decode_chunk(cfg, params, pool, state, jnp.ones(3, bool), stops, eos, spec)[1])


def test_a_rows_tokens_depend_on_neither_its_pages_nor_the_pool():
    """Other physical pages, a larger pool and more reserved slots (a wider page table) decode the same
    tokens, bit for bit: a row reads its live pages only."""
    cfg, params = tiny()
    for sampling in (SamplingParams(temperature=0.0), SAMPLING):
        base = _decoded(cfg, params, sampling)
        assert int(base.decoded.sum()) > 0
        for other in (_decoded(cfg, params, sampling, seed=5, spare=40),
                      _decoded(cfg, params, sampling, slots=160, seed=6)):
            width = base.tokens.shape[1]
            for field in ("tokens", "sampled", "logprobs"):
                np.testing.assert_array_equal(getattr(other, field)[:, :width], getattr(base, field))
            for field in ("length", "active", "decoded", "turn_start"):
                np.testing.assert_array_equal(getattr(other, field), getattr(base, field))


def test_rows_held_out_of_a_chunk_are_untouched_and_go_on_as_if_never_held():
    """A row the host holds (no pages for it: `allowed` false) keeps its state and writes no page; allowed
    again, it samples what it would have sampled had it never been held."""
    cfg, params = tiny()
    spec = generate.DecodeSpec(12, 47, SAMPLING, steps=4, compute=SAMPLE)
    stops, eos = (generate.stop_table([[63, 62]]),), jnp.asarray([0], jnp.int32)

    def chunk(pool, state, allowed, steps=4):
        return generate.decode_chunk(cfg, params, pool, state, jnp.asarray(allowed), stops, eos,
                                     dataclasses.replace(spec, steps=steps))

    pool, state = prefilled(cfg, params, 3)
    _, free = chunk(copied(pool), copied(state), [True] * 3, steps=8)
    held_pool, held = chunk(copied(pool), copied(state), [True, False, True])
    row = np.asarray(state.pages)[1]
    for got, want in zip(jax.tree.leaves(host(held)), jax.tree.leaves(host(state))):
        np.testing.assert_array_equal(got[1], want[1])
    for got, want in zip(jax.tree.leaves(held_pool), jax.tree.leaves(pool)):
        np.testing.assert_array_equal(np.asarray(got)[:, row], np.asarray(want)[:, row])
    pool, state = chunk(*chunk(held_pool, held, [True] * 3), [False, True, False])
    got, want = host(state), host(free)
    for field in ("tokens", "sampled", "logprobs", "length", "active"):
        np.testing.assert_array_equal(getattr(got, field), getattr(want, field))


def test_a_fork_copies_the_partial_page_and_starts_where_its_episode_was():
    """`copy_pages` copies a page in every layer (a target past the pool is skipped); `reset_rows` starts a
    side branch at its fork slot with its episode's key folded with 1, and an episode at slot 0 with its
    own key, whatever row it lands in."""
    cfg, params = tiny()
    pool, state = prefilled(cfg, params, 3)
    width = state.pages.shape[1]
    source, target = int(state.pages[0, 1]), int(state.pages[2, width - 1])
    copied_pool = generate.copy_pages(copied(pool), jnp.asarray([source, 0]),
                                      jnp.asarray([target, pool.k[0].shape[1]]), 3, RULES)
    for got, want in zip(jax.tree.leaves(copied_pool), jax.tree.leaves(pool)):
        got, want = np.asarray(got), np.asarray(want)
        np.testing.assert_array_equal(got[:, target], want[:, source])
        others = np.arange(want.shape[1]) != target
        np.testing.assert_array_equal(got[:, others], want[:, others])
    key = jax.random.key(3)
    rows, branch = jnp.asarray([False, True, True]), jnp.asarray([False, True, False])
    reset = generate.reset_rows(copied(state), rows, key, jnp.asarray([0, 7, 7]), jnp.asarray([0, 5, 0]), branch,
                                RULES)
    assert np.asarray(reset.length).tolist() == [int(state.length[0]), 5, 0]
    assert np.asarray(reset.branch).tolist() == [False, True, False]
    episode = jax.random.fold_in(key, 7)
    assert jax.random.key_data(reset.key[2]).tolist() == jax.random.key_data(episode).tolist()
    assert jax.random.key_data(reset.key[1]).tolist() == jax.random.key_data(
        jax.random.fold_in(episode, 1)).tolist()
    assert not np.asarray(reset.active)[1:].any() and not np.asarray(reset.tokens)[1:].any()
