"""The program language: a Python subset, parsed with `ast` and checked against an allow-list before it runs.

Allowed: assignments (to names, or unpacking into names), `+=`-style updates of a name, `for` over a
list, `if`/`elif`/`else`, `break`, `continue`, `pass`; literals of None, bools, ints, floats and strings,
list, tuple and set displays (with `*` unpacking), indexing and slicing, arithmetic (+ - * / // %),
comparisons (including `in`, `is`), `and`/`or`/`not`, `x if c else y`, list and set comprehensions and
generator expressions, f-strings without conversions or format specs, and calls by name of the functions
in `FUNCTIONS`.

Everything else is rejected before the program runs, with the rule it breaks and its line and column:
imports, attribute access, names starting with "__", function and class definitions, lambdas, `while`,
`try`, `with`, dicts, `**` and bitwise operators, calls of anything but `FUNCTIONS` (no `eval`, `exec`,
`getattr`, `open`, ...), using a function as a value, and assigning to a function's name. Parsing never
compiles or runs the program's text; the sandbox walks the checked tree.

Errors read the same on Python 3.11 to 3.13, except a syntax error's detail, which is the Python parser's
own message (and which programs its stack overflows on: a "nesting limit" either way).
"""
from __future__ import annotations

import ast
import dataclasses
import threading

from searchrl.tasks.rpl.limits import Limits

# CPython 3.11 counts ast.parse's recursion in state the interpreter's threads share, so two parses at once
# (the rollout's env workers checking programs in parallel) can fail with "SystemError: AST constructor
# recursion depth mismatch" (python/cpython#106905; it ended an RPL training run). Parses take turns.
_PARSING = threading.Lock()

# Callable names and the keyword arguments each takes. The SDK's are `searchrl.tasks.rpl.sdk.SDK_FUNCTIONS`.
FUNCTIONS: dict[str, tuple[str, ...]] = {
    "len": (), "range": (), "sorted": ("reverse",), "min": (), "max": (), "set": (), "show": (),
    "sparse_retrieval": ("top_k",), "dense_retrieval": ("top_k",), "fuse": ("top_k",), "dedup": (),
    "rerank": ("top_k",),
}
# The rules and limits an error can name: "<rule>: <detail> (line L, column C)".
RULES = ("syntax error", "forbidden syntax", "forbidden name", "unknown function", "name error",
         "type error", "value error", "index error", "sdk error", "source limit", "nesting limit",
         "step limit", "time limit", "int limit", "string limit", "list limit", "memory limit",
         "retrieval limit", "docs limit", "show limit")
CONSTANT_TYPES = (type(None), bool, int, float, str)
COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp)
BINARY_OPERATORS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod)
UNARY_OPERATORS = (ast.Not, ast.USub, ast.UAdd)

_FORBIDDEN_SYNTAX = {  # how errors name common forbidden nodes; others go by their ast class name
    ast.Attribute: "attribute access", ast.Import: "imports", ast.ImportFrom: "imports",
    ast.FunctionDef: "function definitions", ast.AsyncFunctionDef: "function definitions",
    ast.Lambda: "lambdas", ast.ClassDef: "class definitions", ast.While: "while loops",
    ast.Try: "try statements", ast.With: "with statements", ast.Dict: "dicts", ast.DictComp: "dicts",
    ast.NamedExpr: "assignment expressions (:=)", ast.Delete: "del statements", ast.Return: "return",
    ast.Yield: "yield", ast.YieldFrom: "yield", ast.Await: "await", ast.Global: "global statements",
    ast.Nonlocal: "nonlocal statements", ast.Raise: "raise statements", ast.Assert: "assert statements",
    ast.Match: "match statements", ast.Pow: "the ** operator", ast.MatMult: "the @ operator",
    ast.LShift: "the << operator", ast.RShift: "the >> operator", ast.BitOr: "the | operator",
    ast.BitXor: "the ^ operator", ast.BitAnd: "the & operator", ast.Invert: "the ~ operator",
    ast.Starred: "* unpacking here", ast.AnnAssign: "annotated assignment",
}


class ProgramError(Exception):
    """A program broke a rule of the language or a limit of the sandbox. The message is
    "<rule>: <detail> (line L, column C)", line and column 1-based, the column counted in characters."""

    def __init__(self, rule: str, detail: str, line: int, column: int):
        super().__init__(f"{rule}: {detail} (line {line}, column {column})")
        self.rule, self.detail, self.line, self.column = rule, detail, line, column


@dataclasses.dataclass(frozen=True)
class Program:
    """A parsed program that passed the checks, and its source lines (for error positions)."""

    tree: ast.Module
    lines: list[str]

    def error(self, rule: str, detail: str, node: ast.AST) -> ProgramError:
        """A `ProgramError` at `node` (a statement or expression; anything else is placed at the start)."""
        line, offset = getattr(node, "lineno", 1), getattr(node, "col_offset", 0)
        text = self.lines[line - 1] if line <= len(self.lines) else ""
        # ast counts columns in UTF-8 bytes; errors count characters.
        column = len(text.encode()[:offset].decode(errors="ignore")) + 1
        return ProgramError(rule, detail, line, column)


def parse(source: str, limits: Limits) -> Program:
    """The checked program, or a `ProgramError` naming the first rule or parse-time limit it breaks."""
    if not isinstance(source, str):
        raise ProgramError("syntax error", f"a program is text, got {type(source).__name__}", 1, 1)
    if len(source) > limits.max_source_chars:
        line, column = _position(source, limits.max_source_chars)
        raise ProgramError("source limit", f"the program is longer than {limits.max_source_chars} characters",
                           line, column)
    if "\0" in source:
        raise ProgramError("syntax error", "the program contains a NUL character",
                           *_position(source, source.index("\0")))
    try:
        with _PARSING:
            tree = ast.parse(source)
    except SyntaxError as e:
        raise ProgramError("syntax error", e.msg, e.lineno or 1, max(e.offset or 1, 1)) from None
    except (RecursionError, MemoryError):  # the parser's own stack
        raise ProgramError("nesting limit", "the program is nested too deeply to parse", 1, 1) from None
    except ValueError as e:  # e.g. a lone surrogate, which cannot be encoded
        raise ProgramError("syntax error", str(e), 1, 1) from None
    program = Program(tree, source.replace("\r\n", "\n").replace("\r", "\n").split("\n"))
    _check_depth(program, limits.max_depth)
    try:
        _Checker(program, limits).statements(tree.body, in_loop=False)
    except RecursionError:  # checked nesting keeps far from it; a host calling from deep down may not
        raise ProgramError("nesting limit", "the program nests too deeply for this host", 1, 1) from None
    return program


def _position(source: str, index: int) -> tuple[int, int]:
    """(line, column) of the character at `index`."""
    return source.count("\n", 0, index) + 1, index - source.rfind("\n", 0, index)


def _check_depth(program: Program, max_depth: int) -> None:
    """Rejects trees nested deeper than `max_depth` statements and expressions, without recursion, so that
    checking and running the program (both recursive) stay far from Python's recursion limit. Each `for`
    clause of a comprehension nests what follows it one level deeper, as the sandbox runs it."""
    stack: list[tuple[ast.AST, int]] = [(program.tree, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (ast.stmt, ast.expr)):
            depth += 1
            if depth > max_depth:
                raise program.error("nesting limit", f"the program nests more than {max_depth} levels deep",
                                    node)
        if isinstance(node, COMPREHENSIONS):
            stack.extend((child, depth + i) for i, generator in enumerate(node.generators)
                         for child in ast.iter_child_nodes(generator))
            stack.append((node.elt, depth + len(node.generators)))
        else:
            stack.extend((child, depth) for child in ast.iter_child_nodes(node))


class _Checker:
    """Walks a parsed tree and raises a `ProgramError` at the first node outside the allow-list."""

    def __init__(self, program: Program, limits: Limits):
        self.program, self.limits = program, limits

    def forbidden(self, node: ast.AST, at: ast.AST | None = None) -> ProgramError:
        what = _FORBIDDEN_SYNTAX.get(type(node), type(node).__name__)
        return self.program.error("forbidden syntax", what, at or node)

    def statements(self, body: list[ast.stmt], in_loop: bool) -> None:
        for node in body:
            self.statement(node, in_loop)

    def statement(self, node: ast.stmt, in_loop: bool) -> None:
        match node:
            case ast.Assign(targets=targets, value=value):
                for target in targets:
                    self.target(target)
                self.expression(value)
            case ast.AugAssign(target=target, op=op, value=value):
                if not isinstance(target, ast.Name):
                    raise self.program.error("forbidden syntax", "augmented assignment to anything but a "
                                             "name", target)
                self.operator(op, node)
                self.target(target)
                self.expression(value)
            case ast.Expr(value=value):
                self.expression(value)
            case ast.For(target=target, iter=iterable, body=body, orelse=orelse):
                if orelse:
                    raise self.program.error("forbidden syntax", "for ... else", node)
                self.target(target)
                self.expression(iterable)
                self.statements(body, in_loop=True)
            case ast.If(test=test, body=body, orelse=orelse):
                self.expression(test)
                self.statements(body, in_loop)
                self.statements(orelse, in_loop)
            case ast.Break() | ast.Continue() if not in_loop:
                keyword = "break" if isinstance(node, ast.Break) else "continue"
                raise self.program.error("syntax error", f"'{keyword}' outside a loop", node)
            case ast.Pass() | ast.Break() | ast.Continue():
                pass
            case _:
                raise self.forbidden(node)

    def target(self, node: ast.expr) -> None:
        """An assignment or loop target: a name, or a tuple or list of names to unpack into."""
        if isinstance(node, (ast.Tuple, ast.List)):
            for element in node.elts:
                if not isinstance(element, ast.Name):
                    raise self.program.error("forbidden syntax", "unpacking into anything but names", element)
                self.target(element)
        elif isinstance(node, ast.Name):
            self.name(node)
            if node.id in FUNCTIONS:
                raise self.program.error("forbidden name", f"cannot assign to the function '{node.id}'", node)
        elif isinstance(node, ast.Subscript):
            raise self.program.error("forbidden syntax", "assignment to an item or slice", node)
        else:
            raise self.forbidden(node)

    def name(self, node: ast.Name) -> None:
        if node.id.startswith("__"):
            raise self.program.error("forbidden name", f"'{node.id}': names may not start with '__'", node)

    def operator(self, op: ast.AST, node: ast.expr | ast.stmt) -> None:
        if not isinstance(op, BINARY_OPERATORS + UNARY_OPERATORS):
            raise self.forbidden(op, at=node)

    def expression(self, node: ast.expr, starred: bool = False) -> None:
        """A value; `starred`: where `*x` may unpack x (list, tuple and set displays, call arguments)."""
        match node:
            case ast.Constant(value=value):
                if not isinstance(value, CONSTANT_TYPES):
                    raise self.program.error("forbidden syntax", f"{type(value).__name__} literals",
                                             node)
                if isinstance(value, int) and abs(value) > self.limits.max_int:
                    raise self.program.error("int limit", f"integers are at most {self.limits.max_int} in "
                                             "absolute value", node)
                if isinstance(value, str) and len(value) > self.limits.max_str_len:
                    raise self.program.error("string limit", f"strings are at most {self.limits.max_str_len} "
                                             "characters", node)
            case ast.Name(id=name):
                self.name(node)
                if name in FUNCTIONS:
                    raise self.program.error("forbidden name", f"the function '{name}' can only be called",
                                             node)
            case ast.List(elts=elements) | ast.Tuple(elts=elements) | ast.Set(elts=elements):
                for element in elements:
                    self.expression(element, starred=True)
            case ast.Starred(value=value) if starred:
                self.expression(value)
            case ast.BinOp(left=left, op=op, right=right):
                self.operator(op, node)
                self.expression(left)
                self.expression(right)
            case ast.UnaryOp(op=op, operand=operand):
                self.operator(op, node)
                self.expression(operand)
            case ast.BoolOp(values=values):
                for value in values:
                    self.expression(value)
            case ast.Compare(left=left, comparators=comparators):
                for value in (left, *comparators):
                    self.expression(value)
            case ast.IfExp(test=test, body=body, orelse=orelse):
                for value in (test, body, orelse):
                    self.expression(value)
            case ast.Call():
                self.call(node)
            case ast.Subscript(value=value, slice=ast.Slice(lower=lower, upper=upper, step=step)):
                for part in (value, lower, upper, step):
                    if part is not None:
                        self.expression(part)
            case ast.Subscript(value=value, slice=index):
                self.expression(value)
                self.expression(index)
            case ast.ListComp() | ast.SetComp() | ast.GeneratorExp():
                for generator in node.generators:
                    if generator.is_async:
                        raise self.program.error("forbidden syntax", "async comprehensions",
                                                 node)
                    self.target(generator.target)
                    for value in (generator.iter, *generator.ifs):
                        self.expression(value)
                self.expression(node.elt)
            case ast.JoinedStr(values=values):
                for value in values:
                    if isinstance(value, ast.FormattedValue):
                        self.formatted(value, node)
            case _:
                raise self.forbidden(node)

    def formatted(self, node: ast.FormattedValue, fstring: ast.JoinedStr) -> None:
        """An f-string field: `{expression}`, nothing that would call a value's own formatting. Its errors
        are placed at the f-string: Python 3.11 gives a field the f-string's position, 3.12 its brace's."""
        if node.conversion != -1:
            raise self.program.error("forbidden syntax", "f-string conversions (!r, !s, !a)", fstring)
        if node.format_spec is not None:
            raise self.program.error("forbidden syntax", "f-string format specs", fstring)
        self.expression(node.value)

    def call(self, node: ast.Call) -> None:
        if not isinstance(node.func, ast.Name):
            self.expression(node.func)  # names the forbidden part, e.g. attribute access
            raise self.program.error("forbidden syntax", "calling anything but a function, by name", node)
        name = node.func.id
        if name not in FUNCTIONS:
            raise self.program.error("unknown function", f"'{name}' is not a function of this language",
                                     node.func)
        for argument in node.args:
            self.expression(argument, starred=True)
        for keyword in node.keywords:
            if keyword.arg is None:
                raise self.program.error("forbidden syntax", "** arguments", keyword.value)
            if keyword.arg not in FUNCTIONS[name]:
                raise self.program.error("forbidden syntax", f"{name}() has no keyword argument "
                                         f"'{keyword.arg}'", keyword)
            self.expression(keyword.value)
