"""Retrieval Program Learning's env: programs run in the sandbox against a real BM25 index, action spaces,
QA and GlobalQA scoring, the per-episode metrics, and a few PPO steps on each task kind."""
from __future__ import annotations

import json
import re

import jax
import numpy as np
import pytest

from searchrl import models, run_config, task
from searchrl.episode import Action, Trajectory, Turn
from searchrl.retrieval import RetrievalConfig, load_retriever
from searchrl.retrieval.bm25 import BM25Retriever
from searchrl.retrieval.remote import RemoteRetriever
from searchrl.serving.server import Limits as ServerLimits, RetrievalServer
from searchrl.rl.trainer import Trainer
from searchrl.tasks.rpl import env as rpl
from searchrl.tasks.rpl.sdk import RetrievalSDK
from searchrl.text import tags
from searchrl.text.tokenizer import PROTOCOL_TAGS, train_bpe_tokenizer

DOCS = [("p1", "Velo", "Velo Press is headquartered in Arno."),
        ("p2", "Kiru", "Kiru Guild is headquartered in Arno."),
        ("p3", "Mado", "Mado Trust is headquartered in Beni."),
        ("p4", "Arno", "Arno is a city on the coast.")]


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    root = tmp_path_factory.mktemp("rpl")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": i, "contents": f"{t}\n{x}"}) + "\n" for i, t, x in DOCS))
    BM25Retriever.build(corpus, root / "index", show_progress=False)
    return root / "index"


def program_env(index, **options) -> rpl.ProgramEnv:
    """The program env of `rpl.Config(**options)` over the BM25 index."""
    return rpl.make(rpl.Config(**options), RetrievalConfig(index_dir=str(index)))


@pytest.fixture
def env(index):
    return program_env(index, max_turns=2)


def test_a_program_runs_in_the_sandbox_and_its_shown_documents_come_back(env):
    source = "```python\nhits = sparse_retrieval('headquartered Arno', 3)\nshow([h for h in hits][:2])\n```"
    action = env.parse_action(f"<think>look</think><program>{source}</program>", 0)
    assert action == Action(rpl.PROGRAM, source, done=False)
    [observation] = env.observe([action])
    assert observation.text.startswith("\n\n<information>Doc p1(Title: Velo) Velo Press is headquartered")
    assert set(observation.info["doc_ids"]) == {"p1", "p2"}
    assert observation.info["retrieval_calls"] == 1
    assert observation.info["primitives"] == ("sparse_retrieval",)
    assert observation.info["error"] is None


def test_errors_and_unavailable_functions_become_observations(index):
    env = program_env(index, action_space="dense")
    assert "dense_retrieval(q, top_k)" in env.prompt({"question": "q"})
    assert "sparse_retrieval" not in env.prompt({"question": "q"})
    [unavailable, broken] = env.observe([Action(rpl.PROGRAM, "show(sparse_retrieval('Arno', 2))"),
                                         Action(rpl.PROGRAM, "import os")])
    assert "sdk error: sparse_retrieval() is not available here" in unavailable.text
    assert "program error:" in broken.text and broken.info["doc_ids"] == ()
    with pytest.raises(ValueError, match="action_space 'all'"):
        program_env(index, action_space="all")


def test_unsearchable_queries_and_remote_refusals_are_sdk_errors_for_every_backend(index):
    """Blank, over-long and lone-surrogate queries, and a query the remote server refuses, are the program's
    `sdk error`, the same from a local index and over `/retrieve`, never an exception out of observe."""
    bm25 = load_retriever(str(index))
    with RetrievalServer(bm25, "127.0.0.1", 0, limits=ServerLimits(max_query_chars=30)).start() as server:
        remote = RemoteRetriever(RetrievalConfig(url=server.url, retries=0))
        envs = [rpl.ProgramEnv(rpl.Config(), RetrievalSDK(sparse=r, dense=r)) for r in (bm25, remote)]
        programs = ["show(sparse_retrieval(' ', 3))", f"show(sparse_retrieval('{'x' * 4097}', 3))",
                    "show(dense_retrieval('alpha \\ud800', 3))"]
        observations = [env.observe([Action(rpl.PROGRAM, p) for p in programs]) for env in envs]
        refused = envs[1].observe([Action(rpl.PROGRAM, f"show(sparse_retrieval('{'Arno ' * 7}', 3))")])[0]
        search = rpl.ProgramEnv(rpl.Config(action_space="search"), RetrievalSDK(sparse=remote))
        searched = search.observe([Action(rpl.SEARCH, " "), Action(rpl.SEARCH, "alpha \ud800"),
                                   Action(rpl.SEARCH, "Arno " * 7), Action(rpl.SEARCH, "Arno")])
    assert observations[0] == observations[1]
    errors = [o.info["error"] for o in observations[0]]
    assert errors[0] == ("program error: sdk error: sparse_retrieval: The search query is empty. "
                         "(line 1, column 6)")
    assert "4097 characters, more than 4096" in errors[1]
    assert errors[2].startswith("program error: sdk error: dense_retrieval: The search query is not valid")
    assert re.match(r'program error: sdk error: .*HTTP 400: "queries"\[0\] has 35 characters, more than 30',
                    refused.info["error"])
    assert [o.info["doc_ids"] for o in searched[:3]] == [(), (), ()]
    assert searched[0].info["error"] == "The search query is empty."
    assert "not valid text" in searched[1].info["error"] and "HTTP 400" in searched[2].info["error"]
    assert searched[3].info["doc_ids"] and searched[3].info["error"] is None


@pytest.mark.parametrize("text, turn, expected", [
    ("<answer> Arno </answer>", 0, Action(rpl.ANSWER, "Arno", done=True)),
    ("<program>show([])</program>", 2,
     Action(rpl.INVALID, "no more programs: this turn must answer", done=True)),
    ("nothing", 0, Action(rpl.INVALID, "no complete <program> or <answer> block", done=False)),
    ("nothing", 2, Action(rpl.INVALID, "no complete <program> or <answer> block", done=True)),
])
def test_parse_action(env, text, turn, expected):
    assert env.parse_action(text, turn) == expected


def trajectory(rows: list[list[Turn]], context: list[int]) -> Trajectory:
    """Rows whose observations took `context` tokens (loss_mask 0 after a 2-token prompt)."""
    b, width = len(rows), 2 + max(context) + 1
    loss_mask = np.zeros((b, width), np.float32)
    loss_mask[:, -1] = 1
    return Trajectory(tokens=np.zeros((b, width), np.int32), attention_mask=np.ones((b, width), bool),
                      loss_mask=loss_mask, logprobs=np.zeros((b, width), np.float32),
                      prompt_lengths=np.full(b, width - 1 - np.array(context), np.int32),
                      lengths=np.full(b, width, np.int32), turns=rows, finish_reasons=["done"] * b)


def test_qa_and_globalqa_scores_rewards_and_metrics(env):
    program = Turn(0, 1, "", Action(rpl.PROGRAM, "..."), info={
        "doc_ids": ("p1", "p3"), "retrieval_calls": 2, "primitives": ("fuse", "sparse_retrieval"),
        "error": None})
    rows = [[program, Turn(1, 2, "", Action(rpl.ANSWER, "p1, p2, p9", done=True))],
            [Turn(0, 1, "", Action(rpl.ANSWER, "Arno", done=True))]]
    globalqa = {"question": "Which organisations are headquartered in Arno?", "golden_answers": ["p1", "p2"],
                "metadata": {"type": "count", "evidence_ids": ["p1", "p2"]}}
    open_qa = {"question": "Where is Velo Press?", "golden_answers": ["Arno"]}
    batch = trajectory(rows, [5, 0])
    precision, recall = 2 / 3, 1.0
    answer_f1 = 2 * precision * recall / (precision + recall)
    assert env.rewards(batch, [globalqa, open_qa]) == [[0.0, pytest.approx(answer_f1)], [1.0]]
    first, second = env.metrics(batch, [globalqa, open_qa])
    assert first["answer_f1"] == pytest.approx(answer_f1) and first["doc_f1"] == pytest.approx(0.5)
    assert first["context_tokens"] == 5 and first["retrieval_turns"] == 1 and first["retrieval_calls"] == 2
    assert first["uses_fuse"] == first["uses_sparse_retrieval"] == 1.0 and first["uses_rerank"] == 0.0
    assert second["em"] == 1.0 and second["context_tokens"] == 0 and second["retrieval_turns"] == 0
    assert (first["task_type"], second["task_type"]) == ("count", "qa")
    hint = rpl.GLOBALQA_HINTS["id"]
    assert hint in env.prompt(globalqa) and hint not in env.prompt(open_qa)


def test_the_search_space_is_one_query_per_turn_scored_as_programs_are(index):
    """The AutoSearch-style baseline: `<search>` turns get BM25's top `search_top_k` with their ids, a program
    block is not a turn there, and search turns count as retrieval turns and calls."""
    env = program_env(index, action_space="search", search_top_k=2, max_turns=2)
    prompt = env.prompt({"question": "Where is Velo Press?"})
    question = "Where is Velo Press?"
    assert prompt == rpl.SEARCH_PROMPT.replace("{answer_hint}", "").replace("{question}", question)
    action = env.parse_action("<search> headquartered Arno </search>", 0)
    assert action == Action(rpl.SEARCH, "headquartered Arno", done=False)
    assert env.parse_action("<program>show([])</program>", 0).kind == rpl.INVALID
    assert env.parse_action("<search> Arno </search>", 2) == Action(
        rpl.INVALID, "no more searches: this turn must answer", done=True)
    [observation, invalid] = env.observe([action, Action(rpl.INVALID, "no complete <search> block")])
    top2 = env.sdk.sparse.search(["headquartered Arno"], 2)[0]
    assert observation.info["doc_ids"] == tuple(hit.id for hit in top2)
    assert {hit.id for hit in top2} == {"p1", "p2"}
    assert observation.text == f"\n\n<information>{rpl.format_documents(top2).strip()}</information>\n\n"
    assert "invalid action" in invalid.text
    turns = [Turn(0, 1, "", action, info=observation.info),
             Turn(1, 2, "", Action(rpl.SEARCH, "Beni"), info={**observation.info, "doc_ids": ("p3",)}),
             Turn(2, 3, "", Action(rpl.ANSWER, "p1 p2", done=True))]
    example = {"question": "q", "golden_answers": ["p1", "p2"],
               "metadata": {"type": "count", "evidence_ids": ["p1", "p2"]}}
    [row] = env.metrics(trajectory([turns], [7]), [example])
    assert row["retrieval_turns"] == 2 and row["retrieval_calls"] == 2 and row["uses_sparse_retrieval"] == 1.0
    assert row["answer_f1"] == 1.0 and row["doc_f1"] == pytest.approx(2 * (2 / 3) / (2 / 3 + 1))


def test_cite_by_rank_numbers_shown_documents_across_turns_and_scores_their_ids(index):
    """`cite="rank"`: Search-R1's "Doc <n>" lines, numbered on across the episode's turns (turn t starts at
    t * search_top_k + 1); an answer's numbers are mapped back to the ids they were given, and a number no
    document had counts as a wrong document."""
    env = program_env(index, action_space="search", search_top_k=2, max_turns=2, cite="rank")
    assert rpl.GLOBALQA_HINTS["rank"] in env.prompt({"question": "q", "metadata": {"type": "count"}})
    first, second = (env.parse_action(f"<search> {q} </search>", t) for t, q in enumerate(("Arno", "Beni")))
    assert (first.first_number, second.first_number) == (1, 3)
    observations = env.observe([first, second])
    shown = [env.sdk.sparse.search([q], 2)[0] for q in ("Arno", "Beni")]
    for observation, hits, number in zip(observations, shown, (1, 3)):
        lines = "".join(f"Doc {number + i}(Title: {hit.title}) {hit.text}\n" for i, hit in enumerate(hits))
        assert observation.text == f"\n\n<information>{lines.strip()}</information>\n\n"
        assert observation.info["first_number"] == number
    turns = [Turn(t, t + 1, "", action, info=o.info) for t, (action, o) in enumerate(zip((first, second),
                                                                                        observations))]
    third = shown[1][0].id
    assert rpl.cited_ids(" 1, 3, 9 ", turns) == [shown[0][0].id, third, "9"]
    by_id = [Turn(t.start, t.end, "", t.action, info={"doc_ids": t.info["doc_ids"]}) for t in turns]
    assert rpl.cited_ids(f" {third}, 3 ", by_id) == [third, "3"]  # cite="id": names are the ids
    example = {"question": "q", "golden_answers": [shown[0][0].id, third],
               "metadata": {"type": "count", "evidence_ids": [shown[0][0].id, third]}}
    answer = Turn(2, 3, "", Action(rpl.ANSWER, " 1, 3, 9 ", done=True))
    [row] = env.metrics(trajectory([[*turns, answer]], [7]), [example])
    assert row["answer_f1"] == pytest.approx(2 * (2 / 3) * 1.0 / (2 / 3 + 1.0))  # 2 of 3 cited are gold
    with pytest.raises(ValueError, match="cite"):
        program_env(index, cite="title")


def test_the_sparse_space_offers_bm25_fuse_and_dedup(index):
    env = program_env(index, action_space="sparse")
    prompt = env.prompt({"question": "q"})
    assert "sparse_retrieval(q, top_k), fuse(*lists, top_k=None), dedup(docs)" in prompt
    assert "dense_retrieval" not in prompt and "rerank" not in prompt
    [observation] = env.observe([Action(rpl.PROGRAM, "show(dedup(fuse(sparse_retrieval('Arno', 2), "
                                                     "sparse_retrieval('Arno', 2))))")])
    assert len(observation.info["doc_ids"]) == 2 and observation.info["error"] is None


def test_parse_ids_and_set_f1():
    assert rpl.parse_ids("[p12] p40, p12; doc-7 and Doc 9.") == ["p12", "p40", "doc-7", "9"]
    assert rpl.set_f1([], ["a"]) == 0.0 and rpl.set_f1(["a", "b"], ["a", "b"]) == 1.0


@pytest.mark.parametrize("examples", ["qa", "globalqa"])
def test_each_task_kind_trains_a_few_steps(index, tmp_path, examples):
    texts = [t + " " + x for _, t, x in DOCS] + ["show(sparse_retrieval('Arno', 2)) p1, p2"]
    program_tags = (tags.open_tag(tags.PROGRAM), tags.close_tag(tags.PROGRAM))
    tokenizer = train_bpe_tokenizer(texts * 20, 400, special_tokens=(*PROTOCOL_TAGS, *program_tags))
    config = run_config.experiment_config("rpl")
    config.workdir = str(tmp_path)
    config.env.update(dict(max_turns=1, prompt_template="{question}"))
    config.retrieval.index_dir = str(index)
    config.train.update(dict(batch_size=8, checkpoint_every=1000, async_checkpoints=False))
    config.rollout.update(dict(max_prompt_tokens=24, max_turn_tokens=12, max_obs_tokens=32, obs_buckets=(32,),
                               max_len=24 + 12 + 32 + 12, chunk_steps=12))
    config.rl.update(dict(minibatch_size=8, micro_batch_size=8))
    config = run_config.parse(config)
    env = task.build(config.task, config.env, config.retrieval)
    if examples == "qa":
        data = [{"question": f"Where is {t}?", "golden_answers": ["Arno"]} for _, t, _ in DOCS]
    else:
        data = [{"question": f"Which are in {c}?", "golden_answers": ["p1", "p2"],
                 "metadata": {"type": "count", "evidence_ids": ["p1", "p2"]}} for c in ("Arno", "Beni")]
    cfg = models.get_preset("tiny")
    cfg = type(cfg)(**{**cfg.__dict__, "vocab_size": len(tokenizer), "eos_token_id": tokenizer.eos_token_id})
    policy = models.init_params(cfg, jax.random.key(0))
    trainer = Trainer(config, cfg, policy, tokenizer, env, data * 4)
    try:
        history = trainer.train(2)
        changed = jax.tree.leaves(jax.tree.map(lambda a, b: bool(np.any(np.asarray(a) != np.asarray(b))),
                                               jax.device_get(trainer.state.policy), policy))
    finally:
        trainer.close()
    assert len(history) == 2 and any(changed)
    score = "env/em" if examples == "qa" else "env/answer_f1"
    assert score in history[-1] and "env/context_tokens" in history[-1] and "env/uses_rerank" in history[-1]
    assert all(0.0 <= m["reward/mean"] <= 1.0 for m in history)


# The shape of Qwen3's template: role headers, and an empty think block when thinking is off.
QWEN3_TEMPLATE = (
    "{%- for m in messages %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}{%- endif %}")


@pytest.mark.parametrize("thinking", [True, False])
def test_qwen3_chat_template_and_its_thinking_switch_token_for_token(index, tmp_path, thinking):
    from searchrl.text import chat
    from searchrl.text.tokenizer import load_tokenizer

    tokenizer = train_bpe_tokenizer(["Answer the given question. Where is Velo?"] * 10, 300,
                                    special_tokens=("<|im_start|>", "<|im_end|>", "<think>", "</think>"))
    tokenizer.chat_template = QWEN3_TEMPLATE
    tokenizer.save_pretrained(tmp_path / "qwen3")
    tokenizer = load_tokenizer(str(tmp_path / "qwen3"))
    env = program_env(index, chat_template=True, enable_thinking=thinking, prompt_template="Q: {question}")
    text = chat.render(tokenizer, env.prompt({"question": "Where is Velo?"}))
    expected = "<|im_start|>user\nQ: Where is Velo?<|im_end|>\n<|im_start|>assistant\n"
    expected += "" if thinking else "<think>\n\n</think>\n\n"
    assert text == expected
    assert tokenizer(text)["input_ids"] == tokenizer.apply_chat_template(
        [{"role": "user", "content": "Q: Where is Velo?"}], add_generation_prompt=True,
        enable_thinking=thinking, tokenize=True, return_dict=True)["input_ids"]
