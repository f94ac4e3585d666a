"""Hugging Face checkpoints (config.json + safetensors) to and from the stacked searchrl layout.

Loading streams one tensor slice at a time through `safetensors.safe_open`; given target shardings, each
parameter is assembled with `jax.make_array_from_callback`, so a process reads only the slices its devices
own.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from safetensors import safe_open
from safetensors.numpy import save_file

from searchrl.models.config import ModelConfig, read_hf_config, to_hf_config
from searchrl.models.layout import ParamSpec, param_layout

_INDEX = "model.safetensors.index.json"


class _HFTensor(NamedTuple):
    """How one of our (per-layer) params is stored by HF.

    The HF tensor, reshaped to `view` (each HF axis split into the view axes listed in `groups`) and
    transposed by `perm`, is our array: ours = hf.reshape(view).transpose(perm).
    """

    name: str
    perm: tuple[int, ...] = (0,)
    groups: tuple[tuple[int, ...], ...] = ((0,),)


_PROJ_IN = dict(perm=(2, 0, 1), groups=((0, 1), (2,)))  # HF [N*hd, D] -> ours [D, N, hd]
_BIAS = dict(perm=(0, 1), groups=((0, 1),))  # HF [N*hd] -> ours [N, hd]
_T = dict(perm=(1, 0), groups=((0,), (1,)))  # transpose
_LAYER = {
    "attn_norm": _HFTensor("input_layernorm.weight"),
    "q": _HFTensor("self_attn.q_proj.weight", **_PROJ_IN),
    "k": _HFTensor("self_attn.k_proj.weight", **_PROJ_IN),
    "v": _HFTensor("self_attn.v_proj.weight", **_PROJ_IN),
    "q_bias": _HFTensor("self_attn.q_proj.bias", **_BIAS),
    "k_bias": _HFTensor("self_attn.k_proj.bias", **_BIAS),
    "v_bias": _HFTensor("self_attn.v_proj.bias", **_BIAS),
    "q_norm": _HFTensor("self_attn.q_norm.weight"),
    "k_norm": _HFTensor("self_attn.k_norm.weight"),
    # HF [D, H*hd] -> ours [H, hd, D]
    "o": _HFTensor("self_attn.o_proj.weight", perm=(1, 2, 0), groups=((0,), (1, 2))),
    "o_bias": _HFTensor("self_attn.o_proj.bias"),
    "mlp_norm": _HFTensor("post_attention_layernorm.weight"),
    "gate": _HFTensor("mlp.gate_proj.weight", **_T),
    "up": _HFTensor("mlp.up_proj.weight", **_T),
    "down": _HFTensor("mlp.down_proj.weight", **_T),
}
_TOP = {
    "embed": _HFTensor("model.embed_tokens.weight", perm=(0, 1), groups=((0,), (1,))),
    "final_norm": _HFTensor("model.norm.weight"),
    "lm_head": _HFTensor("lm_head.weight", **_T),
}


class _Entry(NamedTuple):
    """One param: its spec, its HF storage, and the HF names of its per-layer tensors (one if not stacked)."""

    spec: ParamSpec
    hf: _HFTensor
    names: tuple[str, ...]

    @property
    def stacked(self) -> bool:
        return len(self.spec.shape) > 0 and self.spec.axes[0] == "layers"

    @property
    def view(self) -> tuple[int, ...]:
        """Shape of one HF tensor split into the view axes (before `perm`)."""
        local = self.spec.shape[1:] if self.stacked else self.spec.shape
        view = [0] * len(local)
        for i, p in enumerate(self.hf.perm):
            view[p] = local[i]
        return tuple(view)

    @property
    def hf_shape(self) -> tuple[int, ...]:
        return tuple(math.prod(self.view[a] for a in group) for group in self.hf.groups)


def _entries(cfg: ModelConfig) -> dict:
    """Pytree (mirroring params) of `_Entry`."""
    layout = param_layout(cfg)
    layers = {key: _Entry(spec, _LAYER[key], tuple(f"model.layers.{i}.{_LAYER[key].name}"
                                                   for i in range(cfg.num_layers)))
              for key, spec in layout["layers"].items()}
    top = {key: _Entry(spec, _TOP[key], (_TOP[key].name,)) for key, spec in layout.items() if key != "layers"}
    return {**top, "layers": layers}


def _is_entry(x) -> bool:
    return isinstance(x, _Entry)


class _Checkpoint(contextlib.ExitStack):
    """The safetensors files of a checkpoint directory, opened lazily, with a tensor-name -> file map."""

    def __init__(self, path: Path):
        super().__init__()
        index = path / _INDEX
        if index.exists():
            self.where = str(index)
            self.weight_map = json.loads(index.read_text())["weight_map"]
        else:
            files = sorted(path.glob("*.safetensors"))
            if not files:
                raise FileNotFoundError(f"{path}: no *.safetensors files and no {_INDEX}")
            self.where = ", ".join(str(f) for f in files)
            self.weight_map = {}
            for f in files:
                with safe_open(f, framework="numpy") as handle:
                    self.weight_map.update({name: f.name for name in handle.keys()})
        self.path = path
        self._handles: dict[str, object] = {}

    def file(self, name: str) -> str:
        if name not in self.weight_map:
            raise ValueError(f"missing tensor {name!r} in checkpoint {self.where}")
        return str(self.path / self.weight_map[name])

    def slice(self, name: str):
        file = self.file(name)
        if file not in self._handles:
            self._handles[file] = self.enter_context(safe_open(file, framework="numpy"))
        return self._handles[file].get_slice(name)


def _check_shapes(ckpt: _Checkpoint, entries: dict) -> None:
    """Every tensor exists with the expected shape, before anything is read."""
    for entry in jax.tree.leaves(entries, is_leaf=_is_entry):
        for name in entry.names:
            got = tuple(ckpt.slice(name).get_shape())
            if got != entry.hf_shape:
                raise ValueError(f"tensor {name!r} in {ckpt.file(name)} has shape {list(got)}, "
                                 f"expected {list(entry.hf_shape)}")


def _read_local(ckpt: _Checkpoint, entry: _Entry, name: str, idx: tuple[slice, ...]) -> np.ndarray:
    """ours[idx] for one (per-layer) tensor, reading from the file only the rows that cover it."""
    view = entry.view
    view_idx: list[slice] = [slice(None)] * len(view)
    for i, p in enumerate(entry.hf.perm):
        view_idx[p] = idx[i]
    hf_idx, read_view, trim = [], [], []
    for group in entry.hf.groups:
        head = range(*view_idx[group[0]].indices(view[group[0]]))
        inner = math.prod(view[a] for a in group[1:])
        hf_idx.append(slice(head.start * inner, head.stop * inner))  # contiguous rows covering the slice
        read_view += [len(head)] + [view[a] for a in group[1:]]
        trim += [slice(None)] + [view_idx[a] for a in group[1:]]
    data = ckpt.slice(name)[tuple(hf_idx)]
    return data.reshape(read_view)[tuple(trim)].transpose(entry.hf.perm)


def _reader(ckpt: _Checkpoint, entry: _Entry, dtype: np.dtype):
    """Callback: global index of the stacked param -> numpy array of that block, in `dtype`."""
    def read(index) -> np.ndarray:
        index = tuple(index) + (slice(None),) * (len(entry.spec.shape) - len(tuple(index)))
        if not entry.stacked:
            return _read_local(ckpt, entry, entry.names[0], index).astype(dtype)
        layers = range(*index[0].indices(entry.spec.shape[0]))
        return np.stack([_read_local(ckpt, entry, entry.names[i], index[1:]).astype(dtype) for i in layers])

    return read


def load_hf(path: str | os.PathLike, dtype=jnp.float32, shardings: dict | None = None
            ) -> tuple[ModelConfig, dict]:
    """(config, params) from a HF checkpoint directory; params sharded by `shardings` when given."""
    path = Path(path)
    cfg = read_hf_config(path)
    entries = _entries(cfg)
    structure = jax.tree.structure(jax.tree.map(lambda e: 0, entries, is_leaf=_is_entry))
    if shardings is not None and jax.tree.structure(shardings) != structure:
        raise ValueError("shardings must mirror the params pytree (see param_shardings)")
    np_dtype = jnp.dtype(dtype)
    with _Checkpoint(path) as ckpt:
        _check_shapes(ckpt, entries)
        if shardings is None:
            params = jax.tree.map(lambda e: jnp.asarray(_reader(ckpt, e, np_dtype)(())), entries,
                                  is_leaf=_is_entry)
        else:
            params = jax.tree.map(
                lambda e, s: jax.make_array_from_callback(e.spec.shape, s, _reader(ckpt, e, np_dtype)),
                entries, shardings, is_leaf=_is_entry)
    return cfg, params


def _host(x: jax.Array) -> np.ndarray:
    """The whole array on this host (gathered across processes when needed)."""
    if getattr(x, "is_fully_addressable", True):
        return np.asarray(x)
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def _to_hf(entry: _Entry, ours: np.ndarray) -> np.ndarray:
    """Inverse of the load mapping for one (per-layer) array."""
    return np.ascontiguousarray(ours.transpose(np.argsort(entry.hf.perm)).reshape(entry.hf_shape))


def save_hf(cfg: ModelConfig, params: dict, path: str | os.PathLike) -> None:
    """Write config.json, generation_config.json and model.safetensors at `path`, atomically.

    Files go to a temporary sibling directory that is renamed into place, so `path` never holds a half-written
    checkpoint. In a multi-process run every process must call this; process 0 writes.
    """
    path = Path(path)
    entries = _entries(cfg)
    keys = jax.tree_util.keystr
    expected = {keys(k) for k, _ in jax.tree_util.tree_leaves_with_path(entries, is_leaf=_is_entry)}
    got = {keys(k) for k, _ in jax.tree_util.tree_leaves_with_path(params)}
    if expected != got:
        raise ValueError(f"params do not match the layout of {cfg.family}: missing {sorted(expected - got)}, "
                         f"unexpected {sorted(got - expected)}")
    tensors: dict[str, np.ndarray] = {}
    for entry, array in zip(jax.tree.leaves(entries, is_leaf=_is_entry), jax.tree.leaves(params)):
        if tuple(array.shape) != entry.spec.shape:
            raise ValueError(f"param for {entry.names[0]!r} has shape {list(array.shape)}, "
                             f"expected {list(entry.spec.shape)}")
        host = _host(array)
        for i, name in enumerate(entry.names):
            tensors[name] = _to_hf(entry, host[i] if entry.stacked else host)
    if jax.process_index() != 0:
        return
    dtype = str(jnp.dtype(params["embed"].dtype))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(to_hf_config(cfg, dtype), indent=2) + "\n")
        generation = {k: v for k, v in to_hf_config(cfg).items()
                      if k in ("bos_token_id", "eos_token_id", "pad_token_id") and v is not None}
        (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
        old = None
        if path.exists():
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            os.replace(path, old)
        os.replace(tmp, path)
        if old is not None:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
