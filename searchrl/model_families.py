"""Decoder families by name (`ModelConfig.family`, HF's `model_type`): what tells one family's config.json and
chat text from another's. Read by `searchrl.models.config` (the config.json mapping) and by
`searchrl.text.protocol` (where a decoded chat's response starts and ends), so it sits below both.

A new family is its rows of `searchrl.models.decoder.param_table` (where its parts differ from those the flags
below switch) and one registration:

    FAMILIES.register("gemma")(Family("GemmaForCausalLM", hf_defaults={...}, chat=ChatMarkers(...)))
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from searchrl.registry import Registry


@dataclasses.dataclass(frozen=True)
class ChatMarkers:
    """A chat template's text around the assistant's turn: the header it starts after, and the end-of-turn or
    padding tokens a decoded response may end with."""

    assistant: str
    end_tokens: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Family:
    """One decoder family. `hf_defaults`: transformers' class defaults of the optional config.json fields
    (max_position_embeddings, bos_token_id, eos_token_id; head_dim and sliding_window where the family has
    them), taken when a config.json leaves one out."""

    architecture: str  # HF `architectures[0]`, e.g. "LlamaForCausalLM"
    hf_defaults: Mapping[str, Any]
    # q/k/v biases: always (True), never (False), or as config.json's `attention_bias` says (None; written
    # there too). transformers builds Qwen2 with them and Mistral without, whatever the field says.
    attention_bias: bool | None = None
    o_bias: bool = True  # with attention biases, the output projection has one too (not in Qwen2)
    qk_norm: bool = False  # RMSNorm of each query and key head before RoPE (Qwen3)
    sliding_window: bool = False  # config.json's `sliding_window` is read and written (Mistral)
    hf_fields: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # fixed fields its config.json has
    chat: ChatMarkers | None = None  # its instruct models' chat template (None: responses are not cut)


FAMILIES: Registry[Family] = Registry("model family", "config.model.family")

CHATML = ChatMarkers("<|im_start|>assistant", ("<|im_end|>", "<|endoftext|>"))
LLAMA3_CHAT = ChatMarkers("<|start_header_id|>assistant<|end_header_id|>", ("<|eot_id|>", "<|end_of_text|>"))
_NO_WINDOW = {"use_sliding_window": False}

FAMILIES.register("qwen2")(Family(
    "Qwen2ForCausalLM", {"max_position_embeddings": 32768, "bos_token_id": None, "eos_token_id": None},
    attention_bias=True, o_bias=False, hf_fields=_NO_WINDOW, chat=CHATML))
FAMILIES.register("qwen3")(Family(
    "Qwen3ForCausalLM",
    {"max_position_embeddings": 32768, "bos_token_id": None, "eos_token_id": None, "head_dim": 128},
    qk_norm=True, hf_fields=_NO_WINDOW, chat=CHATML))
FAMILIES.register("llama")(Family(
    "LlamaForCausalLM", {"max_position_embeddings": 2048, "bos_token_id": 1, "eos_token_id": 2},
    hf_fields={"mlp_bias": False}, chat=LLAMA3_CHAT))
FAMILIES.register("mistral")(Family(
    "MistralForCausalLM",
    {"max_position_embeddings": 131072, "bos_token_id": 1, "eos_token_id": 2, "sliding_window": 4096},
    attention_bias=False, sliding_window=True))

