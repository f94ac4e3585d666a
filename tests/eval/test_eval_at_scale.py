"""Evaluation at scale: the greedy evaluation, the AutoSearch pilot and the prompting baselines on a (2, 2, 2)
mesh of the 8 fake CPU devices, and as two processes of 4 devices each, give one device's results (the tiny
random policy and BM25 world of tests/eval/test_eval.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from searchrl import distributed, models
from searchrl.data import datasets
from searchrl.eval import harness
from searchrl.retrieval.bm25 import BM25Retriever
from searchrl.tasks.autosearch import baselines, pilot
from tests.eval.eval_processes import PROMPTS, evaluation
from tests.eval.test_eval import build_env, make_config, rollout_config, tiny_policy, world  # noqa: F401
from tests.processes import free_port, wait, xla_flags_with_devices

ATTENTION = models.AttentionConfig()  # the default: `MeshConfig.attention`
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def one_device(world):
    """The tiny world's evaluation and generated texts on one device, in batches of 4."""
    root, _ = world
    return evaluation(root, None, batch_size=4)


def assert_same_results(got, want):
    """Every question's row (answer, EM/F1, searches, intermediate answers, response, ...) and every table."""
    assert all(p["response"] for p in want["predictions"])  # the policy wrote something to compare
    assert all(p["searches"] == 2 for p in want["predictions"])  # searches, each with an intermediate answer
    assert got["predictions"] == want["predictions"]
    for name in ("table", "by", "budgets", "depth"):
        assert got[name] == want[name], name


def test_local_batches_split_a_padded_batch_over_processes():
    """What each of two processes rolls out of 5 examples in batches of 4 (2 rows each): process 1 has no
    real row in the second batch, only padding (the last example repeated)."""
    examples = list("abcde")
    first, second = (list(distributed.local_batches(examples, 4, rows))
                     for rows in (slice(0, 2), slice(2, 4)))
    assert first == [(["a", "b"], 2, 0), (["e", "e"], 1, 4)]
    assert second == [(["c", "d"], 2, 2), (["e", "e"], 0, 6)]
    mesh = models.make_mesh(2, 2, 2)
    assert distributed.row_blocks(mesh) == 4
    assert [harness.mesh_batch_size(n, mesh) for n in (1, 4, 5)] == [4, 4, 8]
    assert harness.mesh_batch_size(3, None) == 3


def test_evaluation_on_a_mesh_equals_one_device(world, one_device):
    """On a (2, 2, 2) mesh, asked for batches of 3: rounded up to the mesh's 4 row blocks, one row each, heads
    and MLP split over the tensor axis; the same rows and tables as one device in batches of 4."""
    root, _ = world
    got = evaluation(root, models.make_mesh(2, 2, 2), batch_size=3)
    assert got["results"]["meta"]["batch_size"] == 4
    assert_same_results(got["results"], one_device["results"])
    assert got["texts"] == one_device["texts"] and len(got["texts"]) == len(PROMPTS)


def test_pilot_on_a_mesh_equals_one_device(world):
    """The pilot's forced-depth runs (depths 0 and 2: the intermediate answers give depth 1) on the mesh."""
    root, tokenizer = world
    config = make_config(root)
    config.rollout.max_prompt_tokens = 48  # room for the answer prompt after the question
    cfg, params = tiny_policy(tokenizer)
    data = datasets.load_examples(config.data.dir, "world", "test", config.data.format, config.data.tfds_dir)

    def runs(mesh):
        return pilot.forced_depth_runs(cfg, params, tokenizer, build_env(config), data,
                                       rollout_config(config), 4, [0, 1, 2],
                                       models.Placement.default(mesh, ATTENTION))

    want, got = runs(None), runs(models.make_mesh(2, 2, 2))
    assert [r["searches"] for r in want[2]] == [2] * 5
    assert got == want


def test_baselines_on_a_mesh_equal_one_device(world):
    """Direct and RAG prompting (one retrieval, the top-3 passages in the prompt) generated on the mesh."""
    root, tokenizer = world
    config = make_config(root)
    config.rollout.max_prompt_tokens = 320
    cfg, params = tiny_policy(tokenizer)
    data = datasets.load_examples(config.data.dir, "world", "test", config.data.format, config.data.tfds_dir)
    retriever = BM25Retriever(root / "index")

    def results(mesh):
        generate = baselines.Generator(cfg, params, tokenizer, rollout_config(config), 4,
                                       models.Placement.default(mesh, ATTENTION))
        return baselines.evaluate_baselines(generate, retriever, data, ["direct", "rag"])

    want, got = results(None), results(models.make_mesh(2, 2, 2))
    assert all(r["response"] for method in want.values() for r in method["predictions"])
    assert [r["searches"] for r in want["rag"]["predictions"]] == [1] * 5
    for method in want:
        assert got[method]["predictions"] == want[method]["predictions"], method
        assert got[method]["table"] == want[method]["table"], method


@pytest.mark.slow
def test_two_processes_evaluate_like_one_device(world, one_device, tmp_path):
    """Two processes of 4 devices each on a (2, 2, 2) mesh (gloo on 127.0.0.1): each rolls out its 2 rows of
    every batch of 4 (in the last batch process 1 holds padding only), and both get every row, in order: one
    device's results and texts."""
    root, _ = world
    port, out = free_port(), tmp_path / "two"
    out.mkdir()
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO),
           "XLA_FLAGS": xla_flags_with_devices(4)}
    with open(out / "log", "w") as log:
        procs = [subprocess.Popen([sys.executable, "-m", "tests.eval.eval_processes", str(root), str(out),
                                   str(i), "2", str(port)], cwd=REPO, env=env, stdout=log,
                                  stderr=subprocess.STDOUT)
                 for i in range(2)]
    wait(procs, [out, out])
    want = json.loads(json.dumps(one_device))  # as the processes' results travel: JSON
    for i in range(2):
        got = json.loads((out / f"process{i}.json").read_text())
        assert_same_results(got["results"], want["results"])
        assert got["texts"] == want["texts"]
