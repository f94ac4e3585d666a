"""The tag grammar: blocks found with string searches, as the non-greedy pattern would, in linear time."""
import re
import time

import pytest
from hypothesis import given, settings, strategies as st

from searchrl.text import tags

MB = 1_000_000


def reference_pattern(*names: str) -> re.Pattern:
    """The pattern the string searches replace (quadratic on many opening tags and no closing one)."""
    return re.compile(r"<(" + "|".join(map(re.escape, names)) + r")>(.*?)</\1>", re.DOTALL)


# Texts made of tag fragments, so that blocks, unclosed and stray tags are common.
tag_texts = st.lists(st.sampled_from(["<answer>", "</answer>", "<search>", "</search>", "<a>", "</a>",
                                      "<answer", "x", " ", "\n", "<", ">", "/"]), max_size=30).map("".join)


def test_block_helpers():
    text = "<think>a</think> <answer> Paris </answer><answer>x"
    assert tags.block(tags.ANSWER, "x") == "<answer>x</answer>"
    assert tags.find_block(text, tags.ANSWER) == tags.Span(17, 25, 32, 41)
    assert tags.first_block(text, tags.SEARCH, tags.ANSWER) == ("answer", "Paris")
    assert tags.first_block(text, tags.THINK, tags.ANSWER) == ("think", "a")
    assert tags.first_block(text, tags.SEARCH) is None
    assert tags.blocks("<a>1</a><a><a>2</a></a>", "a") == ["1", "<a>2"]
    assert tags.replace_blocks("x<a>1</a>y<a>2", "a", "-") == "x-y<a>2"
    assert tags.until_close(" Paris </answer> junk </answer>", tags.ANSWER) == "Paris"


@settings(max_examples=300, deadline=None)
@given(tag_texts)
def test_string_searches_match_the_non_greedy_pattern(text):
    for names in (("answer",), ("search", "answer"), ("a", "answer")):
        match = reference_pattern(*names).search(text)
        assert tags.first_block(text, *names) == (None if match is None else (match[1], match[2].strip()))
    one = reference_pattern("answer")
    assert tags.blocks(text, "answer") == [content.strip() for _, content in one.findall(text)]
    assert tags.replace_blocks(text, "answer", " ") == one.sub(" ", text)


@pytest.mark.parametrize("text", [
    "<answer>" * (MB // 8),  # many opening tags, no closing one: quadratic for the pattern
    "<search><answer>" * (MB // 16) + "</answer>",
    "<answer></search>" * (MB // 17),
    "<answer>x</answer>" * (MB // 18),
    "<" * MB,
])
def test_blocks_take_linear_time(text):
    start = time.perf_counter()
    tags.first_block(text, tags.SEARCH, tags.ANSWER)
    tags.blocks(text, tags.ANSWER)
    tags.replace_blocks(text, tags.ANSWER, " ")
    tags.until_close(text, tags.ANSWER)
    assert time.perf_counter() - start < 1.0
