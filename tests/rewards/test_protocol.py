"""The search-QA tag grammar, answer and query extraction."""
import re
import time

import pytest
from hypothesis import given, settings, strategies as st

from searchrl.text import protocol

PROMPT = ("<|im_start|>user\nAnswer the given question. ... For example, <answer> Beijing </answer>. "
          "Question: capital of France?\n<|im_end|>\n<|im_start|>assistant\n")
MULTI_TURN = ("<think>I need to search.</think>\n<search>capital of France</search>\n"
              "<information>Doc 1(Title: Paris) Paris is the capital.</information>\n"
              "<think>Found it.</think>\n<answer> Paris </answer>")


@pytest.mark.parametrize("response", [
    MULTI_TURN,
    "<think>easy</think><answer>Paris</answer>",
    PROMPT + MULTI_TURN + "<|im_end|><|endoftext|><|endoftext|>",
    "<|start_header_id|>assistant<|end_header_id|>\n\n<think>a</think>\n<answer>b</answer><|eot_id|>",
    "<think>a</think><search>q1</search><information>d</information>"
    "<think>b</think><search>q2</search><information>d</information><think>c</think><answer>x</answer>",
])
def test_valid_sequences(response):
    assert protocol.check_sequence(response) == (True, "")


@pytest.mark.parametrize("response, reason", [
    ("<search>q</search><information>d</information><think>a</think><answer>x</answer>",
     "unexpected tag <search> in state start"),
    # Search-R1 requires a <think> after new information, before the next search or answer.
    ("<think>a</think><search>q</search><information>d</information><answer>x</answer>",
     "unexpected tag <answer> in state after_information"),
    ("<think>a</think> so <answer>x</answer>", "unexpected text 'so' outside tags (state after_think)"),
    ("<think>a</think><answer>x</answer> done", "unexpected text 'done' outside tags (state end)"),
    ("<think>a<answer>x</answer>", "unexpected tag <answer> in state in_think"),
    ("<think><think>a</think></think><answer>x</answer>", "unexpected tag <think> in state in_think"),
    ("<think>a</think><answer>x</answer><answer>y</answer>", "unexpected tag <answer> in state end"),
    ("<think>a</think><search>q</search>", "incomplete sequence, ended in state after_search"),
    ("", "incomplete sequence, ended in state start"),
    ("plain text", "unexpected text 'plain text' outside tags (state start)"),
])
def test_invalid_sequences(response, reason):
    assert protocol.check_sequence(response) == (False, reason)


def test_prompt_example_answer_is_ignored():
    assert protocol.extract_answer(PROMPT + MULTI_TURN) == "Paris"
    assert protocol.extract_answer(PROMPT + "<think>no idea</think>") is None
    # The prompt alone, with no assistant turn, is all response: its example answer is found.
    assert protocol.extract_answer("<answer> Beijing </answer>") == "Beijing"


def test_extract_answer_takes_the_last_answer_outside_information():
    text = ("<think>a</think><answer>first</answer><think>b</think>"
            "<information>quoted <answer>fake</answer> <search>fake</search></information>"
            "<answer>\n second \n</answer>")
    assert protocol.extract_answer(text) == "second"
    assert protocol.extract_queries(text) == []


def test_extract_queries_and_information():
    text = ("<think>a</think><search> q one </search><information> d1 </information>"
            "<think>b</think><search>q two</search><information>d2</information>")
    assert protocol.extract_queries(PROMPT + text) == ["q one", "q two"]
    assert protocol.information_blocks(text) == ["d1", "d2"]


@pytest.mark.parametrize("text, kind, ok", [
    ("<think>a</think>\n<search>q</search>", "search", True),
    ("<think>a</think><answer>x</answer>", "answer", True),
    ("<think>a</think><answer>x</answer>", "search", False),
    ("<think>a</think><search>q</search>", "answer", False),
    ("<think>a</think>", "search", False),
    ("<think>a</think><search>q</search> trailing", "search", False),
    ("<search>q</search>", "search", False),
])
def test_check_turn(text, kind, ok):
    assert protocol.check_turn(text, kind).ok is ok


# The pattern response_part used to strip with (quadratic: 40,000 spaces and a letter took 21 s).
OLD_TRAILING = re.compile(r"(?:\s|<\|im_end\|>|<\|eot_id\|>|<\|endoftext\|>|<\|end_of_text\|>)+\Z")


@pytest.mark.parametrize("text, expected", [
    ("<answer>x</answer><|im_end|>\n<|endoftext|> <|endoftext|>", "<answer>x</answer>"),
    ("a <|eot_id|>\n<|end_of_text|>", "a"),
    ("a<|im_end|>b<|im_end|>", "a<|im_end|>b"),
    ("a<|im_end|", "a<|im_end|"),
    (" <|im_end|> ", ""),
])
def test_response_part_strips_trailing_end_tokens(text, expected):
    assert protocol.response_part(text) == expected


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|end_of_text|>", "<|im_end",
                                 "|>", "text", " ", "\n", "\u3000", "x"]), max_size=12).map("".join))
def test_response_part_strips_as_the_old_pattern(text):
    assert protocol.response_part(text) == OLD_TRAILING.sub("", text)


MB = 1_000_000


@pytest.mark.parametrize("text", [
    " " * MB + "x",
    "\n" * MB,
    "<|im_end|>" * (MB // 10) + "x",
    "<|im_end|" * (MB // 9),
    "<think>" * (MB // 7),
    "<information>" * (MB // 13) + "</answer>",
    "<answer>" * (MB // 8) + "<|im_end|>" * 10,
    "<" * MB,
    "<|im_start|>assistant" * (MB // 21),
])
def test_protocol_parsers_take_linear_time(text):
    start = time.perf_counter()
    protocol.check_sequence(text)
    protocol.check_turn(text, "search")
    protocol.extract_answer(text)
    protocol.extract_queries(text)
    protocol.information_blocks(text)
    assert time.perf_counter() - start < 1.0
