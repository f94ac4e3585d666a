"""AutoSearch end to end on a CPU (`make demo`), from an empty directory to trained search agents.

Per seed of `config.demo.seeds` (under workdir/seed<N>): builds a synthetic world (questions no model can
know), its BM25 index and a tokenizer; cold-starts a tiny policy with SFT on scripted trajectories that often
search once more than needed (first on their two-turn prefixes, where a model trained from scratch learns to
copy names cheaply, then on whole trajectories and on the intermediate answers before some of the extra
searches, so that answering without them is practised too); trains one PPO policy per arm of
`config.demo.arms` from that same cold start (`ARMS`: AutoSearch's rewards, its no-efficiency ablation, a
fixed cost per search), each under workdir/seed<N>/<arm> with its checkpoints, TensorBoard logs and
evaluation report; evaluates every policy greedily on questions about unseen entities, per hop count and per
search budget (seed<N>/demo.png). Writes `results.json` (each seed's summaries, their means and 95% intervals
over the seeds, and AutoSearch's claims checked on them, `claims`) and `results.md` under the workdir.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
from typing import Any, Mapping

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from searchrl import experiment, models  # noqa: E402
from searchrl.data import datasets  # noqa: E402
from searchrl.demo import synthetic  # noqa: E402
from searchrl.demo.miniature import Miniature, train  # noqa: E402
from searchrl.demo.results import (above, claim, interval, paired, per_seed_interval, weakest,  # noqa: E402
                                   seed_intervals)
from searchrl.eval import harness, report  # noqa: E402
from searchrl.retrieval.bm25 import BM25Retriever  # noqa: E402
from searchrl.rl import sft  # noqa: E402
from searchrl.run_config import RunConfig  # noqa: E402
from searchrl.tasks.autosearch import analysis, rewards, scripted  # noqa: E402
from searchrl.tasks.autosearch.config import DemoConfig  # noqa: E402
from searchrl.text.tokenizer import train_bpe_tokenizer  # noqa: E402

DATASET = "world"
METRICS = ("em", "f1", "mean_searches")  # of each policy, overall and per hop count, over the seeds
# The RL arms (`config.ARMS`): each one's reward, from the config's AutoSearch reward and the demo's config.
ARMS = {
    "autosearch": lambda reward, demo: reward,
    "no_efficiency": lambda reward, demo: dataclasses.replace(reward, **rewards.EFFICIENCY_OFF),
    "step_penalty": lambda reward, demo: dataclasses.replace(reward, **rewards.EFFICIENCY_OFF,
                                                             search_step_penalty=demo.step_penalty),
}
# "A similar 1-hop reduction": two arms' mean relative drops of 1-hop searches within this many points.
SIMILAR_DROP = 0.10
# EM "kept" (non-inferiority): AutoSearch - cold start above -1 point, by its interval's lower end.
KEPT = "95% interval above -0.01"


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
    train_bpe_tokenizer(texts, demo.vocab_size, out_dir=config.tokenizer,
                        split_pattern=synthetic.NAME_SYLLABLES)
    return {k: str(v) for k, v in paths.items()}


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    """results.json's view of one evaluation: em, f1, mean_searches overall and by hop count."""
    overall = next(row for row in results["table"] if row["dataset"] == DATASET)

    def view(row):
        return {"n": row["n"], "em": row["em"], "f1": row["f1"], "mean_searches": row["searches"]}

    return {**view(overall), "by_hops": {str(row["hops"]): view(row) for row in results["by"]["hops"]},
            "budgets": results["budgets"], "depth": results["depth"]}


def table(summaries: Mapping[str, Mapping[str, Any]]) -> str:
    """The Markdown table of one seed's summaries (policy name -> `summarize` view)."""
    lines = ["| policy | hops | n | EM | F1 | mean searches |", "|---|---|---|---|---|---|"]
    for name, s in summaries.items():
        for hops, row in [("all", s)] + sorted(s["by_hops"].items()):
            lines.append(f"| {name} | {hops} | {row['n']} | {row['em']:.3f} | {row['f1']:.3f} | "
                         f"{row['mean_searches']:.2f} |")
    return "\n".join(lines)


def print_table(summaries: Mapping[str, Mapping[str, Any]]) -> str:
    """Prints and returns `table(summaries)`."""
    text = table(summaries)
    print(text)
    return text


def plot(summaries: Mapping[str, Mapping[str, Any]], path: str) -> None:
    """The pilot study in miniature: accuracy vs search budget per hop count, of each policy (the cold start
    "sft" dashed); and the searches each policy makes per hop count."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, summary in summaries.items():
        curves = summary["budgets"]
        for curve in curves["by"]["hops"]:
            axes[0].plot(curves["budgets"], curve["em"], "--" if name == "sft" else "-", marker="o",
                         label=f"{name} {curve['hops']}-hop")
        hops = sorted(summary["by_hops"])
        searches = [summary["by_hops"][h]["mean_searches"] for h in hops]
        axes[1].bar([f"{h}-hop\n{name}" for h in hops], searches, alpha=0.7)
    axes[0].set(xlabel="searches allowed", ylabel="exact match", title="accuracy vs search budget")
    axes[0].legend(fontsize=7)
    axes[1].set(ylabel="mean searches", title="searches per question")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def arm_config(config: RunConfig, arm: str) -> RunConfig:
    """One RL arm's run: its reward (`ARMS`) and its own workdir (the seed's workdir/<arm>)."""
    if arm not in ARMS:
        raise ValueError(f"config.demo.arms: unknown arm {arm!r}; expected some of {sorted(ARMS)}")
    reward = ARMS[arm](config.env.autosearch, config.demo)
    return dataclasses.replace(config, workdir=os.path.join(config.workdir, arm),
                               env=dataclasses.replace(config.env, autosearch=reward))


@dataclasses.dataclass(frozen=True)
class ColdStart:
    """What a seed's arms start from: its experiment, held-out questions, cold-started policy, each SFT
    stage's first and last loss, and the policy's `summarize` view."""

    built: experiment.Experiment
    test: dict[str, list[dict]]
    policy: Any
    losses: dict[str, list[float]]
    summary: dict[str, Any]


def cold_start(config: RunConfig, world: dict[str, str]) -> ColdStart:
    """The SFT cold start of the seed's policy on the scripted trajectories (prefixes, then whole ones), and
    its evaluation (workdir/eval_sft). The experiment reads the `world`'s files where the config says."""
    demo = config.demo
    built = experiment.build(config)
    data = config.data
    test = datasets.load_examples(data.dir, data.eval, data.eval_split, data.format, data.tfds_dir)
    test = {name: records[: demo.eval_questions] for name, records in test.items()}
    segments = scripted.scripted_trajectories(built.train_examples, built.env, demo.extra_search_fraction,
                                              config.seed)
    early = scripted.early_answers(built.train_examples, segments, demo.early_answer_fraction, config.seed,
                                   built.env.config.answer_prompt)
    stages = (("prefixes", scripted.turn_prefixes(segments, 2), demo.prefix_sft),
              ("trajectories", segments + early, config.sft))
    placement = models.placement_of(config.mesh)
    policy, losses = built.policy, {}
    for stage, examples, sft_config in stages:
        policy, stage_losses = sft.fine_tune(built.model_cfg, policy, built.tokenizer, examples, sft_config,
                                             placement)
        losses[stage] = [stage_losses[0], stage_losses[-1]]
        print(f"seed {config.seed}: SFT on {stage}: loss {stage_losses[0]:.3f} -> {stage_losses[-1]:.3f}")
    summary = evaluate(config, built, test, policy, os.path.join(config.workdir, "eval_sft"))
    return ColdStart(built, test, policy, losses, summary)


def evaluate(config: RunConfig, built: experiment.Experiment, test: dict[str, list[dict]], params: Any,
             out_dir: str) -> dict[str, Any]:
    """Greedy evaluation of `params` on the held-out questions, per hop count and search budget; its report
    goes to `out_dir`. Returns its `summarize` view."""
    demo = config.demo
    results = harness.evaluate_policy(
        built.model_cfg, params, built.tokenizer, built.env, test, built.rollout, config.train.batch_size,
        budgets=list(demo.budgets), spec=analysis.REPORT,
        placement=models.placement_of(config.mesh).on_one_device(), budget_questions=demo.budget_questions)
    report.write_report(results, out_dir, analysis.REPORT)
    return summarize(results)


def run_arms(config: RunConfig, cold: ColdStart) -> dict[str, Any]:
    """One PPO run per arm of `config.demo.arms` from the cold start, each evaluated: each policy's
    `summarize` view ("sft" and the arms' names) and the SFT losses; the seed's plot (demo.png)."""
    summaries = {"sft": cold.summary}
    for arm in config.demo.arms:
        arm_cfg = arm_config(config, arm)
        # the seed's retriever, the arm's reward
        env = dataclasses.replace(cold.built.env, config=arm_cfg.env)
        params, _ = train(arm_cfg, cold.built, cold.policy, env=env)
        out_dir = os.path.join(arm_cfg.workdir, "eval")
        summaries[arm] = evaluate(config, cold.built, cold.test, params, out_dir)
        print(f"seed {config.seed}: {arm} done")
    plot(summaries, os.path.join(config.workdir, "demo.png"))
    return {**summaries, "sft_loss": cold.losses}


def policies(per_seed: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The policies every seed evaluated: "sft", then the arms, in `ARMS` order."""
    return [p for p in ("sft", *ARMS) if all(p in r for r in per_seed.values())]


def common_hops(per_seed: Mapping[str, Mapping[str, Any]], names: list[str]) -> list[str]:
    """The hop counts that every seed's evaluation of every policy in `names` has questions of."""
    sets = [set(r[p]["by_hops"]) for r in per_seed.values() for p in names]
    return sorted(set.intersection(*sets)) if sets else []


def hop_view(per_seed: Mapping[str, Mapping[str, Any]], names: list[str], hops: list[str]
             ) -> dict[str, dict[str, dict[str, float]]]:
    """seed -> policy -> the `METRICS` of its questions with a hop count in `hops` (n-weighted means)."""
    def pooled(summary):
        rows = [summary["by_hops"][h] for h in hops]
        n = sum(row["n"] for row in rows)
        return {m: sum(row[m] * row["n"] for row in rows) / n for m in METRICS}

    return {seed: {p: pooled(r[p]) for p in names} for seed, r in per_seed.items()}


def over_seeds(per_seed: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """policy -> metric -> its `interval` over the seeds, overall and (under "by_hops") per hop count."""
    names = policies(per_seed)
    out = seed_intervals(per_seed, names, METRICS)
    for policy in names:
        out[policy]["by_hops"] = {}
    for hops in common_hops(per_seed, names):
        for policy, metrics in seed_intervals(hop_view(per_seed, names, [hops]), names, METRICS).items():
            out[policy]["by_hops"][hops] = metrics
    return out


def one_hop_drops(per_seed: Mapping[str, Mapping[str, Any]], arm: str) -> dict[str, float]:
    """Per seed, the relative drop of the arm's 1-hop mean searches from the cold start's (0 where the cold
    start made no search: nothing to cut)."""
    view = hop_view(per_seed, ["sft", arm], ["1"])
    return {seed: 1 - r[arm]["mean_searches"] / cold if (cold := r["sft"]["mean_searches"]) else 0.0
            for seed, r in view.items()}


def claims(per_seed: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """AutoSearch's claims on the miniature: fewer searches where they are redundant (1-hop), EM kept where
    they are needed (2-, 3-hop) and overall, against a step penalty and the no-efficiency ablation, from a
    cold start that answers 1-hop questions. A claim whose arm or hop count was not evaluated is left out.
    "Similar 1-hop reduction": the two arms' mean relative drops within `SIMILAR_DROP`."""
    names = policies(per_seed)
    hops = common_hops(per_seed, names)
    out = []
    if "1" in hops:
        sft_em = per_seed_interval({s: r["sft"]["em"] for s, r in hop_view(per_seed, ["sft"], ["1"]).items()})
        out.append(claim("autosearch", "cold_start_one_hop_em", "cold-start EM on 1-hop questions",
                         sft_em, "95% interval above 0.5", above(sft_em, 0.5)))
    if "autosearch" not in names:
        return out
    if "1" in hops:
        drop = per_seed_interval(one_hop_drops(per_seed, "autosearch"))
        out.append(claim("autosearch", "one_hop_searches_fall",
                         "relative drop of 1-hop mean searches, cold start -> AutoSearch", drop,
                         "95% interval above 0.30", above(drop, 0.30)))
    for h in ("2", "3"):
        if h in hops:
            gain = paired(hop_view(per_seed, names, [h]), "autosearch", "sft", "em")
            out.append(claim("autosearch", f"{h}_hop_em_kept",
                             f"AutoSearch - cold-start EM on {h}-hop questions", gain, KEPT, above(gain, -0.01)))
    gain = paired(per_seed, "autosearch", "sft", "em")
    out.append(claim("autosearch", "em_kept", "AutoSearch - cold-start EM on all questions", gain, KEPT,
                     above(gain, -0.01)))
    multi = [h for h in hops if h != "1"]
    if "step_penalty" in names and "1" in hops and multi:
        extra = paired(hop_view(per_seed, names, multi), "autosearch", "step_penalty", "em")
        drops = {arm: interval(list(one_hop_drops(per_seed, arm).values()))["mean"]
                 for arm in ("autosearch", "step_penalty")}
        gap = abs(drops["autosearch"] - drops["step_penalty"])
        out.append(claim("autosearch", "step_penalty_loses_more_multi_hop_em",
                         "AutoSearch - step-penalty EM on multi-hop questions (the step penalty's extra "
                         "loss), at a similar 1-hop reduction (mean relative drops of 1-hop searches within "
                         f"{SIMILAR_DROP:.2f})",
                         {"extra_em_loss": extra, "one_hop_drop": drops, "drop_gap": gap},
                         f"extra_em_loss 95% interval above 0 and drop_gap <= {SIMILAR_DROP:.2f}",
                         weakest(above(extra), "yes" if gap <= SIMILAR_DROP else "no")))
    if "no_efficiency" in names and "1" in hops:
        full, ablated = (one_hop_drops(per_seed, arm) for arm in ("autosearch", "no_efficiency"))
        less = per_seed_interval({seed: full[seed] - ablated[seed] for seed in full})
        out.append(claim("autosearch", "no_efficiency_cuts_fewer_searches",
                         "relative drop of 1-hop searches, AutoSearch - no-efficiency ablation", less,
                         "95% interval above 0", above(less)))
    return out


def markdown(per_seed: Mapping[str, Mapping[str, Any]]) -> str:
    """results.md: each seed's table, then each figure's mean and 95% interval over the seeds."""
    intervals = over_seeds(per_seed)
    parts = [f"### seed {seed}\n\n" + table({p: r[p] for p in policies(per_seed)})
             for seed, r in per_seed.items()]
    lines = ["| policy | hops | EM | F1 | mean searches |", "|---|---|---|---|---|"]
    for name, s in intervals.items():
        for hops, row in [("all", s)] + sorted(s["by_hops"].items()):
            cells = [f"{row[m]['mean']:.3f}" + ("" if row[m]["low"] is None else
                                                f" [{row[m]['low']:.3f}, {row[m]['high']:.3f}]")
                     for m in METRICS]
            lines.append(f"| {name} | {hops} | " + " | ".join(cells) + " |")
    parts.append(f"### over {len(per_seed)} seed(s): mean [95% Student-t interval]\n\n" + "\n".join(lines))
    return "\n\n".join(parts)


MINIATURE = Miniature(world=build_world, cold_start=cold_start, arms=run_arms, over_seeds=over_seeds,
                      claims=claims, markdown=markdown)
