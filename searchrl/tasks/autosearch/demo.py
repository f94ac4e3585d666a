"""AutoSearch end to end on a CPU (`make demo`), from an empty directory to a trained search agent.

Builds a synthetic world (questions no model can know), its BM25 index and a tokenizer; cold-starts a tiny
policy with SFT on scripted trajectories that often search once more than needed (first on their two-turn
prefixes, where a model trained from scratch learns to copy names cheaply, then on whole trajectories and on
the intermediate answers before some of the extra searches, so that answering without them is practised too);
trains it with PPO on the AutoSearch rewards (intermediate answers, minimal sufficient depth); evaluates both
policies greedily on questions about unseen entities, per hop count and per search budget; writes
`results.json`, `results.md`, `demo.png` and TensorBoard logs under the config's workdir.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from typing import Any

import jax
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from searchrl import experiment, models  # noqa: E402
from searchrl.data import datasets  # noqa: E402
from searchrl.demo import synthetic  # noqa: E402
from searchrl.eval import harness, report  # noqa: E402
from searchrl.retrieval.bm25 import BM25Retriever  # noqa: E402
from searchrl.rl import sft  # noqa: E402
from searchrl.rl.trainer import Trainer  # noqa: E402
from searchrl.run_config import RunConfig  # noqa: E402
from searchrl.tasks.autosearch import analysis, scripted  # noqa: E402
from searchrl.tasks.autosearch.config import DemoConfig  # noqa: E402
from searchrl.text.tokenizer import train_bpe_tokenizer  # noqa: E402

DATASET = "world"


def build_world(config: RunConfig, demo: DemoConfig) -> dict[str, str]:
    """The world's files under workdir/world, its BM25 index and its tokenizer (rebuilt from scratch)."""
    world = synthetic.generate_world(config.seed, demo.entities, hop_fractions=tuple(demo.hop_fractions),
                                     questions_per_entity=demo.questions_per_entity)
    paths = synthetic.write_world(world, os.path.join(config.data.dir, DATASET))
    shutil.rmtree(config.retrieval.index_dir, ignore_errors=True)
    BM25Retriever.build(paths["corpus"], config.retrieval.index_dir, show_progress=False)
    texts = [p.to_json()["contents"] for p in world.passages]
    texts += [q["question"] + " " + q["golden_answers"][0] for qs in world.questions.values() for q in qs]
    texts += [scripted.search_turn("x"), scripted.answer_turn("x"), config.env.prompt_template]
    train_bpe_tokenizer(texts, demo.vocab_size, out_dir=config.tokenizer)
    return {k: str(v) for k, v in paths.items()}


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """results.json's view of one evaluation: em, f1, mean_searches overall and by hop count."""
    overall = next(row for row in results["table"] if row["dataset"] == DATASET)

    def view(row):
        return {"n": row["n"], "em": row["em"], "f1": row["f1"], "mean_searches": row["searches"]}

    return {**view(overall), "by_hops": {str(row["hops"]): view(row) for row in results["by"]["hops"]},
            "budgets": results["budgets"], "depth": results["depth"]}


def print_table(summaries: dict[str, dict[str, Any]]) -> str:
    lines = ["| policy | hops | n | EM | F1 | mean searches |", "|---|---|---|---|---|---|"]
    for name, s in summaries.items():
        for hops, row in [("all", s)] + sorted(s["by_hops"].items()):
            lines.append(f"| {name} | {hops} | {row['n']} | {row['em']:.3f} | {row['f1']:.3f} | "
                         f"{row['mean_searches']:.2f} |")
    table = "\n".join(lines)
    print(table)
    return table


def plot(summaries: dict[str, dict[str, Any]], path: str) -> None:
    """The pilot study in miniature: accuracy vs search budget per hop count, SFT against RL; and searches."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, style in (("sft", "--"), ("rl", "-")):
        curves = summaries[name]["budgets"]
        for curve in curves["by"]["hops"]:
            axes[0].plot(curves["budgets"], curve["em"], style, marker="o", label=f"{name} {curve['hops']}-hop")
        hops = sorted(summaries[name]["by_hops"])
        axes[1].bar([f"{h}-hop\n{name}" for h in hops],
                    [summaries[name]["by_hops"][h]["mean_searches"] for h in hops], alpha=0.7)
    axes[0].set(xlabel="searches allowed", ylabel="exact match", title="accuracy vs search budget")
    axes[0].legend(fontsize=7)
    axes[1].set(ylabel="mean searches", title="searches per question")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(config: RunConfig) -> dict[str, Any]:
    start = time.perf_counter()
    os.makedirs(config.workdir, exist_ok=True)
    for stale in ("checkpoints", "tensorboard"):  # the demo always starts over
        shutil.rmtree(os.path.join(config.workdir, stale), ignore_errors=True)
    if os.path.exists(metrics := os.path.join(config.workdir, "metrics.jsonl")):
        os.remove(metrics)
    demo = config.demo
    build_world(config, demo)
    built = experiment.build(config)
    data = config.data
    test = datasets.load_examples(data.dir, data.eval, data.eval_split, data.format, data.tfds_dir)
    test = {name: records[: demo.eval_questions] for name, records in test.items()}
    print(f"world, index and tokenizer ready ({time.perf_counter() - start:.0f}s)")

    segments = scripted.scripted_trajectories(built.train_examples, built.env, demo.extra_search_fraction,
                                              config.seed)
    early = scripted.early_answers(built.train_examples, segments, demo.early_answer_fraction, config.seed,
                                   built.env.config.answer_prompt)
    stages = (("prefixes", scripted.turn_prefixes(segments, 2), demo.prefix_sft),
              ("trajectories", segments + early, config.sft))
    mesh = models.mesh_of(config.mesh)
    policy = built.policy
    losses = {}
    for stage, examples, sft_config in stages:
        tokens, loss_mask = sft.encode(built.tokenizer, examples, sft_config.max_len)
        policy, stage_losses = sft.train(built.model_cfg, policy, tokens, loss_mask, sft_config, mesh,
                                          models.rules_named(config.mesh.train_rules), config.mesh.attention)
        losses[stage] = [stage_losses[0], stage_losses[-1]]
        print(f"SFT on {stage}: loss {stage_losses[0]:.3f} -> {stage_losses[-1]:.3f} "
              f"({time.perf_counter() - start:.0f}s)")

    evaluate = lambda params: harness.evaluate_policy(  # noqa: E731
        built.model_cfg, params, built.tokenizer, built.env, test, built.rollout, config.train.batch_size,
        budgets=list(demo.budgets), spec=analysis.REPORT, rules=models.rules_named(config.mesh.sample_rules),
        attention=config.mesh.attention)
    summaries = {"sft": summarize(evaluate(policy))}
    trainer = Trainer(config, built.model_cfg, policy, built.tokenizer, built.env, built.train_examples)
    try:
        trainer.train()
        rl_params = jax.device_get(trainer.state.policy)
    finally:
        trainer.close()
    rl_results = evaluate(rl_params)
    summaries["rl"] = summarize(rl_results)
    report.write_report(rl_results, os.path.join(config.workdir, "eval_rl"), analysis.REPORT)

    table = print_table(summaries)
    with open(os.path.join(config.workdir, "results.md"), "w") as f:
        f.write(table + "\n")
    with open(os.path.join(config.workdir, "results.json"), "w") as f:
        json.dump({**summaries, "sft_loss": losses,
                   "seconds": time.perf_counter() - start}, f, indent=1)
    plot(summaries, os.path.join(config.workdir, "demo.png"))
    print(f"results: {config.workdir}/results.json, plot: {config.workdir}/demo.png, "
          f"TensorBoard: {config.workdir}/tensorboard ({time.perf_counter() - start:.0f}s)")
    return summaries

