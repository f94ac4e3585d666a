"""`make demo`'s pipeline end to end at toy sizes: every stage runs and results.json has the documented shape."""
from __future__ import annotations

import json
import os

import pytest

from configs import autosearch
from searchrl import run_config
from searchrl.tasks.autosearch import demo


@pytest.mark.slow
def test_demo_pipeline_writes_its_results(tmp_path):
    config = autosearch.get_config("tiny")
    workdir = str(tmp_path / "demo")
    config.workdir = workdir
    config.tokenizer = os.path.join(workdir, "tokenizer")
    config.data.dir = workdir
    config.retrieval.index_dir = os.path.join(workdir, "index")
    config.demo.update(dict(entities=60, eval_questions=8, budgets=(0, 1)))
    # One step per SFT stage: a later step compiles the SFT step again (its rows pad to another width, or
    # the params come back with the mesh's sharding), which this shape check does not need.
    config.sft.update(dict(steps=1, batch_size=8))
    config.demo.prefix_sft.update(dict(steps=1, batch_size=8))
    config.rollout.obs_buckets = (64,)  # one observation width: fewer rollout programs to compile
    config.train.update(dict(steps=1, batch_size=8, checkpoint_every=1))
    config.rl.update(dict(minibatch_size=8, micro_batch_size=8))

    demo.run(run_config.parse(config))

    results = json.load(open(os.path.join(workdir, "results.json")))
    for policy in ("sft", "rl"):
        summary = results[policy]
        for key in ("em", "f1", "mean_searches"):
            assert 0.0 <= summary[key] and (summary[key] <= 1.0 or key == "mean_searches")
        assert set(summary["by_hops"]) <= {"1", "2", "3"} and summary["by_hops"]
        assert summary["n"] == sum(row["n"] for row in summary["by_hops"].values())
        assert summary["budgets"]["budgets"] == [0, 1]
    for name in ("results.md", "demo.png", "metrics.jsonl", "eval_rl/results.json"):
        assert os.path.exists(os.path.join(workdir, name)), name
    assert os.listdir(os.path.join(workdir, "tensorboard"))
    assert "1" in os.listdir(os.path.join(workdir, "checkpoints"))
