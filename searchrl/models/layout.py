"""The parameter layout of the decoder: every leaf's shape and logical axis names, in one place.

Layers are stacked on a leading axis so the forward pass can `lax.scan` over them. Initialisation, sharding
and the HF import/export all read this table rather than restating shapes.
"""
from __future__ import annotations

from typing import NamedTuple

from searchrl.models.config import ModelConfig


class ParamSpec(NamedTuple):
    """Shape of one parameter and the logical name of each of its axes (None: never sharded)."""

    shape: tuple[int, ...]
    axes: tuple[str | None, ...]


def param_layout(cfg: ModelConfig, *, value: bool = False) -> dict:
    """Pytree of `ParamSpec` mirroring the params; `value=True`: the value model (value head, no lm_head)."""
    L, D, F, V = cfg.num_layers, cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    H, KV, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    layers = {
        "attn_norm": ParamSpec((L, D), ("layers", None)),
        "q": ParamSpec((L, D, H, hd), ("layers", "embed", "heads", "head_dim")),
        "k": ParamSpec((L, D, KV, hd), ("layers", "embed", "kv_heads", "head_dim")),
        "v": ParamSpec((L, D, KV, hd), ("layers", "embed", "kv_heads", "head_dim")),
        "o": ParamSpec((L, H, hd, D), ("layers", "heads", "head_dim", "embed")),
        "mlp_norm": ParamSpec((L, D), ("layers", None)),
        "gate": ParamSpec((L, D, F), ("layers", "embed", "mlp")),
        "up": ParamSpec((L, D, F), ("layers", "embed", "mlp")),
        "down": ParamSpec((L, F, D), ("layers", "mlp", "embed")),
    }
    if cfg.attention_bias:
        layers["q_bias"] = ParamSpec((L, H, hd), ("layers", "heads", "head_dim"))
        layers["k_bias"] = ParamSpec((L, KV, hd), ("layers", "kv_heads", "head_dim"))
        layers["v_bias"] = ParamSpec((L, KV, hd), ("layers", "kv_heads", "head_dim"))
    if cfg.o_bias:
        layers["o_bias"] = ParamSpec((L, D), ("layers", None))
    if cfg.qk_norm:
        layers["q_norm"] = ParamSpec((L, hd), ("layers", None))
        layers["k_norm"] = ParamSpec((L, hd), ("layers", None))
    layout = {
        "embed": ParamSpec((V, D), ("vocab", "embed")),
        "layers": layers,
        "final_norm": ParamSpec((D,), (None,)),
    }
    if value:
        layout["value_head"] = {"kernel": ParamSpec((D,), ("embed",)), "bias": ParamSpec((), ())}
    elif not cfg.tie_word_embeddings:
        layout["lm_head"] = ParamSpec((D, V), ("embed", "vocab"))
    return layout
