"""The sandbox: what programs compute, the errors they get, and every limit, each with its exact message."""
import json
import time

import pytest

from searchrl.tasks.rpl.language import ProgramError
from searchrl.tasks.rpl.limits import Limits
from searchrl.tasks.rpl.sandbox import execute
from searchrl.tasks.rpl.sdk import RetrievalSDK
from tests.tasks.rpl.program_helpers import ids, run, variables

RETRIEVAL_PROGRAM = """
queries = ["cat", "dog"]
runs = [sparse_retrieval(q, top_k=3) for q in queries] + [dense_retrieval("cat", 2)]
fused = dedup(fuse(*runs, top_k=5))
best = rerank("cat", fused, top_k=2)
show(best)
show(fused[0])
"""


def test_retrieval_program():
    result = run(RETRIEVAL_PROGRAM)
    assert result.error is None
    # rrf_k = 1: the three rank-1 hits tie at 1/2 (first reached first), then the rank-2 hits at 1/3; the
    # fake reranker reverses its input.
    assert ids(result) == ["s:dog:1", "s:cat:1", "s:cat:0"]
    assert (result.retrieval_calls, result.docs_retrieved) == (4, 8)
    assert result.primitives == {"sparse_retrieval", "dense_retrieval", "fuse", "dedup", "rerank"}
    assert 0 < result.steps < 100 and 0 <= result.seconds < 1
    record = json.loads(json.dumps(result.to_dict()))
    assert record["shown"][0] == {"id": "s:dog:1", "score": 4.0, "title": "title 1", "text": "dog passage 1"}
    assert record["primitives"] == ["dedup", "dense_retrieval", "fuse", "rerank", "sparse_retrieval"]


@pytest.mark.parametrize("source, expected", [
    ("a = 7 // 2\nb = 7 % 3\nc = 7 / 2\nd = -3 + +2 * 4 - 1\ne = 0.5 * 4", dict(a=3, b=1, c=3.5, d=4, e=2.0)),
    ("s = 'ab' + 'c'\nt = s * 2\nu = t[1:4]\nv = t[-1]\nw = f'{s}-{1}-{2.5}-{None}-{True}'",
     dict(s="abc", t="abcabc", u="bca", v="c", w="abc-1-2.5-None-True")),
    ("x = [1, 2] + [3]\ny = 2 * x\nz = [*x, *'ab']\nn = len(y)\nm = y[::2]\nk = [0] * 3\nj = [1] * -1",
     dict(x=[1, 2, 3], y=[1, 2, 3] * 2, z=[1, 2, 3, "a", "b"], n=6, m=[1, 3, 2], k=[0, 0, 0], j=[])),
    ("t = (1, 'a') + (None,)\ns = {3, 1, 3}\nn = len(s)\ni = 1 in s\nl = sorted(s)\nu = set([2, 2, 5])",
     dict(t=(1, "a", None), s={1, 3}, n=2, i=True, l=[1, 3], u={2, 5})),
    ("a = 1 < 2 <= 2\nb = 1 < 2 > 3\nc = 'a' in 'cat'\nd = 3 not in [1, 2]\ne = None is None\n"
     "f = [1, [2]] == [1, [2]]\ng = 'b' > 'a' != 'c'",
     dict(a=True, b=False, c=True, d=True, e=True, f=True, g=True)),
    ("a = 0 or 'x'\nb = 1 and 0\nc = not []\nd = 5 if 0 else 6\ne = [] or [] or 7",
     dict(a="x", b=0, c=True, d=6, e=7)),
    ("a = [1]\nb = a\na += [2]", dict(a=[1, 2], b=[1])),  # += builds a new list: lists never change
    ("x, y = 'ab'[0], [1, 2]\n[p, q] = y\nr = (p, (q, y))\nu = r[1:] + (3,) * 2",
     dict(x="a", y=[1, 2], p=1, q=2, r=(1, (2, [1, 2])), u=((2, [1, 2]), 3, 3))),
    ("r = [range(3), range(1, 4), range(5, 0, -2), range(3, 1)]\n"
     "m = [min(3, 1, 2), max([4, 9]), max('ab')]\ns = sorted(['b', 'a', 'c'], reverse=True)",
     dict(r=[[0, 1, 2], [1, 2, 3], [5, 3, 1], []], m=[1, 9, "b"], s=["c", "b", "a"])),
])
def test_values(source, expected):
    assert {name: value for name, value in variables(source).items() if name in expected} == expected


def test_control_flow():
    source = """
total = 0
seen = []
for i in range(10):
    if i == 2:
        continue
    elif i > 6:
        break
    for j in [10, 20]:
        if j == 20:
            break
        total += i * j
    seen += [i]
for k, v in [(1, 'a'), (2, 'b')]:
    seen += [v]
"""
    assert variables(source) == {"total": 10 * (0 + 1 + 3 + 4 + 5 + 6), "seen": [0, 1, 3, 4, 5, 6, "a", "b"],
                                 "i": 7, "j": 20, "k": 2, "v": "b"}


def test_comprehensions_have_their_own_scope():
    source = """
i = "outer"
a = [i * 2 for i in range(3)]
b = [[i, j] for i in range(3) if i for j in range(i) if j != 1]
c = {x for x in "abca"}
d = max(len(w) for w in ["a", "abc"])
e = [[x for x in row] for row in [[1, 2], [3]]]
f = [i for i in [i]]
"""
    assert variables(source) == {"i": "outer", "a": [0, 2, 4], "b": [[1, 0], [2, 0]], "c": {"a", "b", "c"},
                                 "d": 3, "e": [[1, 2], [3]], "f": ["outer"]}
    assert run("x = [i for i in [1]]\ny = i").error == "name error: 'i' is not defined (line 2, column 5)"


@pytest.mark.parametrize("source, error", [
    ("x = y", "name error: 'y' is not defined (line 1, column 5)"),
    ("x = 1 + 'a'", "type error: unsupported operand types for +: int and str (line 1, column 5)"),
    ("x = '%s' % 1", "type error: unsupported operand types for %: str and int (line 1, column 5)"),
    ("x = -'a'", "type error: bad operand type for unary -: str (line 1, column 5)"),
    ("x = [1] < [[1]]",
     "type error: '<' not supported between instances of 'int' and 'list' (line 1, column 5)"),
    ("x = sorted(sparse_retrieval('q', 2))",
     "type error: '<' not supported between instances of 'Hit' and 'Hit' (line 1, column 5)"),
    ("x = sparse_retrieval('q', 1)[0][0]",
     "type error: 'Hit' object is not subscriptable (line 1, column 5)"),
    ("x = len(sparse_retrieval('q', 1)[0])",
     "type error: object of type 'Hit' has no len() (line 1, column 5)"),
    ("for x in 5:\n    pass", "type error: cannot loop over int (line 1, column 10)"),
    ("for x in {1, 2}:\n    pass",
     "type error: a set has no order to loop over; loop over sorted(...) of it (line 1, column 10)"),
    ("x = [*{1}]",
     "type error: a set has no order to loop over; loop over sorted(...) of it (line 1, column 6)"),
    ("x = {(1, 2)}",
     "type error: a set holds only None, bool, int, float, str and Hit values, not tuple (line 1, column 5)"),
    ("x = set([[1]])", "type error: unhashable type: 'list' (line 1, column 5)"),
    ("x = f'{[1]}'",
     "type error: f-strings format None, bool, int, float and str values, not list (line 1, column 5)"),
    ("a, b = 1", "type error: cannot unpack int into 2 names (line 1, column 1)"),
    ("a, b = [1, 2, 3]", "value error: cannot unpack 3 values into 2 names (line 1, column 1)"),
    ("x = 1 // 0", "value error: integer division or modulo by zero (line 1, column 5)"),
    ("x = min([])", "value error: min() arg is an empty sequence (line 1, column 5)"),  # on 3.12+ too
    ("x = max('')", "value error: max() arg is an empty sequence (line 1, column 5)"),
    ("x = 1\ny = [f'{x}', f'a{[x]}']",
     "type error: f-strings format None, bool, int, float and str values, not list (line 2, column 14)"),
    ("x = range(1, 5, 0)", "value error: range() arg 3 must not be zero (line 1, column 5)"),
    ("x = [1][::0]", "value error: slice step cannot be zero (line 1, column 5)"),
    ("x = 'abc'[5]", "index error: string index out of range (line 1, column 5)"),
    ("x = len(1, 2)", "type error: len() takes exactly one argument (2 given) (line 1, column 5)"),
    ("x = sparse_retrieval()",
     "type error: sparse_retrieval(): missing a required argument: 'q' (line 1, column 5)"),
    ("x = dedup([], [])", "type error: dedup(): too many positional arguments (line 1, column 5)"),
    ("show()", "type error: show() takes one argument, got 0 (line 1, column 1)"),
    ("show('doc')", "type error: show() takes a Hit or a list of Hits, not str (line 1, column 1)"),
    ("show([sparse_retrieval('q', 1)])",
     "type error: show() takes a Hit or a list of Hits, not a list holding list (line 1, column 1)"),
    ("x = sparse_retrieval(1)",
     "sdk error: sparse_retrieval: query must be a string, got int (line 1, column 5)"),
    ("x = sparse_retrieval('q', top_k=0)",
     "sdk error: sparse_retrieval: top_k must be a positive integer, got 0 (line 1, column 5)"),
    ("x = fuse([1])", "sdk error: fuse argument 0: item 0 is int, not Hit (line 1, column 5)"),
    ("x = rerank('q', ['doc'])", "sdk error: rerank: item 0 is str, not Hit (line 1, column 5)"),
    # Never the SDK's repr of the argument (a list of long strings would make a huge message).
    ("x = fuse(top_k=['y' * 9000] * 9000)",
     "sdk error: fuse: top_k must be a positive integer, got list (line 1, column 5)"),
])
def test_runtime_errors(source, error):
    assert run(source).error == error


def test_missing_backends_are_sdk_errors():
    result = execute("show(fuse(sparse_retrieval('q')))", RetrievalSDK())
    assert result.error == (
        "sdk error: sparse_retrieval: no sparse retriever is configured (line 1, column 11)")
    assert result.primitives == {"sparse_retrieval"} and result.retrieval_calls == 1


def test_hits_shown_before_an_error_are_kept():
    result = run("show(sparse_retrieval('a', 2))\nx = 1 / 0\nshow(sparse_retrieval('b', 2))")
    assert ids(result) == ["s:a:0", "s:a:1"]
    assert result.error == "value error: division by zero (line 2, column 5)"


@pytest.mark.parametrize("source, limits, error", [
    ("for i in range(100):\n    x = i", dict(max_steps=50),
     "step limit: the program ran more than 50 steps (line 2, column 9)"),
    # A call also costs one step per item of its list arguments.
    ("x = sorted(range(50))", dict(max_steps=50),
     "step limit: the program ran more than 50 steps (line 1, column 5)"),
    ("x = 3037000500 * 3037000500", {},
     "int limit: an integer beyond 9223372036854775807 in absolute value (line 1, column 5)"),
    ("x = -9223372036854775807 - 2", {},
     "int limit: an integer beyond 9223372036854775807 in absolute value (line 1, column 5)"),
    ("x = 2\nfor i in range(10):\n    x = x * x", {},
     "int limit: an integer beyond 9223372036854775807 in absolute value (line 3, column 9)"),
    ("x = 'ab' * 6", dict(max_str_len=10),
     "string limit: a string of 12 characters; at most 10 (line 1, column 5)"),
    ("s = 'abcdef'\nx = f'{s}{s}'", dict(max_str_len=10),
     "string limit: a string of 12 characters; at most 10 (line 2, column 5)"),
    ("s = 'abcdef'\nx = s + s", dict(max_str_len=10),
     "string limit: a string of 12 characters; at most 10 (line 2, column 5)"),
    ("x = [0] * 11", dict(max_items=10), "list limit: 11 values; at most 10 (line 1, column 5)"),
    ("a = [1, 2, 3]\nb = [a, a, a]", dict(max_items=10),
     "list limit: a list of 12 values (nested ones included); at most 10 (line 2, column 5)"),
    ("a = [1, 2, 3]\nb = [a] * 3", dict(max_items=10),
     "list limit: a list of 12 values (nested ones included); at most 10 (line 2, column 5)"),
    ("a = (1, 2, 3)\nb = (a, a) + (a,)", dict(max_items=10),
     "list limit: a tuple of 12 values (nested ones included); at most 10 (line 2, column 5)"),
    ("x = range(11)", dict(max_items=10), "list limit: a range of 11 values; at most 10 (line 1, column 5)"),
    ("x = [i for i in range(6) for j in range(2)]", dict(max_items=10),
     "list limit: more than 10 values (line 1, column 5)"),
    ("x = {*range(6), *range(6, 12)}", dict(max_items=10),
     "list limit: more than 10 values (line 1, column 5)"),
    ("x = (0,) * 11", dict(max_items=10), "list limit: 11 values; at most 10 (line 1, column 5)"),
    ("a = []\nfor i in range(20):\n    a = [a]", {},
     "nesting limit: lists and tuples nested 11 deep; at most 10 (line 3, column 9)"),
    ("a = ()\nfor i in range(20):\n    a = (a,)", {},
     "nesting limit: lists and tuples nested 11 deep; at most 10 (line 3, column 9)"),
    ("s = 'x' * 1000\nx = [s + 'y' for i in range(20)]", dict(max_alloc=10_000),
     "memory limit: the program built more than 10000 items and characters in all (line 2, column 6)"),
    ("for i in range(20):\n    x = sparse_retrieval('q', 1)", {},
     "retrieval limit: at most 16 calls of sparse_retrieval, dense_retrieval and rerank (line 2, column 9)"),
    ("x = sparse_retrieval('q', 600)\ny = dense_retrieval('q', 500)", {},
     "docs limit: top_k=500 after 600 docs retrieved; at most 1000 in all (line 2, column 5)"),
    ("x = sparse_retrieval('q', 10**3 + 1)", {}, "forbidden syntax: the ** operator (line 1, column 27)"),
    ("d = sparse_retrieval('q', 60)\nx = rerank('q', d + d)", {},
     "docs limit: rerank scores at most 100 docs, got 120 (line 2, column 5)"),
    ("show(sparse_retrieval('q', 8))\nshow(dense_retrieval('q', 3))", {},
     "show limit: at most 10 hits can be shown; 8 were, this call adds 3 (line 2, column 1)"),
])
def test_limits(source, limits, error):
    assert run(source, **limits).error == error


def test_limit_counters():
    result = run("for i in range(20):\n    show(sparse_retrieval(f'{i}', 1))", max_shown=100)
    assert result.retrieval_calls == 16 and result.docs_retrieved == 16 and len(result.shown) == 16
    result = run("x = sparse_retrieval('q', 600)\ny = dense_retrieval('q', 500)")
    assert result.docs_retrieved == 600 and result.primitives == {"sparse_retrieval"}


def test_time_limit():
    start = time.monotonic()
    result = run("for i in range(10000):\n    for j in range(10000):\n        pass", max_steps=10**12,
                 max_seconds=0.05)
    assert result.error.startswith("time limit: the program ran longer than 0.05 s (line ")
    assert time.monotonic() - start < 1


def test_backend_failures_are_not_program_errors():
    class Down:
        def search(self, queries, k):
            raise ConnectionError("retrieval server is down")

    with pytest.raises(ConnectionError):
        execute("x = sparse_retrieval('q')", RetrievalSDK(sparse=Down()))


def test_program_error_fields():
    error = ProgramError("step limit", "the program ran more than 5 steps", 3, 7)
    assert (error.rule, error.line, error.column) == ("step limit", 3, 7)
    assert str(error) == "step limit: the program ran more than 5 steps (line 3, column 7)"
    assert Limits().max_steps == 100_000
