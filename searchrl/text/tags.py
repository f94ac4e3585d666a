"""The tag grammar of every task's text, in one place: `<think>`, `<search>`, `<information>`, `<answer>`
(Search-R1, AutoSearch, DeepRetrieval), `<program>` (Retrieval Program Learning).

A block is `<tag>content</tag>`. Environments parse their actions with `first_block` and format what they show
with `block`; the protocol checks (`rewards.protocol`) split text with `tag_pattern`.
"""
from __future__ import annotations

import re

THINK, SEARCH, INFORMATION, ANSWER, PROGRAM = "think", "search", "information", "answer", "program"


def tag_pattern(*tags: str) -> re.Pattern:
    """Matches any opening or closing tag of `tags`, as one group (for `re.split`)."""
    return re.compile(r"(</?(?:" + "|".join(map(re.escape, tags)) + r")>)")


def open_tag(tag: str) -> str:
    return f"<{tag}>"


def close_tag(tag: str) -> str:
    return f"</{tag}>"


def block(tag: str, content: str) -> str:
    """`<tag>content</tag>`."""
    return f"{open_tag(tag)}{content}{close_tag(tag)}"


def block_pattern(*tags: str) -> re.Pattern:
    """Matches a whole block of any of `tags`: group 1 is the tag, group 2 the content (non-greedy)."""
    return re.compile(r"<(" + "|".join(map(re.escape, tags)) + r")>(.*?)</\1>", re.DOTALL)


def first_block(text: str, *tags: str) -> tuple[str, str] | None:
    """(tag, stripped content) of the first complete block of any of `tags` in `text`, or None."""
    match = block_pattern(*tags).search(text)
    return None if match is None else (match.group(1), match.group(2).strip())


def blocks(text: str, tag: str) -> list[str]:
    """The stripped contents of every `<tag>` block of `text`, in order."""
    return [content.strip() for _, content in block_pattern(tag).findall(text)]


def until_close(text: str, tag: str) -> str:
    """The stripped text before the first `</tag>` (all of it when there is none): the content of a block
    whose opening tag was a prompt's last words."""
    return text.split(close_tag(tag))[0].strip()
