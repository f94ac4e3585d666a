"""The values a program holds, and `Meter`, which counts what a program spends and builds every new list,
tuple, set and string only after checking it against the `Limits`.

A program holds only None, bools, ints, floats, strings, lists, tuples, sets and `Hit`s (which it can pass
around, compare and show, but not look inside). Sets hold plain values and Hits only. Lists never change
once built (the language has no item assignment and no methods; `x += y` builds a new list), so each list
and tuple records the values it holds (nested ones included) and how deeply it nests: size checks cost
O(1), and comparing, hashing, sorting or searching values costs at most `max_items` per pair and never
recurses deeper than `max_nesting`.
"""
from __future__ import annotations

import ast
import time
from typing import Any, Callable, Sequence

from searchrl.retrieval.types import Hit
from searchrl.tasks.rpl.language import Program, ProgramError
from searchrl.tasks.rpl.limits import Limits

PLAIN = (type(None), bool, int, float, str)  # what f-strings format
SET_ITEMS = (*PLAIN, Hit)  # what sets hold


class ProgramList(list):
    """A program's list, with the number of values it holds (nested ones included) and its nesting depth."""

    __slots__ = ("items", "depth")

    def __init__(self, values: Sequence[Any], items: int, depth: int):
        super().__init__(values)
        self.items, self.depth = items, depth


class ProgramTuple(tuple):
    """A program's tuple, with the number of values it holds (nested ones included) and its nesting depth."""

    def __new__(cls, values: Sequence[Any], items: int, depth: int) -> ProgramTuple:
        self = super().__new__(cls, values)
        self.items, self.depth = items, depth
        return self


ProgramList.__name__ = ProgramList.__qualname__ = "list"  # what Python's own error messages call them
ProgramTuple.__name__ = ProgramTuple.__qualname__ = "tuple"


def shape(value: Any) -> tuple[int, int]:
    """(values held, nesting depth): 0 and 0 for a plain value or a Hit."""
    if isinstance(value, (ProgramList, ProgramTuple)):
        return value.items, value.depth
    if isinstance(value, set):
        return len(value), 1
    return 0, 0


def type_name(value: Any) -> str:
    return "None" if value is None else type(value).__name__


class Meter:
    """Counts a program's steps, wall time and the items and characters it builds, and builds values only
    within the limits. Its errors point at the node given, or at the node stepped on last."""

    def __init__(self, program: Program, limits: Limits):
        self.program, self.limits = program, limits
        self.steps = self.allocated = 0
        self.node: ast.AST = program.tree
        self.deadline = time.monotonic() + limits.max_seconds

    def error(self, rule: str, detail: str, node: ast.AST | None = None) -> ProgramError:
        return self.program.error(rule, detail, node or self.node)

    def step(self, node: ast.AST, cost: int = 1) -> None:
        self.node = node
        self.steps += cost
        if self.steps > self.limits.max_steps:
            raise self.error("step limit", f"the program ran more than {self.limits.max_steps} steps")
        if time.monotonic() > self.deadline:
            raise self.error("time limit", f"the program ran longer than {self.limits.max_seconds:g} s")

    def allocate(self, node: ast.AST, size: int) -> None:
        self.allocated += size
        if self.allocated > self.limits.max_alloc:
            raise self.error("memory limit", f"the program built more than {self.limits.max_alloc} items and "
                             "characters in all", node)

    def new_str(self, node: ast.AST, length: int, build: Callable[[], str]) -> str:
        """build(), a string of `length` characters."""
        if length > self.limits.max_str_len:
            raise self.error("string limit", f"a string of {length} characters; at most "
                             f"{self.limits.max_str_len}", node)
        self.allocate(node, length)
        return build()

    def new_sequence(self, node: ast.AST, kind: type, values: Sequence[Any], items: int | None = None,
                     depth: int | None = None) -> ProgramList | ProgramTuple:
        """`values` as a program list or tuple (`kind`); `items` and `depth` are computed from them unless
        given. `values` are at most twice `max_items` (a concatenation), whatever the program does."""
        if items is None or depth is None:
            shapes = [shape(value) for value in values]
            items = len(values) + sum(held for held, _ in shapes)
            depth = 1 + max((nested for _, nested in shapes), default=0)
        if items > self.limits.max_items:
            raise self.error("list limit", f"a {kind.__name__} of {items} values (nested ones included); at "
                             f"most {self.limits.max_items}", node)
        if depth > self.limits.max_nesting:
            raise self.error("nesting limit", f"lists and tuples nested {depth} deep; at most "
                             f"{self.limits.max_nesting}", node)
        self.allocate(node, len(values))
        return kind(values, items, depth)

    def new_set(self, node: ast.AST, values: Sequence[Any]) -> set:
        """A set of `values`, which must be plain values or Hits."""
        for value in values:
            if not isinstance(value, SET_ITEMS):
                raise self.error("type error", "a set holds only None, bool, int, float, str and Hit values, "
                                 f"not {type_name(value)}", node)
        if len(values) > self.limits.max_items:
            raise self.error("list limit", f"a set of {len(values)} values; at most {self.limits.max_items}",
                             node)
        self.allocate(node, len(values))
        return set(values)

    def check_int(self, node: ast.AST, value: Any) -> Any:
        if isinstance(value, int) and abs(value) > self.limits.max_int:
            raise self.error("int limit", f"an integer beyond {self.limits.max_int} in absolute value", node)
        return value

    def python(self, node: ast.AST, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """function(*args, **kwargs), a Python operation on program values: what it raises for bad values
        becomes an error at `node`."""
        try:
            return function(*args, **kwargs)
        except TypeError as e:
            raise self.error("type error", str(e), node) from None
        except IndexError as e:
            raise self.error("index error", str(e), node) from None
        except (ValueError, ArithmeticError) as e:
            raise self.error("value error", str(e), node) from None
