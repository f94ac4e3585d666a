"""Fuzzing with hypothesis: 10,400 generated programs (arbitrary text, token soup, programs from a grammar and
random syntax trees, hostile constructs mixed in) never raise, never hold anything but program values, and
keep every limit."""
import ast
import random
import re
import textwrap
from unittest import mock

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from searchrl.retrieval.types import Hit
from searchrl.tasks.rpl import sandbox
from searchrl.tasks.rpl.language import FUNCTIONS
from searchrl.tasks.rpl.limits import Limits
from searchrl.tasks.rpl.sandbox import execute
from tests.tasks.rpl.program_helpers import SDK, check_result

SETTINGS = dict(deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
# Small limits, so that generated programs reach them often.
TIGHT = Limits(max_depth=25, max_steps=2_000, max_seconds=2.0, max_str_len=200, max_items=200, max_nesting=4,
               max_alloc=5_000, max_retrieval_calls=4, max_docs_retrieved=40, max_rerank_docs=20, max_shown=5)


class Recording(sandbox._Interpreter):
    """The sandbox's interpreter, keeping the last one run so that a test can read its variables."""

    last = None

    def run(self):
        Recording.last = self
        super().run()


def check_values(value, limits, depth=0):
    """`value` is a program value within `limits`: nothing else ever reaches a program."""
    assert isinstance(value, (type(None), bool, int, float, str, list, tuple, set, Hit)), type(value)
    assert depth <= limits.max_nesting + 1
    if isinstance(value, int):
        assert abs(value) <= limits.max_int
    if isinstance(value, str):
        assert len(value) <= limits.max_str_len
    if isinstance(value, (list, tuple, set)):
        assert len(value) <= limits.max_items
        for item in value:
            check_values(item, limits, depth + 1)


def run_checked(source, limits):
    Recording.last = None
    with mock.patch.object(sandbox, "_Interpreter", Recording):
        result = execute(source, SDK, limits)
    check_result(result, limits)
    if Recording.last is not None:
        for value in Recording.last.variables.values():
            check_values(value, limits)


@settings(max_examples=2_000, **SETTINGS)
@given(st.text(max_size=300))
def test_arbitrary_text(source):
    run_checked(source, Limits())


TOKENS = ["for", "in", "if", "elif", "else", "not", "and", "or", "is", "pass", "break", "continue",
          "lambda", "def", "class", "import", "while", "return", "yield", "True", "False", "None", "x", "y",
          "q", "docs", "__class__", "__builtins__", "len", "range", "sorted", "set", "min", "max", "show",
          "eval", "getattr", "sparse_retrieval", "dense_retrieval", "fuse", "dedup", "rerank", "(", ")", "[",
          "]", "{", "}", ",", ":", ".", "=", "==", "+", "-", "*", "**", "/", "//", "%", "<", ">=", "+=", ":=",
          "!r", "@", "~", "<<", "0", "1", "7", "10000", "99999999999999999999", "2.5", "'cat'", '"dog"',
          "'x' * 100", "f'{x}'", "f'{x!r}'", "f'{x:>9}'", "b'x'", "1j", "...", "#", "\\", ";"]


@settings(max_examples=2_000, **SETTINGS)
@given(st.lists(st.tuples(st.integers(0, 2), st.lists(st.sampled_from(TOKENS), min_size=1, max_size=8)),
                max_size=6))
def test_token_soup(lines):
    run_checked("\n".join("    " * indent + " ".join(tokens) for indent, tokens in lines), TIGHT)


# A grammar of programs that mostly parse and run: "@" is an expression, "#" an indented block. Now and then
# a forbidden construct takes the place of an allowed one.
PRELUDE = "a = [1, 2]\nb = 'cat'\nq = 'dog'\ndocs = sparse_retrieval(q, 3)\ni = 0\n"
LEAVES = ["a", "b", "q", "docs", "i", "0", "1", "7", "-3", "2.5", "1e308", "None", "True", "'cat'", "''",
          "'x' * 150", "[]", "()", "9223372036854775807", "sparse_retrieval('cat', 3)",
          "dense_retrieval(b, 12)", "range(5)", "[1, [2]]", "(1, 'a')", "{3, 'a'}"]
EXPRESSIONS = [
    "@ + @", "@ - @", "@ * @", "@ / @", "@ // @", "@ % @", "-@", "not @", "@ and @", "@ or @", "@ == @",
    "@ < @ <= @", "@ in @", "@ is not @", "@ if @ else @", "[@, @]", "[*@, @]", "(@,)", "(@, *@)", "{@, @}",
    "@[@]", "@[@:@]", "@[::@]", "[@ for a in @]", "[@ for a, b in @ if @]", "{@ for b in @}",
    "max(@ for i in @)", "[i for i in @ for j in @]", 'f"v={@}"', "len(@)", "range(@)", "range(@, @, @)",
    "sorted(@)", "sorted(@, reverse=@)", "min(@)", "max(@, @)", "set(@)", "show(@)", "sparse_retrieval(@, @)",
    "dense_retrieval(@, top_k=@)", "fuse(@, @)", "fuse(*@, top_k=@)", "dedup(@)", "rerank(@, @)",
    "rerank(@, @, top_k=@)"]
FORBIDDEN_EXPRESSIONS = [
    "__class__", "len", "99999999999999999999", "b'b'", "1j", "...", "@ ** @", "@ << @", "~@", 'f"{@!r}"',
    'f"{@:>5}"', "@.__class__", "(lambda: @)()", "{@: @}", "(c := @)", "sorted(@, key=@)", "eval(@)",
    "getattr(@, @)", "@(@)"]
STATEMENTS = ["a = @", "b = @", "a, b = @", "docs += @", "i -= @", "q = @", "show(@)", "@", "pass"]
BLOCKS = ["for i in @:\n#", "for a, b in @:\n#", "if @:\n#", "if @:\n#\nelif @:\n#\nelse:\n#"]
FORBIDDEN_STATEMENTS = ["import os", "a[0] = @", "del a", "global a", "while @:\n#", "def f():\n#",
                        "try:\n#\nexcept:\n    pass", "with @:\n#"]


def expression(rng, depth):
    if rng.random() < 0.005:
        template = rng.choice(FORBIDDEN_EXPRESSIONS)
    elif depth == 0 or rng.random() < 0.3:
        return rng.choice(LEAVES)
    else:
        template = rng.choice(EXPRESSIONS)
    return re.sub("@", lambda _: f"({expression(rng, max(depth - 1, 0))})", template)


def statements(rng, depth, in_loop=False):
    lines = []
    for _ in range(rng.randint(1, 3)):
        roll = rng.random()
        if roll < 0.01:
            template = rng.choice(FORBIDDEN_STATEMENTS)
        elif depth and roll < 0.35:
            template = rng.choice(BLOCKS)
        else:
            template = rng.choice(STATEMENTS + ["break", "continue"] * in_loop)
        loop = in_loop or template.startswith("for")
        body = lambda _: textwrap.indent(statements(rng, max(depth - 1, 0), loop), "    ")  # noqa: E731
        lines.append(re.sub("#", body, re.sub("@", lambda _: expression(rng, 3), template)))
    return "\n".join(lines)


@settings(max_examples=6_000, **SETTINGS)
@given(st.integers(0, 2**32 - 1))  # a seed: drawing each choice from hypothesis would be three times slower
def test_grammar_programs(seed):
    run_checked(PRELUDE + statements(random.Random(seed), depth=3), TIGHT)


# Syntax trees drawn node by node, for shapes the grammar above does not write.
LOAD, STORE = ast.Load(), ast.Store()
NAMES = ["a", "b", "c", "q", "docs", "i", "_", "__class__", "len", "show"]
CALLABLE = [*FUNCTIONS, "sparse_retrieval", "dense_retrieval", "eval", "getattr", "print", "__import__"]
BINARY = [ast.Add(), ast.Add(), ast.Sub(), ast.Mult(), ast.Mult(), ast.Div(), ast.FloorDiv(), ast.Mod(),
          ast.Pow(), ast.LShift(), ast.BitOr()]
COMPARE = [ast.Eq(), ast.NotEq(), ast.Lt(), ast.GtE(), ast.In(), ast.NotIn(), ast.Is(), ast.IsNot()]
NO_ARGUMENTS = ast.arguments(posonlyargs=[], args=[], vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None,
                             defaults=[])


def call(function, args, keywords=()):
    return ast.Call(ast.Name(function, LOAD), list(args), [ast.keyword(k, v) for k, v in keywords])


def names(ctx):
    return st.sampled_from(NAMES).map(lambda name: ast.Name(name, ctx))


TARGETS = st.one_of(names(STORE),
                    st.lists(names(STORE), min_size=2, max_size=2).map(lambda t: ast.Tuple(t, STORE)))
CONSTANTS = st.one_of(st.none(), st.booleans(), st.integers(-3, 12), st.integers(-2**70, 2**70), st.floats(),
                      st.sampled_from(["cat", "dog", "", "x" * 150]), st.text(max_size=4),
                      st.sampled_from([b"b", 1j, ...])).map(ast.Constant)
RETRIEVALS = st.builds(lambda f, q, k: call(f, [ast.Constant(q), ast.Constant(k)]),
                       st.sampled_from(["sparse_retrieval", "dense_retrieval"]),
                       st.sampled_from(["cat", "dog"]), st.integers(1, 15))


def compound_expressions(e):
    element = st.one_of(e, e.map(lambda v: ast.Starred(v, LOAD)))
    return st.one_of(
        st.builds(ast.BinOp, e, st.sampled_from(BINARY), e),
        st.builds(ast.UnaryOp, st.sampled_from([ast.Not(), ast.USub(), ast.UAdd(), ast.Invert()]), e),
        st.builds(ast.BoolOp, st.sampled_from([ast.And(), ast.Or()]), st.lists(e, min_size=2, max_size=3)),
        st.builds(lambda left, rest: ast.Compare(left, [op for op, _ in rest], [r for _, r in rest]), e,
                  st.lists(st.tuples(st.sampled_from(COMPARE), e), min_size=1, max_size=2)),
        st.builds(ast.IfExp, e, e, e),
        st.builds(lambda kind, elts: kind(elts, LOAD) if kind is not ast.Set else ast.Set(elts),
                  st.sampled_from([ast.List, ast.Tuple, ast.Set]), st.lists(element, max_size=4)),
        st.builds(call, st.sampled_from(CALLABLE), st.lists(element, max_size=3),
                  st.lists(st.tuples(st.sampled_from(["top_k", "reverse", "key"]), e), max_size=1)),
        st.builds(lambda value, index: ast.Subscript(value, index, LOAD), e,
                  st.one_of(e, st.builds(ast.Slice, st.none() | e, st.none() | e, st.none() | e))),
        st.builds(lambda kind, elt, target, iterable, ifs: kind(
            elt, [ast.comprehension(target, iterable, ifs, 0)]),
                  st.sampled_from([ast.ListComp, ast.SetComp, ast.GeneratorExp]), e, TARGETS, e,
                  st.lists(e, max_size=1)),
        st.builds(lambda value, conversion, spec: ast.JoinedStr([ast.Constant("v="), ast.FormattedValue(
            value, conversion, spec)]), e, st.sampled_from([-1, -1, -1, 114]),
                  st.sampled_from([None, None, None, ast.JoinedStr([ast.Constant(">5")])])),
        st.builds(lambda value, attr: ast.Attribute(value, attr, LOAD), e,
                  st.sampled_from(["__class__", "real"])),
        st.builds(lambda body: ast.Lambda(NO_ARGUMENTS, body), e),
        st.builds(lambda k, v: ast.Dict([k], [v]), e, e),
        st.builds(ast.NamedExpr, names(STORE), e),
    )


TREE_EXPRESSIONS = st.recursive(st.one_of(CONSTANTS, names(LOAD), RETRIEVALS), compound_expressions,
                                max_leaves=6)
SIMPLE_TREE_STATEMENTS = st.one_of(
    st.builds(lambda target, value: ast.Assign([target], value), TARGETS, TREE_EXPRESSIONS),
    st.builds(ast.AugAssign, names(STORE), st.sampled_from(BINARY), TREE_EXPRESSIONS),
    st.builds(lambda value: ast.Expr(call("show", [value])), TREE_EXPRESSIONS),
    TREE_EXPRESSIONS.map(ast.Expr),
    st.sampled_from([ast.Pass(), ast.Break(), ast.Continue(), ast.Import([ast.alias("os")])]),
    st.builds(lambda index, value: ast.Assign([ast.Subscript(ast.Name("a", LOAD), index, STORE)], value),
              TREE_EXPRESSIONS, TREE_EXPRESSIONS),
)


def compound_statements(statement):
    block = st.lists(statement, min_size=1, max_size=3)
    return st.one_of(
        st.builds(lambda target, iterable, body: ast.For(target, iterable, body, []), TARGETS,
                  TREE_EXPRESSIONS, block),
        st.builds(ast.If, TREE_EXPRESSIONS, block, st.lists(statement, max_size=2)),
        st.builds(lambda test, body: ast.While(test, body, []), TREE_EXPRESSIONS, block),
    )


TREE_STATEMENTS = st.recursive(SIMPLE_TREE_STATEMENTS, compound_statements, max_leaves=4)


@settings(max_examples=400, **SETTINGS)
@given(st.lists(TREE_STATEMENTS, min_size=1, max_size=4))
def test_generated_syntax_trees(body):
    try:
        source = ast.unparse(ast.fix_missing_locations(ast.Module(body, type_ignores=[])))
    except ValueError:  # trees ast.unparse cannot write (f-strings nested in f-strings)
        assume(False)
    run_checked(source, TIGHT)
