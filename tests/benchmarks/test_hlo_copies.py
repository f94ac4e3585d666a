"""A decode step reads each layer's weights and its keys and values in place: its steps (the decode chunk's
loop body) copy none of them, and the whole program copies less than one layer's size (XLA:CPU on the
(2, 2, 2) mesh; for the 3B preset, XLA:TPU on 8 v5p chips with libtpu and XLA:GPU on 8 H100s with JAX's CUDA
plugin, from `make aot-gpu`'s venv where it is built). XLA:TPU lays the query, key and value projections out
anew once a call, before the loop: counted in the total."""
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from searchrl import run_config
from searchrl.benchmarks import aot
from searchrl.benchmarks.hlo_copies import copies, copies_of, decode_program, layer_copies

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


def _check(config, devices, mesh_sizes: tuple[int, int, int]) -> None:
    assert layer_copies(*decode_program(config, devices, mesh_sizes)) == []


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
    _check(search_r1.get_config("tiny"), jax.devices(), (2, 2, 2))


def test_the_3b_decode_step_copies_no_layer_on_tpu():
    config = search_r1.get_config("paper,v5p8")
    mesh = run_config.parse(config).mesh
    devices = aot.topology_devices("v5p:2x2x2", aot.DEFAULT_LIBTPU)
    with jax.default_matmul_precision("default"):  # as a run compiles it (the suite sets "highest": no bf16 dot
        _check(config, devices, (mesh.data, mesh.fsdp, mesh.tensor))  # in the Pallas kernel)


ROOT = pathlib.Path(__file__).resolve().parents[2]
GPU_PYTHON = ROOT / ".venv-gpu" / "bin" / "python"


@pytest.mark.skipif(not GPU_PYTHON.exists(), reason="needs JAX's CUDA plugin: make aot-gpu")
def test_the_3b_decode_step_copies_no_layer_on_gpu():
    """The same check for 8 H100s, run in `make aot-gpu`'s venv (JAX_PLATFORMS=cpu: no driver needed)."""
    check = ("import search_r1\n"
             "from searchrl import run_config\n"
             "from searchrl.benchmarks import aot, hlo_copies\n"
             "config = search_r1.get_config('paper,h100x8')\n"
             "mesh = run_config.parse(config).mesh\n"
             "devices = aot.topology_devices('h100:8', aot.DEFAULT_LIBTPU)\n"
             "found = hlo_copies.layer_copies(*hlo_copies.decode_program(config, devices, (mesh.data, mesh.fsdp, "
             "mesh.tensor)))\n"
             "assert found == [], found\n")
    path = os.pathsep.join(str(p) for p in (ROOT, ROOT / "configs"))
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": path, "XLA_FLAGS": ""}
    done = subprocess.run([str(GPU_PYTHON), "-c", check], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
