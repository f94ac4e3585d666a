"""searchrl.models: Qwen2/Qwen2.5, Qwen3 and Llama-3 decoders (policy, value), KV cache, HF I/O, sharding."""
from searchrl.models.config import (PRESETS, ModelConfig, RopeScaling, config_from_dict, from_hf_config,
                                    get_preset, to_hf_config)
from searchrl.models.decoder import (apply, backbone, forward, init_params, lm_logits, logprobs_from_logits,
                                     token_logprobs, unstack_layers, value_params_from_policy, values)
from searchrl.models.hf import load_hf, save_hf
from searchrl.models.kv_cache import KVCache, cache_shardings, write_rows
from searchrl.models.layout import ParamSpec, param_layout
from searchrl.models.sharding import (SAMPLE_RULES, TRAIN_RULES, ShardingRules, logical_to_sharding,
                                      logical_to_spec, make_mesh, param_logical_axes, param_shardings)

__all__ = [
    "PRESETS", "ModelConfig", "RopeScaling", "config_from_dict", "from_hf_config", "get_preset",
    "to_hf_config",
    "apply", "backbone", "forward", "init_params", "lm_logits", "logprobs_from_logits", "token_logprobs",
    "unstack_layers", "value_params_from_policy", "values",
    "load_hf", "save_hf",
    "KVCache", "cache_shardings", "write_rows",
    "ParamSpec", "param_layout",
    "SAMPLE_RULES", "TRAIN_RULES", "ShardingRules", "logical_to_sharding", "logical_to_spec", "make_mesh",
    "param_logical_axes", "param_shardings",
]
