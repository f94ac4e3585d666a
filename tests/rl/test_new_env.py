"""A new task is one env, registered by name: a calculator tool defined entirely here, trained with PPO and with
GRPO through the public API (`Trainer`), its reward rising, and evaluated with its own tables in the report.
Nothing under searchrl/ knows this task."""
from __future__ import annotations

import collections
import dataclasses
import re

import jax
import numpy as np
import pytest
import transformers
from tokenizers import Tokenizer, models as tok_models, pre_tokenizers

from searchrl import models, run_config, task
from searchrl.episode import Action, Env, Observation, Trajectory
from searchrl.retrieval import RetrievalConfig
from searchrl.eval import harness, report
from searchrl.rl.trainer import Trainer
from searchrl.rollout.config import RolloutConfig
from searchrl.task import TASKS, Analysis, Report, Task

ATTENTION = models.AttentionConfig()  # the default: `MeshConfig.attention`

WORDS = ["<eos>", "<calc>", "</calc>", "<answer>", "</answer>", "=", "+", "?", *"0123456789"]
_NUMBER = re.compile(r"^\d+$")


def calculator_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """One token per word: digits, '+', '=', '?' and the tags (a random policy meets every one of them)."""
    tok = Tokenizer(tok_models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="?"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                 pre_tokenizers.Split(re.compile(r"</?\w+>|\d|\S").pattern,
                                                                      "isolated")])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<eos>")


@dataclasses.dataclass
class CalculatorEnv(Env):
    """The policy may ask `<calc> a + b </calc>` (the tool answers `= a+b`) before it answers `<answer> n
    </answer>`. Reward, on the last turn: 0.5 for ending with a well-formed answer, 0.25 more when the
    calculator was used before it, 1 for the right sum."""

    max_calls: int = 1
    stop_strings: tuple[str, ...] = ("</calc>", "</answer>")
    side_branch = None

    def prompt(self, example):
        return f"{example['a']} + {example['b']} ="

    def parse_action(self, turn_text: str, turn_index: int) -> Action:
        text = turn_text.replace(" ", "")
        if text.endswith("</calc>") and turn_index < self.max_calls:
            return Action("calc", text.removesuffix("</calc>").removeprefix("<calc>"))
        if text.endswith("</answer>"):
            return Action("answer", text.removesuffix("</answer>").removeprefix("<answer>"), done=True)
        return Action("invalid", text, done=turn_index >= self.max_calls)

    def observe(self, actions):
        out = []
        for action in actions:
            terms = action.content.split("+")
            ok = action.kind == "calc" and len(terms) == 2 and all(_NUMBER.match(t) for t in terms)
            out.append(Observation(f" = {sum(map(int, terms)) if ok else '?'} "))
        return out

    def _scores(self, trajectory: Trajectory, examples) -> list[float]:
        scores = []
        for turns, example in zip(trajectory.turns, examples):
            last = turns[-1].action
            used = any(t.action.kind == "calc" for t in turns)
            answered = last.kind == "answer" and bool(_NUMBER.match(last.content))
            right = answered and int(last.content) == example["a"] + example["b"]
            scores.append(0.5 * answered + 0.25 * (answered and used) + 1.0 * right)
        return scores

    def rewards(self, trajectory, examples):
        return [[0.0] * (len(turns) - 1) + [score]
                for turns, score in zip(trajectory.turns, self._scores(trajectory, examples))]

    def metrics(self, trajectory, examples):
        return [{"b": example["b"], "score": s, "calls": sum(t.action.kind == "calc" for t in turns)}
                for s, turns, example in zip(self._scores(trajectory, examples), trajectory.turns, examples)]


@dataclasses.dataclass(frozen=True)
class Config:
    """`config.env` of the calculator task."""

    max_calls: int = 1


def make(config: Config, retrieval) -> CalculatorEnv:
    return CalculatorEnv(config.max_calls)


def calls_table(rows, meta):
    """How many questions made 0, 1, ... calculator calls."""
    counts = collections.Counter(row["calls"] for row in rows)
    return [{"calls": calls, "questions": counts[calls]} for calls in sorted(counts)]


def calls_markdown(table, meta):
    return "## Calculator calls\n\n" + report.markdown_table(
        ("calls", "questions"), [(r["calls"], r["questions"]) for r in table])


TASKS.register("calculator")(Task(Config, make, report=Report(
    labels=("b",), groups={"b": "second term"}, analyses=(Analysis("calls", calls_table, calls_markdown),))))


def make_trainer(tmp_path, tokenizer, **rl):
    config = run_config.experiment_config("calculator")  # the task registered above
    config.workdir = str(tmp_path)
    config.train.update(dict(batch_size=16, checkpoint_every=1000, async_checkpoints=False))
    config.rollout.update(dict(max_prompt_tokens=8, max_len=40, max_turn_tokens=6, max_obs_tokens=8,
                               obs_buckets=(8,), chunk_steps=8))
    config.rl.update(dict(minibatch_size=16, micro_batch_size=16, **rl))
    config.rl.actor.lr = config.rl.critic.lr = 3e-3
    if rl.get("responses_per_prompt", 1) > 1:
        config.train.batch_size = 16 // rl["responses_per_prompt"]
    cfg = dataclasses.replace(models.get_preset("tiny"), vocab_size=len(tokenizer),
                              eos_token_id=tokenizer.eos_token_id)
    rng = np.random.default_rng(0)
    examples = [{"a": int(a), "b": int(b)} for a, b in rng.integers(0, 10, size=(64, 2))]
    run = run_config.parse(config)
    env = task.build(run.task, run.env, run.retrieval)
    return Trainer(run, cfg, models.init_params(cfg, jax.random.key(0)), tokenizer, env, examples, examples[:16])


@pytest.mark.parametrize("algo", [
    dict(advantage="gae"),
    dict(advantage="grpo", use_critic=False, responses_per_prompt=4, whiten_advantages=False),
])
def test_a_calculator_env_defined_here_trains(tmp_path, algo):
    tokenizer = calculator_tokenizer()
    assert tokenizer.decode(tokenizer.encode("<calc> 3 + 4 </calc>")) == "<calc> 3 + 4 </calc>"
    trainer = make_trainer(tmp_path, tokenizer, **algo)
    history = trainer.train(40)
    trainer.close()
    rewards = [m["reward/mean"] for m in history]
    first, last = np.mean(rewards[:5]), np.mean(rewards[-5:])
    assert last > first + 0.25, rewards
    assert history[-1]["env/score"] == pytest.approx(history[-1]["reward/mean"])  # the env's own metrics
    assert "env/calls" in history[-1]


def test_the_calculator_task_adds_its_own_tables_to_an_evaluation(tmp_path):
    tokenizer = calculator_tokenizer()
    cfg = dataclasses.replace(models.get_preset("tiny"), vocab_size=len(tokenizer),
                              eos_token_id=tokenizer.eos_token_id)
    env, spec = task.build("calculator", Config(), RetrievalConfig()), task.get("calculator").report
    examples = [{"a": a, "b": b} for a, b in [(1, 2), (3, 2), (4, 5), (0, 5), (6, 2), (7, 7), (2, 2), (9, 5)]]
    rollout = RolloutConfig(max_prompt_tokens=8, max_len=40, max_turn_tokens=6, max_obs_tokens=8,
                            obs_buckets=(8,), chunk_steps=8)
    results = harness.evaluate_policy(cfg, models.init_params(cfg, jax.random.key(0)), tokenizer, env,
                                      {"sums": examples}, rollout, batch_size=8, spec=spec,
                                      placement=models.Placement.default(attention=ATTENTION))
    assert "b" not in results["table"][0]  # a label of the question, not a metric
    assert [(r["b"], r["n"]) for r in results["by"]["b"]] == [(2, 4), (5, 3), (7, 1)]
    calls = {r["calls"]: r["questions"] for r in results["calls"]}
    assert sum(calls.values()) == 8
    assert calls == collections.Counter(row["calls"] for row in results["predictions"])
    markdown = report.write_report(results, tmp_path, spec)["results.md"].read_text()
    assert "## By second term" in markdown and "## Calculator calls" in markdown
