"""The prompting baselines' prompts, as their public code writes them, and the answer parsers that go with
them.

Sources (cited by constant):
- [FR] FlashRAG (RUC-NLPIR/FlashRAG @ 1ee5249): `examples/methods/run_exp.py:zero_shot` (Direct),
  `flashrag/prompt/base_prompt.py:PromptTemplate` (RAG: its default template, `format_reference`,
  `get_string`), `flashrag/pipeline/active_pipeline.py:IRCOTPipeline` and `flashrag/utils/pred_parse.py`.
- [SO1] Search-o1 (sunnynexus/Search-o1 @ 6ced48f): `scripts/prompts.py` (the Search-o1 instructions, the
  Reason-in-Documents instruction and the open-QA task instruction its direct generation uses, our CoT),
  `scripts/run_search_o1.py` (tags, limits, reasoning-step truncation) and
  `scripts/evaluate.py:extract_answer`.
Every prompt is a `searchrl.text.chat.Prompt`: text for a base model, messages for a chat model (rendered by
the tokenizer's own template, as both codes do for chat models).
"""
from __future__ import annotations

import json
import re
from typing import Sequence

from searchrl.retrieval.types import Hit
from searchrl.tasks.search_r1.env import format_passages
from searchrl.text import chat

# [FR] run_exp.py:zero_shot.
DIRECT_SYSTEM = (
    "Answer the question based on your own knowledge. Only give me the answer and do not output any other "
    "words."
)
# [FR] PromptTemplate.base_system_prompt (its missing space after "document." included).
RAG_SYSTEM = (
    "Answer the question based on the given document.Only give me the answer and do not output any other "
    "words.\nThe following are given documents.\n\n{reference}"
)
QUESTION_USER = "Question: {question}"  # [FR] the user prompt of both
# [FR] IRCOTPipeline.IRCOT_INSTRUCTION / IRCOT_EXAMPLE (from IRCoT's 2WikiMultihopQA demonstrations).
IRCOT_INSTRUCTION = (
    "You serve as an intelligent assistant, adept at facilitating users through complex, multi-hop reasoning "
    "across multiple documents. This task is illustrated through demonstrations, each consisting of a "
    "document set paired with a relevant question and its multi-hop reasoning thoughts. Your task is to "
    "generate one thought for current step, DON'T generate the whole thoughts at once! If you reach what you "
    "believe to be the final step, start with \"So the answer is:\"."
)
IRCOT_EXAMPLE = (
    "Wikipedia Title: Kurram Garhi\nKurram Garhi is a small village located near the city of Bannu, which is "
    "the part of Khyber Pakhtunkhwa province of Pakistan. Its population is approximately 35000. Barren "
    "hills are near this village. This village is on the border of Kurram Agency. Other nearby villages are "
    "Peppal, Surwangi and Amandi Kala.\n\nWikipedia Title: 2001–02 UEFA Champions League second group stage\n"
    "Eight winners and eight runners- up from the first group stage were drawn into four groups of four "
    "teams, each containing two group winners and two runners- up. Teams from the same country or from the "
    "same first round group could not be drawn together. The top two teams in each group advanced to the "
    "quarter- finals.\n\nWikipedia Title: Satellite tournament\nA satellite tournament is either a minor "
    "tournament or event on a competitive sporting tour or one of a group of such tournaments that form a "
    "series played in the same country or region.\n\nWikipedia Title: Trojkrsti\nTrojkrsti is a village in "
    "Municipality of Prilep, Republic of Macedonia.\n\nWikipedia Title: Telephone numbers in Ascension "
    "Island\nCountry Code:+ 247< br> International Call Prefix: 00 Ascension Island does not share the same "
    "country code( +290) with the rest of St Helena.\n\nQuestion: Are both Kurram Garhi and Trojkrsti "
    "located in the same country?\nThought: Kurram Garhi is located in the country of Pakistan. Trojkrsti is "
    "located in the country of Republic of Macedonia. Thus, they are not in the same country. So the answer "
    "is: no.\n\n"
)
IRCOT_USER = "{reference}Question: {question}\nThought:"
IRCOT_REFERENCE = "Wikipedia Title: {title}\n{text}\n\n"
IRCOT_STOPS = (".", "\n")  # [FR] IRCOTPipeline.run_batch: one thought per generation
IRCOT_ANSWER = "So the answer is:"
# [SO1] run_search_o1.py.
BEGIN_QUERY, END_QUERY = "<|begin_search_query|>", "<|end_search_query|>"
BEGIN_RESULT, END_RESULT = "<|begin_search_result|>", "<|end_search_result|>"
SEARCH_O1_MAX_TURNS = 15  # --max_turn
MULTI_HOP = frozenset({"hotpotqa", "2wiki", "2wikimultihopqa", "musique", "bamboogle"})
LIMIT_MESSAGE = (f"\n{BEGIN_RESULT}\nThe maximum search limit is exceeded. You are not allowed to search."
                 f"\n{END_RESULT}\n")
REPEAT_MESSAGE = (f"\n{BEGIN_RESULT}\nYou have searched this query. Please refer to previous results."
                  f"\n{END_RESULT}\n")
# [SO1] prompts.py:get_task_instruction_openqa (not QwQ): Search-o1's direct-generation prompt, our CoT.
COT_USER = (
    "Please answer the following question. You should think step by step to solve it.\n\nProvide your final "
    "answer in the format \\boxed{{YOUR_ANSWER}}.\n\nQuestion:\n{question}\n\n"
)
_SEARCH_O1_TOOLS = (
    "You are a reasoning assistant with the ability to perform web searches to help you answer the user's "
    "question accurately. You have special tools:\n\n- To perform a search: write <|begin_search_query|> "
    "your query here <|end_search_query|>.\nThen, the system will search and analyze relevant web pages, "
    "then provide you with helpful information in the format <|begin_search_result|> ...search results... "
    "<|end_search_result|>.\n\nYou can repeat the search process multiple times if necessary. The maximum "
    "number of search attempts is limited to {limit}.\n\nOnce you have all the information you need, "
    "continue your reasoning.\n\nExample:\n"
)
_SEARCH_O1_REMEMBER = (
    "Assistant continues reasoning with the new information...\n\nRemember:\n- Use <|begin_search_query|> to "
    "request a web search and end with <|end_search_query|>.\n- When done searching, continue your "
    "reasoning.\n\n"
)
# [SO1] prompts.py:get_singleqa_search_o1_instruction / get_multiqa_search_o1_instruction.
SINGLE_QA_INSTRUCTION = _SEARCH_O1_TOOLS + (
    "Question: \"Who got the first Nobel Prize in Physics?\"\nAssistant thinking steps:\n- I need to find "
    "out who was awarded the first Nobel Prize in Physics.\n\nAssistant:\n<|begin_search_query|>first Nobel "
    "Prize in Physics winner<|end_search_query|>\n\n(System returns processed information from relevant web "
    "pages)\n\n"
) + _SEARCH_O1_REMEMBER
MULTI_QA_INSTRUCTION = _SEARCH_O1_TOOLS + (
    "Question: \"Alice David is the voice of Lara Croft in a video game developed by which company?\"\n"
    "Assistant thinking steps:\n- I need to find out who voices Lara Croft in the video game.\n- Then, I "
    "need to determine which company developed that video game.\n\nAssistant:\n<|begin_search_query|>Alice "
    "David Lara Croft voice<|end_search_query|>\n\n(System returns processed information from relevant web "
    "pages)\n\nAssistant thinks: The search results indicate that Alice David is the voice of Lara Croft in "
    "a specific video game. Now, I need to find out which company developed that game.\n\nAssistant:\n"
    "<|begin_search_query|>video game developed by Alice David Lara Croft<|end_search_query|>\n\n(System "
    "returns processed information from relevant web pages)\n\n"
) + _SEARCH_O1_REMEMBER
# [SO1] prompts.py:get_webpage_to_reasonchain_instruction (Reason-in-Documents).
REASON_IN_DOCUMENTS = (
    "**Task Instruction:**\n\nYou are tasked with reading and analyzing web pages based on the following "
    "inputs: **Previous Reasoning Steps**, **Current Search Query**, and **Searched Web Pages**. Your "
    "objective is to extract relevant and helpful information for **Current Search Query** from the "
    "**Searched Web Pages** and seamlessly integrate this information into the **Previous Reasoning Steps** "
    "to continue reasoning for the original question.\n\n**Guidelines:**\n\n1. **Analyze the Searched Web "
    "Pages:**\n- Carefully review the content of each searched web page.\n- Identify factual information "
    "that is relevant to the **Current Search Query** and can aid in the reasoning process for the original "
    "question.\n\n2. **Extract Relevant Information:**\n- Select the information from the Searched Web Pages "
    "that directly contributes to advancing the **Previous Reasoning Steps**.\n- Ensure that the extracted "
    "information is accurate and relevant.\n\n3. **Output Format:**\n- **If the web pages provide helpful "
    "information for current search query:** Present the information beginning with `**Final Information**` "
    "as shown below.\n**Final Information**\n\n[Helpful information]\n\n- **If the web pages do not provide "
    "any helpful information for current search query:** Output the following text.\n\n**Final "
    "Information**\n\nNo helpful information found.\n\n**Inputs:**\n- **Previous Reasoning Steps:**  \n"
    "{prev_reasoning}\n\n- **Current Search Query:**  \n{search_query}\n\n- **Searched Web Pages:**  \n"
    "{document}\n\nNow you should analyze each web page and find helpful information based on the current "
    "search query \"{search_query}\" and previous reasoning steps.\n"
)
NO_INFORMATION = "No helpful information found."


def template(system: str, user: str, use_chat: bool) -> chat.Prompt:
    """[FR] `PromptTemplate.get_string`: a system and a user message for a chat model, else the two
    (non-empty) joined by a blank line."""
    if use_chat:
        return chat.messages(system, user)
    return "\n\n".join(p for p in (system, user) if p)


def continued(prompt: chat.Prompt, text: str) -> chat.Prompt:
    """`prompt` followed by `text` that the model is to continue: appended to a text prompt, else the final
    assistant message of a chat (added when the chat has none)."""
    if isinstance(prompt, str):
        return prompt + text
    chat_prompt = prompt if isinstance(prompt, chat.Chat) else chat.Chat(tuple(prompt))
    messages = list(chat_prompt.messages)
    if messages[-1]["role"] == "assistant":
        messages[-1] = {"role": "assistant", "content": messages[-1]["content"] + text}
    elif text:
        messages.append({"role": "assistant", "content": text})
    return chat.Chat(tuple(messages), chat_prompt.template_kwargs)


def rag_prompt(question: str, hits: Sequence[Hit], use_chat: bool) -> chat.Prompt:
    """[FR] The default template, the passages as `format_reference` writes them (Search-R1's format too)."""
    system = RAG_SYSTEM.format(reference=format_passages(hits))
    return template(system, QUESTION_USER.format(question=question), use_chat)


def title_and_text(hit: Hit) -> tuple[str, str]:
    """[FR] `format_reference`: a passage's title is the first line of its contents, its text the rest."""
    title, _, text = hit.contents.partition("\n")
    return title, text


def ircot_reference(hits: Sequence[Hit]) -> str:
    """[FR] The IRCoT pipeline's reference block: one `Wikipedia Title:` paragraph per passage."""
    return "".join(IRCOT_REFERENCE.format(title=title, text=text)
                   for title, text in map(title_and_text, hits))


def ircot_prompt(question: str, hits: Sequence[Hit], thoughts: Sequence[str]) -> str:
    """[FR] An IRCoT step's prompt: instruction and demonstration, the passages so far, the question and the
    thoughts so far (plain text for every model, as FlashRAG builds it)."""
    user = IRCOT_USER.format(reference=ircot_reference(hits), question=question)
    return template(f"{IRCOT_INSTRUCTION}\n\n{IRCOT_EXAMPLE}", user, use_chat=False) + " ".join(thoughts)


def ircot_answer(thoughts: str) -> str:
    """[FR] `ircot_pred_parse`: the text after "So the answer is:" (up to a second one), else all of it."""
    return thoughts.split(IRCOT_ANSWER)[1].strip() if IRCOT_ANSWER in thoughts else thoughts


def first_line(text: str) -> str:
    """[FR] `basic_pred_parse`: the first line, stripped."""
    return text.split("\n")[0].strip()


def boxed_answer(text: str) -> str:
    """[SO1] `extract_answer(mode="qa")`: the last `\\boxed{...}` (greedy within a line), unwrapped from a
    `\\text{...}` and from parentheses; "" when there is none."""
    matches = re.findall(r"\\boxed\{(.*)\}", text)
    if not matches:
        return ""
    inner = re.findall(r"\\text\{(.*)\}", matches[-1])
    return (inner[-1] if inner else matches[-1]).strip("()")


def search_o1_instruction(dataset: str, max_searches: int) -> str:
    """[SO1] The multi-hop instruction for HotpotQA, 2Wiki, MuSiQue and Bamboogle, else the single-hop one."""
    base = MULTI_QA_INSTRUCTION if dataset.lower() in MULTI_HOP else SINGLE_QA_INSTRUCTION
    return base.format(limit=max_searches)


def search_o1_max_searches(dataset: str) -> int:
    """[SO1] MAX_SEARCH_LIMIT for open-domain QA: 10 for multi-hop datasets, 5 for single-hop ones."""
    return 10 if dataset.lower() in MULTI_HOP else 5


def search_o1_prompt(question: str, dataset: str, use_chat: bool) -> chat.Prompt:
    """[SO1] The instruction and the open-QA task instruction as one user message."""
    instruction = search_o1_instruction(dataset, search_o1_max_searches(dataset))
    text = instruction + COT_USER.format(question=question)
    return template("", text, use_chat)


def search_o1_query(text: str) -> str | None:
    """[SO1] The last query of a generation that ends with `<|end_search_query|>`, else None."""
    if not text.rstrip().endswith(END_QUERY):
        return None
    matches = re.findall(re.escape(BEGIN_QUERY) + r"(.*?)" + re.escape(END_QUERY), text, flags=re.DOTALL)
    return matches[-1].strip() if matches and matches[-1].strip() else None


def web_pages(hits: Sequence[Hit]) -> str:
    """[SO1] The searched pages as Search-o1 shows them (one JSON record per page), here local passages: id,
    title and text as the page's context."""
    pages = []
    for i, hit in enumerate(hits):
        title, text = title_and_text(hit)
        record = {"id": hit.id, "title": title, "context": text}
        pages.append(f"**Web Page {i + 1}:**\n{json.dumps(record, ensure_ascii=False, indent=2)}\n")
    return "".join(pages)


def truncated_reasoning(output: str) -> str:
    """[SO1] The previous reasoning steps shown to Reason-in-Documents: one step per line of the output so
    far; beyond 5 steps, the first, the last 4 and every step with a search query or result, "..." for the
    rest."""
    lines = output.replace("\n\n", "\n").split("\n")
    steps = "".join(f"Step {i + 1}: {line}\n\n" for i, line in enumerate(lines)).split("\n\n")
    if len(steps) <= 5:
        return "\n\n".join(steps).strip("\n")
    kept = ""
    for i, step in enumerate(steps):
        if i == 0 or i >= len(steps) - 4 or BEGIN_QUERY in step or BEGIN_RESULT in step:
            kept += step + "\n\n"
        elif not kept.endswith("\n\n...\n\n"):
            kept += "...\n\n"
    return kept.strip("\n")


def reason_in_documents_prompt(output: str, query: str, hits: Sequence[Hit], use_chat: bool) -> chat.Prompt:
    """[SO1] The Reason-in-Documents request on the reasoning so far, the query and its passages."""
    user = REASON_IN_DOCUMENTS.format(prev_reasoning=truncated_reasoning(output), search_query=query,
                                      document=web_pages(hits))
    return template("", user, use_chat)


def final_information(text: str) -> str:
    """[SO1] `extract_answer(mode="infogen")`: what follows the last "**Final Information**" (newlines
    removed), else what follows "**Modified Reasoning Steps**", else "No helpful information found."."""
    if "\n**Final Information**" in text:
        return text.split("\n**Final Information**")[-1].replace("\n", "").strip("```").strip()
    if "\n**Modified Reasoning Steps**" in text:
        return text.split("\n**Modified Reasoning Steps**")[-1].strip("```").strip()
    return NO_INFORMATION


def search_result(information: str) -> str:
    """[SO1] How Reason-in-Documents' output joins the reasoning."""
    return f"\n\n{BEGIN_RESULT}{information}{END_RESULT}\n\n"
