"""Evaluation at scale for the tests: the greedy evaluation and the baselines' generation of the tiny world
(tests/eval/test_eval.py) on a (2, 2, 2) mesh, the same whether run as one process or as several.

Run as `python -m tests.eval.eval_processes ROOT OUT PROCESS_ID NUM_PROCESSES PORT` (4 CPU devices per
process), it is one process of a multi-process run; each process writes what it got to OUT/process<ID>.json.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import jax
from jax.sharding import Mesh

from searchrl import distributed, models
from searchrl.eval import harness
from searchrl.models.config import DistributedConfig
from searchrl.tasks.autosearch import analysis, baselines
from searchrl.text.tokenizer import load_tokenizer

ATTENTION = models.AttentionConfig()  # the default: `MeshConfig.attention`
PROMPTS = ["The capital of France is", "Berlin is the capital of", "The Seine is the river that",
           "Rome is", "The Spree flows"]  # five: the second batch of four has one real row


def evaluation(root: Path, mesh: Mesh | None, batch_size: int) -> dict[str, Any]:
    """Every question of the tiny world evaluated greedily (searches in every turn that may search, the
    intermediate answers' side branch, a budget of 1 more), and the baselines' generation of PROMPTS up to
    a period: the results and the texts."""
    # Here: bm25s (imported by test_eval) runs a JAX op when imported, before `main` joins the other
    # processes.
    from tests.eval.test_eval import always_search_setup, rollout_config

    tokenizer = load_tokenizer(str(root / "tokenizer"))
    config, cfg, params, env, data = always_search_setup(root, tokenizer)
    rollout = rollout_config(config)
    results = harness.evaluate_policy(cfg, params, tokenizer, env, data, rollout, batch_size, budgets=[1],
                                      spec=analysis.REPORT, placement=models.Placement.default(mesh, ATTENTION))
    generate = baselines.Generator(cfg, params, tokenizer, rollout, batch_size,
                                   models.Placement.default(mesh, ATTENTION))
    return {"results": results, "texts": generate(PROMPTS, (".",))}


def main(root: str, out: str, process_id: str, num_processes: str, port: str) -> None:
    """One process of the run: joins the others before anything touches a device."""
    jax.config.update("jax_default_matmul_precision", "highest")  # as the test suite computes
    distributed.initialize(DistributedConfig(True, f"127.0.0.1:{port}", int(num_processes), int(process_id)))
    got = evaluation(Path(root), models.make_mesh(2, 2, 2), batch_size=4)
    Path(out, f"process{process_id}.json").write_text(json.dumps(got))


if __name__ == "__main__":
    main(*sys.argv[1:])
