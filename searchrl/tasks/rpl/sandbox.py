"""The sandbox: runs a checked program by walking its syntax tree, spending at most what `Limits` allows.

The values a program holds are described in `values`. Sets cannot be looped over (their order is not
defined): loop over `sorted(s)`. A generator expression is evaluated at once, to a list.

Whatever the program does, `execute` returns a `ProgramResult`: a broken rule or limit, a type error, a
bad SDK argument or a query the backend refuses for its text (`QueryRefused`) becomes `.error`. Any other
retrieval failure (`RetrievalError`: the backend down, a request refused as too large) raises: it is not the
program's doing.
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
import operator
import time
from typing import Any, Callable

from searchrl.retrieval.types import Hit, QueryRefused
from searchrl.tasks.rpl.language import Program, ProgramError, parse
from searchrl.tasks.rpl.limits import Limits
from searchrl.tasks.rpl.sdk import SDK_FUNCTIONS, BackendNotConfigured, RetrievalSDK
from searchrl.tasks.rpl.values import PLAIN, Meter, ProgramList, ProgramTuple, shape, type_name

RETRIEVALS = ("sparse_retrieval", "dense_retrieval")  # what max_docs_retrieved counts
BACKEND_CALLS = (*RETRIEVALS, "rerank")  # what max_retrieval_calls counts


def _extreme(function: Callable[..., Any]) -> Callable[..., Any]:
    """min or max, with Python 3.11's text for an empty argument on every Python (3.12 reworded it), so a
    program's error reads the same wherever it runs."""
    def extreme(*args: Any) -> Any:
        if len(args) == 1 and isinstance(args[0], (str, list, tuple, set)) and not args[0]:
            raise ValueError(f"{function.__name__}() arg is an empty sequence")
        return function(*args)
    return extreme


_RETURNS_A_VALUE = {"len": len, "min": _extreme(min), "max": _extreme(max)}  # builtins that build nothing new
_SDK_SIGNATURES = {name: inspect.signature(getattr(RetrievalSDK, name)) for name in SDK_FUNCTIONS}
_ARITHMETIC: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
_SYMBOLS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%"}
_COMPARISONS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Is: operator.is_, ast.IsNot: operator.is_not,
    ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}


@dataclasses.dataclass
class ProgramResult:
    """What a program did: the hits it showed, in order, and the error that stopped it, if any (the hits
    shown before the error are kept)."""

    shown: list[Hit] = dataclasses.field(default_factory=list)
    error: str | None = None  # "<rule or limit>: <detail> (line L, column C)"
    steps: int = 0
    retrieval_calls: int = 0  # sparse_retrieval, dense_retrieval and rerank calls
    docs_retrieved: int = 0  # hits returned by sparse_retrieval and dense_retrieval
    primitives: set[str] = dataclasses.field(default_factory=set)  # the SDK functions called
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: hits as {"id", "score", "title", "text"}, primitives sorted."""
        return {"shown": [dataclasses.asdict(hit) for hit in self.shown], "error": self.error,
                "steps": self.steps, "retrieval_calls": self.retrieval_calls,
                "docs_retrieved": self.docs_retrieved, "primitives": sorted(self.primitives),
                "seconds": self.seconds}


def execute(source: str, sdk: RetrievalSDK, limits: Limits | None = None) -> ProgramResult:
    """Parses, checks and runs one program against `sdk`. Never raises for any `source`; see the module
    docstring for the one exception."""
    limits = limits or Limits()
    result = ProgramResult()
    start = time.monotonic()
    try:
        _Interpreter(parse(source, limits), sdk, limits, result).run()
    except ProgramError as e:
        result.error = str(e)
    result.seconds = time.monotonic() - start
    return result


class _Break(Exception):
    pass


class _Continue(Exception):
    pass


class _Interpreter(Meter):
    """Runs one program. Every statement and expression evaluated is a step; a call also costs one step per
    item of its list, tuple and set arguments (the work of sorting, fusing, ...), and a comparison one per
    value its operands hold."""

    def __init__(self, program: Program, sdk: RetrievalSDK, limits: Limits, result: ProgramResult):
        super().__init__(program, limits)
        self.sdk, self.result = sdk, result
        self.sdk_functions = sdk.functions()
        self.variables: dict[str, Any] = {}
        self.scopes: list[dict[str, Any]] = []  # comprehension variables, innermost last

    def run(self) -> None:
        try:
            self.block(self.program.tree.body)
        except RecursionError:  # checked nesting keeps far from it; a host calling from deep down may not
            raise self.error("nesting limit", "the program nests too deeply for this host") from None
        except MemoryError:
            raise self.error("memory limit", "the host ran out of memory") from None
        finally:
            self.result.steps = self.steps

    # Statements.

    def block(self, body: list[ast.stmt]) -> None:
        for node in body:
            self.step(node)
            match node:
                case ast.Assign(targets=targets, value=value):
                    value = self.evaluate(value)
                    for target in targets:
                        self.bind(target, value, self.variables)
                case ast.AugAssign(target=target, op=op, value=value):
                    current = self.lookup(target)
                    self.bind(target, self.binary(node, op, current, self.evaluate(value)), self.variables)
                case ast.Expr(value=value):
                    self.evaluate(value)
                case ast.For():
                    self.loop(node)
                case ast.If(test=test, body=then, orelse=otherwise):
                    self.block(then if self.evaluate(test) else otherwise)
                case ast.Break():
                    raise _Break
                case ast.Continue():
                    raise _Continue

    def loop(self, node: ast.For) -> None:
        for item in self.iterable(node.iter, self.evaluate(node.iter)):
            self.step(node)
            self.bind(node.target, item, self.variables)
            try:
                self.block(node.body)
            except _Break:
                break
            except _Continue:
                continue

    def bind(self, target: ast.expr, value: Any, scope: dict[str, Any]) -> None:
        if isinstance(target, ast.Name):
            scope[target.id] = value
            return
        names = target.elts  # a tuple or list of names (checked)
        if not isinstance(value, (list, tuple)):
            raise self.error("type error", f"cannot unpack {type_name(value)} into {len(names)} names",
                             target)
        if len(value) != len(names):
            raise self.error("value error", f"cannot unpack {len(value)} values into {len(names)} names",
                             target)
        for name, item in zip(names, value):
            scope[name.id] = item

    def lookup(self, node: ast.Name) -> Any:
        for scope in (*reversed(self.scopes), self.variables):
            if node.id in scope:
                return scope[node.id]
        raise self.error("name error", f"'{node.id}' is not defined", node)

    def iterable(self, node: ast.expr, value: Any) -> list | tuple | str:
        if isinstance(value, set):
            raise self.error("type error", "a set has no order to loop over; loop over sorted(...) of it",
                             node)
        if not isinstance(value, (list, tuple, str)):
            raise self.error("type error", f"cannot loop over {type_name(value)}", node)
        return value

    # Expressions.

    def evaluate(self, node: ast.expr) -> Any:
        self.step(node)
        match node:
            case ast.Constant(value=value):
                return value
            case ast.Name():
                return self.lookup(node)
            case ast.List(elts=elements):
                return self.new_sequence(node, ProgramList, self.elements(node, elements))
            case ast.Tuple(elts=elements):
                return self.new_sequence(node, ProgramTuple, self.elements(node, elements))
            case ast.Set(elts=elements):
                return self.new_set(node, self.elements(node, elements))
            case ast.BinOp(left=left, op=op, right=right):
                return self.binary(node, op, self.evaluate(left), self.evaluate(right))
            case ast.UnaryOp(op=op, operand=operand):
                return self.unary(node, op, self.evaluate(operand))
            case ast.BoolOp(op=op, values=values):
                for value_node in values[:-1]:
                    value = self.evaluate(value_node)
                    if bool(value) == isinstance(op, ast.Or):  # `or` stops at a true value, `and` at
                        return value  # a false one
                return self.evaluate(values[-1])
            case ast.Compare(left=left, ops=ops, comparators=comparators):
                value = self.evaluate(left)
                for op, comparator in zip(ops, comparators):
                    other = self.evaluate(comparator)
                    self.step(node, cost=shape(value)[0] + shape(other)[0])
                    if not self.python(node, _COMPARISONS[type(op)], value, other):
                        return False
                    value = other
                return True
            case ast.IfExp(test=test, body=body, orelse=orelse):
                return self.evaluate(body if self.evaluate(test) else orelse)
            case ast.Call():
                return self.call(node)
            case ast.Subscript():
                return self.subscript(node)
            case ast.ListComp() | ast.GeneratorExp():  # a generator expression is evaluated at once
                return self.new_sequence(node, ProgramList, self.comprehension(node))
            case ast.SetComp():
                return self.new_set(node, self.comprehension(node))
            case ast.JoinedStr():
                return self.fstring(node)
        raise AssertionError(f"the checker let through {type(node).__name__}")

    def elements(self, node: ast.expr, elements: list[ast.expr]) -> list[Any]:
        """The values of display elements or call arguments, `*x` unpacked."""
        values: list[Any] = []
        for element in elements:
            if not isinstance(element, ast.Starred):
                values.append(self.evaluate(element))
                continue
            unpacked = self.iterable(element, self.evaluate(element.value))
            if len(values) + len(unpacked) > self.limits.max_items:
                raise self.error("list limit", f"more than {self.limits.max_items} values", node)
            values.extend(unpacked)
        return values

    def binary(self, node: ast.AST, op: ast.operator, a: Any, b: Any) -> Any:
        """a op b: arithmetic on numbers; + joins two strings, lists or tuples; * repeats one by an int."""
        numbers, sequences = (int, float), (ProgramList, ProgramTuple)
        if isinstance(a, numbers) and isinstance(b, numbers):
            return self.check_int(node, self.python(node, _ARITHMETIC[type(op)], a, b))
        if isinstance(op, ast.Add) and isinstance(a, str) and isinstance(b, str):
            return self.new_str(node, len(a) + len(b), lambda: a + b)
        if isinstance(op, ast.Add) and isinstance(a, sequences) and type(a) is type(b):
            return self.new_sequence(node, type(a), a + b, a.items + b.items, max(a.depth, b.depth))
        if isinstance(op, ast.Mult) and isinstance(b, (str, *sequences)) and isinstance(a, int):
            a, b = b, a
        if isinstance(op, ast.Mult) and isinstance(a, (str, *sequences)) and isinstance(b, int):
            count = max(b, 0)
            if isinstance(a, str):
                return self.new_str(node, len(a) * count, lambda: a * count)
            if len(a) * count > self.limits.max_items:  # before building: the result is new values
                raise self.error("list limit", f"{len(a) * count} values; at most {self.limits.max_items}",
                                 node)
            return self.new_sequence(node, type(a), a * count, a.items * count, a.depth)
        raise self.error("type error", f"unsupported operand types for {_SYMBOLS[type(op)]}: {type_name(a)} "
                         f"and {type_name(b)}", node)

    def unary(self, node: ast.AST, op: ast.unaryop, value: Any) -> Any:
        if isinstance(op, ast.Not):
            return not value
        if not isinstance(value, (int, float)):
            symbol = "-" if isinstance(op, ast.USub) else "+"
            raise self.error("type error", f"bad operand type for unary {symbol}: {type_name(value)}", node)
        return self.check_int(node, -value if isinstance(op, ast.USub) else +value)

    def subscript(self, node: ast.Subscript) -> Any:
        value = self.evaluate(node.value)
        if not isinstance(node.slice, ast.Slice):
            return self.python(node, operator.getitem, value, self.evaluate(node.slice))
        bounds = [None if part is None else self.evaluate(part)
                  for part in (node.slice.lower, node.slice.upper, node.slice.step)]
        part = self.python(node, operator.getitem, value, slice(*bounds))
        if isinstance(part, str):
            self.allocate(node, len(part))
            return part
        return self.new_sequence(node, type(value), part)

    def comprehension(self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp) -> list[Any]:
        """The values a comprehension yields, in order. Its variables live in a scope of their own; the first
        iterable is evaluated outside it, as in Python."""
        values: list[Any] = []
        first = self.evaluate(node.generators[0].iter)
        self.scopes.append({})
        try:
            self.generate(node, 0, first, values)
        finally:
            self.scopes.pop()
        return values

    def generate(self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp, index: int, iterable: Any,
                 values: list[Any]) -> None:
        generator = node.generators[index]
        for item in self.iterable(generator.iter, iterable):
            self.step(generator.target)
            self.bind(generator.target, item, self.scopes[-1])
            if not all(self.evaluate(condition) for condition in generator.ifs):
                continue
            if index + 1 < len(node.generators):
                self.generate(node, index + 1, self.evaluate(node.generators[index + 1].iter), values)
                continue
            if len(values) == self.limits.max_items:
                raise self.error("list limit", f"more than {self.limits.max_items} values", node)
            values.append(self.evaluate(node.elt))

    def fstring(self, node: ast.JoinedStr) -> str:
        parts = []
        for part in node.values:
            if isinstance(part, ast.Constant):
                parts.append(part.value)
                continue
            value = self.evaluate(part.value)  # a FormattedValue with no conversion or spec (checked)
            if not isinstance(value, PLAIN):
                raise self.error("type error", f"f-strings format None, bool, int, float and str values, not "
                                 f"{type_name(value)}", node)  # at the f-string: its fields' positions vary
            parts.append(str(value))
        return self.new_str(node, sum(map(len, parts)), lambda: "".join(parts))

    # Calls.

    def call(self, node: ast.Call) -> Any:
        name = node.func.id  # a name in FUNCTIONS (checked)
        args = self.elements(node, node.args)
        kwargs = {keyword.arg: self.evaluate(keyword.value) for keyword in node.keywords}
        self.step(node, cost=sum(len(arg) for arg in args if isinstance(arg, (list, tuple, set))))
        if name in self.sdk_functions:
            return self.sdk_call(node, name, args, kwargs)
        if name in SDK_FUNCTIONS:
            raise self.error("sdk error", f"{name}() is not available here; available: "
                             f"{', '.join(self.sdk_functions) or 'none'}", node)
        if name == "show":
            return self.show(node, args)
        if name == "range":
            numbers = self.python(node, range, *args)
            count = max(0, -((numbers.start - numbers.stop) // numbers.step))  # len() overflows past 2**63
            if count > self.limits.max_items:
                raise self.error("list limit", f"a range of {count} values; at most {self.limits.max_items}",
                                 node)
            return self.new_sequence(node, ProgramList, numbers, count, 1)
        if name == "sorted":
            return self.new_sequence(node, ProgramList, self.python(node, sorted, *args, **kwargs))
        if name == "set":
            return self.new_set(node, list(self.python(node, set, *args)))
        return self.python(node, _RETURNS_A_VALUE[name], *args)

    def show(self, node: ast.Call, args: list[Any]) -> None:
        """show(docs): puts a Hit, or a list or tuple of Hits, into the model's context."""
        if len(args) != 1:
            raise self.error("type error", f"show() takes one argument, got {len(args)}", node)
        docs = args[0]
        hits = [docs] if isinstance(docs, Hit) else docs
        if not isinstance(hits, (list, tuple)):
            raise self.error("type error", f"show() takes a Hit or a list of Hits, not {type_name(docs)}",
                             node)
        for hit in hits:
            if not isinstance(hit, Hit):
                raise self.error("type error", "show() takes a Hit or a list of Hits, not a "
                                 f"{type_name(docs)} holding {type_name(hit)}", node)
        if len(self.result.shown) + len(hits) > self.limits.max_shown:
            raise self.error("show limit", f"at most {self.limits.max_shown} hits can be shown; "
                             f"{len(self.result.shown)} were, this call adds {len(hits)}", node)
        self.result.shown.extend(hits)

    def sdk_call(self, node: ast.Call, name: str, args: list[Any], kwargs: dict[str, Any]) -> ProgramList:
        """An SDK function, called within the retrieval and docs limits; a bad argument is an "sdk error"."""
        try:
            arguments = _SDK_SIGNATURES[name].bind(self.sdk, *args, **kwargs)
        except TypeError as e:
            raise self.error("type error", f"{name}(): {e}", node) from None
        arguments.apply_defaults()
        limits, result = self.limits, self.result
        if name in BACKEND_CALLS and result.retrieval_calls >= limits.max_retrieval_calls:
            raise self.error("retrieval limit", f"at most {limits.max_retrieval_calls} calls of "
                             "sparse_retrieval, dense_retrieval and rerank", node)
        top_k = arguments.arguments.get("top_k")
        # Checked here, not by the SDK, whose message holds repr(top_k): huge for a list of long strings.
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int)):
            raise self.error("sdk error", f"{name}: top_k must be a positive integer, got {type_name(top_k)}",
                             node)
        if name in RETRIEVALS and result.docs_retrieved + (top_k or 0) > limits.max_docs_retrieved:
            raise self.error("docs limit", f"top_k={top_k} after {result.docs_retrieved} docs retrieved; at "
                             f"most {limits.max_docs_retrieved} in all", node)
        docs = arguments.arguments.get("docs")
        if name == "rerank" and isinstance(docs, (list, tuple)) and len(docs) > limits.max_rerank_docs:
            raise self.error("docs limit", f"rerank scores at most {limits.max_rerank_docs} docs, got "
                             f"{len(docs)}", node)
        result.primitives.add(name)
        result.retrieval_calls += name in BACKEND_CALLS
        try:
            hits = self.sdk_functions[name](*args, **kwargs)
        except (TypeError, ValueError, BackendNotConfigured, QueryRefused) as e:  # a query refused too
            raise self.error("sdk error", str(e)[:500], node) from None
        if name in RETRIEVALS:
            result.docs_retrieved += len(hits)
        return self.new_sequence(node, ProgramList, hits, len(hits), 1)
