"""A decode step reads each layer's weights and its keys and values in place: its compiled program makes no
copy of them, and copies less than one layer's size in all (XLA:CPU, on the (2, 2, 2) mesh). XLA:TPU still
copies each layer's pool around the attention (docs/benchmarks.md), so the TPU compile is not held to it
yet."""
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
    assert copies_of(hlo, shapes) == []
    assert sum(c.bytes for c in copies(hlo)) < layer_bytes


def test_the_tiny_decode_step_copies_no_layer_on_cpu():
    _check(*_decode_program(search_r1.get_config("tiny"), jax.devices(), (2, 2, 2)))
