"""The prompting baselines: prompts and answer parsers by hand, the IRCoT and Search-o1 loops driven by a
scripted model, metrics by hand, and the command line (`python -m searchrl.tasks.autosearch.baselines`) end to
end (in process) on a tiny random Hugging Face checkpoint over a tiny BM25 world."""
from __future__ import annotations

import json
import textwrap

import pytest

from searchrl import models
from searchrl.retrieval.bm25 import BM25Retriever
from searchrl.retrieval.types import Hit
from searchrl.eval import generation
from searchrl.tasks.autosearch import baselines
from searchrl.tasks.autosearch import prompts as P
from searchrl.tasks.search_r1.env import format_passages
from searchrl.text import qa
from tests.eval.test_eval import make_config, tiny_policy, world  # noqa: F401 (a fixture)

PARIS = Hit("d1", 3.0, '"Paris"', "Paris is the capital of France.")
SEINE = Hit("d2", 1.0, '"Seine"', "The Seine flows through Paris.")


class ScriptedRetriever:
    """Hits by query (default: Paris, Seine); remembers every call's queries."""

    def __init__(self, by_query=None):
        self.by_query, self.calls = by_query or {}, []

    def search(self, queries, k):
        self.calls.append(list(queries))
        return [self.by_query.get(q, [PARIS, SEINE])[:k] for q in queries]


def test_prompts_by_hand():
    assert P.template("Sys.", "Question: q", use_chat=False) == "Sys.\n\nQuestion: q"
    assert P.template("", "U", use_chat=True) == [{"role": "user", "content": "U"}]
    rag = P.rag_prompt("Where?", [PARIS, SEINE], use_chat=False)
    assert rag == ("Answer the question based on the given document.Only give me the answer and do not "
                   "output any other words.\nThe following are given documents.\n\n"
                   'Doc 1(Title: "Paris") Paris is the capital of France.\n'
                   'Doc 2(Title: "Seine") The Seine flows through Paris.\n\n\nQuestion: Where?')
    ircot = P.ircot_prompt("Where?", [SEINE], [" It is", " near"])
    assert ircot == (f"{P.IRCOT_INSTRUCTION}\n\n{P.IRCOT_EXAMPLE}\n\n"
                     'Wikipedia Title: "Seine"\nThe Seine flows through Paris.\n\n'
                     "Question: Where?\nThought: It is  near")
    single, multi = P.search_o1_prompt("Q?", "nq", False), P.search_o1_prompt("Q?", "HotpotQA", False)
    assert "limited to 5.\n" in single and "Nobel Prize" in single and "Lara Croft" not in single
    assert "limited to 10.\n" in multi and "Lara Croft" in multi
    assert single.endswith("final answer in the format \\boxed{YOUR_ANSWER}.\n\nQuestion:\nQ?\n\n")


def test_answer_parsers_by_hand(world):
    assert P.boxed_answer("a \\boxed{x} then \\boxed{\\text{Paris}} ok") == "Paris"
    assert P.boxed_answer("\\boxed{(B)}") == "B" and P.boxed_answer("no box") == ""
    assert P.ircot_answer(" Seine. So the answer is: Paris") == "Paris" and P.ircot_answer("hm") == "hm"
    assert P.first_line(" Paris \nmore") == "Paris"
    assert P.final_information("x\n**Final Information**\n\nParis is\nthe capital.") == "Paris isthe capital."
    assert P.final_information("nothing useful") == P.NO_INFORMATION
    assert P.search_o1_query("go <|begin_search_query|> a <|end_search_query|>\n") == "a"
    assert P.search_o1_query("<|begin_search_query|>a<|end_search_query|> and more") is None
    assert P.truncated_reasoning("a\nb") == "Step 1: a\n\nStep 2: b"
    searched = "<|begin_search_query|>q<|end_search_query|>"
    lines = "\n".join(["l1", "l2", searched, "l4", "l5", "l6", "l7", "l8"])
    assert P.truncated_reasoning(lines) == (f"Step 1: l1\n\n...\n\nStep 3: {searched}\n\n...\n\n"
                                            "Step 6: l6\n\nStep 7: l7\n\nStep 8: l8")
    assert baselines.strip_stop(" it is.", P.IRCOT_STOPS) == " it is"
    assert baselines.strip_stop("x", P.IRCOT_STOPS) == "x"
    _, tokenizer = world
    text = "Paris begins. " + "river " * 100 + "Rome ends"  # FlashRAG keeps 100 / 2 - 20 tokens at each end
    cut = generation.fit_prompt(tokenizer, text, 100)
    assert len(tokenizer.encode(cut, add_special_tokens=False)) <= 60 < len(tokenizer.encode(text))
    assert cut.startswith("Paris begins. river") and cut.endswith("river Rome ends")
    assert generation.fit_prompt(tokenizer, "short", 48) == "short"


def test_ircot_loop_with_a_scripted_model():
    thought = " Paris is in France"
    retriever = ScriptedRetriever({thought: [Hit("d2", 2.5, '"Seine"', "The Seine flows through Paris."),
                                             Hit("d3", 0.5, '"Rome"', "Rome is in Italy.")]})
    prompts = []

    def generate(batch, stops):
        assert stops == P.IRCOT_STOPS
        prompts.extend(batch)
        return [(" So the answer is: Paris." if p.endswith(thought) else thought + ".") if "France?" in p
                else " I do not know\n" for p in batch]

    examples = [{"question": "Capital of France?"}, {"question": "Capital of Mars?"}]
    out = baselines.ircot(examples, generate, retriever, baselines.Options(topk=2, ircot_max_iter=3))
    assert (out[0].answer, out[0].searches) == ("Paris", 2)
    assert out[0].response == " Paris is in France  So the answer is: Paris"
    assert (out[1].answer, out[1].searches) == (" I do not know  I do not know  I do not know", 3)
    # one retrieval with each question, then with each unanswered thought; none after the last thought
    assert retriever.calls == [["Capital of France?", "Capital of Mars?"], [thought, " I do not know"],
                               [" I do not know"]]
    second = prompts[2]  # the first question's second step: passages pooled, best score kept, ascending
    titles = [line for line in second.split("\n") if line.startswith("Wikipedia Title: \"")]
    assert titles[-3:] == ['Wikipedia Title: "Rome"', 'Wikipedia Title: "Seine"', 'Wikipedia Title: "Paris"']
    assert second.endswith("Question: Capital of France?\nThought:" + thought)


def test_search_o1_loop_with_a_scripted_model():
    query = "<|begin_search_query|>capital of France<|end_search_query|>"
    requests = []

    def generate(batch, stops):
        if stops == ():  # Reason-in-Documents
            requests.extend(batch)
            return ["The pages say so.\n**Final Information**\n\nParis is the capital." for _ in batch]
        assert stops == (P.END_QUERY,)
        replies = []
        for prompt in batch:
            results = prompt.count(P.BEGIN_RESULT) - P.SINGLE_QA_INSTRUCTION.count(P.BEGIN_RESULT)
            if "Mars" in prompt:
                replies.append("I know: \\boxed{Rome}")
            else:
                replies.append(["Let me search. " + query, "Again. " + query, "So \\boxed{Paris}"][results])
        return replies

    retriever = ScriptedRetriever()
    examples = [{"question": "Capital of France?", "dataset": "nq"},
                {"question": "Capital of Mars?", "dataset": "nq"}]
    france, mars = baselines.search_o1(examples, generate, retriever, baselines.Options(topk=1))
    assert (france.answer, france.searches, mars.answer, mars.searches) == ("Paris", 1, "Rome", 0)
    assert retriever.calls == [["capital of France"]]  # the repeated query is not searched again
    assert france.response == ("Let me search. " + query + P.search_result("Paris is the capital.")
                               + "Again. " + query + P.REPEAT_MESSAGE + "So \\boxed{Paris}")
    (request,) = requests
    assert "**Web Page 1:**\n{\n  \"id\": \"d1\",\n  \"title\": \"\\\"Paris\\\"\"" in request
    assert "- **Current Search Query:**  \ncapital of France\n" in request
    assert "- **Previous Reasoning Steps:**  \nStep 1: Let me search. " + query in request
    over = baselines.Reasoning("p", max_searches=1, queries={"a"})
    assert baselines.search_o1_turn([over], ["<|begin_search_query|>b<|end_search_query|>"]) == []
    assert over.output.endswith(P.LIMIT_MESSAGE) and not over.finished


def test_metrics_by_hand():
    answers = iter(["Paris", "the Seine river", "Berlin\nand more", ""])

    def generate(batch, stops):
        assert stops == ("\n",)
        return [next(answers) for _ in batch]

    data = {"d": [{"id": i, "question": f"q{i}", "golden_answers": [gold]}
                  for i, gold in enumerate(["Paris", "Seine", "Berlin", "Rome"])]}
    results = baselines.evaluate_baselines(generate, ScriptedRetriever(), data, ["direct"])
    rows = results["direct"]["predictions"]
    assert [r["answer"] for r in rows] == ["Paris", "the Seine river", "Berlin", ""]
    assert [r["em"] for r in rows] == [1.0, 0.0, 1.0, 0.0] and rows[1]["f1"] == pytest.approx(2 / 3)
    table = results["direct"]["table"][0]
    assert table["em"] == 0.5 and table["f1"] == pytest.approx((2 + 2 / 3) / 4) and table["cover_em"] == 0.75
    assert "| direct | 0.500 | 0.500 |" in baselines.baselines_markdown(results)
    with pytest.raises(ValueError, match="Unknown baseline.*'react'"):
        baselines.evaluate_baselines(generate, ScriptedRetriever(), data, ["react"])


def baselines_config(root):
    """The tiny world's config with prompts long enough for RAG's three passages."""
    config = make_config(root)
    config.rollout.max_prompt_tokens = 320
    return config


def test_baselines_cli_end_to_end(world, tmp_path, monkeypatch):
    root, tokenizer = world
    cfg, params = tiny_policy(tokenizer)
    models.save_hf(cfg, params, tmp_path / "hf")
    config_file = tmp_path / "baselines_config.py"
    config_file.write_text(textwrap.dedent(f"""
        import pathlib
        from tests.tasks.autosearch.test_baselines import baselines_config

        def get_config():
            return baselines_config(pathlib.Path({str(root)!r}))
    """))
    sent = []
    generate = baselines.Generator.__call__

    def recording(self, prompts, stops=()):
        sent.extend(prompts)
        return generate(self, prompts, stops)

    monkeypatch.setattr(baselines.Generator, "__call__", recording)
    baselines.main([f"--config={config_file}", "--methods=direct,cot,rag,ircot,search_o1",
             f"--checkpoint={tmp_path / 'hf'}", "--datasets=world", "--limit=3", f"--out={tmp_path / 'out'}"])
    out = tmp_path / "out"
    tables = json.loads((out / "baselines.json").read_text())
    assert list(tables) == ["direct", "cot", "rag", "ircot", "search_o1"]
    lines = (root / "data" / "world" / "test.jsonl").read_text().splitlines()
    questions = [json.loads(line)["question"] for line in lines]
    retriever = BM25Retriever(root / "index")
    for method in tables:
        rows = [json.loads(line) for line in (out / method / "predictions.jsonl").read_text().splitlines()]
        assert [r["question"] for r in rows] == questions[:3]
        for r in rows:
            scores = qa.scores(r["answer"], r["golden_answers"])
            assert {k: r[k] for k in ("em", "f1", "cover_em")} == scores
        bounds = {"direct": (0, 0), "cot": (0, 0), "rag": (1, 1), "ircot": (1, 2), "search_o1": (0, 5)}
        low, high = bounds[method]
        assert all(low <= r["searches"] <= high for r in rows)
        assert tables[method]["table"][0]["em"] == pytest.approx(sum(r["em"] for r in rows) / 3)
    for question, hits in zip(questions[:3], retriever.search(questions[:3], 3)):
        rag = P.rag_prompt(question, hits, False)  # the top-3 passages, untruncated, went to the model
        assert rag in sent and format_passages(hits) in rag and len(hits) == 3
        assert len(tokenizer.encode(rag, add_special_tokens=False)) < 320
    assert "# Prompting baselines" in (out / "baselines.md").read_text()
    assert (out / "rag" / "results.md").is_file()
