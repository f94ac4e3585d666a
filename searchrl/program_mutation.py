"""Program mutation inside an RL run (Retrieval Program Learning's PM): at a chosen step, the policy's weaker
programs on training questions are mutated (`searchrl.programs.mutation`), the variants whose execution
verifies an improvement are distilled into the policy with SFT, and RL resumes from the distilled policy.

A program is scored by what it shows: for GlobalQA the dF1 of the shown documents against the evidence, for
open-domain QA whether a shown passage holds a gold answer. Only programs scoring below 1 are mutated, and a
variant must show no more than `MutationConfig.max_shown` documents (the context budget).
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from searchrl.envs.program import PROGRAM, ProgramEnv, is_globalqa, program_span, set_f1
from searchrl.programs import ProgramResult, execute, mutation
from searchrl.rewards import qa
from searchrl.rl import sft
from searchrl.rl.config import MutationConfig
from searchrl.rl.trainer import Trainer
from searchrl.text import chat, tags

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


def mutation_examples(trainer: Trainer, examples: Sequence[Mapping[str, Any]], config: MutationConfig,
                      key: jax.Array) -> tuple[list[list[tuple[str, bool]]], dict[str, float]]:
    """Rolls out `examples` with the trainer's policy and returns the SFT examples of the verified mutants of
    their first programs, with counts of what happened."""
    env = trainer.env
    if not isinstance(env, ProgramEnv):
        raise ValueError(f"program mutation needs the program env, not {type(env).__name__}")
    traj = trainer.engine.run(trainer.state.policy, list(examples), key)
    prompts, frames, verified = [], [], []
    counts = {"programs": 0, "weak": 0, "improved": 0}
    for turns, example in zip(traj.turns, examples):
        turn = next((t for t in turns if t.action.kind == PROGRAM), None)
        if turn is None:
            continue
        counts["programs"] += 1
        frame, source = program_frame(turn.text)
        score = program_score(example)
        if score(execute(source, env.sdk, env.config.limits)) >= 1.0:
            continue
        counts["weak"] += 1
        variants = mutation.mutations(source, env.sdk.available, config.max_variants, env.config.limits)
        better = mutation.verify(source, variants, env.sdk, score, env.config.limits, config.max_shown)
        counts["improved"] += bool(better)
        prompts.append(chat.render(trainer.engine.tokenizer, env.prompt(example)))
        frames.append(frame)
        verified.append(better)
    segments = mutation.distillation_examples(prompts, frames, verified)
    return segments, {name: float(count) for name, count in counts.items()}


def distill(trainer: Trainer, segments: Sequence[Sequence[tuple[str, bool]]], config: MutationConfig
            ) -> list[float]:
    """SFT of the trainer's policy on `segments`, put back into its train state with the same shardings; the
    optimizer states, critic and reference are kept. Returns the SFT losses."""
    tokens, loss_mask = sft.encode(trainer.engine.tokenizer, segments, config.sft.max_len)
    policy, losses = sft.train(trainer.model_cfg, trainer.state.policy, tokens, loss_mask, config.sft,
                               trainer.mesh)
    placed = jax.tree.map(lambda new, old: jax.device_put(new, old.sharding), policy, trainer.state.policy)
    trainer.state = trainer.state._replace(policy=placed)
    return losses


def train_with_mutation(trainer: Trainer, config: MutationConfig) -> list[dict[str, float]]:
    """RL until `config.at_step`, then mutation and distillation (once), then RL to the end."""
    history = trainer.train(config.at_step)
    if trainer.step_count == config.at_step:
        rng = np.random.default_rng(trainer.seed)
        chosen = rng.choice(len(trainer.train_examples), min(config.episodes, len(trainer.train_examples)),
                            replace=False)
        examples = [trainer.train_examples[i] for i in chosen]
        segments, counts = mutation_examples(trainer, examples, config,
                                             jax.random.fold_in(trainer.key, config.at_step))
        metrics = {f"mutation/{name}": count for name, count in counts.items()}
        metrics["mutation/examples"] = float(len(segments))
        if len(segments) >= config.sft.batch_size:
            losses = distill(trainer, segments, config)
            metrics |= {"mutation/sft_loss_first": losses[0], "mutation/sft_loss_last": losses[-1]}
        else:
            log.warning("program mutation: %d verified examples, fewer than sft.batch_size=%d: no "
                        "distillation", len(segments), config.sft.batch_size)
        trainer.writer.write(config.at_step, metrics)
    return history + trainer.train()
