"""Qwen2/Qwen2.5, Qwen3, Llama-3 and Mistral decoder (and its value model) as a Flax linen module, used
pure-functionally: the functions below apply `Decoder` to a plain-dict params pytree.

Layers are stacked on a leading axis and run with `nn.scan`, so compile time does not grow with depth. A
forward pass over the paged KV cache (prefill, single-token decode, multi-turn extends: a `KVCache`) runs them
unrolled from per-layer params instead (`unstack_layers`, once per rollout), so that it reads each layer's
weights and pages in place. One forward pass serves training (no cache) and the rollout (with one).
`param_table` declares every param once (shape, logical axes, initialiser, HF tensor): the modules declare
their params from it, and init, shardings and `models.hf` read it.
Compute runs in the params' dtype; norms, softmax, logits and values are float32.
"""
from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from searchrl.models import layout
from searchrl.models.attention import sharded_attention
from searchrl.models.attention_base import Segments
from searchrl.models.config import AttentionConfig, ModelConfig
from searchrl.models.kv_cache import KVCache, attend
from searchrl.models.layout import (HEADS, HEADS_IN, HEADS_OUT, TRANSPOSED, ParamSpec, Table, normal, ones,
                                   zeros)
from searchrl.models.sharding import Compute, ShardingRules, constrain

_ACT = ("batch", "length", "embed")
# What a layer keeps for its backward pass without `remat`: the outputs of its matmuls with weights (q, k, v,
# o, gate, up, down). Norms, RoPE, the SwiGLU product and attention (scores, softmax, its two batched dots)
# are recomputed from them, so no [B, H, T, T] probabilities are stored. Fewer stacked residuals for the
# layer scan to zero-fill, write and read made bench_small's forward+backward 15% faster on XLA:CPU than
# keeping every intermediate (1.68 against 2.00 s a step, 9 interleaved rounds); it is the common "minimal"
# policy for transformer training on accelerators, where it bounds activation memory.
_SAVED_FOR_BACKWARD = jax.checkpoint_policies.dots_with_no_batch_dims_saveable


def param_table(cfg: ModelConfig, *, value: bool = False) -> Table:
    """Every param of the decoder (`value=True`: of the value model, a value head in place of any lm_head):
    its shape, logical axes, initialiser (unit norms, zero biases, N(0, 0.02) otherwise) and HF tensor.
    Layers are stacked on a leading "layers" axis."""
    D, F, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    H, KV, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    q_axes, kv_axes, o_axes = (("embed", "heads", "head_dim"), ("embed", "kv_heads", "head_dim"),
                               ("heads", "head_dim", "embed"))
    layer = {
        "attn_norm": ParamSpec((D,), (None,), ones, "input_layernorm.weight"),
        "q": ParamSpec((D, H, hd), q_axes, normal, "self_attn.q_proj.weight", HEADS_IN),
        "k": ParamSpec((D, KV, hd), kv_axes, normal, "self_attn.k_proj.weight", HEADS_IN),
        "v": ParamSpec((D, KV, hd), kv_axes, normal, "self_attn.v_proj.weight", HEADS_IN),
        "o": ParamSpec((H, hd, D), o_axes, normal, "self_attn.o_proj.weight", HEADS_OUT),
        "mlp_norm": ParamSpec((D,), (None,), ones, "post_attention_layernorm.weight"),
        "gate": ParamSpec((D, F), ("embed", "mlp"), normal, "mlp.gate_proj.weight", TRANSPOSED),
        "up": ParamSpec((D, F), ("embed", "mlp"), normal, "mlp.up_proj.weight", TRANSPOSED),
        "down": ParamSpec((F, D), ("mlp", "embed"), normal, "mlp.down_proj.weight", TRANSPOSED),
    }
    if cfg.attention_bias:
        for name, n, axis in (("q", H, "heads"), ("k", KV, "kv_heads"), ("v", KV, "kv_heads")):
            layer[f"{name}_bias"] = ParamSpec((n, hd), (axis, "head_dim"), zeros,
                                              f"self_attn.{name}_proj.bias", HEADS)
    if cfg.o_bias:
        layer["o_bias"] = ParamSpec((D,), (None,), zeros, "self_attn.o_proj.bias")
    if cfg.qk_norm:
        layer["q_norm"] = ParamSpec((hd,), (None,), ones, "self_attn.q_norm.weight")
        layer["k_norm"] = ParamSpec((hd,), (None,), ones, "self_attn.k_norm.weight")
    table = {("embed",): ParamSpec((V, D), ("vocab", "embed"), normal, "model.embed_tokens.weight"),
             ("final_norm",): ParamSpec((D,), (None,), ones, "model.norm.weight"),
             **layout.stack(layer, cfg.num_layers, "model.layers.{}.")}
    if value:
        table["value_head", "kernel"] = ParamSpec((D,), ("embed",), normal)
        table["value_head", "bias"] = ParamSpec((), (), zeros)
    elif not cfg.tie_word_embeddings:
        table["lm_head",] = ParamSpec((D, V), ("embed", "vocab"), normal, "lm_head.weight", TRANSPOSED)
    return table


class CachedRows(NamedTuple):
    """The rows a forward pass over the cache appends to: page tables [B, n], live slots before the pass [B]
    and the tokens each appends [B] (its unmasked ones, a prefix of its chunk)."""

    pages: jax.Array
    start: jax.Array
    count: jax.Array


class Layer(nn.Module):
    """One pre-norm block: grouped-query attention (RoPE, optional biases and q/k norms), then SwiGLU."""

    cfg: ModelConfig
    compute: Compute
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, carry: tuple, index: jax.Array | int, positions: jax.Array,
                 keys: tuple[jax.Array, jax.Array, Segments | None] | CachedRows) -> tuple[tuple, None]:
        """carry = (x [B, T, D], the cache's per-layer pools (k, v) or None); without a cache, keys =
        (key_valid [B, S], query_slot [B, T], packed rows' `Segments` or None) say which keys each query
        sees (`searchrl.models.attention`); with one, the rows' `CachedRows`, and layer `index` (static)
        writes its keys/values into its pools."""
        cfg = self.cfg
        lp = layout.declare(self, param_table(cfg), ("layers",))
        x, kv = carry
        rules = self.compute.rules
        y, kv = _attention(cfg, lp, x, positions, keys, kv, index, rules, self.compute.attention)
        x = constrain(x + y, _ACT, rules)
        x = constrain(x + _mlp(cfg, lp, x, rules), _ACT, rules)
        return (x, kv), None


class ValueHead(nn.Module):
    """The value model's scalar head on the final hidden states."""

    cfg: ModelConfig
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, hidden: jax.Array) -> jax.Array:
        p = layout.declare(self, param_table(self.cfg, value=True), ("value_head",))
        return (jnp.einsum("btd,d->bt", hidden, p["kernel"], preferred_element_type=jnp.float32)
                + p["bias"].astype(jnp.float32))


class Decoder(nn.Module):
    """The decoder: `__call__` gives final-normed hidden states (and the extended cache), `logits` and `head`
    the heads on them. `value=True` is the value model (a `ValueHead`, no LM head); `unrolled=True`
    takes per-layer params `layers_0` .. (`unstack_layers`) instead of the stacked `layers`. For the backward
    pass each layer keeps only its weight matmuls' outputs (`_SAVED_FOR_BACKWARD`); `remat` keeps nothing
    and recomputes the whole layer (gradient checkpointing). `compute` lays out the activations under a mesh
    and picks the attention implementation (a `Placement`'s train or sample `Compute`)."""

    cfg: ModelConfig
    compute: Compute
    value: bool = False
    remat: bool = False
    unrolled: bool = False
    param_dtype: Any = jnp.float32

    def setup(self):
        cfg = self.cfg
        top = layout.declare(self, param_table(cfg, value=self.value))
        self.embed, self.final_norm, self.lm_head = top["embed"], top["final_norm"], top.get("lm_head")
        layer = (nn.remat(Layer) if self.remat
                 else nn.remat(Layer, prevent_cse=False, policy=_SAVED_FOR_BACKWARD))
        if self.unrolled:  # per-layer params and pools, read in place: no slice of a stack, no copy (a
            # forward pass: nothing to keep for a backward one)
            self.layers = [Layer(cfg, self.compute, self.param_dtype)
                           for _ in range(cfg.num_layers)]
        else:
            stack = nn.scan(layer, variable_axes={"params": 0}, split_rngs={"params": True},
                            in_axes=(0, nn.broadcast, nn.broadcast), length=cfg.num_layers,
                            metadata_params={nn.PARTITION_NAME: "layers"})
            self.layers = stack(cfg, self.compute, self.param_dtype)
        if self.value:
            self.value_head = ValueHead(cfg, self.param_dtype)

    def __call__(self, tokens: jax.Array, positions: jax.Array, mask: jax.Array, cache: KVCache | None = None,
                 segments: Segments | None = None) -> tuple[jax.Array, KVCache | None]:
        """Final-normed hidden states [B, T, D] and the extended cache (see `forward`)."""
        cfg, rules = self.cfg, self.compute.rules
        T = tokens.shape[1]
        check_window(cfg, T if cache is None else cache.slots)
        if cache is None:  # query t sees the unmasked tokens up to t (of its own segment, if packed)
            kv = None
            keys = (mask, jnp.broadcast_to(jnp.arange(T), mask.shape), segments)
        else:  # query t sees the row's live slots up to its own, length + t
            if segments is not None:
                raise ValueError("Packed rows (segments) have no KV cache.")
            if not self.unrolled:
                raise ValueError("The KV cache is read by the unrolled decoder (per-layer params: "
                                 "`unstack_layers`).")
            keys = CachedRows(cache.pages, cache.length, jnp.sum(mask, axis=1, dtype=jnp.int32))
            kv = (cache.k, cache.v)
        carry = (constrain(jnp.take(self.embed, tokens, axis=0), _ACT, rules), kv)
        if self.unrolled:
            for index, layer in enumerate(self.layers):
                carry, _ = layer(carry, index, positions, keys)
        else:
            carry, _ = self.layers(carry, jnp.arange(cfg.num_layers), positions, keys)
        x, kv = carry
        hidden = rms_norm(x, self.final_norm, cfg.rms_norm_eps)
        if cache is not None:
            cache = KVCache(k=kv[0], v=kv[1], pages=cache.pages, length=cache.length + keys.count)
        return hidden, cache

    def logits(self, hidden: jax.Array) -> jax.Array:
        """Float32 logits [..., V] from final hidden states [..., D] (the tied embedding or lm_head)."""
        return _head_logits(self.cfg, self.embed, self.lm_head, hidden)

    def head(self, tokens: jax.Array, positions: jax.Array, mask: jax.Array,
             segments: Segments | None = None) -> jax.Array:
        """The head on the hidden states: value estimates [B, T] fp32 for the value model, else the logits.
        What `Decoder.init` runs, so that every param exists."""
        hidden, _ = self(tokens, positions, mask, None, segments)
        return self.value_head(hidden) if self.value else self.logits(hidden)


def check_window(cfg: ModelConfig, slots: int) -> None:
    """Raises unless attention over `slots` key slots is exact for `cfg`: a query sees keys at most
    slots - 1 positions behind it, all inside Mistral's sliding window iff slots <= sliding_window
    (transformers keeps key k for query q iff k > q - sliding_window). searchrl's attention implementations
    have no window (`ModelConfig`)."""
    if cfg.sliding_window is not None and slots > cfg.sliding_window:
        raise ValueError(f"{slots} key slots (row length or KV cache size) exceed the model's "
                         f"sliding_window={cfg.sliding_window}: searchrl's attention has no sliding window, "
                         "so keep rows and the cache (rollout.max_len) within it")


def init_params(cfg: ModelConfig, key: jax.Array, dtype=jnp.float32, *, value: bool = False) -> dict:
    """Random params (`value=True`: the value model's), in `dtype`, as `layout.init` draws them from
    `param_table`.

    `Decoder.init` would draw from Flax's per-module RNG streams instead; these draws are the ones searchrl's
    models have always had, so a seed gives the same model (and a run the same results) across versions.
    """
    return layout.init(param_table(cfg, value=value), key, dtype)


def param_shardings(cfg: ModelConfig, mesh: Mesh, rules: ShardingRules, *,
                    value: bool = False) -> dict:
    """Pytree of NamedSharding mirroring the params, for jit in_shardings/out_shardings and `load_hf`."""
    return layout.shardings(param_table(cfg, value=value), mesh, rules)


def value_params_from_policy(cfg: ModelConfig, policy_params: dict, key: jax.Array,
                             init_scale: float = 0.1) -> dict:
    """Value model params: the policy backbone (embed kept, lm_head dropped) plus a small scalar head."""
    params = {name: p for name, p in policy_params.items() if name != "lm_head"}
    width = cfg.hidden_size
    kernel = init_scale / math.sqrt(width) * jax.random.normal(key, (width,))
    dtype = params["final_norm"].dtype
    params["value_head"] = {"kernel": kernel.astype(dtype), "bias": jnp.zeros((), dtype)}
    return params


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """RMSNorm computed in float32, cast back to x's dtype before the weight (as HF does)."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return weight * y.astype(x.dtype)


def rope_inv_freq(cfg: ModelConfig) -> np.ndarray:
    """RoPE inverse frequencies [head_dim / 2], with Llama-3 scaling when configured."""
    inv_freq = 1.0 / cfg.rope_theta ** (np.arange(0, cfg.head_dim, 2, dtype=np.float64) / cfg.head_dim)
    s = cfg.rope_scaling
    if s is not None:
        wavelen = 2 * math.pi / inv_freq
        low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
        high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
        scaled = np.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
        smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
            s.high_freq_factor - s.low_freq_factor)
        smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv_freq = np.where(medium, smoothed, scaled)
    return inv_freq.astype(np.float32)


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: np.ndarray) -> jax.Array:
    """Rotate-half RoPE of x [B, T, N, hd] at integer positions [B, T], in float32."""
    angles = positions[..., None].astype(jnp.float32) * inv_freq  # [B, T, hd/2]
    cos, sin = jnp.cos(angles)[:, :, None, :], jnp.sin(angles)[:, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def _dense(x: jax.Array, w: jax.Array, out_dtype=None) -> jax.Array:
    """x [..., K] times w [K, ...] as one 2-D matmul over x's rows: the einsum's product, but XLA:CPU then
    computes w's gradient without a transposed copy of x (the MLP's forward+backward: a third faster at 1024
    rows on 2 cores)."""
    k = x.shape[-1]
    y = jnp.matmul(x.reshape(-1, k), w.reshape(k, -1), preferred_element_type=out_dtype)
    return y.reshape(*x.shape[:-1], *w.shape[1:])


def _attention(cfg: ModelConfig, lp: dict, x: jax.Array, positions: jax.Array,
               visible: tuple[jax.Array, jax.Array, Segments | None] | CachedRows,
               kv: tuple[tuple[jax.Array, ...], tuple[jax.Array, ...]] | None, layer: int | jax.Array,
               rules: ShardingRules, config: AttentionConfig):
    """Grouped-query attention over the keys `visible` describes (without a cache: (key_valid, query_slot,
    segments), computed by `config.impl`); with the cache's per-layer pools `kv`, appends this layer's
    keys/values to the `CachedRows` and attends over their live pages (`kv_cache.attend`)."""
    h = rms_norm(x, lp["attn_norm"], cfg.rms_norm_eps)
    q, k, v = _dense(h, lp["q"]), _dense(h, lp["k"]), _dense(h, lp["v"])
    if cfg.attention_bias:
        q, k, v = q + lp["q_bias"], k + lp["k_bias"], v + lp["v_bias"]
    if cfg.qk_norm:
        q = rms_norm(q, lp["q_norm"], cfg.rms_norm_eps)
        k = rms_norm(k, lp["k_norm"], cfg.rms_norm_eps)
    inv_freq = rope_inv_freq(cfg)
    q = constrain(apply_rope(q, positions, inv_freq), ("batch", "length", "heads", "head_dim"), rules)
    k = constrain(apply_rope(k, positions, inv_freq), ("batch", "length", "kv_heads", "head_dim"), rules)
    v = constrain(v, ("batch", "length", "kv_heads", "head_dim"), rules)
    B, T, H, hd = q.shape
    if kv is None:
        key_valid, query_slot, segments = visible
        out = sharded_attention(q, jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2), key_valid, query_slot, config,
                                segments, rules)
    else:
        (k_pools, v_pools), rows = kv, visible
        out, k_pool, v_pool = attend(q, k, v, k_pools[layer], v_pools[layer], rows.pages, rows.start,
                                     rows.count, config, rules)
        kv = (_replaced(k_pools, layer, k_pool), _replaced(v_pools, layer, v_pool))
    out = out.astype(x.dtype).reshape(B, T, H * hd)
    # One flat contraction: the weight reshape is free, the heads keep their order (no per-call weight copy).
    y = _dense(out, lp["o"].reshape(H * hd, -1))
    if cfg.o_bias:
        y = y + lp["o_bias"]
    return y, kv


def _replaced(items: tuple, index: int, item) -> tuple:
    """`items` with entry `index` replaced by `item`."""
    return items[:index] + (item,) + items[index + 1:]


def _mlp(cfg: ModelConfig, lp: dict, x: jax.Array, rules: ShardingRules) -> jax.Array:
    """SwiGLU feed-forward block."""
    h = rms_norm(x, lp["mlp_norm"], cfg.rms_norm_eps)
    act = jax.nn.silu(_dense(h, lp["gate"])) * _dense(h, lp["up"])
    return _dense(constrain(act, ("batch", "length", "mlp"), rules), lp["down"])


def backbone(cfg: ModelConfig, params: dict, tokens: jax.Array, positions: jax.Array, mask: jax.Array,
             cache: KVCache | None = None, *, compute: Compute, remat: bool, unrolled: bool = False,
             segments: Segments | None = None) -> tuple[jax.Array, KVCache | None]:
    """Final-normed hidden states [B, T, D] of the policy and the extended cache (see `forward`)."""
    return Decoder(cfg, compute, remat=remat, unrolled=unrolled).apply(
        {"params": params}, tokens, positions, mask, cache, segments)


def unstack_layers(params: dict) -> dict:
    """The same params with the stacked `layers` split into per-layer `layers_0` .. (Flax's names for the
    list `Decoder.layers` of the unrolled decoder, `unrolled=True`): what a forward pass over the KV cache
    reads. A rollout splits them once (`searchrl.rollout`); a step then reads each layer's weights in place,
    where slicing them from the stack would copy them on every step (XLA:CPU always, accelerators often).
    """
    params = dict(params)
    layers = params.pop("layers")
    depth = jax.tree.leaves(layers)[0].shape[0]
    return params | {f"layers_{i}": jax.tree.map(lambda w, i=i: w[i], layers) for i in range(depth)}


def unstack_shardings(shardings: dict, num_layers: int) -> dict:
    """`param_shardings` of the stacked params, as the shardings of `unstack_layers`' per-layer params."""
    shardings = dict(shardings)
    layer = jax.tree.map(lambda s: jax.sharding.NamedSharding(s.mesh, jax.sharding.PartitionSpec(*s.spec[1:])),
                         shardings.pop("layers"))
    return shardings | {f"layers_{i}": layer for i in range(num_layers)}


def forward(cfg: ModelConfig, params: dict, tokens: jax.Array, positions: jax.Array, mask: jax.Array,
            cache: KVCache | None = None, *, compute: Compute, remat: bool, unrolled: bool = False,
            segments: Segments | None = None) -> tuple[jax.Array, jax.Array, KVCache | None]:
    """(logits fp32 [B, T, V], final hidden [B, T, D], cache); tokens, positions int32 and mask bool [B, T].

    Without a cache, query t attends to key s iff s <= t and mask[b, s] (and, for rows packed with several
    sequences, iff `segments.ids[b, s] == segments.ids[b, t]`; positions then restart per sequence). With one
    (the unrolled decoder), row b's unmasked tokens (a prefix of its chunk: mask[b] is true on its first n_b
    tokens) go to slots length[b] .. length[b]+n_b-1 in the pages its table names, each of them attends to
    the row's slots up to its own, and the returned cache has length += n_b. Positions (for RoPE) always come
    from the caller. Outputs at masked positions are unspecified. `compute` lays out the activations under
    a mesh and picks how attention is computed (a `Placement`'s `train` or `sample`); `remat` recomputes
    each whole layer in the backward pass to save memory (`Decoder`; `RLConfig.remat`); `unrolled` takes the
    per-layer params of `unstack_layers`.
    """
    hidden, cache = backbone(cfg, params, tokens, positions, mask, cache, compute=compute, remat=remat,
                             unrolled=unrolled, segments=segments)
    logits = _sharded_logits(cfg, params, hidden, compute.rules)
    return logits, hidden, cache


def _head_logits(cfg: ModelConfig, embed: jax.Array, lm_head: jax.Array | None, hidden: jax.Array
                 ) -> jax.Array:
    """Float32 logits [..., V] from final hidden states [..., D]: the tied embedding's or lm_head's."""
    return _dense(hidden, embed.T if cfg.tie_word_embeddings else lm_head, jnp.float32)


def lm_logits(cfg: ModelConfig, params: dict, hidden: jax.Array) -> jax.Array:
    """Float32 logits [..., V] from final hidden states [..., D] (the tied embedding or lm_head)."""
    return _head_logits(cfg, params["embed"], params.get("lm_head"), hidden)


def _sharded_logits(cfg: ModelConfig, params: dict, hidden: jax.Array, rules: ShardingRules) -> jax.Array:
    """`lm_logits` [B, T, V] laid out by `rules`."""
    return constrain(lm_logits(cfg, params, hidden), ("batch", "length", "vocab"), rules)


def apply(cfg: ModelConfig, params: dict, tokens: jax.Array, *, compute: Compute) -> jax.Array:
    """Logits [B, T, V] of unpadded sequences at positions 0 .. T-1 (a forward pass only: no remat)."""
    B, T = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    return forward(cfg, params, tokens, positions, jnp.ones((B, T), bool), compute=compute, remat=False)[0]


def _next_token_logprobs(logits: jax.Array, targets: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(log p(targets), entropy), both [B, T] fp32, of the distributions softmax(logits [B, T, V]).

    As logit - logsumexp: no log-softmax tensor [B, T, V] is made (or differentiated)."""
    logits = logits.astype(jnp.float32)
    lse = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0] - lse
    entropy = lse - jnp.sum(jnp.exp(logits - lse[..., None]) * logits, axis=-1)
    return picked, entropy


def _after_first(x: jax.Array) -> jax.Array:
    """x [B, T - 1] as [B, T], aligned to the tokens: index 0 (no prefix to predict it from) holds 0."""
    return jnp.concatenate([jnp.zeros_like(x[:, :1]), x], axis=1)


def logprobs_from_logits(logits: jax.Array, tokens: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(log p(tokens[:, t] | logits[:, t-1]), entropy of that distribution), both [B, T] fp32, index 0 = 0."""
    return tuple(map(_after_first, _next_token_logprobs(logits[:, :-1], tokens[:, 1:])))


def token_logprobs(cfg: ModelConfig, params: dict, tokens: jax.Array, positions: jax.Array, mask: jax.Array,
                   *, with_entropy: bool = False, temperature: float | jax.Array, compute: Compute,
                   remat: bool, logits_chunk: int, segments: Segments | None = None):
    """Per-token log-probabilities [B, T] (index t+1 holds log p(tokens[:, t+1] | prefix), index 0 = 0) of
    the model's distribution at `temperature` (logits / temperature; `SamplingParams.temperature`), computed
    as `compute` says (layout, attention), with `remat` and `logits_chunk` as `RLConfig` sets them.

    With `with_entropy`, returns (logprobs, entropy) in the same alignment. The head runs on the hidden states
    that predict a token (all but the last position), so no logits are computed that nothing reads. With
    `logits_chunk`, it runs on that many positions at a time (`_chunked_next_token_logprobs`). Packed rows
    (`segments`, see `forward`) give each sequence's first token a log-probability from the previous
    sequence's last position: the caller masks it.
    """
    hidden = backbone(cfg, params, tokens, positions, mask, compute=compute, remat=remat,
                      segments=segments)[0][:, :-1]

    def head(hidden: jax.Array, targets: jax.Array) -> tuple[jax.Array, jax.Array]:
        logits = _sharded_logits(cfg, params, hidden, compute.rules)
        return _next_token_logprobs(logits / temperature, targets)

    if 0 < logits_chunk < hidden.shape[1]:
        logprobs, entropy = _chunked_next_token_logprobs(head, hidden, tokens[:, 1:], logits_chunk)
    else:
        logprobs, entropy = head(hidden, tokens[:, 1:])
    logprobs, entropy = _after_first(logprobs), _after_first(entropy)
    return (logprobs, entropy) if with_entropy else logprobs


def _chunked_next_token_logprobs(head: Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array]],
                                 hidden: jax.Array, targets: jax.Array, chunk: int
                                 ) -> tuple[jax.Array, jax.Array]:
    """`head(hidden, targets)` ([B, T, D], [B, T] -> two [B, T]) on `chunk` positions at a time, each chunk's
    logits recomputed in the backward pass: the float32 logits of one chunk, [B, chunk, V], are all that
    lives at once, not [B, T, V] (38.7 GiB for 8 rows of 8,547 tokens over Qwen's vocabulary of 151,936)."""
    B, T = targets.shape
    pad = -T % chunk
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))

    def by_chunk(x: jax.Array) -> jax.Array:  # [B, n * chunk, ...] -> [n, B, chunk, ...]
        return jnp.moveaxis(x.reshape(B, -1, chunk, *x.shape[2:]), 1, 0)

    out = jax.lax.map(jax.checkpoint(lambda xs: head(*xs)), (by_chunk(hidden), by_chunk(targets)))
    return tuple(jnp.moveaxis(x, 0, 1).reshape(B, -1)[:, :T] for x in out)


def values(cfg: ModelConfig, params: dict, tokens: jax.Array, positions: jax.Array, mask: jax.Array,
           *, compute: Compute, remat: bool, segments: Segments | None = None) -> jax.Array:
    """Value estimates [B, T] fp32 from value-model params (see `value_params_from_policy`); `segments`
    as in `forward`."""
    return Decoder(cfg, compute, value=True, remat=remat).apply(
        {"params": params}, tokens, positions, mask, segments, method=Decoder.head)
