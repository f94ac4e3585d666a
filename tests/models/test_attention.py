"""Every attention implementation against the reference (values and gradients; the Pallas kernels interpreted
on CPU), blockwise attention over packed rows' block pairs, the decoder with blockwise and Pallas attention
against the reference decoder, and the memory blockwise attention saves."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from searchrl.models import (TRAIN_RULES, AttentionConfig, Compute, Segments, forward, get_preset,
                             init_params, unstack_layers, visible_block_pairs)
from searchrl.models import attention as attention_lib
from tests.models.model_helpers import paged_cache

B, T, H, KV, HD, S = 3, 6, 4, 2, 8, 13  # GQA: two query heads per key head
F32_TOL = 1e-5
# bfloat16 operands: the probabilities and values are rounded to 8 bits of mantissa (relative error 2^-8) in
# a different order (per block against the whole row), so outputs agree to a few of bfloat16's ulps.
BF16_TOL = 3e-2


def _key_valid(rows: list[list[int]]) -> np.ndarray:
    """Bool [B, S] from each row's valid slots."""
    valid = np.zeros((B, S), bool)
    for b, slots in enumerate(rows):
        valid[b, slots] = True
    return valid


def _cases() -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
    """(key_valid [B, S], query_slot [B, T], segment_ids [B, S] or None) of each layout the decoder makes."""
    t = np.arange(T)
    no_cache = np.broadcast_to(t, (B, T))
    padded = np.zeros((B, S), bool)
    padded[0, :T], padded[1, 2:T], padded[2, :4] = True, True, True  # full, left- and right-padded
    lengths = np.array([0, 3, 7])  # a partially filled cache: rows at different lengths, holes included
    cache = _key_valid([list(range(T)), [0, 2, *range(3, 3 + T)], [1, 2, 3, 5, 6, *range(7, 7 + T - 2)]])
    decode = _key_valid([[0, 1, 2, 4], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [3, 5, 11, 12]])
    masked = padded.copy()
    masked[2] = False  # a row with no key at all
    masked[1, :3] = False  # and queries before any valid key
    square = np.zeros((B, S), bool)  # rows without a cache, T == S (the library kernels' case)
    square[0], square[1, 4:], square[2, :9] = True, True, True  # full, left- and right-padded
    # Packed rows (T == S): sequences of 5, 4 and 3 tokens then padding; one sequence; one sequence a row
    # whose second segment starts at slot 1.
    segments = np.array([[1] * 5 + [2] * 4 + [3] * 3 + [0], [1] * 13, [1] + [2] * 10 + [0] * 2])
    return {
        "causal_padding": (padded, no_cache, None),
        "extend_cache": (cache, lengths[:, None] + t, None),
        "decode_cache": (decode, np.array([[4], [9], [12]]), None),
        "fully_masked": (masked, no_cache, None),
        "square_padding": (square, np.broadcast_to(np.arange(S), (B, S)), None),
        "packed": (segments > 0, np.broadcast_to(np.arange(S), (B, S)), segments),
    }


CASES = _cases()


def _operands(case: str, dtype) -> tuple[tuple, jax.Array | None]:
    """((q, k, v, key_valid, query_slot), segment_ids) of a case."""
    key_valid, query_slot, segment_ids = CASES[case]
    rng = np.random.default_rng(0)
    q = rng.standard_normal((B, query_slot.shape[1], H, HD))
    k, v = (rng.standard_normal((B, KV, S, HD)) for _ in range(2))
    args = (*(jnp.asarray(x, dtype) for x in (q, k, v)), jnp.asarray(key_valid),
            jnp.asarray(query_slot, jnp.int32))
    return args, None if segment_ids is None else jnp.asarray(segment_ids, jnp.int32)


def _xla_dot_product(q, k, v, key_valid, query_slot, config, segment_ids=None):
    """`dot_product`'s mask and layout through jax.nn.dot_product_attention's XLA path (cuDNN needs a GPU)."""
    del config
    return attention_lib._dot_product(q, k, v, key_valid, query_slot, segment_ids, "xla")


def _registered(name: str, **kwargs) -> tuple:
    return attention_lib.ATTENTION.get(name), AttentionConfig(name, **kwargs)


IMPLEMENTATIONS = {
    "blockwise_3": _registered("blockwise", block_size=3),  # 13 = 4 x 3 + 1
    "blockwise_4": _registered("blockwise", block_size=4),
    "blockwise_whole": _registered("blockwise", block_size=64),
    "dot_product_xla": (_xla_dot_product, AttentionConfig("dot_product")),
    "pallas_4": _registered("pallas", kernel_block=4, interpret=True),  # tiles of 4 queries and 4 key slots
    "pallas_16": _registered("pallas", interpret=True),  # one tile of 16 (at least a Triton dot's side)
    "pallas_mha_4": _registered("pallas_mha", kernel_block=4, interpret=True),
    "pallas_tpu": _registered("pallas_tpu", interpret=True),
}
# The library kernels serve rows without a cache (T == S) and leave the output of padding queries (and of
# queries with no key) unspecified: there they are compared on the queries a loss reads.
LIBRARY = {"pallas_mha", "pallas_tpu"}


def _read(config: AttentionConfig, case: str) -> np.ndarray:
    """Bool [B, T]: the queries whose outputs (and their gradients) are compared with the reference."""
    key_valid, query_slot, segment_ids = CASES[case]
    if config.impl not in LIBRARY or query_slot.shape[1] != S:
        return np.ones(query_slot.shape, bool)
    segments = None if segment_ids is None else (segment_ids, segment_ids)
    sees = np.asarray(attention_lib.attend_mask(jnp.asarray(key_valid), jnp.asarray(query_slot),
                                                jnp.arange(S), segments)).any(axis=-1)
    return sees & key_valid


def _loss(fn, config, segment_ids, read, q, k, v, key_valid, query_slot):
    """A scalar reading every output of the queries `read` [B, T] with distinct weights (so that every
    gradient entry is checked)."""
    out = fn(q, k, v, key_valid, query_slot, config, segment_ids).astype(jnp.float32)
    weights = jnp.sin(jnp.arange(out.size, dtype=jnp.float32)).reshape(out.shape)
    return jnp.sum(jnp.where(read[:, :, None, None], out * weights, 0.0))


def _gradients(fn, config, args, segment_ids, read):
    loss = functools.partial(_loss, fn, config, segment_ids, jnp.asarray(read))
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(*args)


def test_every_implementation_is_registered_and_tested():
    assert attention_lib.ATTENTION.names() == ["blockwise", "dot_product", "pallas", "pallas_mha",
                                               "pallas_tpu", "reference"]
    tested = {config.impl for _, config in IMPLEMENTATIONS.values()}
    assert tested == set(attention_lib.ATTENTION) - {"reference"}
    with pytest.raises(ValueError, match="config.mesh.attention.impl='flash'"):
        attention_lib.attention(*_operands("causal_padding", jnp.float32)[0], AttentionConfig("flash"))
    with pytest.raises(ValueError, match="block_size"):
        AttentionConfig("blockwise", block_size=0)
    with pytest.raises(ValueError, match="kernel_block"):
        AttentionConfig("pallas", kernel_block=48)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("name", sorted(IMPLEMENTATIONS))
def test_values_and_gradients_match_the_reference_float32(name, case):
    fn, config = IMPLEMENTATIONS[name]
    args, segment_ids = _operands(case, jnp.float32)
    read = _read(config, case)
    ref = attention_lib.reference(*args, AttentionConfig(), segment_ids)
    got = jax.jit(fn, static_argnums=5)(*args, config, segment_ids)
    assert np.isfinite(np.asarray(got)).all()
    np.testing.assert_allclose(np.asarray(got)[read], np.asarray(ref)[read], atol=F32_TOL, rtol=F32_TOL)
    grads = (_gradients(f, c, args, segment_ids, read)
             for f, c in ((fn, config), (attention_lib.reference, AttentionConfig())))
    for g, r in zip(*grads):
        np.testing.assert_allclose(g, r, atol=F32_TOL, rtol=F32_TOL)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("name", ["blockwise_4", "pallas_4", "pallas_mha_4", "pallas_tpu"])
def test_kernels_match_the_reference_bfloat16(name, case):
    fn, config = IMPLEMENTATIONS[name]
    args, segment_ids = _operands(case, jnp.bfloat16)
    read = _read(config, case)
    ref = attention_lib.reference(*args, AttentionConfig(), segment_ids)
    got = jax.jit(fn, static_argnums=5)(*args, config, segment_ids)
    assert got.dtype == ref.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(got, np.float32)[read], np.asarray(ref, np.float32)[read],
                               atol=BF16_TOL)
    grads = (_gradients(f, c, args, segment_ids, read)
             for f, c in ((fn, config), (attention_lib.reference, AttentionConfig())))
    for g, r in zip(*grads):
        scale = float(jnp.abs(r.astype(jnp.float32)).max())
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(r, np.float32), atol=BF16_TOL * scale)


def _padded_pairs(ids: np.ndarray, valid: np.ndarray, block: int, extra: int = 0) -> jax.Array:
    """Block pairs [B, P, 2] of packed rows: each row's, then `extra` or more (-1, -1)."""
    pairs = visible_block_pairs(ids, valid, block)
    return jnp.asarray(np.pad(pairs, ((0, 0), (0, extra), (0, 0)), constant_values=-1))


def test_block_pairs_are_the_blocks_that_hold_a_visible_pair():
    """For packed rows (contiguous sequences, then padding), exactly the (query block, key block) pairs with
    some query that may attend some key: none across sequences, above the diagonal or on padding alone."""
    rng = np.random.default_rng(3)
    width, block = 40, 6
    for _ in range(20):
        lengths = rng.integers(1, 15, rng.integers(1, 5))
        lengths = lengths[np.cumsum(lengths) <= width]
        ids = np.zeros((1, width), np.int32)
        ids[0, :lengths.sum()] = np.repeat(np.arange(1, len(lengths) + 1), lengths)
        valid = ids > 0
        sees = np.asarray(attention_lib.attend_mask(jnp.asarray(valid), jnp.arange(width)[None],
                                                    jnp.arange(width), (jnp.asarray(ids),) * 2))[0]
        sees = sees & valid[0][:, None]  # padding queries see no key
        n = -(-width // block)
        padded = np.zeros((n * block, n * block), bool)
        padded[:width, :width] = sees
        expected = np.argwhere(padded.reshape(n, block, n, block).any(axis=(1, 3)))
        pairs = visible_block_pairs(ids, valid, block)[0]
        np.testing.assert_array_equal(pairs[pairs[:, 0] >= 0], expected)


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, F32_TOL), (jnp.bfloat16, BF16_TOL)])
@pytest.mark.parametrize("block", [3, 4, 64])
@pytest.mark.parametrize("case", ["packed", "square_padding"])
def test_block_sparse_blockwise_matches_the_reference(case, block, dtype, tol):
    """Blockwise attention over packed rows' block pairs (padding pairs included) equals the reference on
    every query with a key to attend, in values and gradients; a row of one sequence is its own case."""
    key_valid, query_slot, segment_ids = CASES[case]
    ids = np.where(key_valid, 1, 0) if segment_ids is None else segment_ids
    args = _operands(case, dtype)[0]
    read = np.asarray(attention_lib.attend_mask(jnp.asarray(key_valid), jnp.asarray(query_slot),
                                                jnp.arange(S), (jnp.asarray(ids),) * 2)).any(axis=-1)
    segments = Segments(jnp.asarray(ids), _padded_pairs(ids, key_valid, block, extra=2))
    config = AttentionConfig("blockwise", block_size=block)

    def sparse(q, k, v, key_valid, query_slot, config, segment_ids):
        return attention_lib.attention(q, k, v, key_valid, query_slot, config, segments)

    ref = attention_lib.reference(*args, AttentionConfig(), jnp.asarray(ids))
    got = jax.jit(sparse, static_argnums=5)(*args, config, None)
    assert got.dtype == ref.dtype and np.isfinite(np.asarray(got, np.float32)).all()
    np.testing.assert_allclose(np.asarray(got, np.float32)[read], np.asarray(ref, np.float32)[read],
                               atol=tol, rtol=tol if dtype == jnp.float32 else 0)
    grads = (_gradients(f, c, args, jnp.asarray(ids), read)
             for f, c in ((sparse, config), (attention_lib.reference, AttentionConfig())))
    for g, r in zip(*grads):
        scale = 1.0 if dtype == jnp.float32 else float(jnp.abs(r.astype(jnp.float32)).max())
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(r, np.float32), atol=tol * scale,
                                   rtol=tol if dtype == jnp.float32 else 0)


CFG = get_preset("tiny")
PARAMS = init_params(CFG, jax.random.key(0))
BLOCKWISE = AttentionConfig("blockwise", block_size=4)
PALLAS = AttentionConfig("pallas", kernel_block=4, interpret=True)


def _forward(attention: AttentionConfig):
    return jax.jit(functools.partial(forward, CFG, compute=Compute(TRAIN_RULES, attention), remat=False))


def test_forward_with_blockwise_attention_matches_the_reference():
    rng = np.random.default_rng(1)
    tokens = jnp.asarray(rng.integers(3, CFG.vocab_size, (2, 11)), jnp.int32)
    mask = jnp.asarray(np.arange(11)[None] >= np.array([[0], [3]]))  # row 1 left-padded
    positions = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0).astype(jnp.int32)
    ref, got = (_forward(a)(PARAMS, tokens, positions, mask)[0] for a in (AttentionConfig(), BLOCKWISE))
    np.testing.assert_allclose(np.asarray(got)[np.asarray(mask)], np.asarray(ref)[np.asarray(mask)], atol=1e-5)


@pytest.mark.parametrize("attention,pairs", [(AttentionConfig(), False), (BLOCKWISE, False),
                                             (BLOCKWISE, True), (PALLAS, False)],
                         ids=["reference", "blockwise", "blockwise_pairs", "pallas"])
def test_packed_forward_equals_each_sequence_alone(attention, pairs):
    """Three sequences packed in one row (positions restarting per sequence, padding at the end) give each
    the logits of its own unpadded forward pass (blockwise attention also over the row's block pairs
    alone)."""
    rng = np.random.default_rng(2)
    lengths = (5, 7, 3)
    sequences = [rng.integers(3, CFG.vocab_size, n) for n in lengths]
    width = sum(lengths) + 2
    tokens = np.zeros((1, width), np.int32)
    tokens[0, :sum(lengths)] = np.concatenate(sequences)
    segment_ids = np.zeros((1, width), np.int32)
    segment_ids[0, :sum(lengths)] = np.repeat(np.arange(1, 4), lengths)
    positions = np.zeros((1, width), np.int32)
    positions[0, :sum(lengths)] = np.concatenate([np.arange(n) for n in lengths])
    block_pairs = _padded_pairs(segment_ids, segment_ids > 0, attention.block_size) if pairs else None
    packed = jax.jit(functools.partial(forward, CFG, compute=Compute(TRAIN_RULES, attention), remat=False))(
        PARAMS, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(segment_ids > 0),
        segments=Segments(jnp.asarray(segment_ids), block_pairs))[0]
    start = 0
    for seq in sequences:
        alone = _forward(AttentionConfig())(PARAMS, jnp.asarray(seq[None], jnp.int32),
                                            jnp.arange(len(seq), dtype=jnp.int32)[None],
                                            jnp.ones((1, len(seq)), bool))[0]
        np.testing.assert_allclose(np.asarray(packed)[0, start:start + len(seq)], np.asarray(alone)[0],
                                   atol=1e-5)
        start += len(seq)


def test_cached_forward_reads_the_pages_with_the_gpu_kernel_as_the_reference_does():
    """A prompt, an observation of per-row length and two decode steps over a scrambled paged cache: the
    decode steps through JAX's Pallas GPU paged attention (interpreted) give the reference's logits."""
    outputs = {}
    params = unstack_layers(PARAMS)
    for attention in (AttentionConfig(), AttentionConfig(paged="pallas_gpu", interpret=True, kernel_block=16)):
        step = jax.jit(functools.partial(forward, CFG, compute=Compute(TRAIN_RULES, attention), remat=False,
                                         unrolled=True))
        cache = paged_cache(CFG, 2, 24)
        logits = []
        for width, lengths in ((7, [7, 4]), (5, [2, 5]), (1, [1, 1]), (1, [1, 1])):
            tokens = jnp.asarray(np.random.default_rng(width).integers(3, CFG.vocab_size, (2, width)), jnp.int32)
            mask = jnp.asarray(np.arange(width)[None] < np.array(lengths)[:, None])
            positions = (cache.length[:, None] + jnp.arange(width)).astype(jnp.int32)
            out, _, cache = step(params, tokens, positions, mask, cache)
            logits.append(np.asarray(out)[np.asarray(mask)])
        outputs[attention.paged] = logits
    for ref, got in zip(outputs["reference"], outputs["pallas_gpu"]):
        np.testing.assert_allclose(got, ref, atol=1e-5)


def _temp_bytes(impl: str, length: int, segments: Segments | None = None) -> int:
    """XLA's temporary bytes for the gradient of the decoder's NLL at `length` tokens (of packed rows'
    `segments`, positions then restarting per sequence)."""
    attention = AttentionConfig(impl, block_size=128)
    tokens = jnp.zeros((1, length), jnp.int32)
    ids = np.ones((1, length), np.int32) if segments is None else np.asarray(segments.ids)
    lengths = np.unique(ids[0], return_counts=True)[1]
    positions = jnp.asarray([np.concatenate([np.arange(n) for n in lengths])])
    mask = jnp.ones((1, length), bool)

    def loss(params):
        return forward(CFG, params, tokens, positions, mask, compute=Compute(TRAIN_RULES, attention),
                       remat=False, segments=segments)[1].sum()

    return jax.jit(jax.grad(loss)).lower(PARAMS).compile().memory_analysis().temp_size_in_bytes


def test_blockwise_attention_holds_no_score_matrix():
    """The gradient program's temporaries grow with the square of the length with the reference (float32
    scores [B, H, T, T]: 64 MiB a layer at 2,048 tokens) and linearly with blockwise attention (XLA:CPU,
    measured: reference 60.0 and 225.7 MiB, blockwise 21.2 and 42.4 MiB at 1,024 and 2,048 tokens)."""
    reference, blockwise = ([_temp_bytes(impl, length) for length in (1024, 2048)]
                            for impl in ("reference", "blockwise"))
    scores = CFG.num_heads * 2048 * 2048 * 4
    assert reference[1] > 3.5 * reference[0] and reference[1] > 2 * scores
    assert blockwise[1] < 2.2 * blockwise[0] and blockwise[1] < scores


def test_blockwise_attention_over_block_pairs_holds_no_score_matrix():
    """Over two packed sequences, blockwise attention's block pairs also keep the gradient program linear in
    the length (no per-pair scores stacked for the backward pass; XLA:CPU, measured: 13.8 and 28.9 MiB at
    1,024 and 2,048 tokens, against 21.2 and 42.4 computing every block)."""
    def halves(length: int, pairs: bool) -> Segments:
        ids = np.repeat(np.array([[1, 2]]), length // 2, axis=1)
        return Segments(jnp.asarray(ids), jnp.asarray(visible_block_pairs(ids, ids > 0, 128)) if pairs
                        else None)

    sparse, every = ([_temp_bytes("blockwise", n, halves(n, pairs)) for n in (1024, 2048)]
                     for pairs in (True, False))
    assert sparse[1] < 2.2 * sparse[0] and sparse[1] < every[1]
