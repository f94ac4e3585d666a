"""Greedy batched text generation until stop strings, on the rollout engine: what a task's prompting
baselines generate with, their prompts rolled out as the evaluation harness rolls out its questions
(`harness.rollout_rows`)."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from searchrl import models
from searchrl.episode import Action, Env
from searchrl.eval import harness
from searchrl.rollout.config import RolloutConfig, SamplingParams
from searchrl.rollout.engine import RolloutEngine
from searchrl.text import chat, tags


@dataclasses.dataclass(frozen=True)
class PromptEnv(Env):
    """One policy turn per example, from its ready prompt (`example["prompt"]`) until a stop string or EOS:
    the rollout engine as a text generator (every episode ends after one turn, so nothing is observed)."""

    stop_strings: tuple[str, ...]
    side_branch = None

    def prompt(self, example: Mapping[str, Any]) -> str:
        return example["prompt"]

    def parse_action(self, turn_text: str, turn_index: int) -> Action:
        return Action(tags.ANSWER, turn_text, done=True)


def fit_prompt(tokenizer: Any, text: str, max_tokens: int) -> str:
    """FlashRAG's `PromptTemplate.truncate_prompt`: a prompt of `max_tokens` tokens or more keeps its first and last
    (max_tokens / 2 - 20) tokens."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) < max_tokens:
        return text
    half = max(max_tokens // 2 - 20, 1)
    return tokenizer.decode(ids[:half]) + tokenizer.decode(ids[-half:])


class Generator:
    """Greedy text generation with the rollout engine, `generator(prompts, stops)` -> one text per prompt:
    prompts rendered (`chat.render`) and fitted to `rollout.max_prompt_tokens`, in batches of exactly
    `batch_size`; one engine per set of stop strings. On the `placement`'s mesh (if any), across its
    processes as the evaluation harness rolls out (`harness.rollout_rows`: each process its rows of every
    batch, every process gets all texts); batch_size is then rounded up to a multiple of its data-parallel
    size."""

    def __init__(self, model_cfg: models.ModelConfig, params, tokenizer: Any, rollout: RolloutConfig,
                 batch_size: int, placement: models.Placement):
        self.model_cfg, self.tokenizer, self.placement = model_cfg, tokenizer, placement
        self.mesh = placement.mesh
        self.batch_size = harness.mesh_batch_size(batch_size, self.mesh)
        self.params = harness.placed_params(model_cfg, params, self.mesh, placement.sample.rules)
        self.rollout = dataclasses.replace(
            rollout, max_len=rollout.max_prompt_tokens + rollout.max_turn_tokens,
            sampling=SamplingParams(temperature=0.0))
        self.engines: dict[tuple[str, ...], RolloutEngine] = {}

    def engine(self, stops: tuple[str, ...]) -> RolloutEngine:
        stops = stops or (self.tokenizer.eos_token,)
        if stops not in self.engines:
            env = PromptEnv(stops)
            self.engines[stops] = RolloutEngine(self.model_cfg, self.tokenizer, env, self.rollout,
                                                placement=self.placement)
        return self.engines[stops]

    def __call__(self, prompts: Sequence[chat.Prompt], stops: tuple[str, ...] = ()) -> list[str]:
        examples = [{"prompt": fit_prompt(self.tokenizer, chat.render(self.tokenizer, p),
                                          self.rollout.max_prompt_tokens)} for p in prompts]
        return harness.rollout_rows(self.engine(stops), self.params, examples, self.batch_size,
                                    lambda traj, _: [turns[0].text for turns in traj.turns], self.mesh,
                                    desc="generate")
