"""A decoder family added by one registration (here, inside the test): its config.json round-trips through
`to_hf_config` / `from_hf_config` and a checkpoint through `save_hf` / `load_hf`, its parameters follow its
bias and norm rules, and its chat text is cut at its markers."""
import dataclasses
import json

import jax
import numpy as np
import pytest

from searchrl.model_families import FAMILIES, ChatMarkers, Family
from searchrl.models import ModelConfig, from_hf_config, init_params, load_hf, save_hf, to_hf_config
from searchrl.text.protocol import extract_answer, response_part

FAMILIES.register("toy")(Family(
    "ToyForCausalLM", {"max_position_embeddings": 1024, "bos_token_id": 0, "eos_token_id": 1, "head_dim": 8},
    attention_bias=True, o_bias=False, qk_norm=True, hf_fields={"toy_flavour": "plain"},
    chat=ChatMarkers("<|toy|>assistant:", ("<|toy_end|>",))))
TOY = ModelConfig("toy", 64, 16, 32, 2, 4, 2, 8, attention_bias=True, qk_norm=True,
                  max_position_embeddings=1024, bos_token_id=0, eos_token_id=1)


def test_hf_config_round_trips_with_the_family_defaults_and_rules():
    hf = to_hf_config(TOY)
    assert (hf["architectures"], hf["model_type"], hf["toy_flavour"]) == (["ToyForCausalLM"], "toy", "plain")
    assert "attention_bias" not in hf and "sliding_window" not in hf  # fixed by the family, not written
    assert from_hf_config(json.loads(json.dumps(hf))) == TOY
    # A config.json naming only the required fields takes the family's defaults (head_dim 8, not 16 / 4)
    # and its biases whatever `attention_bias` says; `model_type` finds the family without `architectures`.
    minimal = {"model_type": "toy", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
               "attention_bias": False}
    assert from_hf_config(minimal) == TOY
    for change, field in (({"attention_bias": False}, "ToyForCausalLM always has q/k/v biases"),
                          ({"qk_norm": False}, "qk_norm"), ({"sliding_window": 64}, "sliding_window")):
        with pytest.raises(ValueError, match=field):
            to_hf_config(dataclasses.replace(TOY, **change))


def test_checkpoint_round_trips_with_the_family_parameters(tmp_path):
    params = init_params(TOY, jax.random.key(0))
    layer = params["layers"]
    assert {"q_bias", "k_bias", "v_bias", "q_norm", "k_norm"} <= set(layer) and "o_bias" not in layer
    save_hf(TOY, params, tmp_path / "toy")
    cfg, loaded = load_hf(tmp_path / "toy")
    assert cfg == TOY
    jax.tree.map(np.testing.assert_array_equal, loaded, params)


def test_responses_are_cut_at_the_family_chat_markers():
    text = "<|toy|>user: who? <answer> no </answer>\n<|toy|>assistant: <answer> Ada </answer><|toy_end|>\n"
    assert response_part(text) == " <answer> Ada </answer>"
    assert extract_answer(text) == "Ada"
