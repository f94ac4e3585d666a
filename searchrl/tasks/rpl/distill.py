"""Program mutation inside an RL run (Retrieval Program Learning's PM): at a chosen step, the policy's weaker
programs on training questions are mutated (`searchrl.tasks.rpl.mutation`, for `MutationConfig.rounds` rounds
of verified edits), the variants whose execution verifies an improvement are turned into trajectories (the
prompt, the policy's turn with the variant in place of its program, the variant's observation, and the
policy's own answer to it: greedy, or the best of `MutationConfig.answer_samples` tries), those whose answer
scores above 0 and at least as well as the rolled-out episode are distilled into the policy with SFT, and RL
resumes from the distilled policy. Keeping only those answers matters: distilling every answer would teach the
answers that cite nothing right along with the ones that do. With `MutationConfig.distil_answers` off, the
kept trajectories end at the program turn (the only one they train) and the answers are left to RL (in the CPU
miniature the answers then kept citing where the old programs showed the members; configs/rpl.py).

searchrl also distils, by default (`MutationConfig.keep_unimproved`), the policy's programs that no edit
improves, each with its answer: with the improved ones alone, distillation also moved programs that
were already best (in the miniature, the window that suits one question type was written for others).

A program is scored by what it shows: for GlobalQA the dF1 of the shown documents against the evidence, for
open-domain QA whether a shown passage holds a gold answer. Only programs scoring below 1 are mutated, and a
variant must show no more than `MutationConfig.max_shown` documents (the context budget).
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import numpy as np

from searchrl import distributed
from searchrl.episode import SamplingParams, Turn
from searchrl.rl.hooks import RunHandle
from searchrl.tasks.rpl import mutation
from searchrl.tasks.rpl.config import MutationConfig
from searchrl.tasks.rpl.env import PROGRAM, ProgramEnv, is_globalqa, program_span, set_f1
from searchrl.tasks.rpl.sandbox import ProgramResult, execute
from searchrl.text import chat, qa, tags

log = logging.getLogger(__name__)


def program_score(example: Mapping[str, Any]) -> Callable[[ProgramResult], float]:
    """How well a program's shown documents serve `example`: dF1 for GlobalQA, answer coverage for QA."""
    if is_globalqa(example):
        evidence = example["metadata"]["evidence_ids"]
        return lambda result: set_f1([hit.id for hit in result.shown], evidence)
    golds = list(example["golden_answers"])
    return lambda result: float(any(qa.has_answer(hit.contents, golds) for hit in result.shown))


def program_frame(turn_text: str) -> tuple[tuple[str, str], str]:
    """The text of a program turn before and after its (first) program's source, and that source."""
    block = tags.find_block(turn_text, PROGRAM)
    content = turn_text[block.inner_start:block.inner_end]
    span = program_span(content)
    start, stop = block.inner_start + span.start, block.inner_start + span.stop
    return (turn_text[:start], turn_text[stop:]), turn_text[start:stop]


class _Continuing:
    """`env`, except that an example's prompt is its "prefix": the rendered trajectory so far, which the
    policy continues."""

    def __init__(self, env: ProgramEnv):
        self._env = env

    def prompt(self, example: Mapping[str, Any]) -> str:
        return example["prefix"]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)


def policy_answers(run: RunHandle, prefixes: Sequence[str], key: jax.Array, greedy: bool = True
                   ) -> list[str | None]:
    """The policy's next turn after each of `prefixes` (rendered trajectories that end where the policy
    writes), when that turn is an answer; None when it is not. Greedy, or sampled as the rollouts sample
    (`greedy=False`). Runs on the run's rollout settings with room for a whole trajectory as the prompt."""
    traj = run.roll_out([{"prefix": prefix} for prefix in prefixes], key, env=_Continuing(run.env),
                        sampling=SamplingParams(temperature=0.0) if greedy else None,
                        prompt_tokens=run.max_len, side_branch=False)
    return [turns[0].text if turns[0].action.kind == tags.ANSWER else None for turns in traj.turns]


class _Candidate(NamedTuple):
    """A rolled-out episode's turn to distil: the policy's, with the best program found in its place."""

    example: Mapping[str, Any]
    rolled_out: float  # the episode's reward
    prompt: str
    turn: str
    variant: bool  # the program is a verified variant (not the policy's own)


def mutation_examples(run: RunHandle, examples: Sequence[Mapping[str, Any]], config: MutationConfig,
                      key: jax.Array) -> tuple[list[list[tuple[str, bool]]], dict[str, float]]:
    """Rolls out `examples` with the run's policy, mutates their first programs (`mutation.climb`) and
    returns the SFT examples: prompt, the policy's turn with the best program found in place of its own
    (`before + source + after`: its reasoning and tags stay as written), that program's observation (as a
    rollout shows it) and the policy's best answer to it: of its greedy answer and, with
    `config.answer_samples` > 1, answers sampled as the rollouts sample, the one of the highest reward (a
    rejection-sampling step, as in expert iteration). The best program is the verified variant, or
    under `config.keep_unimproved` the policy's own when no edit improves it: distillation then moves the
    programs mutation improved and holds the others where they were. A trajectory is kept when its reward
    (`ProgramEnv.episode_reward`: the task metric of that answer) is positive and at least the rolled-out
    episode's. Also counts what happened (`edits`: the verified edits on all paths; `answered`: the
    trajectories the policy answered; `variants`: the kept trajectories with a variant).

    The rollouts run in training-sized batches (`RunHandle.local_batches`); across processes each process
    rolls out, mutates and answers its own rows of each, and every process returns all the kept
    trajectories, in the examples' order, and the counts over all of them."""
    env = run.env
    if not isinstance(env, ProgramEnv):
        raise ValueError(f"program mutation needs the program env, not {type(env).__name__}")
    rollout_key, answer_key = jax.random.split(key)
    rows = []  # this process's rolled-out episodes: (turns, example, reward)
    for mine, real, first_row in run.local_batches(examples):
        if real:
            traj = run.roll_out(mine, rollout_key, first_row)
            traj, mine = traj.first_rows(real), mine[:real]
            rows += zip(traj.turns, mine, [row[-1] for row in env.rewards(traj, mine)])
    candidates: list[_Candidate] = []
    counts = {"programs": 0, "weak": 0, "improved": 0, "edits": 0}
    for turns, example, reward in rows:
        turn = next((t for t in turns if t.action.kind == PROGRAM), None)
        if turn is None:
            continue
        counts["programs"] += 1
        (before, after), source = program_frame(turn.text)
        score = program_score(example)
        path, own = [], score(execute(source, env.sdk, env.config.limits))
        if own < 1.0:
            counts["weak"] += 1
            path = mutation.climb(source, env.sdk, score, env.sdk.available, config.max_variants,
                                  env.config.limits, config.max_shown, rounds=config.rounds, baseline=own)
            counts["improved"] += bool(path)
            counts["edits"] += len(path)
        if path or config.keep_unimproved:
            prompt = chat.render(run.tokenizer, env.prompt(example))
            program = path[-1].source if path else source
            candidates.append(_Candidate(example, reward, prompt, before + program + after, bool(path)))
    actions = [env.parse_action(c.turn, 0) for c in candidates]
    observations = env.observe(actions)
    seen = [run.observation_text(observation, len(run.tokenizer.encode(c.prompt + c.turn, add_special_tokens=False)))
            for c, observation in zip(candidates, observations)]  # as a rollout shows it
    prefixes = [c.prompt + c.turn + shown for c, shown in zip(candidates, seen)]
    tries = [policy_answers(run, prefixes, jax.random.fold_in(answer_key, k), greedy=k == 0)
             for k in range(config.answer_samples)] if candidates else []
    kept = []
    counts["answered"] = counts["variants"] = 0
    for c, action, observation, shown, answers in zip(candidates, actions, observations, seen, zip(*tries)):
        scored = [(env.episode_reward([Turn(0, 0, c.turn, action, shown, observation.info),
                                       Turn(0, 0, answer, env.parse_action(answer, 1))], c.example), -k, answer)
                  for k, answer in enumerate(answers) if answer is not None]
        if not scored:
            continue
        counts["answered"] += 1
        distilled, _, answer = max(scored)  # the best-scoring answer, the first of equals (greedy first)
        if distilled > 0 and distilled >= c.rolled_out:
            answered = [(shown, False), (answer, True)] if config.distil_answers else []
            kept.append([(c.prompt, False), (c.turn, True), *answered])
            counts["variants"] += c.variant
    processes = distributed.all_processes([kept, counts])
    kept = [[tuple(segment) for segment in example] for part, _ in processes for example in part]
    return kept, {name: float(sum(part[name] for _, part in processes)) for name in counts}


def distill(run: RunHandle, segments: Sequence[Sequence[tuple[str, bool]]], config: MutationConfig
            ) -> list[float]:
    """SFT of the run's policy on `segments`, which RL then goes on from (the optimizer states, critic and
    reference kept). Returns the SFT losses."""
    policy, losses = run.fine_tune(segments, config.sft)
    run.replace_policy(policy)
    return losses


@dataclasses.dataclass
class ProgramMutation:
    """The RPL env's train hook: before the step after `config.at_step` (also when a run resumes there),
    mutation and distillation, once; then RL goes on from the distilled policy."""

    config: MutationConfig
    done: bool = False

    def before_step(self, run: RunHandle) -> dict[str, float]:
        if self.done or run.step != self.config.at_step:
            return {}
        self.done = True
        rng = np.random.default_rng(run.seed)
        chosen = rng.choice(len(run.train_examples), min(self.config.episodes, len(run.train_examples)),
                            replace=False)
        examples = [run.train_examples[i] for i in chosen]
        segments, counts = mutation_examples(run, examples, self.config,
                                             jax.random.fold_in(run.key, self.config.at_step))
        metrics = {f"mutation/{name}": count for name, count in counts.items()}
        metrics["mutation/examples"] = float(len(segments))
        if len(segments) >= self.config.sft.batch_size:
            losses = distill(run, segments, self.config)
            metrics |= {"mutation/sft_loss_first": losses[0], "mutation/sft_loss_last": losses[-1]}
        else:
            log.warning("program mutation: %d kept trajectories, fewer than sft.batch_size=%d: no "
                        "distillation", len(segments), self.config.sft.batch_size)
        return metrics


def train_hooks(env: ProgramEnv) -> list[ProgramMutation]:
    """Program mutation when `config.env.mutation.at_step` is set (> 0)."""
    return [ProgramMutation(env.config.mutation)] if env.config.mutation.at_step > 0 else []
