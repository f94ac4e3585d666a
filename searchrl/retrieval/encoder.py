"""BERT-family text encoder (BERT, MiniLM, e5, bge) in Flax, loaded from a Hugging Face directory.

One BERT implementation serves dense retrieval (`DenseEncoder`, pooled sentence embeddings) and reranking
(`searchrl.retrieval.rerank`, which adds the pooler and classifier on top of `Bert`). Inputs are padded to a
few length buckets with a fixed batch size, so a corpus encodes with at most one compiled program per bucket.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import threading
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

Params = dict[str, Any]
Features = Mapping[str, Sequence[Sequence[int]]]

_LENGTH_BUCKETS = (16, 32, 64, 128, 256, 512)
_ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
    "gelu_new": functools.partial(jax.nn.gelu, approximate=True),
    "gelu_pytorch_tanh": functools.partial(jax.nn.gelu, approximate=True),
    "relu": jax.nn.relu,
}
_POOLINGS = ("mean", "cls")

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """The fields of a Hugging Face BERT config.json that the forward pass needs (hashable: a jit static)."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"

    @classmethod
    def from_json(cls, path: str | Path) -> "BertConfig":
        """Reads config.json, rejecting model types and options this implementation does not cover."""
        raw = json.loads(Path(path).read_text())
        if raw.get("model_type", "bert") != "bert":
            raise ValueError(f"{path}: model_type {raw['model_type']!r} is not 'bert'")
        if raw.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"{path}: position_embedding_type {raw['position_embedding_type']!r} is not "
                             "'absolute'")
        if raw.get("hidden_act", "gelu") not in _ACTIVATIONS:
            raise ValueError(f"{path}: hidden_act {raw['hidden_act']!r} not in {sorted(_ACTIVATIONS)}")
        fields = {f.name for f in dataclasses.fields(cls)}
        missing = {f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING} - set(raw)
        if missing:
            raise ValueError(f"{path}: missing fields {sorted(missing)}")
        config = cls(**{k: v for k, v in raw.items() if k in fields})
        if config.hidden_size % config.num_attention_heads:
            raise ValueError(f"{path}: hidden_size {config.hidden_size} is not divisible by "
                             f"num_attention_heads {config.num_attention_heads}")
        return config


# ----------------------------------------------------------------------------------------------- model


class BertLayer(nn.Module):
    """One post-LayerNorm transformer layer: self-attention, add & norm, MLP, add & norm."""

    config: BertConfig
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, attn_bias: jax.Array) -> jax.Array:
        cfg = self.config
        dense = functools.partial(nn.Dense, dtype=self.dtype)
        norm = functools.partial(nn.LayerNorm, epsilon=cfg.layer_norm_eps, dtype=self.dtype)
        batch, length, _ = x.shape
        head_dim = cfg.hidden_size // cfg.num_attention_heads

        def heads(name: str) -> jax.Array:
            y = dense(cfg.hidden_size, name=name)(x)
            return y.reshape(batch, length, cfg.num_attention_heads, head_dim)

        q, k, v = heads("query"), heads("key"), heads("value")
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / math.sqrt(head_dim) + attn_bias
        probs = jax.nn.softmax(logits, axis=-1).astype(self.dtype)
        context = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(batch, length, cfg.hidden_size)
        x = norm(name="attention_norm")(x + dense(cfg.hidden_size, name="attention_output")(context))
        h = _ACTIVATIONS[cfg.hidden_act](dense(cfg.intermediate_size, name="intermediate")(x))
        return norm(name="output_norm")(x + dense(cfg.hidden_size, name="output")(h))


class Bert(nn.Module):
    """BERT encoder: word + position + token-type embeddings, LayerNorm, N layers -> last hidden states."""

    config: BertConfig
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, input_ids: jax.Array, token_type_ids: jax.Array,
                 attention_mask: jax.Array) -> jax.Array:
        cfg = self.config
        embed = functools.partial(nn.Embed, features=cfg.hidden_size, dtype=self.dtype)
        positions = jnp.arange(input_ids.shape[1])[None, :]
        x = (embed(cfg.vocab_size, name="word_embeddings")(input_ids)
             + embed(cfg.max_position_embeddings, name="position_embeddings")(positions)
             + embed(cfg.type_vocab_size, name="token_type_embeddings")(token_type_ids))
        x = nn.LayerNorm(epsilon=cfg.layer_norm_eps, dtype=self.dtype, name="embeddings_norm")(x)
        # Padded keys get the most negative float: softmax gives them exactly zero weight.
        attn_bias = jnp.where(attention_mask[:, None, None, :] > 0, 0.0, jnp.finfo(jnp.float32).min)
        for i in range(cfg.num_hidden_layers):
            x = BertLayer(cfg, self.dtype, name=f"layer_{i}")(x, attn_bias)
        return x


# ------------------------------------------------------------------------------------ weight loading


def load_state_dict(path: str | Path) -> dict[str, np.ndarray]:
    """Reads a Hugging Face checkpoint as float32 numpy arrays, with the `bert.` prefix and legacy
    LayerNorm gamma/beta names normalised away (BertModel and BertFor* checkpoints look alike)."""
    path = Path(path)
    if (path / "model.safetensors").exists():
        from safetensors.numpy import load_file
        raw = load_file(path / "model.safetensors")
    elif (path / "pytorch_model.bin").exists():
        try:
            import torch
        except ImportError:
            raise ImportError(f"{path}/pytorch_model.bin: reading it needs torch; or convert it to "
                              "model.safetensors") from None
        raw = {k: v.float().numpy() for k, v in
               torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True).items()}
    else:
        raise FileNotFoundError(f"{path}: neither model.safetensors nor pytorch_model.bin")
    state = {}
    for key, value in raw.items():
        key = key.removeprefix("bert.")
        key = key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        state[key] = np.asarray(value, dtype=np.float32)
    return state


def _tensor(state: Mapping[str, np.ndarray], key: str) -> np.ndarray:
    if key not in state:
        raise KeyError(f"checkpoint has no tensor {key!r}")
    return state[key]


def dense_params(state: Mapping[str, np.ndarray], name: str) -> Params:
    """A torch Linear ([out, in] weight) as a flax Dense ([in, out] kernel)."""
    return {"kernel": _tensor(state, f"{name}.weight").T, "bias": _tensor(state, f"{name}.bias")}


def _norm_params(state: Mapping[str, np.ndarray], name: str) -> Params:
    return {"scale": _tensor(state, f"{name}.weight"), "bias": _tensor(state, f"{name}.bias")}


def bert_params(state: Mapping[str, np.ndarray], config: BertConfig) -> Params:
    """Maps a (prefix-free) Hugging Face BERT state dict onto the `Bert` parameter tree."""
    params: Params = {
        name: {"embedding": _tensor(state, f"embeddings.{name}.weight")}
        for name in ("word_embeddings", "position_embeddings", "token_type_embeddings")
    }
    params["embeddings_norm"] = _norm_params(state, "embeddings.LayerNorm")
    for i in range(config.num_hidden_layers):
        pre = f"encoder.layer.{i}"
        params[f"layer_{i}"] = {
            "query": dense_params(state, f"{pre}.attention.self.query"),
            "key": dense_params(state, f"{pre}.attention.self.key"),
            "value": dense_params(state, f"{pre}.attention.self.value"),
            "attention_output": dense_params(state, f"{pre}.attention.output.dense"),
            "attention_norm": _norm_params(state, f"{pre}.attention.output.LayerNorm"),
            "intermediate": dense_params(state, f"{pre}.intermediate.dense"),
            "output": dense_params(state, f"{pre}.output.dense"),
            "output_norm": _norm_params(state, f"{pre}.output.LayerNorm"),
        }
    return params


def check_params(module: nn.Module, params: Params, where: str) -> None:
    """Raises if `params` does not have exactly the tree and shapes `module` expects."""
    ids = jnp.zeros((1, 1), jnp.int32)
    expected = jax.eval_shape(module.init, jax.random.key(0), ids, ids, ids)["params"]
    want = {jax.tree_util.keystr(p): x.shape for p, x in jax.tree_util.tree_leaves_with_path(expected)}
    got = {jax.tree_util.keystr(p): x.shape for p, x in jax.tree_util.tree_leaves_with_path(params)}
    for name in sorted(set(want) | set(got)):
        if want.get(name) != got.get(name):
            raise ValueError(f"{where}: parameter {name} has shape {got.get(name)}, "
                             f"expected {want.get(name)}")


def check_sizes(config: BertConfig, max_length: int, batch_size: int) -> None:
    """Raises unless 0 < max_length <= max_position_embeddings and batch_size > 0."""
    if not 0 < max_length <= config.max_position_embeddings:
        raise ValueError(f"max_length {max_length} outside (0, max_position_embeddings="
                         f"{config.max_position_embeddings}]")
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")


def resolve_dtype(dtype: str | None) -> str:
    """None -> bfloat16 on accelerators, float32 on CPU."""
    if dtype is None:
        return "float32" if jax.default_backend() == "cpu" else "bfloat16"
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"dtype {dtype!r} not in ('float32', 'bfloat16', 'float16')")
    return dtype


# ------------------------------------------------------------------------------- batching by buckets


def length_buckets(max_length: int) -> tuple[int, ...]:
    """Padded lengths used for inputs of at most `max_length` tokens (the last bucket is max_length)."""
    return tuple(b for b in _LENGTH_BUCKETS if b < max_length) + (max_length,)


def padded_batches(features: Features, batch_size: int, buckets: Sequence[int],
                   pad_id: int) -> Iterator[tuple[np.ndarray, dict[str, np.ndarray]]]:
    """Yields (row indices, padded int32 arrays [batch_size, bucket]) over inputs sorted by length.

    Sorting keeps padding small; the final short batch is filled with empty rows so every call has the
    same batch size. Rows whose index is past the end are padding and must be dropped by the caller.
    """
    ids, types = features["input_ids"], features["token_type_ids"]
    order = np.argsort([len(x) for x in ids], kind="stable")
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        longest = max(len(ids[r]) for r in rows)
        length = next(b for b in buckets if b >= longest)
        batch = {
            "input_ids": np.full((batch_size, length), pad_id, np.int32),
            "token_type_ids": np.zeros((batch_size, length), np.int32),
            "attention_mask": np.zeros((batch_size, length), np.int32),
        }
        for j, r in enumerate(rows):
            n = len(ids[r])
            batch["input_ids"][j, :n] = ids[r]
            batch["token_type_ids"][j, :n] = types[r]
            batch["attention_mask"][j, :n] = 1
        yield rows, batch


def run_batched(fn: Callable[[dict[str, np.ndarray]], jax.Array], features: Features, batch_size: int,
                buckets: Sequence[int], pad_id: int) -> np.ndarray:
    """Applies `fn` (padded batch -> per-row outputs) to every input; returns outputs in input order."""
    if not features["input_ids"]:
        raise ValueError("run_batched: no inputs")
    out: np.ndarray | None = None
    for rows, batch in padded_batches(features, batch_size, buckets, pad_id):
        result = np.asarray(fn(batch), dtype=np.float32)[:len(rows)]
        if out is None:
            out = np.empty((len(features["input_ids"]),) + result.shape[1:], np.float32)
        out[rows] = result
    return out


# ------------------------------------------------------------------------------------- dense encoder


@functools.partial(jax.jit, static_argnames=("config", "dtype", "pooling", "normalize"))
def _embed(params: Params, batch: dict[str, jax.Array], *, config: BertConfig, dtype: str, pooling: str,
           normalize: bool) -> jax.Array:
    """Pooled float32 embeddings [B, D] of a padded batch."""
    mask = batch["attention_mask"]
    log.info("compiling the dense encoder for input shape %s", mask.shape)  # runs once per traced shape
    hidden = Bert(config, jnp.dtype(dtype)).apply(
        {"params": params}, batch["input_ids"], batch["token_type_ids"], mask).astype(jnp.float32)
    if pooling == "cls":
        pooled = hidden[:, 0]
    else:
        weights = mask[:, :, None].astype(jnp.float32)
        pooled = (hidden * weights).sum(axis=1) / jnp.maximum(weights.sum(axis=1), 1e-9)
    if normalize:
        pooled = pooled / jnp.maximum(jnp.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)
    return pooled


def check_texts(texts: Sequence[str], where: str) -> list[str]:
    """Returns `texts` as a list, raising on any element that is not a string."""
    if isinstance(texts, str):
        raise TypeError(f"{where}: expected a sequence of strings, got one string")
    texts = list(texts)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"{where}: item {i} is {type(text).__name__}, not str")
    return texts


class DenseEncoder:
    """Sentence embeddings from a BERT-family model: mean or CLS pooling, optional L2 normalisation,
    query/passage prefixes (e5 uses "query: " / "passage: ")."""

    def __init__(self, params: Params, config: BertConfig, tokenizer: Any, *, path: str = "",
                 pooling: str = "mean", normalize: bool = True, query_prefix: str = "",
                 passage_prefix: str = "", max_length: int = 256, batch_size: int = 64,
                 dtype: str | None = None):
        if pooling not in _POOLINGS:
            raise ValueError(f"pooling {pooling!r} not in {_POOLINGS}")
        check_sizes(config, max_length, batch_size)
        self.config, self.tokenizer, self.path = config, tokenizer, path
        self._tokenizer_lock = threading.Lock()
        self.pooling, self.normalize = pooling, normalize
        self.query_prefix, self.passage_prefix = query_prefix, passage_prefix
        self.max_length, self.batch_size = max_length, batch_size
        self.dtype = resolve_dtype(dtype)
        self.params = jax.device_put(params)
        self._embed = functools.partial(_embed, self.params, config=config, dtype=self.dtype,
                                        pooling=pooling, normalize=normalize)

    @classmethod
    def from_pretrained(cls, path: str | Path, pooling: str = "mean", normalize: bool = True,
                        query_prefix: str = "", passage_prefix: str = "", max_length: int = 256,
                        batch_size: int = 64, dtype: str | None = None) -> "DenseEncoder":
        """Loads config.json, the weights and the tokenizer from a local Hugging Face directory.
        `max_length` (tokens, special ones included) is capped at the model's max_position_embeddings."""
        from transformers import AutoTokenizer
        path = Path(path)
        config = BertConfig.from_json(path / "config.json")
        params = bert_params(load_state_dict(path), config)
        check_params(Bert(config), params, str(path))
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        return cls(params, config, tokenizer, path=str(path.resolve()), pooling=pooling, normalize=normalize,
                   query_prefix=query_prefix, passage_prefix=passage_prefix,
                   max_length=min(max_length, config.max_position_embeddings), batch_size=batch_size,
                   dtype=dtype)

    @property
    def dim(self) -> int:
        return self.config.hidden_size

    def settings(self) -> dict[str, Any]:
        """The `from_pretrained` arguments that rebuild this encoder; dtype is left to the loading backend."""
        return {"path": self.path, "pooling": self.pooling, "normalize": self.normalize,
                "query_prefix": self.query_prefix, "passage_prefix": self.passage_prefix,
                "max_length": self.max_length, "batch_size": self.batch_size}

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Embeds texts as they are (no prefix): float32 [N, D]."""
        texts = check_texts(texts, "DenseEncoder.encode")
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        with self._tokenizer_lock:  # fast tokenizers fail when one instance is used from two threads
            features = self.tokenizer(texts, truncation=True, max_length=self.max_length,
                                      return_attention_mask=False, return_token_type_ids=True)
        return run_batched(self._embed, features, self.batch_size, length_buckets(self.max_length),
                           self.tokenizer.pad_token_id or 0)

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self.encode([self.query_prefix + t for t in check_texts(texts, "encode_queries")])

    def encode_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self.encode([self.passage_prefix + t for t in check_texts(texts, "encode_passages")])
