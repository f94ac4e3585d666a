"""A decode step reads each layer's weights and its keys and values in place: its steps (the decode chunk's
loop body) copy none of them, and the whole program copies less than one layer's size (XLA:CPU on the
(2, 2, 2) mesh, and XLA:TPU for the 3B preset on 8 v5p chips, compiled with libtpu). XLA:TPU lays the query,
key and value projections out anew once a call, before the loop: counted in the total."""
import dataclasses
import math
import os
import sys

import jax
import jax.numpy as jnp

from searchrl import models, run_config
from searchrl.benchmarks import aot
from searchrl.benchmarks.hlo_copies import copies, copies_of

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "configs"))
import search_r1  # noqa: E402


def test_a_weight_sliced_from_a_stack_is_found():
    """The check can fail: a loop that slices each layer's weight out of a stack copies it (XLA:CPU)."""
    layers, width = 4, 128

    def stacked(x, w):
        return jax.lax.fori_loop(0, layers, lambda i, x: jnp.tanh(jnp.einsum("bd,ed->be", x, w[i]) + w[i].sum(0)),
                                 x)

    hlo = jax.jit(stacked).lower(jnp.ones((2, width)), jnp.ones((layers, width, width))).compile().as_text()
    found = copies_of(hlo, [(width, width)])
    assert found and found[0].bytes == 4 * width * width


def _decode_program(config, devices, mesh_sizes) -> tuple[str, list[tuple[int, ...]], int]:
    """(compiled HLO of the config's decode chunk on a mesh of `devices`, the per-device shapes of one
    layer's weights and pools, that layer's bytes per device)."""
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


def _check(hlo: str, shapes: list[tuple[int, ...]], layer_bytes: int) -> None:
    assert [c for c in copies_of(hlo, shapes) if c.in_loop] == []
    assert sum(c.bytes for c in copies(hlo)) < layer_bytes


def test_copies_in_a_loop_body_are_told_from_those_before_it():
    """A copy in a while loop's body, or in a fusion it calls, runs every iteration; one in the entry
    computation once a call."""
    hlo = """HloModule m

%fused_slice (p: f32[4,8,8], i: s32[]) -> f32[1,8,8] {
  %p = f32[4,8,8]{2,1,0} parameter(0)
  %i = s32[] parameter(1)
  %z = s32[] constant(0)
  ROOT %ds = f32[1,8,8]{2,1,0} dynamic-slice(%p, %i, %z, %z), dynamic_slice_sizes={1,8,8}
}

%body (t: (s32[], f32[4,8,8])) -> (s32[], f32[4,8,8]) {
  %t = (s32[], f32[4,8,8]) parameter(0)
  %w = f32[4,8,8]{2,1,0} get-tuple-element(%t), index=1
  %i = s32[] get-tuple-element(%t), index=0
  %layer = f32[1,8,8]{2,1,0} fusion(%w, %i), kind=kLoop, calls=%fused_slice
  %again = f32[8,8]{1,0} copy(%w)
  ROOT %out = (s32[], f32[4,8,8]) tuple(%i, %w)
}

%cond (t: (s32[], f32[4,8,8])) -> pred[] {
  %t = (s32[], f32[4,8,8]) parameter(0)
  ROOT %c = pred[] constant(true)
}

ENTRY %main (w: f32[4,8,8]) -> (s32[], f32[4,8,8]) {
  %w = f32[4,8,8]{2,1,0} parameter(0)
  %laid_out = f32[4,8,8]{1,2,0} copy(%w)
  %z = s32[] constant(0)
  %t = (s32[], f32[4,8,8]) tuple(%z, %laid_out)
  ROOT %loop = (s32[], f32[4,8,8]) while(%t), condition=%cond, body=%body
}
"""
    found = {c.name: c for c in copies(hlo)}
    assert found["layer"].kind == "fusion:dynamic-slice" and found["layer"].in_loop
    assert found["again"].in_loop and found["again"].bytes == 4 * 64
    assert not found["laid_out"].in_loop and found["laid_out"].bytes == 4 * 256


def test_the_tiny_decode_step_copies_no_layer_on_cpu():
    _check(*_decode_program(search_r1.get_config("tiny"), jax.devices(), (2, 2, 2)))


def test_the_3b_decode_step_copies_no_layer_on_tpu():
    config = search_r1.get_config("paper,v5p8")
    mesh = run_config.parse(config).mesh
    devices = aot.topology_devices("v5p:2x2x2", aot.DEFAULT_LIBTPU)
    with jax.default_matmul_precision("default"):  # as a run compiles it (the suite sets "highest": no bf16 dot
        _check(*_decode_program(config, devices, (mesh.data, mesh.fsdp, mesh.tensor)))  # in the Pallas kernel)
