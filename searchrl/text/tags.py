"""The tag grammar of every task's text, in one place: `<think>`, `<search>`, `<information>`, `<answer>`
(Search-R1, AutoSearch, DeepRetrieval), `<program>` (Retrieval Program Learning).

A block is `<tag>content</tag>`. Environments parse their actions with `first_block` and format what they show
with `block`; the protocol checks (`rewards.protocol`) split text with `tag_pattern`.

Blocks are found with string searches, not a backtracking pattern: model text is arbitrary, and a pattern
like `<(tag)>(.*?)</\\1>` is quadratic on text with many opening tags and no closing one. Every parser here
runs in linear time.
"""
from __future__ import annotations

import re
from typing import Iterator, NamedTuple

THINK, SEARCH, INFORMATION, ANSWER, PROGRAM = "think", "search", "information", "answer", "program"


class Span(NamedTuple):
    """Where a block lies in a text: `text[start:end]` is the block, `text[inner_start:inner_end]` its
    content."""

    start: int
    inner_start: int
    inner_end: int
    end: int


def tag_pattern(*tags: str) -> re.Pattern:
    """Matches any opening or closing tag of `tags`, as one group (for `re.split`); linear time, as every
    match has a fixed length."""
    return re.compile(r"(</?(?:" + "|".join(map(re.escape, tags)) + r")>)")


def open_tag(tag: str) -> str:
    return f"<{tag}>"


def close_tag(tag: str) -> str:
    return f"</{tag}>"


def block(tag: str, content: str) -> str:
    """`<tag>content</tag>`."""
    return f"{open_tag(tag)}{content}{close_tag(tag)}"


def find_block(text: str, tag: str, pos: int = 0) -> Span | None:
    """The first complete `<tag>` block of `text` at or after `pos`: its first opening tag and the first
    closing tag after it (a non-greedy match). None when there is none."""
    start = text.find(open_tag(tag), pos)
    if start < 0:
        return None
    inner_start = start + len(open_tag(tag))
    inner_end = text.find(close_tag(tag), inner_start)
    # No closing tag after the first opening one: none after any later opening one either.
    return None if inner_end < 0 else Span(start, inner_start, inner_end, inner_end + len(close_tag(tag)))


def block_spans(text: str, tag: str) -> Iterator[Span]:
    """Every complete `<tag>` block of `text`, in order, without overlaps (as `re.finditer` would)."""
    span = find_block(text, tag)
    while span is not None:
        yield span
        span = find_block(text, tag, span.end)


def first_block(text: str, *tags: str) -> tuple[str, str] | None:
    """(tag, stripped content) of the first complete block of any of `tags` in `text`, or None."""
    found = [(span, tag) for tag in tags if (span := find_block(text, tag)) is not None]
    if not found:
        return None
    span, tag = min(found)
    return tag, text[span.inner_start:span.inner_end].strip()


def blocks(text: str, tag: str) -> list[str]:
    """The stripped contents of every `<tag>` block of `text`, in order."""
    return [text[s.inner_start:s.inner_end].strip() for s in block_spans(text, tag)]


def replace_blocks(text: str, tag: str, replacement: str) -> str:
    """`text` with every complete `<tag>` block replaced by `replacement`."""
    parts, pos = [], 0
    for span in block_spans(text, tag):
        parts += [text[pos:span.start], replacement]
        pos = span.end
    return "".join(parts) + text[pos:]


def until_close(text: str, tag: str) -> str:
    """The stripped text before the first `</tag>` (all of it when there is none): the content of a block
    whose opening tag was a prompt's last words."""
    return text.split(close_tag(tag), 1)[0].strip()
