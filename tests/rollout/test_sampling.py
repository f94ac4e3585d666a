"""Sampling: greedy, temperature, top-k and top-p restrict what is drawn; log-probs are the full distribution's."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from searchrl.rollout.config import SamplingParams
from searchrl.rollout.sampling import sample

LOGITS = jnp.log(jnp.asarray([[0.5, 0.25, 0.15, 0.07, 0.03]]))


def draw(params: SamplingParams, n: int = 2000) -> tuple[np.ndarray, np.ndarray]:
    tokens, logprobs = sample(jnp.repeat(LOGITS, n, axis=0), jax.random.split(jax.random.key(0), n), params)
    return np.asarray(tokens), np.asarray(logprobs)


def test_greedy_takes_the_argmax_with_its_untempered_logprob():
    tokens, logprobs = draw(SamplingParams(temperature=0.0), n=3)
    assert (tokens == 0).all()
    np.testing.assert_allclose(logprobs, np.log(0.5), rtol=1e-6)


def test_top_k_and_top_p_restrict_the_support():
    tokens, _ = draw(SamplingParams(temperature=1.0, top_k=2))
    assert set(tokens) == {0, 1}
    # Nucleus 0.8: 0.5 + 0.25 < 0.8, so the third token (cumulative 0.9) is still needed; the rest are cut.
    tokens, _ = draw(SamplingParams(temperature=1.0, top_p=0.8))
    assert set(tokens) == {0, 1, 2}
    tokens, _ = draw(SamplingParams(temperature=1.0, top_p=0.4))
    assert set(tokens) == {0}


def test_sampling_frequencies_and_logprobs_follow_the_tempered_distribution():
    params = SamplingParams(temperature=2.0)
    tokens, logprobs = draw(params, n=20000)
    tempered = np.asarray(jax.nn.softmax(LOGITS[0] / 2.0))
    np.testing.assert_allclose(np.bincount(tokens, minlength=5) / len(tokens), tempered, atol=0.015)
    np.testing.assert_allclose(logprobs, np.log(tempered[tokens]), rtol=1e-5)
    # Top-k changes what can be drawn, not the reported log-probability (the trainer recomputes the full one).
    tokens, logprobs = draw(SamplingParams(temperature=2.0, top_k=2), n=50)
    np.testing.assert_allclose(logprobs, np.log(tempered[tokens]), rtol=1e-5)


def test_a_rows_draw_depends_on_its_key_and_logits_only():
    logits = jax.random.normal(jax.random.key(1), (6, 50))
    keys = jax.random.split(jax.random.key(2), 6)
    params = SamplingParams(temperature=1.0)
    tokens, logprobs = sample(logits, keys, params)
    part_tokens, part_logprobs = sample(logits[2:5], keys[2:5], params)
    np.testing.assert_array_equal(part_tokens, tokens[2:5])
    np.testing.assert_array_equal(part_logprobs, logprobs[2:5])
    assert len(set(np.asarray(sample(jnp.repeat(logits[:1], 6, 0), keys, params)[0]))) > 1  # keys matter
