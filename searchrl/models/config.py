"""Model hyper-parameters: the decoder's `ModelConfig` with its published presets and the BERT encoder's
`BertConfig`, each with its Hugging Face config.json mapping.

Both are frozen and hashable so they can be static arguments of `jax.jit`.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Callable

from searchrl import cli
from searchrl.configlib import check_ranges, group, ranged
from searchrl.model_families import FAMILIES

VALUE_SUFFIX = "ForTokenClassification"  # a value model's architecture: transformers' head with num_labels=1


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Llama-3 frequency scaling of RoPE (HF `rope_type: "llama3"`)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int
    rope_type: str = "llama3"

    def __post_init__(self):
        if self.rope_type != "llama3":
            raise ValueError(f"rope_scaling.rope_type {self.rope_type!r} is not supported (only 'llama3')")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture of a decoder of a family in `searchrl.model_families.FAMILIES` (Qwen2/Qwen2.5, Qwen3,
    Llama-3, Mistral).

    `sliding_window` (Mistral's; HF `sliding_window`): a query sees only the keys less than this many
    positions behind it. searchrl's attention has no window: a forward pass is exact while it holds at most
    this many key slots (a row's length, or the KV cache's size), and `Decoder` raises beyond that rather
    than attend to keys Mistral would not see. Mistral-7B-v0.1's window is 4096; v0.2 and later have none
    (None).
    """

    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10_000.0
    rope_scaling: RopeScaling | None = None
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v biases (and o's, where the family's `o_bias`)
    qk_norm: bool = False  # RMSNorm of each query/key head before RoPE
    max_position_embeddings: int = 32768
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None
    sliding_window: int | None = None

    def __post_init__(self):
        FAMILIES.get(self.family)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} is not a multiple of "
                             f"num_kv_heads={self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window={self.sliding_window} must be >= 1 (or None: no window)")
        if isinstance(self.eos_token_id, list):
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))

    @property
    def o_bias(self) -> bool:
        """Whether the attention output projection has a bias: with q/k/v's, where the family has one."""
        return self.attention_bias and FAMILIES.get(self.family).o_bias


def _qwen2p5(hidden: int, inter: int, layers: int, heads: int, kv: int, vocab: int = 151936,
             tied: bool = True) -> ModelConfig:
    # Values of the Qwen2.5-*-Instruct config.json files.
    return ModelConfig("qwen2", vocab, hidden, inter, layers, heads, kv, hidden // heads, rope_theta=1e6,
                       rms_norm_eps=1e-6, tie_word_embeddings=tied, attention_bias=True,
                       max_position_embeddings=32768, bos_token_id=151643, eos_token_id=151645)


def _qwen3(hidden: int, inter: int, layers: int, heads: int, tied: bool = True) -> ModelConfig:
    # Values of the Qwen3-* config.json files (8 KV heads of 128 everywhere).
    return ModelConfig("qwen3", 151936, hidden, inter, layers, heads, 8, 128, rope_theta=1e6,
                       rms_norm_eps=1e-6, tie_word_embeddings=tied, qk_norm=True,
                       max_position_embeddings=40960, bos_token_id=151643, eos_token_id=151645)


def _llama3p2(hidden: int, layers: int, heads: int, head_dim: int) -> ModelConfig:
    # Values of the Llama-3.2-*-Instruct config.json files.
    return ModelConfig("llama", 128256, hidden, 8192, layers, heads, 8, head_dim, rope_theta=500_000.0,
                       rope_scaling=RopeScaling(32.0, 1.0, 4.0, 8192), rms_norm_eps=1e-5,
                       tie_word_embeddings=True, max_position_embeddings=131072, bos_token_id=128000,
                       eos_token_id=(128001, 128008, 128009))


def _mistral7b(vocab: int, theta: float, window: int | None) -> ModelConfig:
    # Values of the Mistral-7B-v0.1 / -v0.3 config.json files.
    return ModelConfig("mistral", vocab, 4096, 14336, 32, 32, 8, 128, rope_theta=theta, rms_norm_eps=1e-5,
                       max_position_embeddings=32768, bos_token_id=1, eos_token_id=2, sliding_window=window)


PRESETS: dict[str, ModelConfig] = {
    "qwen2p5_0p5b": _qwen2p5(896, 4864, 24, 14, 2),
    "qwen2p5_1p5b": _qwen2p5(1536, 8960, 28, 12, 2),
    "qwen2p5_3b": _qwen2p5(2048, 11008, 36, 16, 2),
    "qwen2p5_7b": _qwen2p5(3584, 18944, 28, 28, 4, vocab=152064, tied=False),
    "qwen3_0p6b": _qwen3(1024, 3072, 28, 16),
    "qwen3_1p7b": _qwen3(2048, 6144, 28, 16),
    "qwen3_4b": _qwen3(2560, 9728, 36, 32),
    "qwen3_8b": _qwen3(4096, 12288, 36, 32, tied=False),
    "llama3p2_1b": _llama3p2(2048, 16, 32, 64),
    "llama3p2_3b": _llama3p2(3072, 28, 24, 128),
    "mistral_7b_v0p1": _mistral7b(32000, 10_000.0, 4096),
    "mistral_7b_v0p3": _mistral7b(32768, 1e6, None),  # also the Instruct-v0.3 model
    # ~150K parameters: CPU unit tests.
    "tiny": ModelConfig("qwen3", 512, 64, 256, 2, 4, 2, 16, rope_theta=10_000.0, tie_word_embeddings=True,
                        qk_norm=True, max_position_embeddings=2048, bos_token_id=1, eos_token_id=2,
                        pad_token_id=0),
    # ~65M parameters: benchmarks.
    "bench_small": ModelConfig("qwen3", 32000, 640, 1792, 10, 10, 2, 64, rope_theta=1e6,
                               tie_word_embeddings=True, qk_norm=True, max_position_embeddings=4096,
                               bos_token_id=1, eos_token_id=2, pad_token_id=0),
}


def get_preset(name: str) -> ModelConfig:
    """The preset called `name`; unknown names raise a ValueError listing the known ones."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; known presets: {', '.join(sorted(PRESETS))}")
    return PRESETS[name]


_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")


def _require(hf: dict[str, Any], fields: tuple[str, ...]) -> None:
    """Raises unless every field is set."""
    for field in fields:
        if hf.get(field) is None:
            raise ValueError(f"config is missing required field {field!r}")


def _family(hf: dict[str, Any]) -> str:
    """The family of a config.json: by its first architecture, else by its model_type; a value model
    (`<Arch>ForTokenClassification`, see `hf.save_hf(value=True)`) has its causal LM's."""
    archs = hf.get("architectures") or []
    if archs:
        names = {FAMILIES.get(name).architecture: name for name in FAMILIES}
        arch = archs[0].replace(VALUE_SUFFIX, "ForCausalLM")
        if arch not in names:
            raise ValueError(f"unsupported architecture {archs[0]!r} in field 'architectures'; "
                             f"supported: {', '.join(names)} (or their {VALUE_SUFFIX} value models)")
        return names[arch]
    model_type = hf.get("model_type")
    if model_type not in FAMILIES:
        raise ValueError(f"unsupported architecture: no 'architectures' field and model_type {model_type!r} "
                         f"is not one of {FAMILIES.names()}")
    return model_type


def _rope(hf: dict[str, Any], max_pos: int) -> tuple[float, RopeScaling | None]:
    """(rope_theta, rope_scaling) from 5.x `rope_parameters` or the older `rope_theta` + `rope_scaling`."""
    params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10_000.0)))
    if params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError("field 'partial_rotary_factor' != 1 is not supported")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return theta, None
    if rope_type != "llama3":
        raise ValueError(f"field 'rope_type' = {rope_type!r} is not supported (only 'default' and 'llama3')")
    try:
        scaling = RopeScaling(float(params["factor"]), float(params["low_freq_factor"]),
                              float(params["high_freq_factor"]),
                              int(params.get("original_max_position_embeddings", max_pos)))
    except KeyError as e:
        raise ValueError(f"llama3 rope scaling is missing field {e.args[0]!r}") from None
    return theta, scaling


def from_hf_config(hf: dict[str, Any]) -> ModelConfig:
    """`ModelConfig` from a parsed HF config.json of a registered family's architecture; its biases, q/k norm
    and window as transformers builds that family (Qwen2: biases, Mistral: none, whatever `attention_bias`
    says)."""
    name = _family(hf)
    family = FAMILIES.get(name)
    _require(hf, _REQUIRED)
    for field, ok in (("hidden_act", "silu"), ("use_sliding_window", False), ("mlp_bias", False)):
        if field in hf and hf[field] != ok:
            raise ValueError(f"field {field!r} = {hf[field]!r} is not supported (expected {ok!r})")
    if any(t != "full_attention" for t in hf.get("layer_types") or ()):
        raise ValueError(f"field 'layer_types' = {hf['layer_types']!r}: only full attention is supported")
    defaults = family.hf_defaults
    heads = hf["num_attention_heads"]
    max_pos = hf.get("max_position_embeddings", defaults["max_position_embeddings"])
    theta, scaling = _rope(hf, max_pos)
    eos = hf.get("eos_token_id", defaults["eos_token_id"])
    window = hf.get("sliding_window", defaults.get("sliding_window")) if family.sliding_window else None
    return ModelConfig(
        family=name,
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or defaults.get("head_dim") or hf["hidden_size"] // heads,
        rope_theta=theta,
        rope_scaling=scaling,
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        attention_bias=(family.attention_bias if family.attention_bias is not None
                        else bool(hf.get("attention_bias", False))),
        qk_norm=family.qk_norm,
        max_position_embeddings=max_pos,
        bos_token_id=hf.get("bos_token_id", defaults["bos_token_id"]),
        eos_token_id=tuple(eos) if isinstance(eos, list) else eos,
        pad_token_id=hf.get("pad_token_id"),
        sliding_window=window,
    )


def to_hf_config(cfg: ModelConfig, dtype: str = "float32") -> dict[str, Any]:
    """HF config.json dict for `cfg`, readable by transformers 4.x and 5.x (and vLLM)."""
    family = FAMILIES.get(cfg.family)
    if family.attention_bias is not None and cfg.attention_bias != family.attention_bias:
        has = "always has" if family.attention_bias else "has no"
        raise ValueError(f"{family.architecture} {has} q/k/v biases: attention_bias must be "
                         f"{family.attention_bias}")
    if cfg.sliding_window is not None and not family.sliding_window:
        raise ValueError(f"sliding_window={cfg.sliding_window} is not expressible for family {cfg.family!r}")
    if cfg.qk_norm != family.qk_norm:
        raise ValueError(f"qk_norm={cfg.qk_norm} is not expressible for family {cfg.family!r}")
    scaling = None
    if cfg.rope_scaling is not None:
        scaling = dataclasses.asdict(cfg.rope_scaling)
    hf: dict[str, Any] = {
        "architectures": [family.architecture],
        "model_type": cfg.family,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": scaling,
        "rope_parameters": {**(scaling or {"rope_type": "default"}), "rope_theta": cfg.rope_theta},
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": list(cfg.eos_token_id) if isinstance(cfg.eos_token_id, tuple) else cfg.eos_token_id,
        "pad_token_id": cfg.pad_token_id,
        "dtype": dtype,
        "torch_dtype": dtype,
    }
    hf |= family.hf_fields
    if family.attention_bias is None:
        hf["attention_bias"] = cfg.attention_bias
    if family.sliding_window:
        hf["sliding_window"] = cfg.sliding_window
    return hf


def read_hf_config(path: str | os.PathLike, parse: Callable[[dict[str, Any]], Any] = from_hf_config) -> Any:
    """`path`/config.json parsed by `parse` (`from_hf_config`: a `ModelConfig`); errors name the file, and a
    missing one the command that fetches the model."""
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        raise cli.MissingInput("model", config_file if Path(path).is_dir() else path, cli.fetch_model(path))
    try:
        return parse(json.loads(config_file.read_text()))
    except ValueError as e:
        raise ValueError(f"{config_file}: {e}") from None


BERT_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")  # HF `hidden_act` values BERT runs with


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """Architecture of a BERT-family encoder (BERT, MiniLM, e5, bge) and of the classifier a cross-encoder
    (BertForSequenceClassification) puts on it."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    num_labels: int = 2  # the classifier's outputs (HF's default)

    def __post_init__(self):
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size={self.hidden_size} is not a multiple of "
                             f"num_heads={self.num_heads}")
        if self.hidden_act not in BERT_ACTIVATIONS:
            raise ValueError(f"field 'hidden_act' = {self.hidden_act!r} is not one of {BERT_ACTIVATIONS}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


def bert_from_hf_config(hf: dict[str, Any]) -> BertConfig:
    """`BertConfig` from a parsed HF config.json of a BERT model (BertModel, BertForSequenceClassification,
    ...)."""
    if hf.get("model_type", "bert") != "bert":
        raise ValueError(f"model_type {hf['model_type']!r} is not 'bert'")
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"field 'position_embedding_type' = {hf['position_embedding_type']!r} is not "
                         "supported (only 'absolute')")
    _require(hf, _REQUIRED)
    return BertConfig(
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"],
        max_position_embeddings=hf.get("max_position_embeddings", 512),
        type_vocab_size=hf.get("type_vocab_size", 2),
        layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
        hidden_act=hf.get("hidden_act", "gelu"),
        num_labels=len(hf["id2label"]) if hf.get("id2label") else hf.get("num_labels", 2),
    )


# ModelConfig fields an experiment config may override from the command line (`--config.model.num_layers=2`).
OVERRIDABLE = {
    "family": str, "vocab_size": int, "hidden_size": int, "intermediate_size": int, "num_layers": int,
    "num_heads": int, "num_kv_heads": int, "head_dim": int, "rope_theta": float, "rms_norm_eps": float,
    "tie_word_embeddings": bool, "attention_bias": bool, "qk_norm": bool, "max_position_embeddings": int,
}
_OVERRIDE_RANGES = {int: "[1, inf)", float: "(0, inf)"}  # the values an overriding number allows, by type


def _override_field(name: str, kind: type) -> tuple:
    """ModelSource's field overriding ModelConfig's `name`: None (unset) by default."""
    return (name, kind | None, ranged(None, _OVERRIDE_RANGES[kind]) if kind in _OVERRIDE_RANGES else None)


# `config.model`: which decoder a run uses. `path` (a local HF directory: its config.json) wins over `preset`
# (a `PRESETS` name); every OVERRIDABLE field that is set (not None) then replaces the value from there.
ModelSource = dataclasses.make_dataclass("ModelSource", [
    ("preset", str, "tiny"),
    ("path", str, ""),
    # A value model written by `checkpoint export` (<out>/critic): a run's critic starts from it (verl's
    # critic.model.path); empty: from the policy's backbone with a new value head.
    ("critic_path", str, ""),
    ("param_dtype", str, "float32"),  # bfloat16 on accelerators; master weights stay float32 in the optimizer
    *(_override_field(name, kind) for name, kind in OVERRIDABLE.items()),
], frozen=True, namespace={"__post_init__": check_ranges})
ModelSource.__module__ = __name__  # picklable (a run's config goes to the processes that run its seeds)


def config_from_source(model: ModelSource) -> ModelConfig:
    """`ModelConfig` from an experiment's `config.model`."""
    cfg = read_hf_config(model.path) if model.path else get_preset(model.preset)
    overrides = {name: getattr(model, name) for name in OVERRIDABLE if getattr(model, name) is not None}
    return dataclasses.replace(cfg, **overrides)


@group
class AttentionConfig:
    """`config.mesh.attention`: how the decoder computes attention on this backend (not what: every
    implementation computes the same function). `impl` is a name in `searchrl.models.attention.ATTENTION`:
    "reference" materialises the float32 scores [B, H, T, S]; "blockwise" never does (an online softmax over
    `block_size` key slots at a time, forward and backward; every backend, every case); "dot_product" is
    cuDNN's fused kernel with a dense mask (GPU). The Pallas kernels (`searchrl.models.attention_pallas`;
    on CPU with `interpret`): "pallas" is searchrl's own flash attention, forward and backward, for every case
    (training, packed rows, extend and decode against the cache; GPU via Triton, short lengths: a program
    holds a head's keys in shared memory); "pallas_mha" is JAX's Triton flash attention for rows without a
    cache, "blockwise" otherwise (GPU); "pallas_tpu" is JAX's TPU flash
    attention for rows without a cache, "blockwise" otherwise (TPU)."""

    impl: str = "reference"
    block_size: int = ranged(512, "[1, inf)")  # key slots per block of "blockwise"
    # queries and key slots per tile of "pallas", "pallas_mha" (2^n; >= 16 on a GPU)
    kernel_block: int = ranged(64, "[1, inf)")
    interpret: bool = False  # run the Pallas kernels in Pallas' interpret mode (what CPU can run)
    paged: str = "reference"  # which implementation of attention over the paged KV cache (PAGED_ATTENTION)

    def __post_init__(self):
        if self.kernel_block & (self.kernel_block - 1):
            raise ValueError(f"attention.kernel_block must be a power of two, got {self.kernel_block}")


@group
class MeshConfig:
    """`config.mesh`: the (data, fsdp, tensor) device mesh (one size may be -1: the devices left over), the
    sharding rules of training and of sampling (names in `sharding.RULES`) and the attention implementation
    of both: how the programs compute on the hardware."""

    data: int = ranged(-1, "-1 or [1, inf)")
    fsdp: int = ranged(1, "-1 or [1, inf)")
    tensor: int = ranged(1, "-1 or [1, inf)")
    train_rules: str = "train"
    sample_rules: str = "sample"
    attention: AttentionConfig = AttentionConfig()

    def with_attention(self, **changes) -> MeshConfig:
        """The same mesh and layouts, their attention with `changes` (`AttentionConfig`'s fields)."""
        return dataclasses.replace(self, attention=dataclasses.replace(self.attention, **changes))


@group
class DistributedConfig:
    """`config.distributed`: JAX's runtime, its processes and its share of GPU memory (see
    `searchrl.distributed.initialize`)."""

    enabled: bool = False  # jax.distributed.initialize() from the cluster environment
    coordinator_address: str = ""  # host:port; empty = auto-detect (SLURM, TPU pod, ...)
    num_processes: int = ranged(-1, "-1 or [1, inf)")  # -1: from the cluster environment
    process_id: int = ranged(-1, "-1 or [0, inf)")
    # The share of each GPU's memory JAX preallocates (XLA_PYTHON_CLIENT_MEM_FRACTION); 0: JAX's own, 0.75.
    memory_fraction: float = ranged(0.0, "[0, 1)")
