"""Sampling: greedy, temperature, top-k and top-p restrict what is drawn; log-probs are the full distribution's."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from searchrl.rollout.config import SamplingParams
from searchrl.rollout.sampling import sample

LOGITS = jnp.log(jnp.asarray([[0.5, 0.25, 0.15, 0.07, 0.03]]))


def draw(params: SamplingParams, n: int = 2000) -> tuple[np.ndarray, np.ndarray]:
    keys = jax.random.split(jax.random.key(0), n)
    tokens, logprobs = jax.vmap(lambda k: sample(LOGITS, k, params))(keys)
    return np.asarray(tokens[:, 0]), np.asarray(logprobs[:, 0])


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
