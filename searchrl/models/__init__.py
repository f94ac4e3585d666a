"""searchrl.models: Qwen2/Qwen2.5, Qwen3, Llama-3 and Mistral decoders (policy, value), the BERT encoder and
cross-encoder, their parameter tables, KV cache, HF I/O, sharding.

Names load on first use (`models.forward` imports the decoder then), so that `searchrl.models.config` — what
experiment configs read — imports without JAX.
"""
import importlib

_EXPORTS = {
    "attention": ("ATTENTION", "pair_block"),
    "paged_attention": ("PAGED_ATTENTION",),
    "attention_base": ("Segments", "visible_block_pairs"),
    "bert": ("Bert",),
    "config": ("PRESETS", "AttentionConfig", "BertConfig", "DistributedConfig", "MeshConfig", "ModelConfig",
               "ModelSource", "RopeScaling", "bert_from_hf_config", "config_from_source", "from_hf_config",
               "get_preset", "to_hf_config"),
    "decoder": ("Decoder", "apply", "backbone", "forward", "init_params", "lm_logits", "logprobs_from_logits",
                "param_shardings", "param_table", "token_logprobs", "unstack_layers", "unstack_shardings",
                "value_params_from_policy", "values"),
    "hf": ("load_bert", "load_hf", "save_hf"),
    "kv_cache": ("KVCache", "KVPool", "pool_sharding", "pool_spec", "row_axes", "row_shards", "write_rows"),
    "layout": ("ParamSpec",),
    "sharding": ("RULES", "SAMPLE_RULES", "TRAIN_RULES", "Compute", "ShardingRules", "constrain",
                 "logical_to_sharding", "logical_to_spec", "make_mesh", "mesh_of", "mesh_sizes", "Placement",
                 "placement_of", "process_mesh", "rows_sharding", "rules_named", "to_process_mesh"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'searchrl.models' has no attribute {name!r}")
    return getattr(importlib.import_module(f"searchrl.models.{_MODULE_OF[name]}"), name)


def __dir__() -> list[str]:
    return __all__
