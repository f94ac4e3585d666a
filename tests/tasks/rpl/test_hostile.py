"""Hostile programs: escapes, resource bombs, endless work and parser abuse all end in an error that names
the rule or limit, quickly, inside the host process."""
import inspect
import sys
import time

import pytest

from searchrl.tasks.rpl.limits import Limits
from searchrl.tasks.rpl.sandbox import execute
from tests.tasks.rpl.program_helpers import SDK, check_result, run, variables

NESTED_IFS = "".join(" " * i + "if 1:\n" for i in range(60)) + " " * 60 + "x = 1\n"
HOSTILE = {
    # Escapes through the interpreter's own objects.
    "class walk": ("x = ().__class__.__bases__[0].__subclasses__()", "forbidden syntax: attribute access"),
    "class walk in a comprehension": (
        "x = [c for c in [].__class__.__mro__[-1].__subclasses__() if c.__name__ == 'Popen']",
        "forbidden syntax: attribute access"),
    "getattr by string": ("x = getattr((), '__cla' + 'ss__')", "unknown function: 'getattr'"),
    "builtins by name": ("x = __builtins__", "forbidden name: '__builtins__'"),
    "import call": ("x = __import__('os')", "unknown function: '__import__'"),
    "import statement": ("import os\nos.system('true')", "forbidden syntax: imports"),
    "eval": ("eval('1 + 1')", "unknown function: 'eval'"),
    "exec": ("exec('import os')", "unknown function: 'exec'"),
    "compile": ("compile('1', 'f', 'eval')", "unknown function: 'compile'"),
    "open": ("x = open('/etc/passwd')", "unknown function: 'open'"),
    "globals": ("x = globals()", "unknown function: 'globals'"),
    "type": ("x = type(1)", "unknown function: 'type'"),
    "nfkc lookalike of eval": ("x = ｅｖａｌ('1')", "unknown function: 'eval'"),
    "function as a value": ("f = sorted\nx = f([2, 1])", "forbidden name: the function 'sorted'"),
    "rebinding a function": ("show = print", "forbidden name: cannot assign to the function 'show'"),
    "lambda": ("x = (lambda: 1)()", "forbidden syntax: lambdas"),
    "decorator": ("@eval\ndef f():\n    pass", "forbidden syntax: function definitions"),
    "try to swallow errors": ("try:\n    x = 1\nexcept:\n    pass", "forbidden syntax: try statements"),
    "walrus": ("x = [(y := 1)]", "forbidden syntax: assignment expressions"),
    # Format-string tricks.
    "f-string attribute": ("x = f'{().__class__}'", "forbidden syntax: attribute access"),
    "f-string conversion": ("x = 1\ny = f'{x!r}'", "forbidden syntax: f-string conversions"),
    "f-string spec width bomb": ("x = 1\ny = f'{x:>1000000000}'", "forbidden syntax: f-string format specs"),
    "f-string nested spec": ("x = 1\ny = f'{x:{x}}'", "forbidden syntax: f-string format specs"),
    "str.format": ("x = '{0.__class__}'.format(1)", "forbidden syntax: attribute access"),
    "%-formatting": ("x = '%s' % 1", "type error: unsupported operand types for %: str and int"),
    "%-formatting a dict": ("x = '%(a)s' % {'a': 1}", "forbidden syntax: dicts"),
    "f-string of a huge string": ("s = 'x' * 6000\nt = f'{s}{s}'", "string limit"),
    # Huge ranges, repetitions and numbers.
    "huge range": ("for i in range(1000000000000):\n    pass", "list limit: a range of 1000000000000 values"),
    "huge range past sys.maxsize": ("x = range(-9223372036854775807, 9223372036854775807)",
                                    "list limit: a range of 18446744073709551614 values"),
    "string repetition": ("x = 'x' * 1000000000", "string limit: a string of 1000000000 characters"),
    "negative-free repetition": ("x = 1000000000 * 'x'", "string limit: a string of 1000000000 characters"),
    "list repetition": ("x = [0] * 1000000000", "list limit: 1000000000 values"),
    "nested repetition": ("x = [[0] * 10000] * 10000", "list limit: a list of 10001 values"),
    "power": ("x = 9 ** 9 ** 9", "forbidden syntax: the ** operator"),
    "shift": ("x = 1 << 100000000", "forbidden syntax: the << operator"),
    "squaring loop": ("x = 3\nfor i in range(100):\n    x = x * x", "int limit"),
    "huge literal": ("x = " + "9" * 4000, "int limit"),
    # Deep nesting and recursion.
    "deep list display": ("x = " + "[" * 99 + "]" * 99, "nesting limit: the program nests more than 50"),
    "deep unary chain": ("x = " + "-" * 15000 + "1", "nesting limit"),
    "long operator chain": ("x = 1" + " + 1" * 3000, "nesting limit"),
    "too many parentheses": ("x = " + "(" * 300 + "1" + ")" * 300,
                             "syntax error: too many nested parentheses"),
    "deep blocks": (NESTED_IFS, "nesting limit: the program nests more than 50"),
    "many comprehension clauses": ("x = [1 " + "for a in [1] " * 100 + "]", "nesting limit"),
    "recursion": ("def f():\n    return f()\nf()", "forbidden syntax: function definitions"),
    "y combinator": ("x = (lambda f: f(f))(lambda f: f(f))", "forbidden syntax: lambdas"),
    "self-nesting list": ("a = []\nfor i in range(1000):\n    a = [a, a]",
                          "nesting limit: lists and tuples nested 11"),
    # Memory bombs.
    "doubling list": ("a = ['x' * 10000]\nfor i in range(64):\n    a = a + a", "list limit"),
    "fresh strings": ("s = 'x' * 9000\nb = [s + 'y' for i in range(10000)]", "memory limit"),
    "fresh lists": ("a = list_ = [0] * 9000\nb = [a[1:] for i in range(10000)]", "memory limit"),
    "starred blow-up": ("a = [0] * 10000\nx = [*a, *a]", "list limit: more than 10000 values"),
    "starred arguments": ("a = [0] * 10000\nx = max(*a, *a)", "list limit: more than 10000 values"),
    "slices of a long string": ("s = 'x' * 10000\nb = [s[i:] for i in range(10000)]", "memory limit"),
    # Endless work.
    "while": ("while True:\n    pass", "forbidden syntax: while loops"),
    "nested loops": ("for i in range(10000):\n    for j in range(10000):\n        pass", "step limit"),
    "sorting in a loop": ("a = sorted(range(10000))\nfor i in range(10000):\n    b = sorted(a)",
                          "step limit"),
    "comparing big values": ("a = [[0] * 99] * 100\nb = [[0] * 99] * 100\n"
                             "for i in range(10000):\n    c = a == b", "step limit"),
    # Retrieval abuse.
    "retrieval in a loop": ("for i in range(1000):\n    x = sparse_retrieval('q', 1)", "retrieval limit"),
    "one huge retrieval": ("x = dense_retrieval('q', top_k=1000000000)", "docs limit: top_k=1000000000"),
    "huge rerank": ("d = sparse_retrieval('q', 100)\nx = rerank('q', d * 3)",
                    "docs limit: rerank scores at most"),
    "fuse of many lists": ("d = sparse_retrieval('q', 100)\nx = fuse(*[d] * 200)", "list limit"),
    "showing everything": ("show(sparse_retrieval('q', 100))", "show limit"),
    "repr bomb through the SDK": ("x = sparse_retrieval('q', ['y' * 10000] * 10000)",
                                  "sdk error: sparse_retrieval: top_k must be a positive integer, got list"),
    # Bytes the parser must survive.
    "NUL": ("x = 1\0", "syntax error: the program contains a NUL character"),
    "lone surrogate": ("x = '\ud800'", "syntax error: 'utf-8' codec can't encode"),
    "huge program": ("x = 1\n" * 1_000_000, "source limit"),
    "binary noise": (bytes(range(256)).decode("latin-1") * 10, "syntax error"),
}


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_program(name):
    source, error = HOSTILE[name]
    start = time.monotonic()
    result = run(source)
    check_result(result, Limits())
    assert result.error.startswith(error), result.error
    assert time.monotonic() - start < 3


def test_programs_hold_only_program_values():
    # Whatever a program computes, its variables hold only the language's values.
    program = """
docs = sparse_retrieval("q", 3)
values = [None, True, 1, 2.5, "s", (1, [2]), {3}, docs, docs[0], [i for i in range(3)], sorted({"b", "a"})]
"""
    allowed = (type(None), bool, int, float, str, list, tuple, set, type(variables(program)["docs"][0]))

    def walk(value):
        assert isinstance(value, allowed), type(value)
        if isinstance(value, (list, tuple, set)):
            for item in value:
                walk(item)

    for value in variables(program).values():
        walk(value)


def test_a_host_near_its_recursion_limit_gets_an_error_not_an_exception():
    program = "x = " + "[" * 45 + "]" * 45

    def call_at_depth(depth):
        return call_at_depth(depth - 1) if depth else execute(program, SDK)

    result = call_at_depth(sys.getrecursionlimit() - len(inspect.stack()) - 40)
    assert result.error.startswith("nesting limit: "), result.error
