"""The matrix-multiply work of a traced program, counted on its jaxpr with every loop's trip count.

XLA's cost analysis of a compiled program counts the body of a loop once, whatever its trip count: for a model
whose layers run under `lax.scan` (and a PPO step that loops over micro-batches, minibatches and epochs) it
undercounts by orders of magnitude. Here a `scan` counts `length` times its body, a `while` `while_trips`
times (its trip count is data-dependent: the caller says what one run means, e.g. one decode step), a `cond`
its most expensive branch, and every other nested jaxpr (jit, remat, custom derivatives) once.

Only `dot_general` is counted: FLOPs 2 x (output elements) x (contracted size), and bytes its operands and
output occupy (each read or written at least once: a lower bound on the HBM traffic of a matmul-bound
program). Elementwise work is left out; it is small next to a transformer's matmuls.
"""
from __future__ import annotations

import dataclasses
import math

from jax.extend import core


@dataclasses.dataclass(frozen=True)
class MatmulCost:
    flops: float = 0.0
    bytes: float = 0.0

    def __add__(self, other: MatmulCost) -> MatmulCost:
        return MatmulCost(self.flops + other.flops, self.bytes + other.bytes)

    def __mul__(self, times: float) -> MatmulCost:
        return MatmulCost(self.flops * times, self.bytes * times)


def _nbytes(aval) -> int:
    return math.prod(aval.shape) * aval.dtype.itemsize


def _dot_cost(eqn) -> MatmulCost:
    lhs, rhs = (v.aval for v in eqn.invars)
    (out,) = (v.aval for v in eqn.outvars)
    (contracting, _), _ = eqn.params["dimension_numbers"]
    contracted = math.prod(lhs.shape[d] for d in contracting)
    return MatmulCost(2.0 * math.prod(out.shape) * contracted, _nbytes(lhs) + _nbytes(rhs) + _nbytes(out))


def _jaxprs(value) -> list[core.Jaxpr]:
    """The jaxprs in an equation parameter (a jaxpr, a closed one, or a tuple of them)."""
    if isinstance(value, core.ClosedJaxpr):
        return [value.jaxpr]
    if isinstance(value, core.Jaxpr):
        return [value]
    if isinstance(value, (tuple, list)):
        return [j for v in value for j in _jaxprs(v)]
    return []


def matmul_cost(jaxpr: core.Jaxpr | core.ClosedJaxpr, while_trips: int = 1) -> MatmulCost:
    """The FLOPs and bytes of every `dot_general` that running `jaxpr` once executes (module docstring)."""
    jaxpr = jaxpr.jaxpr if isinstance(jaxpr, core.ClosedJaxpr) else jaxpr
    total = MatmulCost()
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "dot_general":
            total += _dot_cost(eqn)
        elif name == "scan":
            total += matmul_cost(eqn.params["jaxpr"], while_trips) * eqn.params["length"]
        elif name == "while":
            body = matmul_cost(eqn.params["body_jaxpr"], while_trips)
            total += (body + matmul_cost(eqn.params["cond_jaxpr"], while_trips)) * while_trips
        elif name == "cond":
            total += max((matmul_cost(b, while_trips) for b in eqn.params["branches"]), key=lambda c: c.flops)
        else:
            for value in eqn.params.values():
                for sub in _jaxprs(value):
                    total += matmul_cost(sub, while_trips)
    return total

