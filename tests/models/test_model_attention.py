"""The attention kernels against textbook softmax attention differentiated by JAX: values and gradients,
masks (padding, fully masked queries), causal blocks of uneven size, bf16."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from searchrl.models.attention import attention, causal_attention, query_block

B, KV, G, HD = 2, 2, 3, 16


def _inputs(T: int, seed: int = 0, dtype=jnp.float32):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, KV, G, T, HD), np.float32)
    k, v = (rng.standard_normal((B, KV, T, HD), np.float32) for _ in range(2))
    cotangent = rng.standard_normal((B, KV, G, T, HD), np.float32)
    return tuple(jnp.asarray(x, dtype) for x in (q, k, v, cotangent))


def _causal_mask(T: int, real: tuple[tuple[int, int], ...]) -> jnp.ndarray:
    """[B, T, T]: key s <= query t, and row b's keys real[b][0] .. real[b][1] - 1 are not padding."""
    idx = np.arange(T)
    keep = (idx[None, :] >= np.array([r[0] for r in real])[:, None]) & (
        idx[None, :] < np.array([r[1] for r in real])[:, None])
    return jnp.asarray((idx[None, :] <= idx[:, None])[None] & keep[:, None, :])


def _textbook(q, k, v, attend):
    """softmax(QK^T / sqrt(d) masked) V per query head, the keys of its kv head repeated G times."""
    f32 = jnp.float32
    keys, values = (jnp.repeat(x.astype(f32)[:, :, None], G, axis=2) for x in (k, v))
    scores = jnp.einsum("bkgtd,bkgsd->bkgts", q.astype(f32), keys) / math.sqrt(HD)
    scores = jnp.where(attend[:, None, None], scores, -1e30)
    return jnp.einsum("bkgts,bkgsd->bkgtd", jax.nn.softmax(scores, axis=-1), values)


def _value_and_grads(fn, q, k, v, attend, cotangent):
    out, vjp = jax.vjp(lambda q, k, v: fn(q, k, v, attend), q, k, v)
    return (out, *vjp(cotangent.astype(out.dtype)))


@pytest.mark.parametrize("fn", [attention, causal_attention], ids=["attention", "causal_attention"])
@pytest.mark.parametrize("T", [5, 70])
def test_values_and_gradients_match_textbook_attention(fn, T):
    q, k, v, cotangent = _inputs(T)
    attend = _causal_mask(T, real=((0, T), (0, T - 3)))  # right padding
    got = _value_and_grads(jax.jit(fn), q, k, v, attend, cotangent)
    want = _value_and_grads(_textbook, q, k, v, attend, cotangent)
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5, err_msg=name)


def test_blocks_are_uneven_and_cover_every_query():
    assert [query_block(T) for T in (5, 32, 70, 512, 1000, 4096)] == [32, 32, 32, 32, 63, 256]
    T = 70  # blocks of 32, 32 and 6 queries
    q, k, v, cotangent = _inputs(T, seed=1)
    attend = _causal_mask(T, real=((0, T), (0, 40)))
    blocked = _value_and_grads(jax.jit(causal_attention), q, k, v, attend, cotangent)
    whole = _value_and_grads(jax.jit(attention), q, k, v, attend, cotangent)
    for name, g, w in zip(("out", "dq", "dk", "dv"), blocked, whole):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("T", [6, 70])
def test_fully_masked_queries_stay_finite_and_leave_the_gradients_exact(T):
    """Queries that may attend no key (left padding) have unspecified but finite outputs; with no
    cotangent on them, as when a loss masks them out, every gradient is the textbook one."""
    q, k, v, cotangent = _inputs(T, seed=2)
    attend = _causal_mask(T, real=((0, T), (4, T)))  # row 1: queries 0-3 see no key at all
    cotangent = cotangent.at[1, :, :, :4].set(0.0)
    got = _value_and_grads(jax.jit(causal_attention), q, k, v, attend, cotangent)
    want = _value_and_grads(_textbook, q, k, v, attend, cotangent)
    assert all(np.isfinite(np.asarray(x)).all() for x in got)
    np.testing.assert_allclose(np.asarray(got[0][:, :, :, 4:]), np.asarray(want[0][:, :, :, 4:]), rtol=1e-5,
                               atol=1e-5)
    for name, g, w in zip(("dq", "dk", "dv"), got[1:], want[1:]):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5, err_msg=name)


def test_bfloat16_keeps_dtypes_and_tracks_float32():
    T = 40
    q, k, v, cotangent = _inputs(T, seed=3, dtype=jnp.bfloat16)
    attend = _causal_mask(T, real=((0, T), (0, T - 5)))
    got = _value_and_grads(jax.jit(causal_attention), q, k, v, attend, cotangent)
    want = _value_and_grads(_textbook, q, k, v, attend, cotangent)
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        assert g.dtype == jnp.bfloat16, name
        scale = float(jnp.max(jnp.abs(w)))
        assert float(jnp.max(jnp.abs(g.astype(jnp.float32) - w))) < 2e-2 * scale, name
