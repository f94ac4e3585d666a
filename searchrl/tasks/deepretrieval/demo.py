"""DeepRetrieval in miniature on a CPU: RL teaches a policy to rewrite queries for BM25 from the retrieval
reward alone.

Per seed: builds a world where users and documents name things differently (`searchrl.tasks.deepretrieval.world`),
its BM25 index and a tokenizer; cold-starts a tiny policy with SFT on rewrites that pick one of each user
word's candidate technical words at random (it knows the candidates, not which one the corpus uses); trains it
with PPO on the gated NDCG reward (`query_rewrite`, task "classic"); evaluates the user's raw query, the cold
start and the RL policy greedily on held-out topics. Writes `results.json` and `results.md` under the
config's workdir, and per seed (a subdirectory each) the evaluation reports `eval_sft/` and `eval_rl/` (with
their predictions.jsonl, for `python -m searchrl.tasks.deepretrieval.rewrites`), metrics.jsonl and TensorBoard logs.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import random
import shutil
import time
from typing import Any

from searchrl import experiment, models, task
from searchrl.data import datasets
from searchrl.demo.miniature import Miniature, train
from searchrl.demo.results import claim, on_every_seed, paired, seed_intervals
from searchrl.eval import harness, report
from searchrl.retrieval.bm25 import BM25Retriever
from searchrl.rl import sft
from searchrl.run_config import RunConfig
from searchrl.tasks.deepretrieval import analysis
from searchrl.tasks.deepretrieval import world as rewrite_world
from searchrl.tasks.deepretrieval.config import RewriteDemoConfig
from searchrl.text import chat
from searchrl.text.tokenizer import train_bpe_tokenizer

DATASET = "rewrite_world"
METRICS = ("recall@10", "ndcg@10", "recall@100")  # held-out columns of results.json, raw and rewritten
POLICIES = ("raw", "sft", "rl")


def build_world(config: RunConfig, demo: RewriteDemoConfig) -> rewrite_world.RewriteWorld:
    """The world's BEIR files under workdir/rewrite_world, its BM25 index and its tokenizer (from scratch)."""
    for built_before in (DATASET, "index", "tokenizer"):
        shutil.rmtree(os.path.join(config.workdir, built_before), ignore_errors=True)
    world = rewrite_world.generate_world(config.seed, concepts_per_kind=demo.concepts_per_kind,
                                         num_candidates=demo.num_candidates)
    paths = rewrite_world.write_world(world, os.path.join(config.data.dir, DATASET))
    BM25Retriever.build(paths["corpus"], config.retrieval.index_dir, show_progress=False)
    # its prompts and answers, in the tokenizer's texts
    env = task.build(config.task, config.env, config.retrieval)
    queries = [{"question": q["text"], **q} for qs in world.queries.values() for q in qs]
    texts = [doc["text"] for doc in world.docs]
    texts += [env.prompt(q) + env.target_response(rewrite_world.oracle_rewrite(world, q)) for q in queries]
    train_bpe_tokenizer(texts, demo.vocab_size, out_dir=config.tokenizer)
    return world


def cold_start_examples(world: rewrite_world.RewriteWorld, built: experiment.Experiment, samples: int,
                        seed: int) -> list[list[tuple[str, bool]]]:
    """`samples` SFT examples per training question: its prompt, then a rewrite with one candidate technical
    word per user word, drawn at random."""
    rng = random.Random(seed)
    queries = {q["_id"]: q for q in world.queries["train"]}
    out = []
    for example in built.train_examples:
        prompt = chat.render(built.tokenizer, built.env.prompt(example))
        for _ in range(samples):
            rewrite = rewrite_world.candidate_rewrite(world, queries[example["id"]], rng)
            out.append([(prompt, False), (built.env.target_response(rewrite), True)])
    return out


def held_out_metrics(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    """The raw query's and the policy's METRICS on the held-out topics, from an evaluation's table."""
    row = next(r for r in results["table"] if r["dataset"] == DATASET)
    return {"raw": {m: row[f"raw_{m}"] for m in METRICS},
            "policy": {m: row[m] for m in METRICS} | {"format_valid": row["format_valid"],
                                                       "query_words": row["query_words"]}}


@dataclasses.dataclass(frozen=True)
class ColdStart:
    """What a seed's RL starts from: its experiment, held-out topics, cold-started policy, its first and last
    SFT loss, and the raw query's and the policy's held-out metrics (`held_out_metrics`)."""

    built: experiment.Experiment
    test: dict[str, list[dict]]
    policy: Any
    losses: list[float]
    metrics: dict[str, dict[str, float]]


def cold_start(config: RunConfig, world: rewrite_world.RewriteWorld) -> ColdStart:
    """SFT on random candidate rewrites (`cold_start_examples`), evaluated on the held-out topics."""
    start = time.perf_counter()
    built = experiment.build(config)
    test = datasets.load_examples(config.data.dir, DATASET, "test", config.data.format, config.data.tfds_dir)
    examples = cold_start_examples(world, built, config.demo.sft_samples, config.seed)
    placement = models.placement_of(config.mesh)
    policy, losses = sft.fine_tune(built.model_cfg, built.policy, built.tokenizer, examples, config.sft,
                                   placement)
    print(f"seed {config.seed}: SFT loss {losses[0]:.3f} -> {losses[-1]:.3f} "
          f"({time.perf_counter() - start:.0f}s)")
    metrics = evaluate(config, built, test, policy, "sft")
    return ColdStart(built, test, policy, [losses[0], losses[-1]], metrics)


def evaluate(config: RunConfig, built: experiment.Experiment, test: dict[str, list[dict]], params: Any,
             name: str) -> dict[str, dict[str, float]]:
    """Greedy evaluation on the held-out topics (its report in workdir/eval_<name>): `held_out_metrics`."""
    results = harness.evaluate_policy(built.model_cfg, params, built.tokenizer, built.env, test,
                                      built.rollout, config.train.batch_size, spec=analysis.REPORT,
                                      placement=models.placement_of(config.mesh).on_one_device())
    report.write_report(results, os.path.join(config.workdir, f"eval_{name}"), analysis.REPORT)
    return held_out_metrics(results)


def rl_arm(config: RunConfig, cold: ColdStart) -> dict[str, Any]:
    """PPO from the cold start on the seed's workdir; the held-out metrics of each policy, the first and last
    training reward and SFT loss."""
    params, history = train(config, cold.built, cold.policy)
    rl = evaluate(config, cold.built, cold.test, params, "rl")
    return {"raw": cold.metrics["raw"], "sft": cold.metrics["policy"], "rl": rl["policy"],
            "train_reward": [history[0]["reward/mean"], history[-1]["reward/mean"]], "sft_loss": cold.losses}


def markdown(per_seed: dict[str, dict[str, Any]]) -> str:
    lines = ["| seed | policy | " + " | ".join(METRICS) + " |", "|---|---|" + "---|" * len(METRICS)]
    for seed, result in per_seed.items():
        for policy in POLICIES:
            cells = " | ".join(f"{result[policy][m]:.3f}" for m in METRICS)
            lines.append(f"| {seed} | {policy} | {cells} |")
    return "\n".join(lines)


def claims(per_seed: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """DeepRetrieval's claim on the miniature: RL lifts held-out recall@10 over the cold start by at least 20
    points on every seed."""
    gain = paired(per_seed, "rl", "sft", "recall@10")
    return [claim("deepretrieval", "rl_beats_cold_start_recall@10",
                  "RL - cold-start held-out recall@10 on every seed", gain, ">= 0.20 on every seed",
                  on_every_seed(g >= 0.20 for g in gain["per_seed"].values()))]


MINIATURE = Miniature(world=build_world, cold_start=cold_start, arms=rl_arm,
                      over_seeds=functools.partial(seed_intervals, policies=POLICIES, metrics=METRICS),
                      claims=claims, markdown=markdown)
