"""Decoder semantics: KV-cache prefill/decode/extend, padding, bf16, value head, log-probabilities."""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from searchrl.models import (TRAIN_RULES, AttentionConfig, Compute, apply, forward, get_preset, lm_logits,
                             token_logprobs, unstack_layers, value_params_from_policy, values)
from tests.models.model_helpers import paged_cache, random_params, random_tokens

TRAIN = Compute(TRAIN_RULES, AttentionConfig())  # a default run's training layout and attention

CFG = get_preset("tiny")
PARAMS = random_params(CFG)
fwd = jax.jit(functools.partial(forward, CFG, compute=TRAIN, remat=False))


def _left_pad(rows: list[np.ndarray], width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Left-padded tokens, positions ("real tokens so far") and mask."""
    tokens = np.zeros((len(rows), width), np.int32)
    mask = np.zeros((len(rows), width), bool)
    for b, row in enumerate(rows):
        tokens[b, width - len(row):], mask[b, width - len(row):] = row, True
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32)
    return tokens, positions, mask


def _alone(row: np.ndarray, width: int = 16) -> np.ndarray:
    """Logits of one sequence on its own, no mask, positions 0..n-1: the reference for batched/cached paths.

    The row is followed by filler up to a fixed width (one compilation); causality keeps it out of the result.
    """
    tokens = np.zeros((1, width), np.int32)
    tokens[0, :len(row)] = row
    positions = np.arange(width, dtype=np.int32)[None]
    return np.asarray(fwd(PARAMS, tokens, positions, np.ones((1, width), bool))[0])[0, :len(row)]


def test_left_padded_batch_equals_rows_alone():
    rows = [random_tokens(CFG, (n,), seed=n) for n in (4, 9, 7)]
    tokens, positions, mask = _left_pad(rows, 9)
    logits = np.asarray(fwd(PARAMS, tokens, positions, mask)[0])
    for b, row in enumerate(rows):
        np.testing.assert_allclose(logits[b, mask[b]], _alone(row), atol=1e-4, rtol=0)


def _right_pad(rows: list[np.ndarray], width: int, start: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Right-padded tokens, their positions (from each row's `start`, default 0) and mask: a chunk
    appended to a cache."""
    tokens = np.zeros((len(rows), width), np.int32)
    mask = np.zeros((len(rows), width), bool)
    for b, row in enumerate(rows):
        tokens[b, :len(row)], mask[b, :len(row)] = row, True
    start = np.zeros(len(rows), np.int32) if start is None else start
    return tokens, (start[:, None] + np.arange(width)).astype(np.int32), mask


UNSTACKED = unstack_layers(PARAMS)
cached = jax.jit(functools.partial(forward, CFG, compute=TRAIN, remat=False,
                                   unrolled=True))


def test_prefill_then_decode_equals_full_forward():
    """Prompts of different lengths (right-padded) into scrambled pages, then single-token decode steps."""
    prompts = [random_tokens(CFG, (n,), seed=10 + n) for n in (3, 6)]
    new = random_tokens(CFG, (2, 4), seed=1)
    tokens, positions, mask = _right_pad(prompts, 6)
    cache = paged_cache(CFG, batch=2, slots=16)
    prefill, _, cache = cached(UNSTACKED, tokens, positions, mask, cache)
    np.testing.assert_array_equal(np.asarray(cache.length), [3, 6])
    steps = []
    for t in range(new.shape[1]):
        pos = np.array([[len(p) + t] for p in prompts], np.int32)
        logits, _, cache = cached(UNSTACKED, new[:, t:t + 1], pos, np.ones((2, 1), bool), cache)
        steps.append(np.asarray(logits[:, 0]))
    np.testing.assert_array_equal(np.asarray(cache.length), [7, 10])
    for b, prompt in enumerate(prompts):
        ref = _alone(np.concatenate([prompt, new[b]]))
        np.testing.assert_allclose(np.asarray(prefill)[b, mask[b]], ref[:len(prompt)], atol=1e-4, rtol=0)
        np.testing.assert_allclose(np.stack(steps, 1)[b], ref[len(prompt):], atol=1e-4, rtol=0)


def test_the_cache_is_read_by_the_unrolled_decoder_only():
    tokens, positions, mask = _right_pad([random_tokens(CFG, (3,), seed=1)], 4)
    with pytest.raises(ValueError, match="unrolled decoder"):
        fwd(PARAMS, tokens, positions, mask, paged_cache(CFG, batch=1, slots=8))


def test_unstacked_layers_compute_the_same_logits():
    assert "layers" not in UNSTACKED and f"layers_{CFG.num_layers}" not in UNSTACKED
    np.testing.assert_array_equal(UNSTACKED["layers_1"]["q"], PARAMS["layers"]["q"][1])
    tokens, positions, mask = _left_pad([random_tokens(CFG, (n,), seed=30 + n) for n in (5, 8)], 8)
    stacked = fwd(PARAMS, tokens, positions, mask)
    unrolled = jax.jit(functools.partial(forward, CFG, unrolled=True, compute=TRAIN,
                                         remat=False))
    np.testing.assert_allclose(unrolled(UNSTACKED, tokens, positions, mask)[0], stacked[0], atol=1e-5, rtol=0)


def test_extend_of_right_padded_chunks_then_decode():
    """Prompt, observation chunk (right-padded: rows append different counts), decode: rows end at different
    slots, across page boundaries; a row appending nothing is left as it was."""
    prompts = [random_tokens(CFG, (n,), seed=20 + n) for n in (5, 2)]
    observations = [random_tokens(CFG, (n,), seed=30 + n) for n in (3, 6)]
    decoded = random_tokens(CFG, (2, 2), seed=2)
    cache = paged_cache(CFG, batch=2, slots=24, seed=3)
    _, _, cache = cached(UNSTACKED, *_right_pad(prompts, 5), cache)
    seen = np.array([len(p) for p in prompts])
    obs, obs_pos, obs_mask = _right_pad(observations, 6, seen.astype(np.int32))
    extend, _, cache = cached(UNSTACKED, obs, obs_pos, obs_mask, cache)
    seen += obs_mask.sum(1)
    np.testing.assert_array_equal(np.asarray(cache.length), seen)
    before = jax.tree.map(np.asarray, cache)
    _, _, after = cached(UNSTACKED, obs, obs_pos, np.zeros_like(obs_mask), cache)
    for got, want in zip(jax.tree.leaves(after), jax.tree.leaves(before)):
        np.testing.assert_array_equal(got, want)

    steps = []
    for t in range(decoded.shape[1]):
        logits, _, cache = cached(UNSTACKED, decoded[:, t:t + 1], (seen + t)[:, None].astype(np.int32),
                                  np.ones((2, 1), bool), cache)
        steps.append(np.asarray(logits[:, 0]))
    for b in range(2):
        ref = _alone(np.concatenate([prompts[b], observations[b], decoded[b]]))
        n_p, n_o = len(prompts[b]), len(observations[b])
        np.testing.assert_allclose(np.asarray(extend)[b, :n_o], ref[n_p:n_p + n_o], atol=1e-4, rtol=0)
        np.testing.assert_allclose(np.stack(steps, 1)[b], ref[n_p + n_o:], atol=1e-4, rtol=0)


def test_padding_keys_are_never_attended():
    """Changing the token under a padded position leaves every real position's logits unchanged."""
    tokens, positions, mask = _left_pad([random_tokens(CFG, (5,), seed=3)], 8)
    base = np.asarray(fwd(PARAMS, tokens, positions, mask)[0])
    other = np.asarray(fwd(PARAMS, np.where(mask, tokens, 7), positions, mask)[0])
    np.testing.assert_array_equal(base[mask], other[mask])
    full = np.asarray(fwd(PARAMS, tokens, positions, np.ones_like(mask))[0])
    assert np.abs(full[mask] - base[mask]).max() > 1e-2  # the mask really changes what is attended


def test_bf16_params_stay_close_to_fp32():
    tokens = random_tokens(CFG, (2, 12), seed=4)
    ref = np.asarray(apply(CFG, PARAMS, tokens, compute=TRAIN))
    bf16 = apply(CFG, jax.tree.map(lambda p: p.astype(jnp.bfloat16), PARAMS), tokens, compute=TRAIN)
    assert bf16.dtype == jnp.float32
    diff = np.abs(np.asarray(bf16) - ref).max()
    print(f"bf16 vs fp32 max |logit diff| = {diff:.4f} (max |logit| = {np.abs(ref).max():.2f})")
    assert np.isfinite(diff) and diff < 0.05 * np.abs(ref).max()


def test_token_logprobs_match_numpy_log_softmax():
    tokens = random_tokens(CFG, (2, 10), seed=5)
    positions = np.broadcast_to(np.arange(10, dtype=np.int32), (2, 10))
    mask = np.ones((2, 10), bool)
    logprobs, entropy = token_logprobs(CFG, PARAMS, tokens, positions, mask, with_entropy=True,
                                       temperature=1.0, compute=TRAIN, remat=False,
                                       logits_chunk=0)
    assert logprobs.shape == entropy.shape == (2, 10) and logprobs.dtype == jnp.float32
    def log_softmax(x):
        shifted = x - x.max(-1, keepdims=True)
        return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))

    logits = np.asarray(apply(CFG, PARAMS, tokens, compute=TRAIN), np.float64)
    logp = log_softmax(logits)
    expected = np.take_along_axis(logp[:, :-1], tokens[:, 1:, None], -1)[..., 0]
    np.testing.assert_allclose(np.asarray(logprobs)[:, 1:], expected, atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(entropy)[:, 1:], -(np.exp(logp) * logp).sum(-1)[:, :-1],
                               atol=1e-5, rtol=0)
    np.testing.assert_array_equal(np.asarray(logprobs)[:, 0], 0)
    np.testing.assert_array_equal(
        np.asarray(token_logprobs(CFG, PARAMS, tokens, positions, mask, temperature=1.0, compute=TRAIN,
                                  remat=False, logits_chunk=0)), np.asarray(logprobs))
    logp = log_softmax(logits / 0.7)  # the distribution at temperature 0.7
    np.testing.assert_allclose(
        np.asarray(token_logprobs(CFG, PARAMS, tokens, positions, mask, temperature=0.7, compute=TRAIN,
                                  remat=False, logits_chunk=0))[:, 1:],
        np.take_along_axis(logp[:, :-1], tokens[:, 1:, None], -1)[..., 0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("chunk", [4, 5, 16])
def test_logits_in_chunks_give_the_same_logprobs_entropy_and_gradients(chunk):
    """The head on `chunk` positions at a time (padded at the end when they do not divide the 16 predicting
    positions; a no-op from 16 on) against the whole sequence at once, on padded rows, at temperature 0.7."""
    tokens = random_tokens(CFG, (3, 17), seed=6)
    positions = np.broadcast_to(np.arange(17, dtype=np.int32), (3, 17))
    mask = np.arange(17)[None, :] < np.array([[17], [11], [4]])

    def loss(params, logits_chunk):
        logprobs, entropy = token_logprobs(CFG, params, tokens, positions, mask, with_entropy=True,
                                           temperature=0.7, logits_chunk=logits_chunk, compute=TRAIN,
                                           remat=False)
        return jnp.sum(logprobs * mask) + 0.3 * jnp.sum(entropy * mask), (logprobs, entropy)

    (whole, (logprobs, entropy)), grads = jax.value_and_grad(loss, has_aux=True)(PARAMS, 0)
    (chunked, (chunked_logprobs, chunked_entropy)), chunked_grads = jax.value_and_grad(loss, has_aux=True)(
        PARAMS, chunk)
    # float32 over another summation order: a few ulps of values around 4
    np.testing.assert_allclose(chunked_logprobs, logprobs, rtol=2e-6, atol=0)
    np.testing.assert_allclose(chunked_entropy, entropy, rtol=2e-6, atol=0)
    np.testing.assert_allclose(chunked, whole, rtol=1e-6)
    for name, grad in jax.tree_util.tree_leaves_with_path(grads):
        chunked_grad = functools.reduce(lambda tree, key: tree[key.key], name, chunked_grads)
        np.testing.assert_allclose(chunked_grad, grad, atol=1e-5 * float(np.abs(grad).max()), rtol=0,
                                   err_msg=jax.tree_util.keystr(name))


def test_value_model_params_and_outputs():
    untied = dataclasses.replace(CFG, tie_word_embeddings=False)
    policy = random_params(untied)
    critic = value_params_from_policy(untied, policy, jax.random.key(0))
    assert "lm_head" not in critic and critic["embed"] is policy["embed"]
    head = critic["value_head"]
    assert head["kernel"].shape == (untied.hidden_size,) and head["bias"].shape == ()
    tokens, positions, mask = _left_pad([random_tokens(CFG, (n,), seed=n) for n in (4, 6)], 6)
    v = values(untied, critic, tokens, positions, mask, compute=TRAIN, remat=False)
    assert v.shape == (2, 6) and v.dtype == jnp.float32 and np.isfinite(np.asarray(v)).all()
    hidden = np.asarray(forward(untied, policy, tokens, positions, mask, compute=TRAIN,
                                remat=False)[1],
                        np.float64)
    expected = hidden @ np.asarray(head["kernel"], np.float64)
    np.testing.assert_allclose(np.asarray(v), expected, atol=1e-5, rtol=0)
    assert 0 < np.abs(np.asarray(v)).max() < 2.0  # small at init


@pytest.mark.parametrize("remat", [False, True])
def test_gradients_are_finite_through_padding(remat):
    """Left padding gives fully masked query rows; their gradients must not turn into NaN."""
    tokens, positions, mask = _left_pad([random_tokens(CFG, (n,), seed=n) for n in (3, 7)], 7)

    def loss(params, remat):
        return -(token_logprobs(CFG, params, tokens, positions, mask, remat=remat, temperature=1.0,
                                compute=TRAIN, logits_chunk=0) * mask).sum()

    grads = jax.jit(jax.grad(loss), static_argnums=1)(PARAMS, remat)
    assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))
    if remat:
        ref = jax.jit(jax.grad(loss), static_argnums=1)(PARAMS, False)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5), grads, ref)


def test_lm_logits_of_one_hidden_state_per_row():
    """The rollout samples from the last hidden state of each row: [B, D] -> [B, V] must match forward."""
    tokens = random_tokens(CFG, (2, 5), seed=6)
    positions = np.broadcast_to(np.arange(5, dtype=np.int32), (2, 5))
    logits, hidden, _ = fwd(PARAMS, tokens, positions, np.ones((2, 5), bool))
    np.testing.assert_allclose(np.asarray(lm_logits(CFG, PARAMS, hidden[:, -1])), np.asarray(logits[:, -1]),
                               atol=1e-6, rtol=0)


def test_the_decoder_is_a_flax_module_applied_to_a_params_pytree():
    """`Decoder.init` gives the params' structure with each axis's logical name (Flax's logical partitioning);
    `Decoder.apply` on the params pytree is what `forward` computes; the value model has a value head."""
    import flax.linen as nn
    from jax.sharding import PartitionSpec as P

    from searchrl.models import Decoder, init_params

    tokens, positions, mask = _left_pad([random_tokens(CFG, (n,), seed=40 + n) for n in (4, 7)], 7)
    boxed = Decoder(CFG, compute=TRAIN).init(jax.random.key(0), tokens, positions, mask,
                                                 method=Decoder.head)["params"]
    assert jax.tree.structure(nn.unbox(boxed)) == jax.tree.structure(PARAMS)
    specs = nn.get_partition_spec(boxed)
    assert specs["layers"]["q"] == P("layers", "embed", "heads", "head_dim")
    assert specs["embed"] == P("vocab", "embed")
    hidden, _ = Decoder(CFG, compute=TRAIN).apply({"params": PARAMS}, tokens, positions, mask)
    logits = Decoder(CFG, compute=TRAIN).apply({"params": PARAMS}, hidden,
                                                                        method=Decoder.logits)
    np.testing.assert_allclose(logits, fwd(PARAMS, tokens, positions, mask)[0], atol=1e-6, rtol=1e-6)
    critic = init_params(CFG, jax.random.key(1), value=True)
    assert "value_head" in critic and "lm_head" not in critic
    v = values(CFG, critic, tokens, positions, mask, compute=TRAIN, remat=False)
    assert v.shape == tokens.shape
