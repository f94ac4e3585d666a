"""Retrieval Program Learning in miniature on a CPU: the paper's two claims on GlobalQA-style tasks.

Builds a synthetic world (`searchrl.demo.synthetic`), its GlobalQA tasks (`searchrl.tasks.rpl.globalqa`,
`config.demo.types`), a BM25 index and a tokenizer. One tiny policy is cold-started with SFT on the scripted
turns of both kinds (the prompt says which kind to write; `cold_start`). From that one checkpoint, per RL seed
(`config.demo.seeds`), it is trained with PPO for the same number of steps on answer F1 as each of:

- search: the AutoSearch-style agent (`program` env, `search` space): one query per turn, Search-R1's top 3
  passages back; scripted with the plan query, then the group's value alone;
- program: one program turn over the sparse SDK (`sparse` space: sparse_retrieval, fuse, dedup); scripted
  as `show(sparse_retrieval(<plan query>, cold_start_top_k)[i:j])`, one trajectory per window of
  `cold_start_windows`.

Halfway, the program run's checkpoint is copied: one copy continues RL, the other runs program mutation on
the policy's weak programs, distils the trajectories of the verified variants and of the programs no
edit improves (`searchrl.tasks.rpl.distill`) and resumes RL on the same batches. Claim (a): the program
policy reaches higher answer F1 and dF1 than the search policy while consuming fewer context tokens.
Claim (b): mutation + distillation + resumed RL beats continued RL on held-out tasks. Writes
`results.json`, `results.md` and `rpl.png` (Figures 3, 4 and 5 in miniature) under the config's workdir;
per seed, each arm's evaluation report (`seed<seed>/<arm>/eval_<arm>/`) and training logs.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import shutil
from typing import Any, Collection, Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from searchrl import experiment, models  # noqa: E402
from searchrl.data import datasets  # noqa: E402
from searchrl.demo import synthetic  # noqa: E402
from searchrl.demo.miniature import Branch, Miniature, train  # noqa: E402
from searchrl.demo.results import above, claim, on_every_seed, paired, seed_intervals  # noqa: E402
from searchrl.episode import Action, Observation  # noqa: E402
from searchrl.eval import harness, report  # noqa: E402
from searchrl.metric_writer import read_metrics  # noqa: E402
from searchrl.retrieval.bm25 import BM25Retriever  # noqa: E402
from searchrl.retrieval.types import Hit  # noqa: E402
from searchrl.rl import sft  # noqa: E402
from searchrl.run_config import RunConfig  # noqa: E402
from searchrl.tasks.rpl import analysis, distill, globalqa  # noqa: E402
from searchrl.tasks.rpl.config import RPLDemoConfig  # noqa: E402
from searchrl.tasks.rpl.env import (PROGRAM, SEARCH, ProgramEnv, format_documents,  # noqa: E402
                                   named_documents)
from searchrl.text import chat, tags  # noqa: E402
from searchrl.text.tokenizer import PROTOCOL_TAGS, train_bpe_tokenizer  # noqa: E402

DATASET = "globalqa"
ARMS = ("search", "program", "program_pm")  # the evaluated policies, after the same number of RL steps
POLICIES = ("search_sft", "program_sft", *ARMS)  # and the cold start, evaluated in each env
PROMPTS = ("Write a program. Question: {question}\n", "Search. Question: {question}\n")  # program, search
HELD_OUT_SPLITS = ("dev", "test")  # of the world's entities
METRICS = ("answer_f1", "doc_f1", "context_tokens", "retrieval_turns", "retrieval_calls")
Segments = list[tuple[str, bool]]


def program_source(query: str, top_k: int, window: tuple[int, int]) -> str:
    """A scripted program: retrieve `top_k`, show the ranks window[0] .. window[1] - 1; written as
    `ast.unparse` writes the variants mutation distils. The query starts with a space, as its words do in the
    question: byte-level BPE then gives them the same tokens in both, and the policy's copy of a name it has
    never seen is token for token."""
    start, stop = window
    return f"show(sparse_retrieval({' ' + query!r}, {top_k})[{start or ''}:{stop}])"


def turn_text(action: Action) -> str:
    """A scripted retrieval turn: the action's block, its content between spaces (as for the query)."""
    return tags.block(action.kind, f" {action.content} ")


def answer_turn(names: Sequence[str]) -> str:
    return tags.block(tags.ANSWER, f" {', '.join(names) or 'none'} ")


def citations(observations: Sequence[Observation], gold: Collection[str]) -> list[str]:
    """How an answer names the gold documents among those shown, in the order first shown: as the
    observations named them (`named_documents`: by number under `cite="rank"`, else by id)."""
    cited = {}
    for observation in observations:
        for name, doc in named_documents(observation.info):
            if doc in gold:
                cited.setdefault(doc, name)
    return list(cited.values())


def build_world(config: RunConfig, demo: RPLDemoConfig) -> list[dict[str, Any]]:
    """The world's corpus and its GlobalQA tasks of `demo.types` under workdir, the BM25 index and the
    tokenizer (from scratch); returns the training tasks of every type (the prefix stage's)."""
    for built_before in (DATASET, "world", "index", "tokenizer"):
        shutil.rmtree(os.path.join(config.workdir, built_before), ignore_errors=True)
    world = synthetic.generate_world(config.seed, demo.entities, questions_per_entity=0.0,
                                     pair_fraction=demo.pair_fraction, test_fraction=demo.test_fraction)
    corpus = synthetic.write_world(world, os.path.join(config.workdir, "world"))["corpus"]
    every_type = globalqa.generate_tasks(world, config.seed, per_type=len(world.entities),
                                         max_answer=demo.max_answer)
    tasks = {split: [t for t in records if t["metadata"]["type"] in demo.types]
             for split, records in every_type.items()}
    globalqa.write_tasks(tasks, config.data.dir, DATASET)
    BM25Retriever.build(corpus, config.retrieval.index_dir, show_progress=False)
    # Fitted on the training split's text: passages as observations show them (by id, or numbered 1 to
    # max_shown under cite="rank"), but none of a held-out entity, questions and programs. With a small
    # vocabulary, held-out names are made of pieces that training queries write too.
    shown = [p for p in world.passages if world.entities[p.entity].split not in HELD_OUT_SPLITS]
    numbered = config.env.cite == "rank"
    texts = [format_documents([Hit(p.id, 0.0, f'"{p.title}"', p.text)],
                              1 + i % config.env.limits.max_shown if numbered else None)
             for i, p in enumerate(shown)]
    texts += [t["question"] for t in tasks["train"]]
    texts += [program_source(t["metadata"]["plan"][0], demo.cold_start_top_k, window)
              for t in tasks["train"] for window in demo.cold_start_windows]
    train_bpe_tokenizer(texts, demo.vocab_size, out_dir=config.tokenizer,
                        special_tokens=(*PROTOCOL_TAGS, tags.open_tag(tags.PROGRAM),
                                        tags.close_tag(tags.PROGRAM)))
    return every_type["train"]


def scripted_plans(example: Mapping[str, Any], env: ProgramEnv, demo: RPLDemoConfig) -> list[list[Action]]:
    """The cold start's retrieval turns for `example`, one list per trajectory: a program of the plan query
    per window of `demo.cold_start_windows`, or one search plan (the plan query, then the group's value
    alone) cut to the env's turns."""
    meta = example["metadata"]
    if env.tool == PROGRAM:
        return [[Action(PROGRAM, program_source(meta["plan"][0], demo.cold_start_top_k, window))]
                for window in demo.cold_start_windows]
    queries = [meta["plan"][0], meta["value"]][: min(demo.search_turns, env.config.max_turns)]
    return [[Action(SEARCH, query) for query in queries]]


def first_turns(examples: Sequence[Mapping[str, Any]], env: ProgramEnv, tokenizer: Any,
                demo: RPLDemoConfig) -> list[Segments]:
    """The prefix stage's examples: each prompt and the first retrieval turn of each of its plans.

    They hold the copy a retrieval turn makes (the group's name from the question into the query) in a few
    dozen tokens, so a model trained from scratch can see many more names than there are whole tasks."""
    return [[(chat.render(tokenizer, env.prompt(example)), False),
             (turn_text(plan[0]), True)]
            for example in examples for plan in scripted_plans(example, env, demo)]


def scripted_trajectories(examples: Sequence[Mapping[str, Any]], env: ProgramEnv, tokenizer: Any,
                          demo: RPLDemoConfig) -> list[Segments]:
    """Per example and plan: prompt, (retrieval turn, observation) per action, then the answer citing the
    gold documents among those shown, in the order shown. Each turn is parsed and observed by the env (the
    observations in one batch), as in a rollout."""
    plans = [(example, plan) for example in examples for plan in scripted_plans(example, env, demo)]
    observations = iter(env.observe([env.parse_action(turn_text(action), t) for _, plan in plans
                                     for t, action in enumerate(plan)]))
    out = []
    for example, plan in plans:
        segments, seen = [(chat.render(tokenizer, env.prompt(example)), False)], []
        for action in plan:
            seen.append(next(observations))
            segments += [(turn_text(action), True), (seen[-1].text, False)]
        segments.append((answer_turn(citations(seen, set(example["golden_answers"]))), True))
        out.append(segments)
    return out


def arm_config(config: RunConfig, arm: str, demo: RPLDemoConfig) -> RunConfig:
    """An arm's config: its workdir and prompt, and for `search` the search space with `demo.search_turns`."""
    env = config.env
    if arm == "search":
        env = dataclasses.replace(env, action_space="search", max_turns=demo.search_turns)
    env = dataclasses.replace(env, prompt_template=PROMPTS[env.action_space == "search"])
    return dataclasses.replace(config, workdir=os.path.join(config.workdir, arm), env=env)


def cold_start(configs: Sequence[RunConfig], prefix_tasks: Sequence[Mapping[str, Any]],
               demo: RPLDemoConfig) -> tuple[list[experiment.Experiment], dict]:
    """Each config's experiment, and one policy trained with SFT on the scripted turns of them all (the
    prompt says which kind of turn to write), so every arm starts from the same weights: first on the first
    turns of `prefix_tasks`, then on the whole trajectories of the training tasks."""
    built = [experiment.build(config) for config in configs]
    stages = (("prefixes", [s for b in built for s in first_turns(prefix_tasks, b.env, b.tokenizer, demo)],
               demo.prefix_sft),
              ("trajectories", [s for b in built
                                for s in scripted_trajectories(b.train_examples, b.env, b.tokenizer, demo)],
               configs[0].sft))
    placement = models.placement_of(configs[0].mesh)
    policy = built[0].policy
    for stage, segments, sft_config in stages:
        policy, losses = sft.fine_tune(built[0].model_cfg, policy, built[0].tokenizer, segments, sft_config,
                                       placement)
        print(f"cold start on {len(segments)} {stage}: SFT loss {losses[0]:.3f} -> "
              f"{losses[-1]:.3f}")
    return built, policy


def held_out(config: RunConfig, built: experiment.Experiment, params: dict,
             test: dict[str, list[dict]], name: str) -> dict[str, float]:
    """Greedy evaluation on the held-out tasks; its report goes to workdir/eval_<name>. Returns METRICS and
    the share of episodes calling each SDK function."""
    results = harness.evaluate_policy(built.model_cfg, params, built.tokenizer, built.env, test,
                                      built.rollout, config.train.batch_size, spec=analysis.REPORT,
                                      placement=models.placement_of(config.mesh).on_one_device())
    report.write_report(results, os.path.join(config.workdir, f"eval_{name}"), analysis.REPORT)
    row = next(r for r in results["table"] if r["dataset"] == DATASET)
    return {m: row[m] for m in METRICS} | {k: v for k, v in row.items() if k.startswith("uses_")}


def curve(workdir: str, name: str) -> list[tuple[int, float]]:
    """(step, value) of a logged metric, in step order."""
    return [(int(r["step"]), float(r[name])) for r in read_metrics(os.path.join(workdir, "metrics.jsonl"))
            if name in r]


@dataclasses.dataclass(frozen=True)
class ColdStart:
    """What every RL seed starts from: both envs' experiments, the cold-started policy, the held-out tasks
    and the policy's held-out metrics in each env."""

    search: experiment.Experiment
    program: experiment.Experiment
    policy: dict
    test: dict[str, list[dict]]
    held_out: dict[str, dict[str, float]]


def cold_started(config: RunConfig, prefix_tasks: Sequence[Mapping[str, Any]]) -> ColdStart:
    """The shared cold start on the world and its held-out evaluation in each env (workdir/<arm>/eval_*)."""
    demo = config.demo
    test = datasets.load_examples(config.data.dir, DATASET, "test", config.data.format, config.data.tfds_dir)
    test = {name: records[: demo.eval_questions] for name, records in test.items()}
    configs = [arm_config(config, arm, demo) for arm in ("search", "program")]
    (search, program), policy = cold_start(configs, prefix_tasks, demo)
    held = {f"{arm}_sft": held_out(arm_cfg, built, policy, test, f"{arm}_sft")
            for arm, arm_cfg, built in zip(("search", "program"), configs, (search, program))}
    return ColdStart(search, program, policy, test, held)


def run_arms(config: RunConfig, start: ColdStart) -> dict[str, Any]:
    """One RL seed from the cold start: each arm's RL (workdir/seed<seed>/<arm>), held-out metrics; program
    mutation branches off the program run halfway, on the same batches."""
    search, built, policy, test = start.search, start.program, start.policy, start.test
    half = config.train.steps // 2
    results: dict[str, Any] = dict(start.held_out)
    configs = {arm: arm_config(config, arm, config.demo) for arm in ARMS}
    params, _ = train(configs["search"], search, policy)
    results["search"] = held_out(configs["search"], search, params, test, "search")
    print(f"seed {config.seed}: search arm done")

    eval_examples = test[DATASET]
    program_config, pm_config = configs["program"], configs["program_pm"]
    params, _ = train(program_config, built, policy, eval_examples=eval_examples,
                      branch=Branch(half, pm_config.workdir))  # checkpointed at `half`: the branch point
    results["program"] = held_out(program_config, built, params, test, "program")
    mutation = distill.ProgramMutation(dataclasses.replace(built.env.config.mutation, at_step=half))
    # resumes at the branch point, with the same data order and keys as the continued run
    params, _ = train(pm_config, built, policy, eval_examples=eval_examples, hooks=[mutation], branched=True)
    results["program_pm"] = held_out(pm_config, built, params, test, "program_pm")
    results["mutation"] = {k.removeprefix("mutation/"): v for r in
                           read_metrics(os.path.join(pm_config.workdir, "metrics.jsonl"))
                           for k, v in r.items() if k.startswith("mutation/")}
    results["curves"] = {arm: {"held_out_answer_f1": curve(configs[arm].workdir, "eval/answer_f1"),
                               "uses": {name: curve(configs[arm].workdir, f"env/uses_{name}")
                                        for name in built.env.sdk.available}}
                         for arm in ("program", "program_pm")}
    return results


def claims(per_seed: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The paper's two claims on the miniature: (a) on every seed, programs beat the search agent on answer
    F1 and dF1 with less context; (b) mutation beats continued RL on held-out answer F1, the mean gain's 95%
    interval over the seeds above 0."""
    def a(r):
        return (r["program"]["answer_f1"] > r["search"]["answer_f1"] and r["program"]["doc_f1"] >
                r["search"]["doc_f1"] and r["program"]["context_tokens"] < r["search"]["context_tokens"])

    held = {seed: a(r) for seed, r in per_seed.items()}
    gain = paired(per_seed, "program_pm", "program", "answer_f1")
    return [claim("rpl", "a_program_beats_search",
                  "program RL beats search RL on answer F1 and dF1 with fewer context tokens",
                  {"per_seed": held}, "on every seed", on_every_seed(held.values())),
            claim("rpl", "b_mutation_beats_continued_rl",
                  "program RL + mutation - program RL, held-out answer F1", gain,
                  "95% interval above 0", above(gain))]


def markdown(per_seed: Mapping[str, Mapping[str, Any]]) -> str:
    lines = ["| seed | policy | " + " | ".join(METRICS) + " |", "|---|---|" + "---|" * len(METRICS)]
    for seed, result in per_seed.items():
        for policy in POLICIES:
            cells = " | ".join(f"{result[policy][m]:.3f}" if m.endswith("f1") else f"{result[policy][m]:.1f}"
                               for m in METRICS)
            lines.append(f"| {seed} | {policy} | {cells} |")
    return "\n".join(lines)


def plot(per_seed: Mapping[str, Mapping[str, Any]], path: str) -> None:
    """Figure 3 (held-out answer F1 over RL steps, with and without mutation), Figure 4 (context tokens and
    retrieval turns per policy) and Figure 5 (share of training programs calling each SDK function)."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for seed, result in per_seed.items():
        for arm, style in (("program", "--"), ("program_pm", "-")):
            if points := result["curves"][arm]["held_out_answer_f1"]:
                axes[0].plot(*zip(*points), style, marker="o", label=f"seed {seed} {arm}")
            for name, points in result["curves"][arm]["uses"].items():
                if points:
                    axes[2].plot(*zip(*points), style, label=f"seed {seed} {arm} {name}", alpha=0.7)
    axes[0].set(xlabel="RL step", ylabel="held-out answer F1", title="with and without program mutation")
    means = {arm: [np.mean([r[arm][m] for r in per_seed.values()])
                   for m in ("context_tokens", "retrieval_turns")] for arm in ARMS}
    x = np.arange(len(ARMS))
    axes[1].bar(x - 0.2, [means[arm][0] for arm in ARMS], 0.4, label="context tokens")
    twin = axes[1].twinx()
    twin.bar(x + 0.2, [means[arm][1] for arm in ARMS], 0.4, color="tab:orange", label="retrieval turns")
    axes[1].set(xticks=x, xticklabels=ARMS, ylabel="context tokens", title="context consumed (held out)")
    twin.set(ylabel="retrieval turns")
    axes[2].set(xlabel="RL step", ylabel="share of episodes", title="SDK functions called in training")
    for axis in (axes[0], axes[2]):
        axis.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_run(per_seed: Mapping[str, Mapping[str, Any]], workdir: str) -> None:
    """`plot` of every seed to workdir/rpl.png."""
    plot(per_seed, os.path.join(workdir, "rpl.png"))


MINIATURE = Miniature(world=build_world, cold_start=cold_started, arms=run_arms,
                      over_seeds=functools.partial(seed_intervals, policies=POLICIES, metrics=METRICS),
                      claims=claims, markdown=markdown, plot=plot_run)
