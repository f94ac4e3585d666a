"""Top-k / top-p without a full-vocabulary sort: the same logits kept, bit for bit, as sorting the vocabulary,
and the vocabulary sorted only for rows whose nucleus the prefilter does not settle."""
from __future__ import annotations

import functools
import re

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest

from searchrl.rollout import sampling
from searchrl.rollout.config import SamplingParams

TOP_PS = (0.5, 0.9, 0.95, 0.999, 1.0)
TOP_KS = (0, 1, 5, 50)


def sorted_restrict(logits: jax.Array, top_k: int, top_p: float) -> jax.Array:
    """Top-k / top-p by sorting the whole vocabulary: the definition the prefilter must reproduce."""
    if top_k > 0:
        kth = jax.lax.top_k(logits, min(top_k, logits.shape[-1]))[0][..., -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    if top_p < 1.0:
        sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]
        probs = jax.nn.softmax(sorted_logits, axis=-1)
        mass_before = jnp.cumsum(probs, axis=-1) - probs
        cutoff = jnp.min(jnp.where(mass_before < top_p, sorted_logits, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits < cutoff, -jnp.inf, logits)
    return logits


def mixed_logits(key: jax.Array, vocab: int, rows: int = 16) -> jax.Array:
    """`rows` rows each of peaked, moderate and flat logits, and of tied ones (4 distinct values per row)."""
    k1, k2 = jax.random.split(key)
    scale = jnp.repeat(jnp.asarray([8.0, 1.5, 0.05]), rows)[:, None]
    spread = jnp.asarray([2.0, 0.3, 0.02])[jnp.arange(rows) % 3, None]
    ties = jax.random.randint(k2, (rows, vocab), 0, 4).astype(jnp.float32) * spread
    return jnp.concatenate([jax.random.normal(k1, (3 * rows, vocab)) * scale, ties])


def peaked_and_flat(vocab: int = 5000) -> tuple[jax.Array, jax.Array]:
    """Rows whose 0.9-nucleus fits in the prefilter, and a row whose nucleus is most of the vocabulary."""
    logits = jax.random.normal(jax.random.key(3), (5, vocab))
    return logits[:4] * 8.0, logits[4:] * 0.05


@pytest.mark.parametrize("vocab", (10, 17, 100, 5000))
def test_restrict_is_bit_identical_to_the_full_sort(vocab):
    logits = mixed_logits(jax.random.key(vocab), vocab)
    combos = [(top_k, top_p) for top_k in TOP_KS for top_p in TOP_PS]
    # One program per implementation holding every combination: compiled once, not once per combination.
    fast = jax.jit(lambda x: [sampling._restrict(x, k, p) for k, p in combos])(logits)
    full = jax.jit(lambda x: [sorted_restrict(x, k, p) for k, p in combos])(logits)
    for (top_k, top_p), got, want in zip(combos, fast, full):
        np.testing.assert_array_equal(got, want, err_msg=f"top_k={top_k} top_p={top_p}")
    assert np.isfinite(fast[combos.index((5, 0.9))]).sum(axis=-1).min() >= 1


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0, top_p=0.9),
                                    SamplingParams(temperature=0.7, top_k=50, top_p=0.95)])
def test_sample_draws_the_same_tokens_and_logprobs_as_the_full_sort(params, monkeypatch):
    logits = mixed_logits(jax.random.key(7), 3000)
    keys = jax.random.split(jax.random.key(8), logits.shape[0])
    tokens, logprobs = jax.jit(sampling.sample, static_argnums=2)(logits, keys, params)
    monkeypatch.setattr(sampling, "_restrict", sorted_restrict)
    want_tokens, want_logprobs = jax.jit(sampling.sample, static_argnums=2)(logits, keys, params)
    np.testing.assert_array_equal(tokens, want_tokens)
    np.testing.assert_array_equal(logprobs, want_logprobs)


def test_a_rows_restriction_does_not_depend_on_the_batch():
    peaked, flat = peaked_and_flat()
    restrict = jax.jit(functools.partial(sampling._restrict, top_k=0, top_p=0.9))
    batch = restrict(jnp.concatenate([peaked, flat]))  # the flat row sorts the batch
    np.testing.assert_array_equal(batch[:4], restrict(peaked))  # alone, the prefilter suffices
    np.testing.assert_array_equal(batch[4:], restrict(flat))
    assert np.isfinite(batch[4]).sum() > sampling.PREFILTER


def test_the_vocabulary_is_sorted_only_for_a_nucleus_the_prefilter_does_not_settle(monkeypatch):
    peaked, flat = peaked_and_flat()
    # Probabilities 1/2, 1/4, 1/8, 1/8: the third token's mass before it is top_p=0.75 itself, up to rounding.
    halving = jnp.full((1, 5000), -jnp.inf).at[0, :4].set(jnp.log(jnp.asarray([4.0, 2.0, 1.0, 1.0])))
    cases = ((peaked, 0.9), (flat, 0.9), (peaked, 0.9), (halving, 0.75))
    wanted = [sorted_restrict(logits, 0, top_p) for logits, top_p in cases]
    sorts, sort = [], jnp.sort

    def counted_sort(x, **kwargs):
        jax.debug.callback(lambda: sorts.append(1))
        return sort(x, **kwargs)

    monkeypatch.setattr(sampling.jnp, "sort", counted_sort)
    counts = []
    for (logits, top_p), want in zip(cases, wanted):
        np.testing.assert_array_equal(jax.jit(functools.partial(sampling._restrict, top_k=0, top_p=top_p))(logits),
                                      want)
        jax.effects_barrier()
        counts.append(len(sorts))
    assert counts == [0, 1, 1, 2]


def primitives(jaxpr: jax.extend.core.Jaxpr, in_cond: bool = False):
    """(primitive name, whether inside a `cond` branch) of every equation of `jaxpr` and its sub-jaxprs."""
    for eqn in jaxpr.eqns:
        yield eqn.primitive.name, in_cond
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                sub = sub.jaxpr if isinstance(sub, jax.extend.core.ClosedJaxpr) else sub
                if isinstance(sub, jax.extend.core.Jaxpr):
                    yield from primitives(sub, in_cond or eqn.primitive.name == "cond")


@pytest.mark.parametrize("vocab,sorts_in_cond", [(5000, True), (sampling.PREFILTER, False)])
def test_sample_sorts_the_vocabulary_only_inside_a_cond_branch(vocab, sorts_in_cond):
    params = SamplingParams(temperature=1.0, top_k=5, top_p=0.9)
    jaxpr = jax.make_jaxpr(functools.partial(sampling.sample, params=params))(
        jnp.zeros((2, vocab)), jax.random.split(jax.random.key(0), 2)).jaxpr
    sorts = [in_cond for name, in_cond in primitives(jaxpr) if name == "sort"]
    assert sorts == ([True] if sorts_in_cond else [])
    assert ("top_k", False) in set(primitives(jaxpr))


@pytest.mark.parametrize("top_k,top_p", [(5, 1.0), (0, 0.9), (50, 0.95)])
def test_the_compiled_program_sorts_only_in_the_fallback(top_k, top_p):
    """XLA keeps the top-k a TopK (not a sort of the row) and the fallback's sort inside its branch."""
    restrict = jax.jit(functools.partial(sampling._restrict, top_k=top_k, top_p=top_p))
    hlo = restrict.lower(jnp.zeros((4, 5000))).compile().as_text()
    entry = hlo[hlo.index("ENTRY"):]  # the entry computation comes last
    assert not re.search(r"= \S+ sort\(", entry)
    assert len(re.findall(r"= \S+ sort\(", hlo)) == (top_p < 1.0)
