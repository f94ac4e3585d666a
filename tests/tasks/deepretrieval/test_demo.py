"""The DeepRetrieval miniature: its world makes raw queries fail and the right rewrite succeed with BM25, and
its pipeline runs end to end at toy sizes and writes results.json in the documented shape."""
from __future__ import annotations

import json
import os
import random

import numpy as np
import pytest

from configs import deepretrieval
from searchrl import run_config
from searchrl.data import datasets
from searchrl.demo import miniature
from searchrl.retrieval import metrics
from searchrl.retrieval.bm25 import BM25Retriever
from searchrl.tasks.deepretrieval import demo as rewrite, world as rewrite_world
from searchrl.tasks.deepretrieval.config import RewriteDemoConfig


@pytest.fixture(scope="module")
def world():
    return rewrite_world.generate_world(0, concepts_per_kind=8,
                                        num_candidates=RewriteDemoConfig().num_candidates)


def test_every_test_topic_is_a_new_combination_of_trained_concepts(world):
    train = {(q["condition"], q["treatment"]) for q in world.queries["train"]}
    test = {(q["condition"], q["treatment"]) for q in world.queries["test"]}
    assert not train & test and len(train) + len(test) == 64
    for kind in rewrite_world.KINDS:
        for concept in world.concepts[kind]:
            assert concept.technical in concept.candidates and len(set(concept.candidates)) == 4
            assert concept.lay != concept.technical


def test_raw_queries_fail_and_the_technical_rewrite_succeeds(world, tmp_path):
    paths = rewrite_world.write_world(world, tmp_path / "rewrite_world")
    retriever = BM25Retriever.build(paths["corpus"], tmp_path / "index", show_progress=False)
    test = datasets.load_examples(str(tmp_path), "rewrite_world", "test", "beir", "")["rewrite_world"]
    queries = {q["_id"]: q for q in world.queries["test"]}
    rng = random.Random(0)

    def recall(rewrite):
        hits = retriever.search([rewrite(queries[ex["id"]]) for ex in test], 10)
        return np.mean([metrics.recall_at_k([h.id for h in hs], ex["qrels"], 10)
                        for hs, ex in zip(hits, test)])

    assert recall(lambda q: q["text"]) < 0.2
    assert recall(lambda q: rewrite_world.oracle_rewrite(world, q)) == 1.0
    assert recall(lambda q: rewrite_world.candidate_rewrite(world, q, rng)) < 0.5


@pytest.mark.slow
def test_demo_pipeline_writes_its_results(tmp_path):
    config = deepretrieval.get_config("tiny")
    config.workdir = str(tmp_path / "demo")
    config.demo.update(dict(concepts_per_kind=8, seeds=(3,)))
    config.sft.update(dict(steps=1, batch_size=16))  # a 2nd step compiles the SFT step again (sharding)
    config.sft.optim.update(dict(warmup_steps=0, decay_steps=1))
    config.train.update(dict(steps=2, batch_size=8))
    config.rl.update(dict(minibatch_size=8, micro_batch_size=8))

    miniature.run(run_config.parse(config))

    results = json.load(open(os.path.join(config.workdir, "results.json")))
    seed = results["held_out"]["3"]
    for policy in rewrite.POLICIES:
        for metric in rewrite.METRICS:
            assert 0.0 <= seed[policy][metric] <= 1.0
            assert results["over_seeds"][policy][metric] == {"mean": seed[policy][metric], "low": None,
                                                             "high": None, "n": 1}
    gain = seed["rl"]["recall@10"] - seed["sft"]["recall@10"]
    claim, = results["claims"]
    assert claim["measured"]["per_seed"] == {"3": gain} and claim["holds"] == (gain >= 0.2)
    assert len(seed["train_reward"]) == 2 and len(seed["sft_loss"]) == 2
    assert os.path.exists(os.path.join(config.workdir, "results.md"))
    for name in ("rewrite_world/lexicon.json", "eval_sft/predictions.jsonl", "eval_rl/results.md"):
        assert os.path.exists(os.path.join(config.workdir, "seed3", name)), name
