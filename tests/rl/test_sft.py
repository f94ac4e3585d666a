"""Supervised cold start: segment masks, the masked NLL against an independent computation, and learning."""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from searchrl import models
from searchrl.rl import sft
from searchrl.rl.config import SFTConfig
from searchrl.text.tokenizer import train_bpe_tokenizer

TRAIN = models.Compute(models.TRAIN_RULES, models.AttentionConfig())  # as a default run trains

WORDS = "red green blue cyan magenta yellow black white".split()

# The plain forward pass, compiled once per length (eager calls would each compile its layer scan anew).
apply = jax.jit(functools.partial(models.apply, compute=TRAIN), static_argnums=0)


@pytest.fixture(scope="module")
def tokenizer():
    rng = np.random.default_rng(0)
    return train_bpe_tokenizer([" ".join(rng.choice(WORDS, 10)) for _ in range(200)], vocab_size=300)


def examples():
    return [[(f"say {w} :", False), (f"<answer> {w} </answer>", True)] for w in WORDS]


def test_encode_masks_exactly_the_policy_segments(tokenizer):
    tokens, mask = sft.encode(tokenizer, examples(), max_len=24)
    for row, segments in zip(range(len(WORDS)), examples()):
        prompt = tokenizer.encode(segments[0][0], add_special_tokens=False)
        answer = tokenizer.encode(segments[1][0], add_special_tokens=False)
        n = len(prompt) + len(answer)
        assert list(tokens[row, :n]) == prompt + answer and not tokens[row, n:].any()
        assert list(mask[row]) == [0.0] * len(prompt) + [1.0] * len(answer) + [0.0] * (24 - n)
    with pytest.raises(ValueError, match="SFT example 0 has"):
        sft.encode(tokenizer, examples(), max_len=4)


def test_nll_matches_an_independent_log_softmax(tokenizer):
    cfg = dataclasses.replace(models.get_preset("tiny"), vocab_size=len(tokenizer))
    params = models.init_params(cfg, jax.random.key(0))
    tokens, mask = sft.encode(tokenizer, examples(), max_len=24)
    got = float(sft.nll(cfg, params, jnp.asarray(tokens), jnp.asarray(mask), compute=TRAIN))
    total, count = 0.0, 0
    for row in range(len(tokens)):  # each row alone, unpadded, through the plain forward pass
        n = int(np.nonzero(mask[row])[0].max()) + 1
        logits = np.asarray(apply(cfg, params, jnp.asarray(tokens[row:row + 1, :n])), np.float64)[0]
        logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
            - logits.max(-1, keepdims=True)
        for t in np.nonzero(mask[row])[0]:
            total -= logp[t - 1, tokens[row, t]]
            count += 1
    np.testing.assert_allclose(got, total / count, rtol=1e-5)


def test_sft_learns_the_scripted_answers(tokenizer):
    cfg = dataclasses.replace(models.get_preset("tiny"), vocab_size=len(tokenizer))
    params = models.init_params(cfg, jax.random.key(0))
    tokens, mask = sft.encode(tokenizer, examples(), max_len=24)
    config = SFTConfig(steps=120, batch_size=8)
    mesh = models.make_mesh(-1, 1, 1)
    trained, losses = sft.train(cfg, params, tokens, mask, config, mesh, compute=TRAIN)
    assert losses[-1] < 0.05 * losses[0], losses[::20]
    # Greedy continuation of every prompt reproduces its answer.
    for row, segments in enumerate(examples()):
        ids = tokenizer.encode(segments[0][0], add_special_tokens=False)
        for _ in range(len(tokenizer.encode(segments[1][0], add_special_tokens=False))):
            logits = apply(cfg, trained, jnp.asarray([ids]))
            ids.append(int(jnp.argmax(logits[0, -1])))
        assert tokenizer.decode(ids).endswith(segments[1][0])
