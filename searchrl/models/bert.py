"""BERT-family encoder (BERT, MiniLM, e5, bge) and cross-encoder (BertForSequenceClassification) as a Flax
linen module, used pure-functionally as the decoder is: `encode` and `classify` apply `Bert` to a plain-dict
params pytree.

`param_table` declares every param once (shape, logical axes, initialiser, HF tensor): `Bert` declares its
params from it and `models.hf.load_bert` reads a checkpoint by it. Layers are stacked on a leading axis and
run with `nn.scan`. Compute runs in the params' dtype; layer norms, softmax and the classifier's logits are
float32.
"""
from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from searchrl.models import layout
from searchrl.models.config import BertConfig
from searchrl.models.layout import (HEADS, HEADS_IN, HEADS_OUT, TRANSPOSED, ParamSpec, Table, normal, ones,
                                   zeros)


def param_table(cfg: BertConfig, *, classifier: bool = False) -> Table:
    """Every param of the encoder (`classifier=True`: and of the cross-encoder's pooler and classifier): its
    shape, logical axes, initialiser and the name BertModel gives its HF tensor (`hf_name` reads other
    checkpoints' names as these)."""
    D, F, H, hd = cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.head_dim
    q_axes, o_axes = ("embed", "heads", "head_dim"), ("heads", "head_dim", "embed")
    layer = {}
    for name, hf in (("q", "query"), ("k", "key"), ("v", "value")):
        layer[name] = ParamSpec((D, H, hd), q_axes, normal, f"attention.self.{hf}.weight", HEADS_IN)
        layer[f"{name}_bias"] = ParamSpec((H, hd), q_axes[1:], zeros, f"attention.self.{hf}.bias", HEADS)
    layer |= {
        "o": ParamSpec((H, hd, D), o_axes, normal, "attention.output.dense.weight", HEADS_OUT),
        "o_bias": ParamSpec((D,), (None,), zeros, "attention.output.dense.bias"),
        "attn_norm": ParamSpec((D,), (None,), ones, "attention.output.LayerNorm.weight"),
        "attn_norm_bias": ParamSpec((D,), (None,), zeros, "attention.output.LayerNorm.bias"),
        "up": ParamSpec((D, F), ("embed", "mlp"), normal, "intermediate.dense.weight", TRANSPOSED),
        "up_bias": ParamSpec((F,), ("mlp",), zeros, "intermediate.dense.bias"),
        "down": ParamSpec((F, D), ("mlp", "embed"), normal, "output.dense.weight", TRANSPOSED),
        "down_bias": ParamSpec((D,), (None,), zeros, "output.dense.bias"),
        "mlp_norm": ParamSpec((D,), (None,), ones, "output.LayerNorm.weight"),
        "mlp_norm_bias": ParamSpec((D,), (None,), zeros, "output.LayerNorm.bias"),
    }
    table = {
        ("word_embeddings",): ParamSpec((cfg.vocab_size, D), ("vocab", "embed"), normal,
                                        "embeddings.word_embeddings.weight"),
        ("position_embeddings",): ParamSpec((cfg.max_position_embeddings, D), (None, "embed"), normal,
                                            "embeddings.position_embeddings.weight"),
        ("token_type_embeddings",): ParamSpec((cfg.type_vocab_size, D), (None, "embed"), normal,
                                              "embeddings.token_type_embeddings.weight"),
        ("embed_norm",): ParamSpec((D,), (None,), ones, "embeddings.LayerNorm.weight"),
        ("embed_norm_bias",): ParamSpec((D,), (None,), zeros, "embeddings.LayerNorm.bias"),
        **layout.stack(layer, cfg.num_layers, "encoder.layer.{}."),
    }
    if classifier:
        table |= {
            ("pooler",): ParamSpec((D, D), ("embed", None), normal, "pooler.dense.weight", TRANSPOSED),
            ("pooler_bias",): ParamSpec((D,), (None,), zeros, "pooler.dense.bias"),
            ("classifier",): ParamSpec((D, cfg.num_labels), ("embed", None), normal, "classifier.weight",
                                       TRANSPOSED),
            ("classifier_bias",): ParamSpec((cfg.num_labels,), (None,), zeros, "classifier.bias"),
        }
    return table


def hf_name(stored: str) -> str:
    """The `param_table` name of a tensor as a checkpoint stores it: without the `bert.` prefix of BertFor*
    models, legacy LayerNorm gamma/beta read as weight/bias."""
    return (stored.removeprefix("bert.").replace("LayerNorm.gamma", "LayerNorm.weight")
            .replace("LayerNorm.beta", "LayerNorm.bias"))


def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array, eps: float) -> jax.Array:
    """LayerNorm computed in float32, returned in x's dtype."""
    x32 = x.astype(jnp.float32)
    centred = x32 - jnp.mean(x32, axis=-1, keepdims=True)
    y = centred * jax.lax.rsqrt(jnp.mean(centred * centred, axis=-1, keepdims=True) + eps)
    return (y * scale.astype(jnp.float32) + bias.astype(jnp.float32)).astype(x.dtype)


def _linear(x: jax.Array, w: jax.Array, b: jax.Array, contract: int = 1) -> jax.Array:
    """x's last `contract` axes times w's first ones, plus b."""
    return jnp.tensordot(x, w, axes=contract) + b


def _activation(x: jax.Array, name: str) -> jax.Array:
    """HF's `hidden_act` `name` (one of `BERT_ACTIVATIONS`): erf GELU, its tanh approximation or ReLU."""
    return jax.nn.relu(x) if name == "relu" else jax.nn.gelu(x, approximate=name != "gelu")


def _attention(cfg: BertConfig, lp: dict, x: jax.Array, attn_bias: jax.Array) -> jax.Array:
    """Bidirectional multi-head self-attention; `attn_bias` [B, 1, 1, T] keeps padded keys out."""
    q, k, v = (_linear(x, lp[name], lp[f"{name}_bias"]) for name in "qkv")  # [B, T, H, hd]
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
    scores = scores / math.sqrt(cfg.head_dim)
    probs = jax.nn.softmax(scores + attn_bias, axis=-1).astype(v.dtype)
    return _linear(jnp.einsum("bhqk,bkhd->bqhd", probs, v), lp["o"], lp["o_bias"], contract=2)


class BertLayer(nn.Module):
    """One post-LayerNorm block: self-attention, add & norm, MLP, add & norm."""

    cfg: BertConfig
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, attn_bias: jax.Array) -> tuple[jax.Array, None]:
        cfg = self.cfg
        lp = layout.declare(self, param_table(cfg), ("layers",))
        x = layer_norm(x + _attention(cfg, lp, x, attn_bias), lp["attn_norm"], lp["attn_norm_bias"],
                       cfg.layer_norm_eps)
        h = _activation(_linear(x, lp["up"], lp["up_bias"]), cfg.hidden_act)
        x = layer_norm(x + _linear(h, lp["down"], lp["down_bias"]), lp["mlp_norm"], lp["mlp_norm_bias"],
                       cfg.layer_norm_eps)
        return x, None


class Bert(nn.Module):
    """The encoder: `__call__` gives the last hidden states. `classifier=True` is the cross-encoder, whose
    `classify` puts the pooler (dense + tanh on [CLS]) and the classifier on them."""

    cfg: BertConfig
    classifier: bool = False
    param_dtype: Any = jnp.float32

    def setup(self):
        self.top = layout.declare(self, param_table(self.cfg, classifier=self.classifier))
        stack = nn.scan(BertLayer, variable_axes={"params": 0}, split_rngs={"params": True},
                        in_axes=nn.broadcast, length=self.cfg.num_layers,
                        metadata_params={nn.PARTITION_NAME: "layers"})
        self.layers = stack(self.cfg, self.param_dtype)

    def __call__(self, input_ids: jax.Array, token_type_ids: jax.Array, attention_mask: jax.Array
                 ) -> jax.Array:
        """Hidden states [B, T, D] of the last layer; int inputs [B, T], attention_mask 0 on padding."""
        p = self.top
        x = (jnp.take(p["word_embeddings"], input_ids, axis=0) + p["position_embeddings"][:input_ids.shape[1]]
             + jnp.take(p["token_type_embeddings"], token_type_ids, axis=0))
        x = layer_norm(x, p["embed_norm"], p["embed_norm_bias"], self.cfg.layer_norm_eps)
        # Padded keys get the most negative float: softmax gives them exactly zero weight.
        attn_bias = jnp.where(attention_mask[:, None, None, :] > 0, 0.0, jnp.finfo(jnp.float32).min)
        return self.layers(x, attn_bias)[0]

    def classify(self, hidden: jax.Array) -> jax.Array:
        """Float32 logits [B, num_labels] from the hidden states [B, T, D]."""
        p = self.top
        pooled = jnp.tanh(_linear(hidden[:, 0], p["pooler"], p["pooler_bias"]))
        return _linear(pooled, p["classifier"], p["classifier_bias"]).astype(jnp.float32)

    def head(self, input_ids: jax.Array, token_type_ids: jax.Array, attention_mask: jax.Array) -> jax.Array:
        """The cross-encoder's logits, or the encoder's hidden states: what `Bert.init` runs, so that every
        param exists."""
        hidden = self(input_ids, token_type_ids, attention_mask)
        return self.classify(hidden) if self.classifier else hidden


def encode(cfg: BertConfig, params: dict, input_ids: jax.Array, token_type_ids: jax.Array,
           attention_mask: jax.Array) -> jax.Array:
    """Last hidden states [B, T, D] of the encoder (in the params' dtype)."""
    return Bert(cfg).apply({"params": params}, input_ids, token_type_ids, attention_mask)


def classify(cfg: BertConfig, params: dict, input_ids: jax.Array, token_type_ids: jax.Array,
             attention_mask: jax.Array) -> jax.Array:
    """The cross-encoder's float32 logits [B, num_labels] of (query, passage) pairs."""
    return Bert(cfg, classifier=True).apply({"params": params}, input_ids, token_type_ids, attention_mask,
                                            method=Bert.head)
