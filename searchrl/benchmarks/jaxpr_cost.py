"""The matrix-multiply work of a traced program, counted on its jaxpr with every loop's trip count.

XLA's cost analysis of a compiled program counts the body of a loop once, whatever its trip count: for a model
whose layers run under `lax.scan` (and a PPO step that loops over micro-batches, minibatches and epochs) it
undercounts by orders of magnitude. Here the model counts what runs:

- a `scan` counts `length` times its body; a `while` its trip count: a hint's (`Trips`) where the caller
  gives one, else the bound of its counter where the jaxpr has one (a `fori_loop` over an array bound, `i < n`
  with n known when tracing: an attention loop over all its key blocks), else `while_trips` (a loop that stops
  on data, such as a decode chunk that ends once every row is done: the caller says what one run means, e.g.
  one decode step; such loops are reported in `ProgramCost.assumed_loops`); nested loops multiply;
- a `cond` counts its most expensive branch, a `shard_map` its body once per device it runs on, and every
  other nested jaxpr (jit, remat, custom derivatives) once;
- a Pallas kernel counts the FLOPs and bytes its `cost_estimate` declares; one without counts its body's
  matmuls once per grid step and its blocks read or written once per grid step, and is named in
  `ProgramCost.undeclared_kernels`.

Only `dot_general` is counted outside kernels: FLOPs 2 x (output elements) x (contracted size), and bytes its
operands and output occupy (each read or written at least once: a lower bound on the HBM traffic of a
matmul-bound program). Elementwise work is left out; it is small next to a transformer's matmuls.

Per device (`devices`, `in_shards`): FLOPs are split evenly over the devices; a matmul operand that is a
program input (or a slice, cast, reshape or transpose of one) counts its size over the number of pieces its
sharding splits it into, so a replicated weight counts whole on every device; every other array counts its
size over the device count. A weight that XLA all-gathers before its matmul (FSDP) is read whole, so there
the count is a lower bound.
"""
from __future__ import annotations

import dataclasses
import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.extend import core
from jax.extend.source_info_util import summarize
from jax.sharding import NamedSharding, PartitionSpec


@dataclasses.dataclass(frozen=True)
class MatmulCost:
    """FLOPs and bytes of matmuls (and of Pallas kernels)."""

    flops: float = 0.0
    bytes: float = 0.0

    def __add__(self, other: MatmulCost) -> MatmulCost:
        return MatmulCost(self.flops + other.flops, self.bytes + other.bytes)

    def __mul__(self, times: float) -> MatmulCost:
        return MatmulCost(self.flops * times, self.bytes * times)


@dataclasses.dataclass(frozen=True)
class Loop:
    """A `while` loop of a jaxpr, as trip hints see it."""

    name: str  # "module.function" that wrote it, e.g. "attention._flash_forward" (a closure: its own name)
    where: str  # its source line, "file:line:column (function)"
    bound: int | None  # the most trips its counter allows, where the jaxpr bounds it
    exact: bool  # `bound` is its trip count: its condition tests nothing but the counter


# A loop's trip count: a callable (None: no hint for this loop) or a mapping from `Loop.name`.
Trips = Callable[[Loop], float | None] | Mapping[str, float]


@dataclasses.dataclass(frozen=True)
class ProgramCost:
    """What running a jaxpr once costs, and what the count had to assume."""

    cost: MatmulCost = MatmulCost()
    assumed_loops: tuple[Loop, ...] = ()  # counted `while_trips` times: no hint and no exact bound
    undeclared_kernels: tuple[str, ...] = ()  # Pallas kernels without a cost estimate (counted from the grid)

    def __add__(self, other: ProgramCost) -> ProgramCost:
        return ProgramCost(self.cost + other.cost, self.assumed_loops + other.assumed_loops,
                           self.undeclared_kernels + other.undeclared_kernels)

    def times(self, n: float) -> ProgramCost:
        """The cost of running it `n` times (what was assumed is still said once)."""
        return dataclasses.replace(self, cost=self.cost * n)


def shard_count(spec: PartitionSpec, mesh_shape: Mapping[str, int]) -> int:
    """The pieces an array laid out by `spec` on a mesh of `mesh_shape` is split into: the product of the sizes
    of the mesh axes it is sharded over (1: replicated, whole on every device)."""
    axes = [a for entry in spec for a in (entry if isinstance(entry, tuple) else (entry,)) if isinstance(a, str)]
    return math.prod(mesh_shape[a] for a in axes)


def input_shards(args: Any) -> tuple[int, ...]:
    """`shard_count` of each array in `args` (a pytree of arrays or `jax.ShapeDtypeStruct`s, static
    arguments among them) by its `NamedSharding`, 1 without one: `program_cost`'s `in_shards` for the program
    traced from `args`."""
    return tuple(shard_count(leaf.sharding.spec, leaf.sharding.mesh.shape)
                 if isinstance(getattr(leaf, "sharding", None), NamedSharding) else 1
                 for leaf in jax.tree.leaves(args) if hasattr(leaf, "shape") and hasattr(leaf, "dtype"))


def program_cost(jaxpr: core.Jaxpr | core.ClosedJaxpr, trips: Trips | None = None, while_trips: float = 1,
                 devices: int = 1, in_shards: Sequence[float] | None = None) -> ProgramCost:
    """The FLOPs and bytes of every matmul and Pallas kernel that running `jaxpr` once executes, on each of
    `devices` devices, its inputs split into `in_shards` pieces each (default: `devices`); see the module
    docstring for loops (`trips`, `while_trips`) and sharding."""
    invars = _open(jaxpr).invars
    if in_shards is not None and len(in_shards) != len(invars):
        raise ValueError(f"in_shards names {len(in_shards)} inputs; the jaxpr has {len(invars)}")
    shards = dict(zip(invars, in_shards)) if in_shards is not None else {}
    return _Counter(trips, while_trips).count(jaxpr, _Scope(_consts(jaxpr), shards, devices))


def matmul_cost(jaxpr: core.Jaxpr | core.ClosedJaxpr, while_trips: float = 1, trips: Trips | None = None,
                devices: int = 1, in_shards: Sequence[float] | None = None) -> MatmulCost:
    """`program_cost`'s FLOPs and bytes alone."""
    return program_cost(jaxpr, trips, while_trips, devices, in_shards).cost


# Primitives whose output holds its (first) input's data: a weight sliced, cast or laid out anew is still read
# from the device's shard of the weight.
_SAME_DATA = frozenset({"convert_element_type", "reshape", "transpose", "squeeze", "slice", "dynamic_slice",
                        "copy_p", "sharding_constraint", "reduce_precision"})
# Integer scalar operations evaluated when their operands are known while tracing (a loop bound computed from
# an argument of a nested jit).
_SCALAR_OPS: dict[str, Callable[..., int]] = {
    "convert_element_type": lambda x: x, "add": operator.add, "sub": operator.sub, "mul": operator.mul,
    "max": max, "min": min, "neg": operator.neg}
_COMPARISONS = {"lt": (0, 1, 0), "le": (0, 1, 1), "gt": (1, 0, 0), "ge": (1, 0, 1)}  # (counter, bound, +1)


@dataclasses.dataclass(frozen=True)
class _Scope:
    """What is known of a jaxpr's variables: integer scalars' values, inputs' shard counts, and over how many
    devices every other array is spread (below 1 in a `shard_map` body counted as the total)."""

    known: Mapping[Any, int]
    shards: Mapping[Any, float]
    spread: float

    def divisor(self, atom) -> float:
        return self.shards.get(atom, self.spread) if isinstance(atom, core.Var) else self.spread


def _open(jaxpr: core.Jaxpr | core.ClosedJaxpr) -> core.Jaxpr:
    return jaxpr.jaxpr if isinstance(jaxpr, core.ClosedJaxpr) else jaxpr


def _int_scalar(aval) -> bool:
    return getattr(aval, "shape", None) == () and np.issubdtype(aval.dtype, np.integer)


def _consts(jaxpr: core.Jaxpr | core.ClosedJaxpr) -> dict[Any, int]:
    """The integer scalars a closed jaxpr closes over."""
    if not isinstance(jaxpr, core.ClosedJaxpr):
        return {}
    return {v: int(c) for v, c in zip(jaxpr.jaxpr.constvars, jaxpr.consts) if _int_scalar(v.aval)}


def _value(atom, known: Mapping[Any, int]) -> int | None:
    if isinstance(atom, core.Literal):
        return int(atom.val) if _int_scalar(atom.aval) else None
    return known.get(atom)


def _evaluate(eqn, known: dict[Any, int]) -> None:
    """Adds the value of `eqn`'s output to `known` where it is an integer scalar op of known operands."""
    name = eqn.primitive.name
    if name in _SCALAR_OPS and _int_scalar(eqn.outvars[0].aval):
        values = [_value(x, known) for x in eqn.invars]
        if None not in values:
            known[eqn.outvars[0]] = int(_SCALAR_OPS[name](*values))


def _nbytes(aval) -> int:
    return math.prod(aval.shape) * aval.dtype.itemsize


def _dot_cost(eqn, scope: _Scope) -> MatmulCost:
    lhs, rhs = eqn.invars
    (out,) = eqn.outvars
    (contracting, _), _ = eqn.params["dimension_numbers"]
    contracted = math.prod(lhs.aval.shape[d] for d in contracting)
    flops = 2.0 * math.prod(out.aval.shape) * contracted
    return MatmulCost(flops / scope.spread, sum(_nbytes(x.aval) / scope.divisor(x) for x in (lhs, rhs, out)))


def _jaxprs(value) -> list[core.Jaxpr | core.ClosedJaxpr]:
    """The jaxprs in an equation parameter (a jaxpr, a closed one, or a tuple of them)."""
    if isinstance(value, (core.ClosedJaxpr, core.Jaxpr)):
        return [value]
    if isinstance(value, (tuple, list)):
        return [j for v in value for j in _jaxprs(v)]
    return []


def _inner(sub: core.Jaxpr | core.ClosedJaxpr, operands: Sequence, scope: _Scope, spread: float | None = None,
           shards: bool = True) -> _Scope:
    """The scope of `sub` whose inputs are `operands` of the outer scope (None: nothing known of that input)."""
    pairs = [(v, x) for v, x in zip(_open(sub).invars, operands) if x is not None]
    known = {v: k for v, x in pairs if (k := _value(x, scope.known)) is not None}
    inner = {v: scope.shards[x] for v, x in pairs if shards and isinstance(x, core.Var) and x in scope.shards}
    return _Scope(_consts(sub) | known, inner, scope.spread if spread is None else spread)


def _invariant(eqn) -> list[bool]:
    """Per carried value of a `while`: whether its body passes it on unchanged."""
    body = _open(eqn.params["body_jaxpr"])
    carried = body.invars[eqn.params["body_nconsts"]:]
    return [out is v for out, v in zip(body.outvars, carried)]


def _while_operands(eqn, part: str) -> list:
    """The operands of a `while`'s cond or body jaxpr ("cond", "body"): its consts, then the carried values
    that the body leaves unchanged (the others are None)."""
    cond_n, body_n = eqn.params["cond_nconsts"], eqn.params["body_nconsts"]
    consts = eqn.invars[:cond_n] if part == "cond" else eqn.invars[cond_n:cond_n + body_n]
    init = eqn.invars[cond_n + body_n:]
    return list(consts) + [x if same else None for x, same in zip(init, _invariant(eqn))]


def _producers(jaxpr: core.Jaxpr) -> dict[Any, Any]:
    return {out: e for e in jaxpr.eqns for out in e.outvars}


def _step(eqn, position: int) -> int | None:
    """How much a `while` body adds to its carried value `position` each trip, where it adds a literal."""
    body = _open(eqn.params["body_jaxpr"])
    start = body.invars[eqn.params["body_nconsts"] + position]
    made = _producers(body).get(body.outvars[position])
    if made is None or made.primitive.name != "add":
        return None
    a, b = made.invars
    other = b if a is start else a if b is start else None
    return None if other is None else _value(other, _consts(eqn.params["body_jaxpr"]))


def _counter_bound(eqn, compare, known: Mapping[Any, int], scope: _Scope) -> int | None:
    """The trips a comparison of a `while`'s cond allows, if it compares a counter (a carried value the body
    steps by a literal from a known start) against a known bound."""
    counter_at, bound_at, inclusive = _COMPARISONS[compare.primitive.name]
    cond = _open(eqn.params["cond_jaxpr"])
    counter, limit = compare.invars[counter_at], compare.invars[bound_at]
    carried = cond.invars[eqn.params["cond_nconsts"]:]
    if counter not in carried or (upper := _value(limit, known)) is None:
        return None
    position = carried.index(counter)
    start = _value(eqn.invars[eqn.params["cond_nconsts"] + eqn.params["body_nconsts"] + position], scope.known)
    step = _step(eqn, position)
    if start is None or step is None or step <= 0:
        return None
    return max(0, -(-(upper + inclusive - start) // step))


def _loop(eqn, scope: _Scope) -> Loop:
    """The `Loop` of a `while` equation: where it was written and what its condition bounds."""
    cond = eqn.params["cond_jaxpr"]
    known = dict(_inner(cond, _while_operands(eqn, "cond"), scope).known)
    for test in _open(cond).eqns:
        _evaluate(test, known)
    made = _producers(_open(cond))
    pending, bounds, exact = list(_open(cond).outvars), [], True
    while pending:
        test = made.get(pending.pop())
        if test is not None and test.primitive.name in ("and", "convert_element_type"):  # conjuncts, as bools
            pending += test.invars
            continue
        bound = (_counter_bound(eqn, test, known, scope)
                 if test is not None and test.primitive.name in _COMPARISONS else None)
        exact &= bound is not None
        bounds += [] if bound is None else [bound]
    where = summarize(eqn.source_info)
    return Loop(_loop_name(where), where, min(bounds) if bounds else None, exact and bool(bounds))


def _loop_name(where: str) -> str:
    """"module.function" of a source line "path/module.py:line:column (function)" (a closure's own name)."""
    found = re.match(r"(?P<file>.*?):\d+(?::\d+)? \((?P<function>.*)\)$", where)
    if found is None:
        return where
    return f"{found['file'].rsplit('/', 1)[-1].removesuffix('.py')}.{found['function'].split('>.')[-1]}"


def _kernel_estimate(eqn, body: ProgramCost, spread: float) -> MatmulCost:
    """A Pallas kernel without a cost estimate: its body's matmuls and its blocks, once per grid step."""
    grid = eqn.params["grid_mapping"].grid
    if not all(isinstance(n, int) for n in grid):
        return MatmulCost()
    blocks = sum(_nbytes(b.ref_aval) for b in eqn.params["grid_mapping"].block_mappings)
    return MatmulCost(body.cost.flops, blocks / spread) * math.prod(grid)


@dataclasses.dataclass(frozen=True)
class _Counter:
    """`program_cost`'s walk over a jaxpr and its nested jaxprs, with the caller's loop hints."""

    hints: Trips | None
    while_trips: float

    def count(self, jaxpr: core.Jaxpr | core.ClosedJaxpr, scope: _Scope) -> ProgramCost:
        total, known, shards = ProgramCost(), dict(scope.known), dict(scope.shards)
        for eqn in _open(jaxpr).eqns:
            here = _Scope(known, shards, scope.spread)
            total += self._equation(eqn, here)
            _evaluate(eqn, known)
            source = eqn.invars[0] if eqn.invars else None
            if eqn.primitive.name in _SAME_DATA and isinstance(source, core.Var) and source in shards:
                shards[eqn.outvars[0]] = shards[source]
        return total

    def _trips(self, loop: Loop) -> tuple[float, bool]:
        """(the trips to count a loop for, whether they are `while_trips` for want of a better figure)."""
        hint = self.hints(loop) if callable(self.hints) else (self.hints or {}).get(loop.name)
        if hint is not None:
            return hint, False
        return (loop.bound, False) if loop.exact else (self.while_trips, True)

    def _equation(self, eqn, scope: _Scope) -> ProgramCost:
        name, params = eqn.primitive.name, eqn.params
        if name == "dot_general":
            return ProgramCost(_dot_cost(eqn, scope))
        if name == "scan":
            consts, carry = params["num_consts"], params["num_carry"]
            operands = eqn.invars[:consts] + [None] * carry + eqn.invars[consts + carry:]
            return self.count(params["jaxpr"], _inner(params["jaxpr"], operands, scope)).times(params["length"])
        if name == "while":
            loop = _loop(eqn, scope)
            trips, assumed = self._trips(loop)
            run = sum((self.count(params[f"{part}_jaxpr"], _inner(params[f"{part}_jaxpr"],
                                                                  _while_operands(eqn, part), scope))
                       for part in ("body", "cond")), ProgramCost())
            return run.times(trips) + ProgramCost(assumed_loops=(loop,) if assumed else ())
        if name == "cond":
            runs = [self.count(b, _inner(b, eqn.invars[1:], scope)) for b in params["branches"]]
            return ProgramCost(max((r.cost for r in runs), key=lambda c: c.flops),
                               sum((r.assumed_loops for r in runs), ()),
                               sum((r.undeclared_kernels for r in runs), ()))
        if name == "shard_map":
            devices = math.prod(params["mesh"].shape[a] for a in params["newly_manual_axes"])
            inner = _inner(params["jaxpr"], eqn.invars, scope, spread=scope.spread / devices, shards=False)
            return self.count(params["jaxpr"], inner)
        if name == "pallas_call":
            return self._kernel(eqn, scope)
        # jit, remat, custom derivatives: a jaxpr called on the equation's operands, where their numbers match
        return sum((self.count(sub, _inner(sub, eqn.invars if len(_open(sub).invars) == len(eqn.invars) else (),
                                            scope))
                    for value in params.values() for sub in _jaxprs(value)), ProgramCost())

    def _kernel(self, eqn, scope: _Scope) -> ProgramCost:
        """A Pallas kernel: its declared cost estimate, else one from its grid (and it is named)."""
        declared = eqn.params["cost_estimate"]
        if declared is not None:
            return ProgramCost(MatmulCost(declared.flops, declared.bytes_accessed) * (1 / scope.spread))
        body = self.count(eqn.params["jaxpr"], _Scope({}, {}, scope.spread))
        return ProgramCost(_kernel_estimate(eqn, body, scope.spread), body.assumed_loops,
                           body.undeclared_kernels + (eqn.params["name"],))
