"""The copies a compiled program makes: the bytes each `copy` and `dynamic-slice` writes (on its own or as
the root of a fusion), read from the program's optimised HLO text.

A decode step that reads a layer's weights or its keys and values in place makes no copy of them; one that
slices them out of a stacked array first writes them again, every step (what the paged cache and the unrolled
decode avoid: `searchrl.models.kv_cache`). `largest_copies` lists the biggest, for a test to hold against one
layer's size. A copy inside a loop body (a decode chunk's steps) is made every step; one outside, once a call.
"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, NamedTuple

import jax

_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
          "s64": 8, "u64": 8, "f64": 8}
_COPYING = ("copy", "dynamic-slice")
# `%name = TYPE[dims]{layout} opcode(` (an instruction; ROOT before the name for a computation's result)
_INSTRUCTION = re.compile(r"^\s*(ROOT\s+)?%(\S+)\s*=\s*(\w+)\[([\d,]*)\]\S*\s+([\w-]+)\(")
_COMPUTATION = re.compile(r"^\s*%(\S+)\s*\(.*\{\s*$")
_CALLS = re.compile(r"calls=%([\w.\-]+)")
_CALLED = re.compile(r"(?:calls|to_apply|body|condition)=%([\w.\-]+)|branch_computations=\{([^}]*)\}")
_LOOP_BODY = re.compile(r"\bbody=%([\w.\-]+)")


class Copy(NamedTuple):
    """One instruction that writes a copy: its name, opcode (or "fusion:<root opcode>"), output bytes,
    dimensions, and whether it runs in a loop's body (every iteration)."""

    name: str
    kind: str
    bytes: int
    shape: tuple[int, ...]
    in_loop: bool = False


def _roots(hlo: str) -> dict[str, str]:
    """Each computation's root opcode."""
    roots, current = {}, None
    for line in hlo.splitlines():
        if (head := _COMPUTATION.match(line)) is not None:
            current = head.group(1)
        elif (inst := _INSTRUCTION.match(line)) is not None and inst.group(1) and current is not None:
            roots[current] = inst.group(5)
    return roots


def _in_loops(hlo: str) -> set[str]:
    """The computations a `while` loop's body runs (its body and whatever that calls, transitively)."""
    calls, current, bodies = {}, None, set()
    for line in hlo.splitlines():
        if (head := _COMPUTATION.match(line)) is not None:
            current = head.group(1)
            continue
        for single, branches in _CALLED.findall(line):
            names = [single] if single else [b.strip().lstrip("%") for b in branches.split(",")]
            calls.setdefault(current, set()).update(names)
        bodies.update(_LOOP_BODY.findall(line))
    reached, todo = set(), list(bodies)
    while todo:
        if (name := todo.pop()) not in reached:
            reached.add(name)
            todo += calls.get(name, ())
    return reached


def copies(hlo: str) -> list[Copy]:
    """Every copy in a compiled program's HLO text (`compiled.as_text()`): `copy` and `dynamic-slice`
    instructions outside fusions, and fusions whose root is one, with the bytes of their outputs and the
    dimensions written."""
    roots, looped, found, inside = _roots(hlo), _in_loops(hlo), [], None
    fused = set(_CALLS.findall("\n".join(line for line in hlo.splitlines() if " fusion(" in line)))
    for line in hlo.splitlines():
        if (head := _COMPUTATION.match(line)) is not None:
            inside = head.group(1)
            continue
        inst = _INSTRUCTION.match(line)
        if inst is None or inside in fused:
            continue
        _, name, dtype, dims, opcode = inst.groups()
        shape = tuple(int(d) for d in dims.split(",") if d)
        size = _BYTES.get(dtype, 4) * math.prod(shape)
        if opcode in _COPYING:
            found.append(Copy(name, opcode, size, shape, inside in looped))
        elif opcode == "fusion" and (called := _CALLS.search(line)) is not None:
            if (root := roots.get(called.group(1))) in _COPYING:
                found.append(Copy(name, f"fusion:{root}", size, shape, inside in looped))
    return found


def largest_copies(hlo: str, n: int = 5) -> list[Copy]:
    """The `n` biggest copies of a compiled program, biggest first."""
    return sorted(copies(hlo), key=lambda c: -c.bytes)[:n]


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def copies_of(hlo: str, shapes: list[tuple[int, ...]]) -> list[Copy]:
    """The copies of a compiled program that write an array of one of `shapes` (sizes of 1 ignored: a slice
    keeps its stacked axis): e.g. a layer's weights or its keys and values, per device."""
    wanted = {_squeezed(s) for s in shapes}
    return [c for c in copies(hlo) if _squeezed(c.shape) in wanted]


def decode_program(config: Any, devices: list[jax.Device], mesh_sizes: tuple[int, int, int]
                   ) -> tuple[str, list[tuple[int, ...]], int]:
    """(compiled HLO of a run config's decode chunk on a (data, fsdp, tensor) mesh of `devices`, the
    per-device shapes of one layer's weights and pools, that layer's bytes per device)."""
    from searchrl import models, run_config  # noqa: PLC0415
    from searchrl.benchmarks import aot  # noqa: PLC0415
    config = run_config.parse(config)
    cfg = models.config_from_source(dataclasses.replace(config.model, path=""))
    mesh = models.make_mesh(*mesh_sizes, devices=devices)
    fn, args = aot.rollout_inputs(config, cfg, mesh)["decode"]
    with jax.set_mesh(mesh):
        hlo = fn.trace(*args).lower().compile(aot.compiler_options(mesh)).as_text()
    params, pool = args[1], args[2]
    layer = jax.tree.leaves(params["layers_0"]) + [pool.k[0], pool.v[0]]
    shapes = [x.sharding.shard_shape(x.shape) for x in layer]
    size = sum(x.dtype.itemsize * math.prod(s) for x, s in zip(layer, shapes))
    return hlo, shapes, size


def layer_copies(hlo: str, shapes: list[tuple[int, ...]], layer_bytes: int) -> list[str]:
    """What keeps a decode program from reading its layers in place: copies of a layer's weights or pools
    in its loop body (every step), or copies in all of at least one layer's bytes. Empty when it does."""
    found = [f"{c.name} ({c.kind}, {c.shape}) copies a layer's array every step"
             for c in copies_of(hlo, shapes) if c.in_loop]
    if (total := sum(c.bytes for c in copies(hlo))) >= layer_bytes:
        found.append(f"its copies write {total} bytes a call, not less than one layer's {layer_bytes}")
    return found
