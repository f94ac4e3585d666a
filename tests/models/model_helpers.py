"""Builders shared by the model tests: tiny random transformers models and well-conditioned random params."""
import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers

from searchrl.models import KVCache, KVPool, ModelConfig, init_params

# Tiny HF configs covering every supported variant.
HF_CONFIGS = {
    "qwen2_tied": (transformers.Qwen2Config, dict(tie_word_embeddings=True)),
    "qwen2_untied": (transformers.Qwen2Config, dict(tie_word_embeddings=False)),
    # head_dim != hidden / heads, as in Qwen3-4B/8B.
    "qwen3": (transformers.Qwen3Config, dict(head_dim=24, tie_word_embeddings=True)),
    "llama3": (transformers.LlamaConfig, dict(
        tie_word_embeddings=False, rope_theta=500_000.0, bos_token_id=1, eos_token_id=[2, 3],
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 64})),
    # Mistral v0.2+ (no window), head_dim explicit and != hidden / heads.
    "mistral": (transformers.MistralConfig, dict(head_dim=24, sliding_window=None, rope_theta=1e6)),
    # Mistral-7B-v0.1's layout: a sliding window (HF masks with it), here wider than the test rows.
    "mistral_window": (transformers.MistralConfig, dict(sliding_window=16)),
}


def build_hf_model(name: str, seed: int = 0) -> transformers.PreTrainedModel:
    """A tiny transformers model, every parameter random (biases and norms too), float32, eager attention."""
    cls, extra = HF_CONFIGS[name]
    config = cls(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6,
                 **extra)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").float().eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.1)
    return model


def torch_logits(model, tokens: np.ndarray, positions: np.ndarray | None = None) -> np.ndarray:
    with torch.no_grad():
        kwargs = {} if positions is None else {"position_ids": torch.from_numpy(positions).long()}
        return model(input_ids=torch.from_numpy(tokens).long(), **kwargs).logits.float().numpy()


def random_params(cfg: ModelConfig, seed: int = 0, dtype=jnp.float32) -> dict:
    """Params with O(1) attention logits and non-trivial norms/biases, so masking mistakes show up clearly."""
    params = init_params(cfg, jax.random.key(seed))
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
    out = [p + (0.2 if p.ndim <= 2 else 0.08) * jax.random.normal(k, p.shape) for p, k in zip(leaves, keys)]
    return jax.tree.map(lambda p: p.astype(dtype), jax.tree.unflatten(treedef, out))


def random_tokens(cfg: ModelConfig, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, cfg.vocab_size, size=shape).astype(np.int32)


def paged_cache(cfg: ModelConfig, batch: int, slots: int, page_size: int = 4, shards: int = 1, seed: int = 0,
                dtype=jnp.float32) -> KVCache:
    """An empty paged cache of `slots` slots a row whose rows hold their pages in a scrambled order: row b of
    block s (`shards` equal blocks of rows, one per device) holds pages of that block's own pool, named by
    local ids (`searchrl.models.kv_cache`). Every page is held by one row."""
    n = -(-slots // page_size)
    per_shard = batch // shards
    rng = np.random.default_rng(seed)
    pages = np.concatenate([rng.permutation(per_shard * n).reshape(per_shard, n) for _ in range(shards)])
    pool = KVPool.init(cfg, batch * n, page_size, dtype)
    return KVCache(pool.k, pool.v, jnp.asarray(pages, jnp.int32), jnp.zeros(batch, jnp.int32))


def global_pages(cache: KVCache, shards: int) -> KVCache:
    """`cache` with local page ids (`paged_cache`) turned into ids of the whole pool: what one device reads."""
    per_shard_rows, per_shard_pages = cache.pages.shape[0] // shards, cache.k[0].shape[1] // shards
    offset = (np.arange(cache.pages.shape[0]) // per_shard_rows * per_shard_pages)[:, None]
    return cache._replace(pages=cache.pages + jnp.asarray(offset, jnp.int32))
