"""The language's allow-list: what parses and passes the checks, and the rule and position named for what
does not."""
import ast
import concurrent.futures

import pytest

from searchrl.tasks.rpl import language
from searchrl.tasks.rpl.language import FUNCTIONS
from searchrl.tasks.rpl.limits import Limits
from searchrl.tasks.rpl.sandbox import execute
from searchrl.tasks.rpl.sdk import SDK_FUNCTIONS
from tests.tasks.rpl.program_helpers import SDK, run

EVERY_ALLOWED_CONSTRUCT = """
queries = ["cat", 'dog']
a, b = queries
[c, d] = (1, 2.5)
x = y = None
n = 0
n += 1
n -= -1
n *= +3
n //= 2
n %= 5
n /= 2
t = (1, "a", True, None)
s = {1, 2}
for q in queries:
    if q == "cat" and n > 0 or not s:
        continue
    elif q in ["dog"] and q is not None:
        pass
    else:
        break
docs = [sparse_retrieval(q, top_k=2) for q in queries if len(q) == 3]
fused = dedup(fuse(*docs, top_k=3))
best = rerank("cat", fused[:2], top_k=1) + dense_retrieval(f"{a} {n}", 1)
show(best)
m = max(len(q) for q in queries) if queries else min(1, 2)
evens = {i for i in range(0, 10, 2)}
pairs = [[i, j] for i in range(3) for j in sorted(evens, reverse=True) if i < j <= 4]
first = pairs[0][1:]
label = "n=" + f"{n}" * 2
"""


def test_every_allowed_construct_runs():
    result = run(EVERY_ALLOWED_CONSTRUCT)
    assert result.error is None
    assert [hit.id for hit in result.shown] == ["s:dog:0", "d:cat 1.5:0"]  # rerank reverses; n ends at 1.5


def test_functions_cover_the_sdk():
    assert set(SDK_FUNCTIONS) <= set(FUNCTIONS)
    assert set(FUNCTIONS) - set(SDK_FUNCTIONS) == {"len", "range", "sorted", "min", "max", "set", "show"}


@pytest.mark.parametrize("source, error", [
    # Syntax errors keep Python's message and position.
    ("x = (", "syntax error: '(' was never closed (line 1, column 5)"),
    ("x = 1 +", "syntax error: invalid syntax (line 1, column 8)"),
    ("x = 1\0", "syntax error: the program contains a NUL character (line 1, column 6)"),
    ("x = 1\ny = \0", "syntax error: the program contains a NUL character (line 2, column 5)"),
    ("break", "syntax error: 'break' outside a loop (line 1, column 1)"),
    ("if 1:\n    continue", "syntax error: 'continue' outside a loop (line 2, column 5)"),
    # Forbidden syntax.
    ("import os", "forbidden syntax: imports (line 1, column 1)"),
    ("from os import path", "forbidden syntax: imports (line 1, column 1)"),
    ("x = 1\ny = x.real", "forbidden syntax: attribute access (line 2, column 5)"),
    ("def f():\n    return 1", "forbidden syntax: function definitions (line 1, column 1)"),
    ("f = lambda: 1", "forbidden syntax: lambdas (line 1, column 5)"),
    ("class A:\n    pass", "forbidden syntax: class definitions (line 1, column 1)"),
    ("while True:\n    pass", "forbidden syntax: while loops (line 1, column 1)"),
    ("try:\n    x = 1\nexcept Exception:\n    pass", "forbidden syntax: try statements (line 1, column 1)"),
    ("with x:\n    pass", "forbidden syntax: with statements (line 1, column 1)"),
    ("x = {'a': 1}", "forbidden syntax: dicts (line 1, column 5)"),
    ("x = {k: 1 for k in [1]}", "forbidden syntax: dicts (line 1, column 5)"),
    ("if (n := 3) > 1:\n    pass", "forbidden syntax: assignment expressions (:=) (line 1, column 5)"),
    ("x = 1\ndel x", "forbidden syntax: del statements (line 2, column 1)"),
    ("x = (yield)", "forbidden syntax: yield (line 1, column 6)"),
    ("global x", "forbidden syntax: global statements (line 1, column 1)"),
    ("raise 1", "forbidden syntax: raise statements (line 1, column 1)"),
    ("match x:\n    case 1:\n        pass", "forbidden syntax: match statements (line 1, column 1)"),
    ("x: int = 1", "forbidden syntax: annotated assignment (line 1, column 1)"),
    ("x = 2 ** 8", "forbidden syntax: the ** operator (line 1, column 5)"),
    ("x = 1 << 40", "forbidden syntax: the << operator (line 1, column 5)"),
    ("x = 6 & 3", "forbidden syntax: the & operator (line 1, column 5)"),
    ("x = ~1", "forbidden syntax: the ~ operator (line 1, column 5)"),
    ("x = 1\nx **= 2", "forbidden syntax: the ** operator (line 2, column 1)"),
    ("x = b'abc'", "forbidden syntax: bytes literals (line 1, column 5)"),
    ("x = 1j", "forbidden syntax: complex literals (line 1, column 5)"),
    ("x = ...", "forbidden syntax: ellipsis literals (line 1, column 5)"),
    ("for x in [1]:\n    pass\nelse:\n    pass", "forbidden syntax: for ... else (line 1, column 1)"),
    ("x = [1]\nx[0] = 2", "forbidden syntax: assignment to an item or slice (line 2, column 1)"),
    ("x = [1]\nx[0] += 1",
     "forbidden syntax: augmented assignment to anything but a name (line 2, column 1)"),
    ("a, *b = [1, 2]", "forbidden syntax: unpacking into anything but names (line 1, column 4)"),
    ("x = [i async for i in y]", "forbidden syntax: async comprehensions (line 1, column 5)"),
    ("x = 1\ny = f'{x!r}'", "forbidden syntax: f-string conversions (!r, !s, !a) (line 2, column 5)"),
    ("x = 1\ny = f'{x:>10}'", "forbidden syntax: f-string format specs (line 2, column 5)"),
    ("x = 1\ny = [f'a{x}', f'b{x:>3}']", "forbidden syntax: f-string format specs (line 2, column 15)"),
    ("x = [1][0](1)", "forbidden syntax: calling anything but a function, by name (line 1, column 5)"),
    ("sorted([1], key=len)", "forbidden syntax: sorted() has no keyword argument 'key' (line 1, column 13)"),
    ("sparse_retrieval(**{'q': 'x'})", "forbidden syntax: ** arguments (line 1, column 20)"),
    # Names.
    ("__x = 1", "forbidden name: '__x': names may not start with '__' (line 1, column 1)"),
    ("x = __builtins__", "forbidden name: '__builtins__': names may not start with '__' (line 1, column 5)"),
    ("len = 1", "forbidden name: cannot assign to the function 'len' (line 1, column 1)"),
    ("for show in [1]:\n    pass", "forbidden name: cannot assign to the function 'show' (line 1, column 5)"),
    ("x = [fuse for x in [1]]", "forbidden name: the function 'fuse' can only be called (line 1, column 6)"),
    ("x = [len][0](1)", "forbidden name: the function 'len' can only be called (line 1, column 6)"),
    ("print(1)", "unknown function: 'print' is not a function of this language (line 1, column 1)"),
    ("x = eval('1')", "unknown function: 'eval' is not a function of this language (line 1, column 5)"),
    ("x = 1\ny = getattr(x, 'real')", "unknown function: 'getattr' is not a function of this language "
                                      "(line 2, column 5)"),
    # Parse-time limits.
    ("x = 9223372036854775808", "int limit: integers are at most 9223372036854775807 in absolute value "
                                "(line 1, column 5)"),
    ("x = " + "[" * 60 + "]" * 60,
     "nesting limit: the program nests more than 50 levels deep (line 1, column 54)"),
    ("x = [1 " + "for a in [1] " * 60 + "]", "nesting limit: the program nests more than 50 levels deep "
                                            "(line 1, column 6)"),
])
def test_rules_and_positions(source, error):
    assert run(source).error == error


@pytest.mark.parametrize("source", ["x = " + "-" * 19_000 + "1", "x = 1" + " + 1" * 4_000])
def test_nesting_past_the_parser_is_a_nesting_limit(source):
    """Python's parser gives up on both (3.11, 3.12); 3.13's parses the long sum, which the depth check then
    refuses."""
    try:
        ast.parse(source)
    except (RecursionError, MemoryError):
        expected = "nesting limit: the program is nested too deeply to parse (line 1, column 1)"
        assert run(source).error == expected
    else:
        assert run(source).error.startswith("nesting limit: the program nests more than 50 levels deep")


def test_positions_count_characters_and_every_newline_style():
    assert run("q = 'héllo'; x = y.z").error == "forbidden syntax: attribute access (line 1, column 18)"
    assert run("x = 1\r\ny = 2\rz = q.r").error == "forbidden syntax: attribute access (line 3, column 5)"


def test_source_and_literal_limits():
    assert run("x = 1\ny = 2\n", max_source_chars=10).error == (
        "source limit: the program is longer than 10 characters (line 2, column 5)")
    assert run("x = 'abcdef'", max_str_len=5).error == (
        "string limit: strings are at most 5 characters (line 1, column 5)")
    assert run("x = [[[1]]]", max_depth=4).error == (
        "nesting limit: the program nests more than 4 levels deep (line 1, column 8)")
    assert run("x = " + "1" * 5_000).error.startswith("syntax error: Exceeds the limit (4300 digits)")


def test_anything_that_is_not_text_is_an_error():
    assert execute(b"x = 1", SDK).error == "syntax error: a program is text, got bytes (line 1, column 1)"
    assert execute(None, SDK, Limits()).error == (
        "syntax error: a program is text, got NoneType (line 1, column 1)")
    assert run("x = '\ud800'").error.startswith(
        "syntax error: 'utf-8' codec can't encode character '\\ud800'")


def test_programs_parse_one_at_a_time(monkeypatch):
    """The env workers check programs on several threads; ast.parse runs under a lock, as CPython 3.11's is
    not safe to run in two threads at once (`language._PARSING`)."""
    held = []

    def parse(*args, **kwargs):  # ast.parse itself: the module is shared (pytest's reports parse too)
        held.append(language._PARSING.locked())
        return ast_parse(*args, **kwargs)

    ast_parse = ast.parse
    monkeypatch.setattr(language.ast, "parse", parse)
    sources = [f"show(sparse_retrieval('q{i}', top_k={i + 1}))" for i in range(64)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        programs = list(pool.map(lambda s: language.parse(s, Limits()), sources))
    assert len(programs) == 64 and len(held) >= 64 and all(held[:64])
