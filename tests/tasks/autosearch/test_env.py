"""The AutoSearch env, built on the Search-R1 env: its rewards from the record of a trajectory, the minimal
sufficient depth, the intermediate answers' side branch and the public answer prompt."""
from __future__ import annotations

import dataclasses

import pytest

from searchrl import models
from searchrl.episode import Action, Trajectory, Turn
from searchrl.tasks.autosearch import env as autosearch_env
from searchrl.tasks.autosearch import rewards as autosearch
from searchrl.tasks.autosearch.env import INTERMEDIATE_ANSWER, AutoSearchEnv, autosearch_record
from searchrl.tasks.search_r1 import env as search_env
from searchrl.tasks.search_r1.env import INVALID_ACTION
from tests.tasks.search_r1.test_env import ANSWER, EXAMPLES, OBS, SEARCH, CountingRetriever
from tests.tasks.search_r1.test_env import _trajectory as search_r1_trajectory

ATTENTION = models.AttentionConfig()  # the default: `MeshConfig.attention`
TRAIN = models.Compute(models.TRAIN_RULES, ATTENTION)  # a default run's training layout and attention


def _trajectory(turns: list[list[Turn]], side_branch: str | None = INTERMEDIATE_ANSWER) -> Trajectory:
    return search_r1_trajectory(turns, side_branch)


def _rows():
    """The Search-R1 tests' two rows, the first with an intermediate answer after its search."""
    good = [Turn(0, 1, SEARCH, Action("search", "capital of France"), OBS,
                 {INTERMEDIATE_ANSWER: " Paris </answer>"}),
            Turn(1, 2, ANSWER, Action("answer", "Paris", done=True))]
    wrong = [Turn(0, 1, "<answer>Lyon</answer>", Action("answer", "Lyon", done=True))]
    return [good, wrong]


def test_autosearch_rewards_follow_the_record():
    turns = _rows()
    traj = _trajectory(turns)
    env = AutoSearchEnv(CountingRetriever(), autosearch_env.Config(reward="autosearch", intermediate_answers=True))
    rewards = env.rewards(traj, EXAMPLES)
    expected = autosearch.autosearch_rewards(autosearch_record(turns[0], ["Paris"])).total
    assert rewards[0] == expected and len(rewards[0]) == 2
    assert rewards[0][1] > 1.0  # the correct final answer's +1 survives
    assert len(rewards[1]) == 1


def test_autosearch_record_maps_invalid_turns_to_failed_steps():
    turns = [Turn(0, 1, "blah", Action("invalid", "no block"), "msg"),
             Turn(1, 2, SEARCH, Action("search", "capital of France"), OBS,
                  {INTERMEDIATE_ANSWER: "Paris </answer>"}),
             Turn(2, 3, ANSWER, Action("answer", "Paris", done=True))]
    record = autosearch_record(turns, ["Paris"])
    assert [s.query for s in record.search_turns] == [None, "capital of France"]
    assert [s.format_ok for s in record.search_turns] == [False, True]
    assert record.intermediate_answers == [None, "Paris"]
    assert record.answer_turn.format_ok


def test_metrics_per_row_and_config_errors():
    rows = AutoSearchEnv(CountingRetriever()).metrics(_trajectory(_rows()), EXAMPLES)
    assert rows[0]["intermediate_answers"] == ["Paris"] and rows[0]["depth"] == 1
    assert rows[1]["intermediate_answers"] == [] and rows[1]["depth"] is None
    with pytest.raises(ValueError, match="reads the 'intermediate_answer' side branch"):
        AutoSearchEnv(CountingRetriever(), autosearch_env.Config(intermediate_answers=False))


def test_minimal_sufficient_depth_by_hand():
    depth = autosearch_env.minimal_sufficient_depth
    assert depth(["Paris"], [], "Paris", 0) == 0  # right without searching
    assert depth(["Paris"], [], "Lyon", 0) is None
    assert depth(["Paris"], ["Lyon", "the Paris", "Paris"], "Paris", 3) == 2  # the first right one counts
    assert depth(["Paris"], ["Lyon", "Nice"], "Paris", 2) == 2  # only the final answer (after search 2)
    assert depth(["Paris"], ["Lyon", "Nice"], "", 2) is None
    assert depth(["Paris", "City of Light"], ["city of light"], "Lyon", 1) == 1  # any gold, normalised


def test_side_branch_is_declared_with_intermediate_answers_only():
    branch = AutoSearchEnv(CountingRetriever(),
                           autosearch_env.Config(intermediate_answers=True, answer_prompt="\nA:")).side_branch
    assert branch.prompt == "\nA:" and branch.after_kinds == ("search",) and \
        branch.stop_strings == ("</answer>",)


# AutoSearch's intermediate-answer prompt, as the public code writes it out (github.com/bofusun/AutoSearch
# verl/trainer/main_ppo_format_turn_new78.py:421-438), filled in by hand for the question and trajectory
# below.
PUBLIC_CONTEXT = ("Question: " + "Capital of France?" + "\n\n" +
                  "Below are your previous reasoning, search calls, and retrieved informations:\n"
                  + "blah" + INVALID_ACTION + SEARCH + OBS + "\n\n")
PUBLIC_PROMPT_TEXT = (
    "<|im_start|>system\n"
    "You are a helpful assistant."
    "<|im_end|>\n"
    "<|im_start|>user\n"
    "Answer the given question according to search trajectories, which consists of multiple reasoning, "
    "search calls, and retrieved informations.\n"
    "Important instructions:\n"
    "1) You must conduct reasoning inside <think> and </think> first.\n"
    "2) After reasoning, output the final answer wrapped in <answer> and </answer>.\n"
    "For example: <think>Reasoning</think><answer>Jaden Smith</answer>\n"
    f"Search trajectory: {PUBLIC_CONTEXT}."
    "<|im_end|>\n"
    "<|im_start|>assistant\n"
)
# Qwen2.5's chat template without its tool branches: a default system message when the chat has none.
QWEN25_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    "<|im_end|>\\n' }}"
    "{%- endif %}{%- for m in messages %}{%- if not (m['role'] == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


@pytest.fixture(scope="module")
def chat_tokenizer():
    from searchrl.text.tokenizer import PROTOCOL_TAGS, train_bpe_tokenizer

    texts = [autosearch_env.PUBLIC_ANSWER_USER, INVALID_ACTION, SEARCH + OBS + ANSWER, EXAMPLES[0]["question"]]
    texts *= 20
    tokenizer = train_bpe_tokenizer(texts, 600, special_tokens=(*PROTOCOL_TAGS, "<|im_start|>", "<|im_end|>"))
    tokenizer.chat_template = QWEN25_TEMPLATE
    return tokenizer


PUBLIC = autosearch_env.Config(intermediate_answer_mode="public_prompt")


def test_public_answer_prompt_is_the_public_text_byte_for_byte(chat_tokenizer):
    from searchrl.text import chat

    turns = [Turn(0, 1, "blah", Action("invalid", "no block"), INVALID_ACTION),
             Turn(1, 2, SEARCH, Action("search", "capital of France"), OBS)]
    env = AutoSearchEnv(CountingRetriever(), PUBLIC)
    example = {"question": " Capital of France?\nsecond line", "golden_answers": ["Paris"]}
    assert chat.render(chat_tokenizer, env.side_branch_prompt(example, turns)) == PUBLIC_PROMPT_TEXT


def test_side_branch_sampling_and_prompt_by_mode():
    branch = AutoSearchEnv(CountingRetriever(), autosearch_env.Config(intermediate_answers=True)).side_branch
    assert (branch.sampling, branch.separate_prompt) == (autosearch_env.SamplingParams(0.0, 0, 1.0), False)
    sampling = autosearch_env.SamplingParams(temperature=1.0, top_k=50, top_p=0.9)
    config = dataclasses.replace(PUBLIC, intermediate_answer_sampling=sampling,
                                 intermediate_answer_tokens=500)
    branch = AutoSearchEnv(CountingRetriever(), config).side_branch
    assert (branch.sampling, branch.max_tokens) == (sampling, 500)
    assert branch.separate_prompt and branch.prompt == autosearch_env.PUBLIC_ANSWER_USER
    with pytest.raises(ValueError, match="intermediate_answer_mode 'both'"):
        AutoSearchEnv(CountingRetriever(), autosearch_env.Config(intermediate_answer_mode="both"))


def test_public_answers_are_read_as_the_public_code_does_and_set_the_minimal_depth():
    # The answer after search 1 of 2 is right: minimal depth 1, so search 2 gets the overshoot penalty.
    answers = ["<think>so</think><answer> Paris </answer>", "I guess Lyon"]
    turns = [Turn(0, 1, SEARCH, Action("search", "capital of France"), OBS,
                  {INTERMEDIATE_ANSWER: answers[0]}),
             Turn(1, 2, SEARCH.replace("France", "Gaul"), Action("search", "capital of Gaul"), OBS,
                  {INTERMEDIATE_ANSWER: answers[1]}),
             Turn(2, 3, ANSWER, Action("answer", "Paris", done=True))]
    record = autosearch_record(turns, ["Paris"], autosearch_env.PUBLIC_PROMPT)
    assert record.intermediate_answers == ["Paris", "I guess Lyon"]  # the first block, else all the text
    expected = autosearch.autosearch_rewards(record)
    assert expected.minimal_depth == 1
    assert expected.efficiency[1] == -autosearch.RewardConfig().efficiency_overshoot_penalty
    env = AutoSearchEnv(CountingRetriever(), PUBLIC)
    assert env.rewards(_trajectory([turns]), EXAMPLES[:1]) == [expected.total]
    row = env.metrics(_trajectory([turns]), EXAMPLES[:1])[0]
    assert row["intermediate_answers"] == ["Paris", "I guess Lyon"] and row["depth"] == 1
    # Read as continuations, the same texts hold no right answer: no minimal depth.
    assert autosearch.autosearch_rewards(autosearch_record(turns, ["Paris"])).minimal_depth is None


class AlwaysSearches(AutoSearchEnv):
    """The search-QA env whose every turn searches (a random model writes no tags), then answers."""

    def parse_action(self, turn_text: str, turn_index: int) -> Action:
        if turn_index < self.config.max_turns:
            return Action(search_env.SEARCH, f"query {turn_index}")
        return Action(search_env.ANSWER, turn_text, done=True)


def greedy_text(cfg, params, tokenizer, text: str, max_tokens: int, stop: str) -> str:
    """The greedy continuation of `text` by full forward passes, cut after `stop` (the engine's reference)."""
    import jax.numpy as jnp

    ids, out = tokenizer.encode(text, add_special_tokens=False), []
    while len(out) < max_tokens:
        token = int(jnp.argmax(models.apply(cfg, params, jnp.asarray([ids + out]),
                                            compute=TRAIN)[0, -1]))
        if token == tokenizer.eos_token_id:
            break
        out.append(token)
    text = tokenizer.decode(out)
    return text[:text.find(stop) + len(stop)] if stop in text else text


def test_an_episode_in_the_public_mode_answers_from_the_separate_prompt(chat_tokenizer):
    import jax

    from searchrl.rollout.config import RolloutConfig
    from searchrl.rollout.engine import RolloutEngine
    from searchrl.text import chat

    cfg = dataclasses.replace(models.get_preset("tiny"), vocab_size=len(chat_tokenizer),
                              eos_token_id=chat_tokenizer.eos_token_id, tie_word_embeddings=False)
    params = models.init_params(cfg, jax.random.key(1))
    rollout = RolloutConfig(max_prompt_tokens=192, max_len=80, max_turn_tokens=4, max_obs_tokens=32,
                            obs_buckets=(16, 32), chunk_steps=4,
                            sampling=autosearch_env.SamplingParams(temperature=0.0))
    config = dataclasses.replace(PUBLIC, prompt_template="Question: {question}\n", topk=1, max_turns=2,
                                 intermediate_answer_tokens=6)
    examples = EXAMPLES[:1]

    def run(mode: str):
        env = AlwaysSearches(CountingRetriever(), dataclasses.replace(config, intermediate_answer_mode=mode))
        engine = RolloutEngine(cfg, chat_tokenizer, env, rollout, placement=models.Placement.default(attention=ATTENTION))
        return env, engine.run(params, examples, jax.random.key(0))

    env, traj = run(autosearch_env.PUBLIC_PROMPT)
    _, continued = run(autosearch_env.CONTINUATION)
    turns = traj.turns[0]
    assert [t.text for t in turns] == [t.text for t in continued.turns[0]]  # the branch leaves the episode
    texts = [t.info[INTERMEDIATE_ANSWER] for t in turns[:2]]
    prompts = [chat.render(chat_tokenizer, env.side_branch_prompt(examples[0], turns[:k + 1]))
               for k in range(2)]
    assert len(chat_tokenizer.encode(prompts[1])) > 32  # prefilled in several chunks
    assert texts == [greedy_text(cfg, params, chat_tokenizer, p, 6, "</answer>") for p in prompts]
    assert texts != [t.info[INTERMEDIATE_ANSWER] for t in continued.turns[0][:2]]
    # The minimal sufficient depth reads them: a gold equal to the first answer is found at depth 1.
    first = autosearch_env.intermediate_answer(turns[0], autosearch_env.PUBLIC_PROMPT)
    row = env.metrics(traj, [{**examples[0], "golden_answers": [first]}])[0]
    assert row["intermediate_answers"][0] == first and row["depth"] == 1
