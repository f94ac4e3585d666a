"""DeepRetrieval's prompts, per task family, with and without reasoning (pat-jj/DeepRetrieval,
code/data_preprocess/{nq_serini,pubmed,msmarco_beir,spider,bird}.py and no_reason/*).

The public code writes Qwen's chat markup by hand and puts the assistant's first words ("Assistant:
Let me ...") inside the user turn; searchrl keeps its system message, user message and assistant
prefix as separate parts, so the tokenizer's own chat template can render them (`searchrl.text.chat`),
or a plain-text layout for base models (`plain_text`). The texts themselves are the public code's.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

_QUERY_NOTE = ("Note: The query should use Boolean operators (AND, OR) and parentheses for grouping terms "
               "appropriately.")


@dataclasses.dataclass(frozen=True)
class TaskPrompt:
    """A task's system message, its user message (a template over the example's fields) and the
    assistant prefix the policy continues (it opens `<think>`, or `<answer>` in some no-reasoning
    prompts)."""

    system: str
    user: str  # fields: {question}; the SQL tasks also {schema} and {knowledge} (see `user_message`)
    assistant: str


def _example(key: str, think: bool) -> str:
    thinking = "<think>\n[thinking process]\n</think>\n" if think else ""
    value = "SELECT ... (in one line)" if key == "sql" else "...."
    return f'{thinking}<answer>\n{{\n    "{key}": "{value}"\n}} \n</answer>'


_SYSTEM_THINK = ("You are a helpful assistant. You first thinks about the reasoning process in the mind "
                 "and then provides the user with the answer.")
_SYSTEM_DIRECT = "You are a helpful assistant. You directly provide the user with the answer."
_SYSTEM_NEED = "You are a helpful assistant. You need to provide the user with the answer."

_EVIDENCE = ("\nYou are a query rewriting expert. Your task is to create query terms for user query to find "
             "relevant literature in a Wikipedia corpus using BM25.\n")
_LITERATURE = (
    "\n"
    "The Assistant is a clinical specialist. He is conducting research and doing a medical literature "
    "review. His task is to create query terms for a search URL to find relevant literature on PubMed or "
    "ClinicalTrials.gov.\n"
    "\n"
    "The research is defined using the PICO framework:\n"
    "P: Patient, Problem or Population - Who or what is the research about?\n"
    "I: Intervention - What is the main intervention or exposure being considered?\n"
    "C: Comparison - What is the intervention being compared to?\n"
    "O: Outcome - What are the relevant outcomes or effects being measured?\n"
    "\n"
)
_CLASSIC = ("\nYou are an expert in query generation. Given a web search query, your task is to create "
            "query terms to retrieve relevant passages that answer the query.")
_SQL = ("\nYou are a SQL query writing expert. Your task is to write the SQL query for the user query to "
        "retrieve data from a database.\n")
_SQL_CONTEXT = ("Database Schema:\n{schema}\n{knowledge}Note: Using valid SQLite and "
                "understanding External Knowledge, answer the following questions for the tables provided "
                "above.\n")

PROMPTS: dict[tuple[str, bool], TaskPrompt] = {
    ("evidence", True): TaskPrompt(
        _SYSTEM_THINK,
        _EVIDENCE + "\nShow your work in <think> </think> tags. Your final response must be in JSON format "
        f"within <answer> </answer> tags. For example,\n{_example('query', True)}. \n{_QUERY_NOTE}\n\n"
        "Here's the user query:\n{question}",
        "Let me rewrite the query with reasoning. \n<think>\n"),
    ("evidence", False): TaskPrompt(
        _SYSTEM_DIRECT,
        _EVIDENCE + "\nYour response must be in JSON format within <answer> </answer> tags. For example,\n"
        f"{_example('query', False)}\n{_QUERY_NOTE} Directly provide the query (in the format mentioned "
        "above) without thinking and without any additional text.\n\nHere's the user query:\n{question}",
        "Here's the generated query:\n"),
    ("literature", True): TaskPrompt(
        "A conversation between User and Assistant. The User asks a question, and the Assistant solves it. "
        "The Assistant first thinks about the reasoning process in the mind and then provides the User "
        "with the answer.",
        _LITERATURE + "The Assistant should show his thinking process in <think> </think> tags. The "
        "Assistant should return the final answer in JSON format in <answer> </answer> tags, \nFor "
        f"example:\n{_example('query', True)}. \n{_QUERY_NOTE}\n\nUser: The research is defined by the "
        "following PICO:\n{question}",
        "Let me solve this step by step. \n<think>\n"),
    ("literature", False): TaskPrompt(
        _SYSTEM_DIRECT,
        _LITERATURE + "\nYour response must be in JSON format within <answer> </answer> tags. For example,\n"
        f"{_example('query', False)}\n{_QUERY_NOTE} Directly provide the query (in the format mentioned "
        "above) without thinking and without any additional text.\n\nHere's the user query:\n{question}",
        "Here's the generated query:\n"),
    ("classic", True): TaskPrompt(
        _SYSTEM_THINK.replace("thinks", "think").replace("provides", "provide"),
        _CLASSIC + "\nShow your work in <think> </think> tags. Your final response must be in JSON format "
        f"within <answer> </answer> tags. For example,\n{_example('query', False)}. \n{_QUERY_NOTE}\n\n"
        "Here's the claim:\n{question}",
        "Let me think step by step. \n<think>\n"),
    ("classic", False): TaskPrompt(
        _SYSTEM_NEED,
        _CLASSIC + "\nYour final response must be in JSON format within <answer> </answer> tags. For "
        f"example,\n{_example('query', False)}. \n{_QUERY_NOTE}\n\nHere's the search query:\n{{question}}",
        "\n<answer>\n"),
    ("sql", True): TaskPrompt(
        _SYSTEM_THINK.replace("thinks", "think"),
        _SQL + _SQL_CONTEXT + "\nShow your work in <think> </think> tags. Your final response must be in "
        f"JSON format within <answer> </answer>. For example,\n{_example('sql', True)}. \n"
        "\nHere's the user query:\n{question}",
        "Let me write the SQL query with reasoning. \n<think>\n"),
    ("sql", False): TaskPrompt(
        _SYSTEM_NEED,
        _SQL + _SQL_CONTEXT + "\nYour final response must be in JSON format within <answer> </answer>. For "
        f"example,\n{_example('sql', False)}. \n\nHere's the user query:\n{{question}}",
        "Let me write the SQL query. \n<answer>\n"),
}


def fill(template: str, fields: Mapping[str, str]) -> str:
    """`template` with each `{name}` replaced by its field (literal braces elsewhere stay as they are)."""
    for name, value in fields.items():
        template = template.replace("{" + name + "}", value)
    return template


def user_message(template: str, example: Mapping[str, Any]) -> str:
    """The user message of one example: its question, and for SQL its schema and BIRD's external knowledge
    line (absent for Spider, whose prompt has none)."""
    knowledge = example.get("knowledge") or ""
    return fill(template, {"question": example["question"], "schema": example.get("schema", ""),
                           "knowledge": f"External Knowledge: {knowledge}\n" if knowledge else ""})
