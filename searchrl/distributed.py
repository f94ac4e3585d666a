"""Multi-process JAX: start-up from the config or the cluster environment, and global batches from each
process's rows.

Every process runs the same program on its own devices; arrays are global (`jax.Array` spanning all processes'
devices). A process only ever holds its share of a batch: `local_rows` says which global rows that is, and
`host_local_batch_to_global` assembles the global array from every process's share without any copy to a
single host.
"""
from __future__ import annotations

import json
import os
from typing import Any, Iterator, Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from searchrl.models.config import DistributedConfig
from searchrl.models.sharding import TRAIN_RULES
from searchrl.shapes import padded_batch


def initialize(dist: DistributedConfig) -> None:
    """JAX's runtime as `config.distributed` says: the GPU memory share (`set_memory_fraction`), then
    `jax.distributed.initialize` (a no-op when disabled or already done).

    With `coordinator_address` set, `num_processes` and `process_id` must be too; with it empty, JAX detects
    the cluster (SLURM, TPU pods, Open MPI, Kubernetes). Must run before anything touches a device.
    """
    set_memory_fraction(dist.memory_fraction)
    if not dist.enabled or jax.distributed.is_initialized():
        return
    # Cross-process collectives between CPU devices (tests, CPU clusters); accelerators ignore it.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if not dist.coordinator_address:
        jax.distributed.initialize()
        return
    if dist.num_processes < 1 or not 0 <= dist.process_id < dist.num_processes:
        raise ValueError(f"config.distributed: coordinator_address={dist.coordinator_address!r} needs "
                         f"num_processes >= 1 and 0 <= process_id < num_processes, got "
                         f"num_processes={dist.num_processes}, process_id={dist.process_id}")
    jax.distributed.initialize(dist.coordinator_address, dist.num_processes, dist.process_id)


def set_memory_fraction(fraction: float) -> None:
    """Has JAX preallocate `fraction` of each GPU's memory (XLA_PYTHON_CLIENT_MEM_FRACTION, read when the
    GPU backend starts: so before anything touches a device); 0 keeps JAX's default (0.75). A value already
    in the environment wins: the user's own setting. (`DistributedConfig` holds `fraction` in [0, 1).)"""
    if fraction:
        os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", str(fraction))


def _row_sharding(mesh: Mesh, spec: PartitionSpec | None) -> NamedSharding:
    """Rows sharded over the training rules' batch axes (those in `mesh`) unless `spec` says otherwise."""
    if spec is None:
        spec = PartitionSpec(tuple(a for a in TRAIN_RULES.mesh_axes("batch") if a in mesh.shape))
    return NamedSharding(mesh, spec)


def _row_blocks(sharding: NamedSharding) -> tuple[int, list[int]]:
    """(number of row blocks, the blocks this process's devices hold, sorted)."""
    axes = sharding.spec[0] if len(sharding.spec) else None
    axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    blocks = int(np.prod([sharding.mesh.shape[a] for a in axes]))
    index = sharding.addressable_devices_indices_map((blocks,))
    return blocks, sorted({idx[0].indices(blocks)[0] for idx in index.values()})


def local_rows(mesh: Mesh, num_rows: int, spec: PartitionSpec | None = None) -> slice:
    """The global rows [start, stop) of a `num_rows` batch that this process feeds."""
    blocks, mine = _row_blocks(_row_sharding(mesh, spec))
    if num_rows % blocks:
        raise ValueError(f"a batch of {num_rows} rows does not split into the mesh's {blocks} row blocks")
    if mine != list(range(mine[0], mine[0] + len(mine))):
        raise ValueError(f"process {jax.process_index()} holds non-adjacent row blocks {mine} of this mesh")
    size = num_rows // blocks
    return slice(mine[0] * size, (mine[-1] + 1) * size)


def row_blocks(mesh: Mesh, spec: PartitionSpec | None = None) -> int:
    """How many row blocks a batch splits into on `mesh` (a batch's rows must be a multiple of it)."""
    return _row_blocks(_row_sharding(mesh, spec))[0]


def local_batches(examples: Sequence[Any], batch_rows: int, rows: slice
                  ) -> Iterator[tuple[list[Any], int, int]]:
    """`examples` in batches of `batch_rows` (the last one padded: `padded_batch`), as this process rolls
    them out: its `rows` of each batch (`local_rows`), how many of those are real examples (the rest is
    padding, at the end) and the global index of its first row (which its sampling keys are folded from)."""
    for start in range(0, len(examples), batch_rows):
        mine = padded_batch(examples[start:start + batch_rows], batch_rows)[rows]
        real = min(max(len(examples) - start - rows.start, 0), len(mine))
        yield mine, real, start + rows.start


def host_local_batch_to_global(mesh: Mesh, arrays, spec: PartitionSpec | None = None):
    """Global arrays from every process's rows (a pytree of numpy arrays, rows first; see `local_rows`).

    Arrays are sharded along rows by `spec` (default: the batch axes of the training rules); scalars are
    replicated and must be equal on every process.
    """
    sharding = _row_sharding(mesh, spec)
    blocks, mine = _row_blocks(sharding)

    def to_global(x):
        x = np.asarray(x)
        if x.ndim == 0:
            return jax.make_array_from_process_local_data(NamedSharding(mesh, PartitionSpec()), x, x.shape)
        if x.shape[0] % len(mine):
            raise ValueError(f"{x.shape[0]} local rows do not split over this process's "
                             f"{len(mine)} row blocks")
        global_shape = (x.shape[0] // len(mine) * blocks,) + x.shape[1:]
        return jax.make_array_from_process_local_data(sharding, x, global_shape)

    return jax.tree.map(to_global, arrays)


def all_processes(value: Any) -> list[Any]:
    """Every process's `value` (JSON-serialisable: numbers, strings, lists, dicts), in process order.

    All processes must call it at the same point. On one process it is `[value]`, without touching a device.
    """
    if jax.process_count() == 1:
        return [value]
    data = np.frombuffer(json.dumps(value).encode(), np.uint8)
    sizes = multihost_utils.process_allgather(np.int32(data.size))
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[:data.size] = data
    gathered = multihost_utils.process_allgather(padded)
    return [json.loads(bytes(row[:size])) for row, size in zip(gathered, sizes)]
