"""The BERT encoder and cross-encoder against transformers (tiny random models), read from safetensors or
pytorch_model.bin checkpoints; errors in configs and checkpoints name what is wrong."""
import json

import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file

from searchrl.models import bert, load_bert


def tiny_config(**overrides) -> transformers.BertConfig:
    kwargs = dict(vocab_size=300, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=37, max_position_embeddings=128, type_vocab_size=2)
    return transformers.BertConfig(**{**kwargs, **overrides})


def save(model: torch.nn.Module, path, safetensors: bool = True):
    model.save_pretrained(path)
    if not safetensors:
        (path / "model.safetensors").unlink()
        torch.save(model.state_dict(), path / "pytorch_model.bin")
    return path


def random_batch(vocab: int, batch: int = 4, length: int = 24):
    rng = np.random.default_rng(0)
    ids = rng.integers(1, vocab, (batch, length))
    types = rng.integers(0, 2, (batch, length))
    mask = np.ones((batch, length), np.int64)
    for row, n in enumerate([length, 17, 5, 1][:batch]):
        mask[row, n:] = 0
    return ids, types, mask


def _torch(*arrays):
    return [torch.tensor(a) for a in arrays]


@pytest.mark.parametrize("hidden_act,cls_name,safetensors", [
    ("gelu", "BertModel", True),
    ("gelu_new", "BertModel", False),
    ("relu", "BertForSequenceClassification", True),  # "bert." prefixed names
])
def test_hidden_states_match_transformers(tmp_path, hidden_act, cls_name, safetensors):
    torch.manual_seed(0)
    model = getattr(transformers, cls_name)(tiny_config(hidden_act=hidden_act)).eval()
    config, params = load_bert(save(model, tmp_path, safetensors))
    ids, types, mask = random_batch(config.vocab_size)
    encoder = model if cls_name == "BertModel" else model.bert
    with torch.no_grad():
        want = encoder(*_torch(ids), token_type_ids=_torch(types)[0],
                       attention_mask=_torch(mask)[0]).last_hidden_state.numpy()
    got = np.asarray(bert.encode(config, params, ids, types, mask))
    assert np.abs(got - want).max() <= 1e-4


@pytest.mark.parametrize("num_labels", [1, 3])
def test_classifier_logits_match_transformers(tmp_path, num_labels):
    torch.manual_seed(num_labels)
    model = transformers.BertForSequenceClassification(tiny_config(num_labels=num_labels)).eval()
    config, params = load_bert(save(model, tmp_path), classifier=True)
    assert config.num_labels == num_labels
    ids, types, mask = random_batch(config.vocab_size)
    with torch.no_grad():
        want = model(*_torch(ids), token_type_ids=_torch(types)[0], attention_mask=_torch(mask)[0]).logits
    got = np.asarray(bert.classify(config, params, ids, types, mask))
    assert got.shape == (4, num_labels) and np.abs(got - want.numpy()).max() <= 1e-4


def test_legacy_layer_norm_names_are_read(tmp_path):
    torch.manual_seed(0)
    path = save(transformers.BertModel(tiny_config()).eval(), tmp_path)
    _, params = load_bert(path)
    tensors = load_file(path / "model.safetensors")
    legacy = {name.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"):
              t for name, t in tensors.items()}
    assert legacy.keys() != tensors.keys()
    save_file(legacy, path / "model.safetensors", metadata={"format": "pt"})
    _, again = load_bert(path)
    np.testing.assert_array_equal(again["layers"]["attn_norm"], params["layers"]["attn_norm"])
    np.testing.assert_array_equal(again["embed_norm_bias"], params["embed_norm_bias"])


def test_bad_configs_and_checkpoints_are_named(tmp_path):
    torch.manual_seed(0)
    path = save(transformers.BertModel(tiny_config()).eval(), tmp_path)
    raw = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**raw, "model_type": "roberta"}))
    with pytest.raises(ValueError, match=r"config\.json: model_type 'roberta'"):
        load_bert(path)
    (path / "config.json").write_text(json.dumps({**raw, "hidden_act": "swish"}))
    with pytest.raises(ValueError, match="'hidden_act' = 'swish'"):
        load_bert(path)
    (path / "config.json").write_text(json.dumps(raw))
    tensors = load_file(path / "model.safetensors")
    name = "encoder.layer.1.output.dense.weight"
    save_file({k: v for k, v in tensors.items() if k != name}, path / "model.safetensors")
    with pytest.raises(ValueError, match=rf"missing tensor '{name}'.*model\.safetensors"):
        load_bert(path)
    save_file({**tensors, name: tensors[name][:, :-1]}, path / "model.safetensors")
    with pytest.raises(ValueError, match=rf"'{name}'.*shape \[32, 36\], expected \[32, 37\]"):
        load_bert(path)
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(ValueError, match=r"missing tensor 'classifier\.weight'"):
        load_bert(path, classifier=True)
