"""Device mesh and logical-axis sharding rules for the decoder.

Arrays name their axes logically (`batch`, `embed`, `heads`, ...); a `ShardingRules` table (Flax's logical
axis rules) maps each name to mesh axes (`data`, `fsdp`, `tensor`). Training uses FSDP + tensor parallelism,
sampling keeps weights whole across the data axes. A mesh axis shards at most one dimension of an array, as
`nn.logical_to_mesh_axes` assigns them; unlike `nn.logical_to_mesh_sharding`, mesh axes of size 1 are left
out and a dimension that a mesh axis does not divide evenly is left unsharded along it, so tiny test models
run on any mesh.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from searchrl.models.config import AttentionConfig, MeshConfig

MESH_AXES = ("data", "fsdp", "tensor")
LOGICAL_AXES = ("batch", "length", "embed", "heads", "kv_heads", "head_dim", "mlp", "vocab", "layers")

MeshAxes = str | tuple[str, ...] | None


@dataclasses.dataclass(frozen=True)
class ShardingRules:
    """Logical axis name -> mesh axis, tuple of mesh axes, or None (replicated)."""

    rules: tuple[tuple[str, MeshAxes], ...]

    def __post_init__(self):
        unknown = {name for name, _ in self.rules} - set(LOGICAL_AXES)
        if unknown:
            raise ValueError(f"unknown logical axes {sorted(unknown)}; known: {LOGICAL_AXES}")

    def mesh_axes(self, name: str) -> tuple[str, ...]:
        """The mesh axes that logical axis `name` is sharded over, in order."""
        table = dict(self.rules)
        if name not in table:
            raise ValueError(f"logical axis {name!r} has no rule in {sorted(table)}")
        axes = table[name]
        return () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)


# Training: batch over data x fsdp, weights sharded over fsdp (on `embed`) and tensor (heads / mlp / vocab).
TRAIN_RULES = ShardingRules((
    ("batch", ("data", "fsdp")), ("length", None), ("embed", "fsdp"), ("heads", "tensor"),
    ("kv_heads", "tensor"), ("head_dim", None), ("mlp", "tensor"), ("vocab", "tensor"), ("layers", None),
))
# Sampling: weights whole on every data/fsdp replica (no per-token gathers), tensor parallel only.
SAMPLE_RULES = ShardingRules((
    ("batch", ("data", "fsdp")), ("length", None), ("embed", None), ("heads", "tensor"),
    ("kv_heads", "tensor"), ("head_dim", None), ("mlp", "tensor"), ("vocab", "tensor"), ("layers", None),
))


RULES = {"train": TRAIN_RULES, "sample": SAMPLE_RULES}  # named in `MeshConfig`


def rules_named(name: str) -> ShardingRules:
    if name not in RULES:
        raise ValueError(f"Unknown sharding rules {name!r}; known: {sorted(RULES)}")
    return RULES[name]


def mesh_of(config: MeshConfig) -> Mesh:
    """The mesh `config.mesh` asks for, over every device."""
    return make_mesh(config.data, config.fsdp, config.tensor)


class Compute(NamedTuple):
    """How a model pass computes: its activations laid out under a mesh by `rules` (a `MeshConfig`'s train or
    sample rules) and its attention computed by `attention` (`MeshConfig.attention`). A static argument: one
    compiled program per value."""

    rules: ShardingRules
    attention: AttentionConfig

    def with_attention(self, **changes) -> Compute:
        """The same layout, its attention with `changes` (`AttentionConfig`'s fields)."""
        return self._replace(attention=dataclasses.replace(self.attention, **changes))


class Placement(NamedTuple):
    """Where and how a policy computes, as a run's `config.mesh` says (`placement_of`, built once): the device
    mesh (None: the default device, unsharded), and how training and sampling compute on it: their layouts
    (`MeshConfig.train_rules`, `sample_rules`), both with the attention of `MeshConfig.attention`."""

    mesh: Mesh | None
    train: Compute
    sample: Compute

    @classmethod
    def of(cls, config: MeshConfig, mesh: Mesh | None = None) -> Placement:
        """The layouts and attention `config` names, on `mesh` (None: the default device), whatever mesh
        `config` itself sizes: a program traced or run on another mesh than the run's."""
        return cls(mesh, Compute(rules_named(config.train_rules), config.attention),
                   Compute(rules_named(config.sample_rules), config.attention))

    @classmethod
    def default(cls, mesh: Mesh | None = None, attention: AttentionConfig = AttentionConfig()) -> Placement:
        """The default layouts (`TRAIN_RULES`, `SAMPLE_RULES`: `MeshConfig`'s) and `attention` on `mesh`
        (None: the default device)."""
        return cls(mesh, Compute(TRAIN_RULES, attention), Compute(SAMPLE_RULES, attention))

    def on_one_device(self) -> Placement:
        """The same layouts and attention on the default device alone (no mesh)."""
        return self._replace(mesh=None)


def placement_of(config: MeshConfig) -> Placement:
    """The placement `config` describes, on its mesh over every device (`mesh_of`)."""
    return Placement.of(config, mesh_of(config))


def mesh_sizes(data: int, fsdp: int, tensor: int, count: int) -> tuple[int, int, int]:
    """The (data, fsdp, tensor) sizes of a mesh over `count` devices, a -1 (at most one) taking the devices
    left over; a ValueError when the sizes do not divide them."""
    sizes = [data, fsdp, tensor]
    if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
        raise ValueError(f"mesh sizes {dict(zip(MESH_AXES, sizes))}: each must be >= 1, at most one -1")
    fixed = math.prod(s for s in sizes if s != -1)
    if count % fixed:
        raise ValueError(f"mesh {dict(zip(MESH_AXES, sizes))} does not divide the {count} devices")
    return tuple(count // fixed if s == -1 else s for s in sizes)


def make_mesh(data: int, fsdp: int, tensor: int, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (data, fsdp, tensor) mesh; one size may be -1 to take the devices left over."""
    devices = list(jax.devices() if devices is None else devices)
    sizes = mesh_sizes(data, fsdp, tensor, len(devices))
    return jax.make_mesh(sizes, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES),
                         devices=devices[:math.prod(sizes)])


def process_mesh(mesh: Mesh) -> Mesh:
    """The block of `mesh` on this process's devices, with the same axes: where a process runs its own work
    (its rows of a rollout). `mesh` itself on one process. Each process's devices must form a block of the
    mesh, as `make_mesh` lays them out (processes along the leading axes)."""
    if jax.process_count() == 1:
        return mesh
    mine = np.vectorize(lambda d: d.process_index == jax.process_index())(mesh.devices)
    box = tuple(slice(int(i.min()), int(i.max()) + 1) for i in np.nonzero(mine))
    if not mine[box].all():
        raise ValueError(f"process {jax.process_index()}'s devices are not a block of the mesh "
                         f"{dict(mesh.shape)}")
    return Mesh(mesh.devices[box], mesh.axis_names, axis_types=mesh.axis_types)


def to_process_mesh(tree, mesh: Mesh):
    """Global arrays whose every value this process holds (sharded only along the axes `mesh` has whole),
    as arrays on this process's block `mesh` (`process_mesh`): the same device buffers, no copy, no
    collective. Arrays already on `mesh` are returned as they are."""
    def local(x: jax.Array) -> jax.Array:
        if x.sharding.mesh == mesh:
            return x
        sharding = NamedSharding(mesh, x.sharding.spec)
        held = x.sharding.addressable_devices_indices_map(x.shape)
        wanted = sharding.addressable_devices_indices_map(x.shape)
        if any(held.get(device) != index for device, index in wanted.items()):
            raise ValueError(f"a {x.shape} array sharded {x.sharding.spec} over "
                             f"{dict(x.sharding.mesh.shape)} has no whole copy on this process's devices "
                             f"{dict(mesh.shape)}")
        shards = {s.device: s.data for s in x.addressable_shards}
        return jax.make_array_from_single_device_arrays(x.shape, sharding,
                                                        [shards[d] for d in mesh.devices.flat])

    return jax.tree.map(local, tree)


def logical_to_spec(axes: Sequence[str | None], rules: ShardingRules, mesh_shape: Mapping[str, int],
                    shape: Sequence[int] | None = None) -> PartitionSpec:
    """PartitionSpec for logical `axes` under Flax's logical axis rules (`nn.logical_to_mesh_axes`), less
    the mesh axes of size 1 and, with `shape`, those that do not divide their dimension evenly."""
    for name in axes:
        if name is not None:
            rules.mesh_axes(name)  # a clear error for a name without a rule
    spec = []
    for dim, mesh_axes in enumerate(nn.logical_to_mesh_axes(tuple(axes), rules.rules)):
        kept: list[str] = []
        for axis in () if mesh_axes is None else (mesh_axes,) if isinstance(mesh_axes, str) else mesh_axes:
            if mesh_shape.get(axis, 1) == 1:
                continue
            if shape is not None and shape[dim] % (math.prod(mesh_shape[a] for a in kept) * mesh_shape[axis]):
                break
            kept.append(axis)
        spec.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
    return PartitionSpec(*spec)


def logical_to_sharding(axes: Sequence[str | None], mesh: Mesh, rules: ShardingRules,
                        shape: Sequence[int] | None = None) -> NamedSharding:
    """NamedSharding on `mesh` for an array with logical `axes` (see `logical_to_spec`)."""
    return NamedSharding(mesh, logical_to_spec(axes, rules, dict(mesh.shape), shape))


def rows_sharding(shape: Sequence[int], mesh: Mesh, rules: ShardingRules) -> NamedSharding:
    """NamedSharding of a [B] or [B, S] array of per-row values (a batch, a rollout's inputs): rows over the
    batch axes of `rules`."""
    return logical_to_sharding(("batch", "length")[:len(shape)], mesh, rules, shape)


def constrain(x: jax.Array, axes: Sequence[str | None], rules: ShardingRules) -> jax.Array:
    """Sharding constraint on an activation when an (Auto-axes) mesh is set with `jax.set_mesh`; else `x`."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or any(t != AxisType.Auto for t in mesh.axis_types):
        return x
    return jax.lax.with_sharding_constraint(x, logical_to_spec(axes, rules, dict(mesh.shape), x.shape))
