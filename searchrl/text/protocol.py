"""The search-QA tag protocol: `<think>`, `<search>`, `<information>`, `<answer>`.

A response is valid when it walks this state machine from `start` to `end` (Search-R1's
`is_valid_sequence`, qa_em_format.py):

    start --<think>--> in_think --</think>--> after_think
    after_think --<search>--> in_search --</search>--> after_search
    after_search --<information>--> in_information --</information>--> after_information
    after_information --<think>--> in_think
    after_think --<answer>--> in_answer --</answer>--> end

Text is free inside a tag; between tags only whitespace is allowed, and nothing may follow the final
`</answer>`. Every tag is therefore balanced. As in Search-R1, new information must be followed by a
`<think>` before the next search or answer.

A single model turn (an env may check each turn on its own) is a walk from `start` that stops at
`after_search` (a search turn) or at `end` (an answer turn). `tool_or_answer` reads a turn's action the way
every tag-speaking env does.
"""
from __future__ import annotations

import functools
import re
from typing import Literal, NamedTuple, Sequence

from searchrl.episode import Action, Turn
from searchrl.model_families import FAMILIES, ChatMarkers
from searchrl.text import tags

INVALID = "invalid"  # the action kind of a turn that is not a valid action, in every env

_TAG_SPLIT = tags.tag_pattern(tags.THINK, tags.SEARCH, tags.INFORMATION, tags.ANSWER)
_TRANSITIONS: dict[tuple[str, str], str] = {
    ("start", "<think>"): "in_think",
    ("after_information", "<think>"): "in_think",
    ("in_think", "</think>"): "after_think",
    ("after_think", "<search>"): "in_search",
    ("in_search", "</search>"): "after_search",
    ("after_search", "<information>"): "in_information",
    ("in_information", "</information>"): "after_information",
    ("after_think", "<answer>"): "in_answer",
    ("in_answer", "</answer>"): "end",
}
_CONTENT_STATES = frozenset({"in_think", "in_search", "in_information", "in_answer"})
_TURN_ACCEPT = {"search": "after_search", "answer": "end"}


@functools.cache
def _chat_markers(chats: frozenset[ChatMarkers]) -> tuple[tuple[str, ...], re.Pattern]:
    """The assistant headers of `chats` (the registered families' chat templates: ChatML for Qwen, Llama 3's),
    and the pattern of a run of whitespace and their end tokens, read backwards from the end of a response:
    one possessive match at the start of the reversed text takes linear time (searching the text for a run
    that ends at its end is quadratic). Longer tokens are tried first (a family's token may end another's)."""
    tokens = sorted({token for chat in chats for token in chat.end_tokens}, key=lambda t: (-len(t), t))
    trailing = re.compile(r"(?:\s+|" + "|".join(re.escape(token[::-1]) for token in tokens) + ")*+")
    return tuple(sorted({chat.assistant for chat in chats})), trailing


class FormatCheck(NamedTuple):
    """Whether a text follows the protocol, and if not, the first place it breaks."""

    ok: bool
    reason: str


def response_part(text: str) -> str:
    """The model's response: the text after the first assistant header of a registered family's chat template
    (all of it when there is none), without trailing end-of-turn tokens.

    This is what keeps the prompt's own example (`<answer> Beijing </answer>`) out of the answer.
    """
    headers, trailing = _chat_markers(frozenset(chat for name in FAMILIES
                                                if (chat := FAMILIES.get(name).chat) is not None))
    found = [(start, -len(header)) for header in headers if (start := text.find(header)) >= 0]
    if found:
        start, minus_length = min(found)
        text = text[start - minus_length:]
    return text[:len(text) - trailing.match(text[::-1]).end()]


def _walk(text: str, state: str) -> tuple[str, str]:
    """Runs the state machine over `text` from `state`; returns (final state, error or "")."""
    for part in _TAG_SPLIT.split(text):
        if not part.strip():
            continue
        if _TAG_SPLIT.fullmatch(part):
            nxt = _TRANSITIONS.get((state, part))
            if nxt is None:
                return state, f"unexpected tag {part} in state {state}"
            state = nxt
        elif state not in _CONTENT_STATES:
            snippet = part.strip()[:40]
            return state, f"unexpected text {snippet!r} outside tags (state {state})"
    return state, ""


def check_sequence(response: str) -> FormatCheck:
    """Checks a whole response (search turns, observations and the final answer) against the grammar."""
    state, error = _walk(response_part(response), "start")
    if error:
        return FormatCheck(False, error)
    if state != "end":
        return FormatCheck(False, f"incomplete sequence, ended in state {state}")
    return FormatCheck(True, "")


def check_turn(text: str, kind: Literal["search", "answer"]) -> FormatCheck:
    """Checks one model turn: `<think>..</think>` then `<search>..</search>` or `<answer>..</answer>`."""
    state, error = _walk(text, "start")
    if error:
        return FormatCheck(False, error)
    if state != _TURN_ACCEPT[kind]:
        return FormatCheck(False, f"a {kind} turn ended in state {state}")
    return FormatCheck(True, "")


def _outside_information(text: str) -> str:
    """The response with retrieved passages removed, so tags quoted by a document are never parsed."""
    return tags.replace_blocks(response_part(text), tags.INFORMATION, " ")


def extract_answer(text: str) -> str | None:
    """The stripped content of the last `<answer>...</answer>` of the response, or None."""
    answers = tags.blocks(_outside_information(text), tags.ANSWER)
    return answers[-1] if answers else None


def extract_queries(text: str) -> list[str]:
    """The stripped contents of every `<search>...</search>` of the response, in order."""
    return tags.blocks(_outside_information(text), tags.SEARCH)


def information_blocks(text: str) -> list[str]:
    """The stripped contents of every `<information>...</information>` of the response, in order."""
    return tags.blocks(response_part(text), tags.INFORMATION)


def tool_or_answer(turn_text: str, turn_index: int, max_turns: int, tool: str, missing: str,
                   tool_disabled: str) -> Action:
    """The first `<tool>` or `<answer>` block of a turn as its action (kind: the tag). An answer ends the
    episode, and so does the turn after the last tool turn (`turn_index >= max_turns`), whatever it holds: a
    tool call there is invalid (`tool_disabled`), as is a turn with neither block (`missing`)."""
    last_turn = turn_index >= max_turns
    block = tags.first_block(turn_text, tool, tags.ANSWER)
    if block is None:
        return Action(INVALID, missing, done=last_turn)
    kind, content = block
    if kind == tool and last_turn:
        return Action(INVALID, tool_disabled, done=True)
    return Action(kind, content, done=kind == tags.ANSWER or last_turn)


def final_answer(turns: Sequence[Turn]) -> str:
    """The answer of a row's last turn ("" when it did not answer)."""
    last = turns[-1].action if turns else None
    return last.content if last is not None and last.kind == tags.ANSWER else ""
