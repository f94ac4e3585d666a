"""The prompting baselines on GlobalQA (scored by the RPL env's answer F1 and dF1) and Qwen3's thinking switch
in their chat prompts, with a scripted model and retriever."""
from __future__ import annotations

import pytest

from searchrl.retrieval.types import Hit
from searchrl.tasks.autosearch import baselines
from searchrl.text import chat
from searchrl.text.tokenizer import load_tokenizer, train_bpe_tokenizer
from tests.tasks.rpl.test_program import QWEN3_TEMPLATE

HITS = [Hit("p1", 3.0, "Ada", "Ada lives in Velo."), Hit("p7", 2.0, "Bo", "Bo lives in Arn."),
        Hit("p3", 1.0, "Cy", "Cy lives in Velo.")]
COUNT = {"question": "Which people live in Velo?", "golden_answers": ["p1", "p3"],
         "metadata": {"type": "count", "evidence_ids": ["p1", "p3", "p4"]}}
QA = {"question": "Where does Ada live?", "golden_answers": ["Velo"]}
ANSWERS = {COUNT["question"]: "Doc 1 and Doc 2\n", QA["question"]: "Velo\n"}  # by the question in the prompt


class Retriever:
    def search(self, queries, k):
        return [HITS[:k] for _ in queries]


def scripted(answers=ANSWERS):
    """A model that answers each prompt by the question in it."""
    def generate(prompts, stops):
        return [next(a for q, a in answers.items() if q in p) for p in prompts]
    return generate


def test_a_globalqa_answer_is_scored_by_the_rpl_scorer_and_qa_by_em():
    results = baselines.evaluate_baselines(scripted(), Retriever(), {"globalqa": [COUNT], "nq": [QA]},
                                           methods=("direct", "rag"))
    count, qa_row = results["rag"]["predictions"]
    # "Doc 1 and Doc 2" names p1 and p7 as the prompt numbered them: one of the two golds, P = R = 1/2.
    assert count["answer_f1"] == pytest.approx(0.5) and "em" not in count
    # shown {p1, p7, p3} against the evidence {p1, p3, p4}: P = R = 2/3.
    assert count["doc_f1"] == pytest.approx(2 / 3)
    assert (qa_row["em"], qa_row["f1"], qa_row["cover_em"]) == (1.0, 1.0, 1.0) and "answer_f1" not in qa_row
    direct = results["direct"]["predictions"][0]
    # No passages shown: "1" and "2" stay as written, neither a document.
    assert (direct["answer_f1"], direct["doc_f1"]) == (0.0, 0.0)
    markdown = baselines.baselines_markdown(results)
    assert "| rag | 0.500 |  |  |" in markdown.split("## answer_f1")[1]  # GlobalQA's column only
    assert "| rag | 0.667 |  |  |" in markdown.split("## doc_f1")[1] and "## em" in markdown


def test_ids_cited_as_written_count_too():
    generate = scripted({COUNT["question"]: "p3, p1, p9\n"})
    results = baselines.evaluate_baselines(generate, Retriever(), {"globalqa": [COUNT]}, methods=("rag",))
    row = results["rag"]["predictions"][0]
    assert row["answer_f1"] == pytest.approx(0.8)  # {p3, p1, p9} against {p1, p3}: P = 2/3, R = 1


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    """A Qwen3-style template that reads enable_thinking, and one that ignores it."""
    out = {}
    for name, template in (("qwen3", QWEN3_TEMPLATE), ("plain", QWEN3_TEMPLATE.split("{%- if enable")[0]
                                                        + "{%- endif %}")):
        tokenizer = train_bpe_tokenizer(["Where does Ada live?"] * 10, 300,
                                        special_tokens=("<|im_start|>", "<|im_end|>", "<think>", "</think>"))
        tokenizer.chat_template = template
        path = tmp_path_factory.mktemp(name)
        tokenizer.save_pretrained(path)
        out[name] = load_tokenizer(str(path))
    return out


@pytest.mark.parametrize("thinking", [None, True, False])
def test_the_thinking_switch_changes_the_rendered_prompt(tokenizers, thinking):
    rendered = []

    def generate(prompts, stops):
        rendered.extend(chat.render(tokenizers["qwen3"], p) for p in prompts)
        return ["Velo\n"] * len(prompts)

    options = baselines.Options(chat=True, thinking=thinking)
    baselines.check_thinking(tokenizers["qwen3"], options)
    baselines.evaluate_baselines(generate, Retriever(), {"nq": [QA]}, methods=("direct",), options=options)
    expected = "<|im_start|>assistant\n" + ("<think>\n\n</think>\n\n" if thinking is False else "")
    assert rendered[0].endswith(expected) and rendered[0].count("<think>") == (thinking is False)


def test_a_thinking_switch_needs_chat_and_a_template_that_reads_it(tokenizers):
    with pytest.raises(ValueError, match="add --chat"):
        baselines.check_thinking(tokenizers["qwen3"], baselines.Options(thinking=False))
    with pytest.raises(ValueError, match="ignores enable_thinking"):
        baselines.check_thinking(tokenizers["plain"], baselines.Options(chat=True, thinking=False))
    baselines.check_thinking(tokenizers["plain"], baselines.Options(chat=True))  # no switch asked: fine
