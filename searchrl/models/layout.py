"""The parameter layout of the decoder, read from its Flax module: every leaf's shape and logical axis names,
and the shardings they give under a rule set.

Initialisation, sharding and the HF import/export all read this layout rather than restating shapes; it comes
from `Decoder`'s own `nn.with_logical_partitioning` annotations (layers stacked on a leading "layers" axis).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import flax.linen as nn
import jax
from jax.sharding import Mesh

from searchrl.models.config import ModelConfig
from searchrl.models.decoder import abstract_params
from searchrl.models.sharding import TRAIN_RULES, ShardingRules, logical_to_sharding


class ParamSpec(NamedTuple):
    """Shape of one parameter and the logical name of each of its axes (None: never sharded)."""

    shape: tuple[int, ...]
    axes: tuple[str | None, ...]


def _is_spec(x) -> bool:
    return isinstance(x, ParamSpec)


@functools.lru_cache(maxsize=None)
def param_layout(cfg: ModelConfig, *, value: bool = False) -> dict:
    """Pytree of `ParamSpec` mirroring the params; `value=True`: the value model (value head, no lm_head)."""
    return jax.tree.map(lambda box: ParamSpec(tuple(box.value.shape), tuple(box.names)),
                        abstract_params(cfg, value=value), is_leaf=lambda x: isinstance(x, nn.Partitioned))


def param_logical_axes(cfg: ModelConfig, *, value: bool = False) -> dict:
    """Pytree of logical axis-name tuples mirroring the params (`value=True`: the value model's)."""
    return jax.tree.map(lambda s: s.axes, param_layout(cfg, value=value), is_leaf=_is_spec)


def param_shardings(cfg: ModelConfig, mesh: Mesh, rules: ShardingRules = TRAIN_RULES, *,
                    value: bool = False) -> dict:
    """Pytree of NamedSharding mirroring the params, for jit in_shardings/out_shardings and `load_hf`."""
    return jax.tree.map(lambda s: logical_to_sharding(s.axes, mesh, rules, s.shape),
                        param_layout(cfg, value=value), is_leaf=_is_spec)
