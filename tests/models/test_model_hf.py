"""HF checkpoints: logit and gradient parity with transformers, round trips, sharded files, errors."""
import dataclasses
import json
import os
import stat

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from jax.sharding import PartitionSpec
from safetensors.numpy import load_file, save_file

from searchrl.models import (TRAIN_RULES, AttentionConfig, Compute, ShardingRules, apply, forward,
                             get_preset, init_params, load_hf, make_mesh, param_shardings, save_hf,
                             token_logprobs)
from tests.models.model_helpers import HF_CONFIGS, paged_cache, torch_logits

TRAIN = Compute(TRAIN_RULES, AttentionConfig())  # a default run's training layout and attention

TOKENS = np.random.default_rng(0).integers(0, 256, size=(2, 13)).astype(np.int32)


@pytest.mark.parametrize("name", sorted(HF_CONFIGS))
def test_logits_match_transformers(hf_checkpoint, name):
    model, path = hf_checkpoint(name)
    cfg, params = load_hf(path)
    assert ("lm_head" in params) == (not cfg.tie_word_embeddings)
    ours = np.asarray(apply(cfg, params, jnp.asarray(TOKENS), compute=TRAIN))
    ref = torch_logits(model, TOKENS)
    assert np.abs(ref).max() > 0.5  # the comparison is not between near-zero logits
    np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)


def test_rope_scaling_matches_at_large_positions(hf_checkpoint):
    """Llama-3 frequency scaling matters most far from 0: compare at positions 300.. (explicit ids)."""
    model, path = hf_checkpoint("llama3")
    cfg, params = load_hf(path)
    assert cfg.rope_scaling is not None and cfg.rope_scaling.factor == 8.0
    positions = (300 + np.arange(TOKENS.shape[1]))[None].repeat(2, 0).astype(np.int32)
    ours = forward(cfg, params, jnp.asarray(TOKENS), jnp.asarray(positions), jnp.ones(TOKENS.shape, bool),
                   compute=TRAIN, remat=False)[0]
    np.testing.assert_allclose(np.asarray(ours), torch_logits(model, TOKENS, positions), atol=1e-4, rtol=0)


@pytest.mark.parametrize("remat", [False, True])
@pytest.mark.parametrize("name", sorted(HF_CONFIGS))
def test_gradients_match_transformers(hf_checkpoint, tmp_path, name, remat):
    """The mean next-token NLL's gradient for every parameter, against transformers' `loss.backward()`:
    exported through `save_hf`, so each gradient is compared under its HF tensor name."""
    model, path = hf_checkpoint(name)
    cfg, params = load_hf(path)
    tokens = jnp.asarray(TOKENS)
    positions = jnp.broadcast_to(jnp.arange(TOKENS.shape[1], dtype=jnp.int32), TOKENS.shape)

    def nll(params):
        return -token_logprobs(cfg, params, tokens, positions, jnp.ones(TOKENS.shape, bool), remat=remat,
                               temperature=1.0, compute=TRAIN, logits_chunk=0
                               )[:, 1:].mean()

    loss, grads = jax.jit(jax.value_and_grad(nll))(params)
    save_hf(cfg, grads, tmp_path / "grads")
    ours = load_file(tmp_path / "grads" / "model.safetensors")
    ids = torch.from_numpy(TOKENS).long()
    ref_loss = model(input_ids=ids, labels=ids).loss
    ref_loss.backward()
    ref = {pname: p.grad.numpy() for pname, p in model.named_parameters()}
    np.testing.assert_allclose(float(loss), ref_loss.item(), rtol=1e-6)
    assert sorted(ours) == sorted(ref)
    for pname, grad in ref.items():
        assert np.abs(grad).max() > 1e-4, pname  # every parameter gets a gradient worth comparing
        np.testing.assert_allclose(ours[pname], grad, atol=2e-6, rtol=0, err_msg=pname)


@pytest.mark.parametrize("name", ["qwen2_untied", "qwen3", "llama3", "mistral", "mistral_window"])
def test_save_hf_round_trip_through_transformers(hf_checkpoint, tmp_path, name):
    _, path = hf_checkpoint(name)
    cfg, params = load_hf(path)
    out = tmp_path / "exported"
    save_hf(cfg, params, out)
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors"]
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").float()
    ours = np.asarray(apply(cfg, params, jnp.asarray(TOKENS), compute=TRAIN))
    np.testing.assert_allclose(torch_logits(reloaded, TOKENS), ours, atol=1e-4, rtol=0)
    cfg2, params2 = load_hf(out)
    assert cfg2 == cfg
    jax.tree.map(np.testing.assert_array_equal, params2, params)


def test_save_hf_exports_our_own_init_and_overwrites_atomically(tmp_path):
    cfg = get_preset("tiny")
    out = tmp_path / "ckpt"
    save_hf(cfg, init_params(cfg, jax.random.key(0)), out)
    params = init_params(cfg, jax.random.key(1))
    save_hf(cfg, params, out)  # overwrite an existing checkpoint
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no temp or backup dirs left behind
    model = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").float()
    tokens = TOKENS % cfg.vocab_size
    ours = np.asarray(apply(cfg, params, jnp.asarray(tokens), compute=TRAIN))
    np.testing.assert_allclose(torch_logits(model, tokens), ours, atol=1e-4, rtol=0)
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation == {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}


def test_bf16_checkpoint_round_trip(tmp_path):
    cfg = get_preset("tiny")
    params = init_params(cfg, jax.random.key(0), dtype=jnp.bfloat16)
    save_hf(cfg, params, tmp_path / "bf16")
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    tensors = load_file(tmp_path / "bf16" / "model.safetensors")
    assert tensors["model.embed_tokens.weight"].dtype == jnp.bfloat16
    _, loaded = load_hf(tmp_path / "bf16", dtype=jnp.bfloat16)
    jax.tree.map(np.testing.assert_array_equal, loaded, params)


def test_sharded_safetensors_index(hf_checkpoint):
    model, path = hf_checkpoint("qwen2_untied", max_shard_size="100KB")
    assert (path / "model.safetensors.index.json").exists()
    assert len(list(path.glob("*.safetensors"))) > 2
    cfg, params = load_hf(path)
    ours = np.asarray(apply(cfg, params, jnp.asarray(TOKENS), compute=TRAIN))
    np.testing.assert_allclose(ours, torch_logits(model, TOKENS), atol=1e-4, rtol=0)


def test_load_hf_with_shardings(hf_checkpoint):
    """Each device's block is read straight from the file; heads and head_dim split too (slice trimming)."""
    _, path = hf_checkpoint("qwen3", max_shard_size="100KB")
    cfg, ref = load_hf(path)
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    head_dim_split = ShardingRules(tuple((n, {"head_dim": "tensor", "embed": "fsdp"}.get(n))
                                         for n, _ in TRAIN_RULES.rules))
    for rules in (TRAIN_RULES, head_dim_split):
        shardings = param_shardings(cfg, mesh, rules)
        _, params = load_hf(path, shardings=shardings)
        for p, s, r in zip(jax.tree.leaves(params), jax.tree.leaves(shardings), jax.tree.leaves(ref)):
            assert p.sharding == s
            np.testing.assert_array_equal(np.asarray(p), np.asarray(r))
    assert shardings["layers"]["q"].spec == PartitionSpec(None, "fsdp", None, "tensor")


def test_mistral_window_is_read_and_a_longer_row_or_cache_is_refused(hf_checkpoint):
    """Within the window attention is exact (the parity tests); beyond it transformers masks keys that
    searchrl's attention would see, so a forward pass over more key slots than the window raises."""
    model, path = hf_checkpoint("mistral_window")
    cfg, params = load_hf(path)
    assert cfg.sliding_window == 16 and not cfg.attention_bias
    narrow = dataclasses.replace(cfg, sliding_window=8)
    with pytest.raises(ValueError, match="13 key slots.*sliding_window=8"):
        apply(narrow, params, jnp.asarray(TOKENS), compute=TRAIN)
    model.config.sliding_window = 8  # what the refusal protects against: a different function
    assert np.abs(torch_logits(model, TOKENS) - np.asarray(
        apply(cfg, params, jnp.asarray(TOKENS), compute=TRAIN))).max() > 1e-2
    step = jnp.zeros((2, 1), jnp.int32)
    with pytest.raises(ValueError, match="17 key slots.*sliding_window=16"):
        forward(cfg, params, step, step, jnp.ones((2, 1), bool), paged_cache(cfg, 2, 17, page_size=1),
                compute=TRAIN, remat=False)


def _rewrite(path, edit):
    tensors = load_file(path / "model.safetensors")
    edit(tensors)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


def test_missing_tensor_names_tensor_and_file(hf_checkpoint):
    _, path = hf_checkpoint("qwen2_untied")
    _rewrite(path, lambda t: t.pop("model.layers.1.self_attn.k_proj.bias"))
    with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn\.k_proj\.bias.*model\.safetensors"):
        load_hf(path)


def test_missing_untied_lm_head(hf_checkpoint):
    _, path = hf_checkpoint("llama3")
    _rewrite(path, lambda t: t.pop("lm_head.weight"))
    with pytest.raises(ValueError, match=r"'lm_head\.weight'"):
        load_hf(path)


def test_wrong_shape_names_tensor_expected_and_got(hf_checkpoint):
    _, path = hf_checkpoint("qwen3")
    name = "model.layers.0.mlp.down_proj.weight"

    def shrink(t):
        t[name] = t[name][:, :-1]
    _rewrite(path, shrink)
    with pytest.raises(ValueError, match=rf"{name}.*shape \[64, 95\], expected \[64, 96\]"):
        load_hf(path)


def test_unsupported_architecture_and_missing_field(hf_checkpoint):
    _, path = hf_checkpoint("qwen3")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "architectures": ["MixtralForCausalLM"]}))
    with pytest.raises(ValueError, match="MixtralForCausalLM"):
        load_hf(path)
    del config["intermediate_size"]
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config\.json.*'intermediate_size'"):
        load_hf(path)


def test_save_hf_rejects_params_of_another_layout(tmp_path):
    cfg = get_preset("tiny")
    params = init_params(cfg, jax.random.key(0))
    del params["layers"]["q_norm"]
    with pytest.raises(ValueError, match="q_norm"):
        save_hf(cfg, params, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


def test_an_exported_model_has_the_umask_default_modes(tmp_path):
    """mkdtemp and safetensors once left it rwx------ / rw------- (unreadable to a serving engine's user)."""
    cfg = get_preset("tiny")
    umask = os.umask(0o022)
    try:
        save_hf(cfg, init_params(cfg, jax.random.key(0)), tmp_path / "model")
    finally:
        os.umask(umask)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "model").iterdir()}
    assert stat.S_IMODE((tmp_path / "model").stat().st_mode) == 0o755
    assert modes == {"model.safetensors": 0o644, "config.json": 0o644, "generation_config.json": 0o644}
