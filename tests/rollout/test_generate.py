"""The jitted rollout steps: `extend` on a subset of rows, `move_rows` between batches, and the decode
chunk's two ways of reading the layer weights."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from searchrl import models
from searchrl.rollout import generate
from searchrl.rollout.config import SamplingParams

RULES, ATTENTION = models.SAMPLE_RULES, models.AttentionConfig()
SAMPLING = SamplingParams(temperature=1.0)


def tiny():
    cfg = dataclasses.replace(models.get_preset("tiny"), vocab_size=64, tie_word_embeddings=False)
    return cfg, models.init_params(cfg, jax.random.key(0))


def prefilled(cfg, params, rows: int, key: int = 3) -> generate.GenState:
    """`rows` rows holding prompts of different lengths, each with a turn started (a pending token)."""
    state = generate.init_state(cfg, rows, 48, jax.random.key(key))
    lengths = np.arange(rows, dtype=np.int32) % 5 + 3
    tokens = np.asarray(jax.random.randint(jax.random.key(key + 1), (rows, 8), 1, 64), np.int32)
    return generate.extend(cfg, params, state, None, tokens, lengths, np.ones(rows, bool), SAMPLING, RULES,
                           ATTENTION)


def host(state: generate.GenState) -> generate.GenState:
    """The state as numpy arrays (keys as their data)."""
    def one(x):
        return np.asarray(jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x)

    return jax.tree.map(one, state)


def rows_of(x: np.ndarray, rows) -> np.ndarray:
    """Rows `rows` of a state field (the cache's keys and values are [layers, rows, ...])."""
    return np.take(x, rows, 1 if x.ndim == 5 else 0)


def test_extend_on_some_rows_computes_those_rows_and_leaves_the_others():
    """Appending to rows 3 and 1 of 5 (the order given, one of them appending nothing and starting no turn)
    gives those rows what a whole-batch extend gives them; the other rows are untouched, bit for bit."""
    cfg, params = tiny()
    state = prefilled(cfg, params, 5)
    state = state._replace(active=jnp.zeros(5, bool), pending=jnp.zeros(5, bool))  # every turn ended
    chunk = np.asarray(jax.random.randint(jax.random.key(7), (5, 6), 1, 64), np.int32)
    lengths, start = np.asarray([0, 4, 0, 6, 0], np.int32), np.asarray([0, 1, 0, 0, 0], bool)
    whole = generate.extend(cfg, params, jax.tree.map(jnp.copy, state), None, chunk, lengths, start,
                            SAMPLING, RULES, ATTENTION)
    rows = np.asarray([3, 1], np.int32)
    some = generate.extend(cfg, params, jax.tree.map(jnp.copy, state), rows, chunk[rows], lengths[rows],
                           start[rows], SAMPLING, RULES, ATTENTION)
    for got, want, before in zip(*(jax.tree.leaves(host(s)) for s in (some, whole, state))):
        np.testing.assert_allclose(rows_of(got, rows), rows_of(want, rows), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(rows_of(got, [0, 2, 4]), rows_of(before, [0, 2, 4]))
    assert np.asarray(some.cache.length).tolist() == (np.asarray(state.cache.length) + lengths).tolist()
    assert np.asarray(some.active).tolist() == [False, True, False, False, False]


def test_move_rows_carries_an_episode_whole_and_keeps_each_rows_step_count():
    """A row moved into a parked batch and back into another row is the same row, bit for bit (cache,
    tokens, key), except `decoded`, which counts the decode row's steps and stays with each side."""
    cfg, params = tiny()
    state, parked = prefilled(cfg, params, 4), prefilled(cfg, params, 2, key=9)
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
        np.testing.assert_array_equal(rows_of(got, 0), rows_of(want, 2))


def test_a_decode_chunk_reading_layers_in_place_equals_one_that_unstacks_them():
    """Unstacking the layer weights once a chunk (`DecodeSpec.unstack_layers`, on CPUs) and slicing each
    layer's weights in place (GPUs and TPUs, `unstacks_layers`) decode the same tokens, greedy and sampled."""
    cfg, params = tiny()
    stops, eos = generate.stop_table([[63, 62]]), jnp.asarray([0], jnp.int32)
    for sampling in (SamplingParams(temperature=0.0), SAMPLING):
        spec = generate.DecodeSpec(6, 6, 47, sampling, rules=RULES, attention=ATTENTION, unstack_layers=True)
        in_place = dataclasses.replace(spec, unstack_layers=False)
        runs = [host(generate.decode_chunk(cfg, params, prefilled(cfg, params, 3), stops, eos, s))
                for s in (spec, in_place)]
        assert int(runs[0].decoded.sum()) > 0
        for got, want in zip(*(jax.tree.leaves(r) for r in runs)):
            if np.issubdtype(want.dtype, np.floating):
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
            else:
                np.testing.assert_array_equal(got, want)
    assert generate.unstacks_layers(jax.devices("cpu"))
    assert not generate.unstacks_layers([type("Gpu", (), {"platform": "gpu"})()])
