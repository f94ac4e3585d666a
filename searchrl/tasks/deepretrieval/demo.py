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

import os
import random
import shutil
import time
from typing import Any

import jax

from searchrl import experiment, models, task
from searchrl.data import datasets
from searchrl.demo.config import seed_config, world_config
from searchrl.demo.results import claim, paired, run_seeds, seed_intervals, write_results
from searchrl.eval import harness, report
from searchrl.retrieval.bm25 import BM25Retriever
from searchrl.rl import sft
from searchrl.rl.trainer import Trainer
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


def run_seed(config: RunConfig) -> dict[str, Any]:
    """One seed from an empty directory: world, cold start, PPO, and the held-out metrics of each policy."""
    start = time.perf_counter()
    demo = config.demo
    for built_before in (DATASET, "index", "tokenizer", "checkpoints", "tensorboard"):  # the demo starts over
        shutil.rmtree(os.path.join(config.workdir, built_before), ignore_errors=True)
    if os.path.exists(metrics := os.path.join(config.workdir, "metrics.jsonl")):
        os.remove(metrics)
    world = build_world(config, demo)
    built = experiment.build(config)
    test = datasets.load_examples(config.data.dir, DATASET, "test", config.data.format, config.data.tfds_dir)
    examples = cold_start_examples(world, built, demo.sft_samples, config.seed)
    placement = models.placement_of(config.mesh)
    policy, losses = sft.fine_tune(built.model_cfg, built.policy, built.tokenizer, examples, config.sft, placement)
    print(f"seed {config.seed}: SFT loss {losses[0]:.3f} -> {losses[-1]:.3f} "
          f"({time.perf_counter() - start:.0f}s)")

    def evaluate(params, name):
        results = harness.evaluate_policy(built.model_cfg, params, built.tokenizer, built.env, test,
                                          built.rollout, config.train.batch_size, spec=analysis.REPORT,
                                          placement=placement.on_one_device())
        report.write_report(results, os.path.join(config.workdir, f"eval_{name}"), analysis.REPORT)
        return held_out_metrics(results)

    cold = evaluate(policy, "sft")
    trainer = Trainer(config, built.model_cfg, policy, built.tokenizer, built.env, built.train_examples)
    try:
        history = trainer.train()
        rl_params = jax.device_get(trainer.state.policy)
    finally:
        trainer.close()
    rl = evaluate(rl_params, "rl")
    return {"raw": cold["raw"], "sft": cold["policy"], "rl": rl["policy"],
            "train_reward": [history[0]["reward/mean"], history[-1]["reward/mean"]],
            "sft_loss": [losses[0], losses[-1]], "seconds": time.perf_counter() - start}


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
                  min(gain["per_seed"].values()) >= 0.20)]


def run(config: RunConfig) -> dict[str, Any]:
    """Every seed of `config.demo.seeds`; results.json holds each seed's metrics, their means and 95%
    intervals over the seeds, and the claim."""
    start = time.perf_counter()
    demo = config.demo
    configs = [world_config(seed_config(config, seed)) for seed in demo.seeds]
    per_seed = dict(zip(map(str, demo.seeds), run_seeds(run_seed, configs, demo.parallel_seeds)))
    results = {"held_out": per_seed, "over_seeds": seed_intervals(per_seed, POLICIES, METRICS),
               "claims": claims(per_seed), "seconds": time.perf_counter() - start}
    write_results(config.workdir, markdown(per_seed), results)
    print(f"results: {config.workdir}/results.json ({results['seconds']:.0f}s)")
    return results
