"""AutoSearch's pilot at forced search depth: the forcing rules and the pilot's arithmetic by hand,
forced-depth rollouts of a tiny random policy over a tiny BM25 world, and its command line
(`python -m searchrl.tasks.autosearch.pilot`) end to end, in process (the compiled programs are shared), on two
tiny random Hugging Face checkpoints."""
from __future__ import annotations

import json
import textwrap

import pytest

from searchrl import models
from searchrl.data import datasets
from searchrl.episode import Action
from searchrl.eval import harness
from searchrl.retrieval.types import Hit
from searchrl.tasks.autosearch import env as autosearch_env
from searchrl.tasks.autosearch import pilot
from searchrl.tasks.autosearch.env import AutoSearchEnv
from searchrl.tasks.autosearch.forced_depth import ForcedDepthEnv, ForcedSearch
from searchrl.tasks.autosearch.prompts import continued
from searchrl.tasks.search_r1 import env as search_env
from searchrl.text import chat, qa, tags
from tests.eval.test_eval import build_env, make_config, rollout_config, tiny_policy, world  # noqa: F401 (a fixture)

ATTENTION = models.AttentionConfig()  # the default: `MeshConfig.attention`


class RecordingRetriever:
    """Two fixed passages for every query; remembers the queries of each call."""

    def __init__(self):
        self.calls = []

    def search(self, queries, k):
        self.calls.append(list(queries))
        return [[Hit("d1", 2.0, '"Paris"', "Paris is the capital of France."),
                 Hit("d2", 1.0, '"Seine"', "The Seine flows through Paris.")][:k] for _ in queries]


def test_forcing_rules_by_hand():
    retriever = RecordingRetriever()
    base = AutoSearchEnv(retriever,
                         autosearch_env.Config(max_turns=4, topk=2, prompt_template="Q: {question}\n"))
    env = ForcedDepthEnv(base, depth=2)
    assert env.max_turns == env.base.max_turns == 2 and env.prompt({"question": "x"}) == "Q: x\n"
    assert env.side_branch.name == autosearch_env.INTERMEDIATE_ANSWER and env.side_branch.prompt == "\n<answer>"
    own = env.parse_action("<think>hm</think><search> capital of France </search>", 0)
    assert own == Action("search", "capital of France") and not isinstance(own, ForcedSearch)
    early = env.parse_action("<think>easy</think><answer> Paris </answer>", 0)  # an early answer: searched
    assert isinstance(early, ForcedSearch) and early == ForcedSearch("search", "Paris")
    rambling = env.parse_action("<think>the   river</think> Seine\n", 1)  # no action: its words searched
    assert isinstance(rambling, ForcedSearch) and rambling.content == "the river Seine" and not rambling.done
    last = env.parse_action("<search>more</search>", 2)  # after the k-th search the policy may not search
    assert (last.kind, last.done) == ("invalid", True)
    observations = env.observe([own, rambling])
    assert retriever.calls == [["capital of France", "the river Seine"]]  # one batched search
    assert [o.info["forced"] for o in observations] == [False, True]
    assert observations[0].text == ('\n\n<information>Doc 1(Title: "Paris") Paris is the capital of France.\n'
                                    'Doc 2(Title: "Seine") The Seine flows through Paris.</information>\n\n')
    zero = ForcedDepthEnv(base, depth=0)  # answers at once: the answer prompt follows the prompt
    assert zero.prompt({"question": "x"}) == "Q: x\n\n<answer>"
    assert zero.parse_action(" Rome </answer> and more", 0) == Action("answer", "Rome", done=True)
    with pytest.raises(ValueError, match=">= 0"):
        ForcedDepthEnv(base, depth=-1)


def test_answer_prompt_continues_a_chat():
    messages = [{"role": "user", "content": "Q"}]
    assert continued(messages, "\n<answer>").messages[-1] == {"role": "assistant", "content": "\n<answer>"}
    prefixed = chat.Chat((*messages, {"role": "assistant", "content": "<think>"}), {"enable_thinking": False})
    out = continued(prefixed, "x")
    assert out.messages[-1]["content"] == "<think>x" and out.template_kwargs == {"enable_thinking": False}
    assert continued("text", "!") == "text!"


def row(dataset, qid, em, hops=None):
    return {"dataset": dataset, "id": qid, "hops": hops, "em": em, "f1": em, "searches": 0,
            "forced_searches": 0}


def test_rows_at_each_depth_by_hand():
    run_row = {"dataset": "a", "id": "q", "hops": 2, "question": "Q?", "golden_answers": ["Paris"],
               "answer": "Rome", "intermediate_answers": ["Berlin", "the Paris"], "searches": 2,
               "forced": [True, False]}
    first, second = pilot.at_depth(run_row, 1), pilot.at_depth(run_row, 2)
    assert (first["answer"], first["em"], first["searches"], first["forced_searches"]) == \
        ("Berlin", 0.0, 1, 1)
    assert (second["answer"], second["em"], second["searches"], second["forced_searches"]) == \
        ("the Paris", 1.0, 2, 1)
    short = pilot.at_depth({**run_row, "intermediate_answers": ["Berlin"], "searches": 1}, 2)
    assert (short["answer"], short["em"], short["searches"]) == ("", 0.0, 1)  # no room for search 2
    zero = pilot.at_depth({**run_row, "intermediate_answers": [], "searches": 0, "forced": []}, 0)
    assert (zero["answer"], zero["em"], zero["searches"]) == ("Rome", 0.0, 0)


def test_pilot_arithmetic_by_hand(tmp_path):
    runs = {0: [row("a", "q1", 0.0, 1), row("a", "q2", 1.0, 2), row("b", "q3", 0.0)],
            1: [row("a", "q1", 1.0, 1), row("a", "q2", 0.0, 2), row("b", "q3", 0.0)],
            2: [row("a", "q1", 1.0, 1), row("a", "q2", 1.0, 2), row("b", "q3", 0.0)]}
    assert [d["depth"] for d in pilot.minimal_depths(runs)] == [1, 0, None]
    summary = pilot.model_summary("m", runs)
    curves = {c["dataset"]: c["em"] for c in summary["accuracy"]["datasets"]}
    assert curves == {"a": [0.5, 0.5, 1.0], "b": [0.0, 0.0, 0.0], "average": [0.25, 0.25, 0.5]}
    hops = [(h["hops"], h["em"]) for h in summary["accuracy"]["by"]["hops"]]
    assert hops == [(1, [0.0, 1.0, 1.0]), (2, [1.0, 0.0, 1.0])]
    a, b, pooled = summary["depth"]["datasets"]
    assert a["counts"] == {"0": 1, "1": 1, "2": 0, "never": 0} and b["counts"]["never"] == 1
    assert pooled["n"] == 3 and pooled["fractions"]["0"] == pytest.approx(1 / 3)
    results = {"meta": {"depths": [0, 1, 2]}, "models": [summary], "predictions": []}
    md = pilot.pilot_markdown(results)
    assert "| model | group | em @ 0 | em @ 1 | em @ 2 |" in md and "| m | a | 0.500 | 0.500 | 1.000 |" in md
    assert "| m | all | 3 | 1 (0.33) | 1 (0.33) | 0 (0.00) | 1 (0.33) |" in md
    paths = pilot.write_pilot(results, tmp_path)
    for name in ("pilot_accuracy.png", "pilot_depth.png"):
        assert paths[name].read_bytes()[:4] == b"\x89PNG"
    assert pilot.model_labels(["/m/3B", "/n/7B"]) == ["3B", "7B"]
    assert pilot.model_labels(["/a/hf", "/b/hf", ""]) == ["/a/hf", "/b/hf", "policy"]


def pilot_config(root):
    """The tiny world's config with room for the answer prompt after the question."""
    config = make_config(root)
    config.rollout.max_prompt_tokens = 48
    return config


def test_forced_depth_makes_exactly_k_searches(world):
    root, tokenizer = world
    config = pilot_config(root)
    cfg, params = tiny_policy(tokenizer)
    env = build_env(config)
    data = datasets.load_examples(config.data.dir, "world,trivia", "test", config.data.format,
                                  config.data.tfds_dir)
    rollout = rollout_config(config)
    for depth in (0, 2):
        rows = harness.evaluate_policy(cfg, params, tokenizer, ForcedDepthEnv(env, depth), data, rollout,
                                       batch_size=4, placement=models.Placement.default(attention=ATTENTION))["predictions"]
        assert len(rows) == 8
        for r in rows:  # a random policy rarely searches: the env makes its turns searches
            assert r["searches"] == depth and len(r["forced"]) == depth and r["finish_reason"] == "done"
            assert r["response"].count("<information>") == depth
            assert len(r["intermediate_answers"]) == depth  # the answer after every search
            if depth == 0:  # the answer prompt was the prompt's end: the answer is the text up to </answer>
                assert r["answer"] == tags.until_close(r["response"], tags.ANSWER)


def test_pilot_cli_on_two_checkpoints(world, tmp_path, capsys):
    root, tokenizer = world
    checkpoints = []
    for seed, name in ((0, "small"), (1, "large")):
        cfg, params = tiny_policy(tokenizer, seed)
        models.save_hf(cfg, params, tmp_path / name)
        checkpoints.append(str(tmp_path / name))
    config_file = tmp_path / "pilot_config.py"
    config_file.write_text(textwrap.dedent(f"""
        import pathlib
        from tests.tasks.autosearch.test_pilot import pilot_config

        def get_config():
            return pilot_config(pathlib.Path({str(root)!r}))
    """))
    pilot.main([f"--config={config_file}", f"--checkpoints={','.join(checkpoints)}", "--depths=0,2,1",
             "--datasets=world", "--limit=3", f"--out={tmp_path / 'out'}"])
    assert "| model | group | em @ 0 | em @ 1 | em @ 2 |" in capsys.readouterr().out
    out = tmp_path / "out"
    for name in ("pilot.md", "pilot.json", "predictions.jsonl", "pilot_accuracy.png", "pilot_depth.png"):
        assert (out / name).is_file(), name
    results = json.loads((out / "pilot.json").read_text())
    assert results["meta"]["depths"] == [0, 1, 2] and results["meta"]["questions"] == 3
    assert [m["model"] for m in results["models"]] == ["small", "large"]
    for summary in results["models"]:
        world_curve = summary["accuracy"]["datasets"][0]
        assert world_curve["dataset"] == "world" and world_curve["searches"] == [0.0, 1.0, 2.0]
        assert sum(summary["depth"]["datasets"][-1]["counts"].values()) == 3
    predictions = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(predictions) == 2 * 3 * 3  # models x depths x questions
    for p in predictions:
        assert p["searches"] == p["forced_depth"]
        assert p["em"] == qa.scores(p["answer"], p["golden_answers"])["em"]
