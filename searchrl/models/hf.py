"""Hugging Face checkpoints to and from params laid out by a parameter table (`models.layout`): the decoder's
(config.json + safetensors, written and read) and BERT's (read).

Every param's HF tensor name and axes come from its `ParamSpec`. Loading streams one tensor slice at a time
through `safetensors.safe_open`; given target shardings, each parameter is assembled with
`jax.make_array_from_callback`, so a process reads only the slices its devices own. A pytorch_model.bin (an
older BERT checkpoint) is read whole, with torch.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from safetensors import safe_open
from safetensors.numpy import save_file

from searchrl.models import bert, layout
from searchrl.models.config import (VALUE_SUFFIX, BertConfig, ModelConfig, bert_from_hf_config,
                                    read_hf_config, to_hf_config)
from searchrl.models.decoder import param_table
from searchrl.models.layout import ParamSpec, Table

_INDEX = "model.safetensors.index.json"
_TORCH = "pytorch_model.bin"


def _hf_names(spec: ParamSpec) -> tuple[str, ...]:
    """The HF tensors of a param: one per layer if it is stacked."""
    return tuple(spec.hf.format(i) for i in range(spec.shape[0])) if spec.stacked else (spec.hf,)


def _hf_axes(spec: ParamSpec) -> tuple[tuple[int, ...], ...]:
    """For each axis of the HF tensor, the axes of one layer of ours that it merges."""
    return spec.hf_axes or tuple((axis,) for axis in range(len(spec.layer().shape)))


def _hf_shape(spec: ParamSpec) -> tuple[int, ...]:
    shape = spec.layer().shape
    return tuple(math.prod(shape[a] for a in group) for group in _hf_axes(spec))


def _hf_order(spec: ParamSpec) -> list[int]:
    """Our axes in the order HF stores them."""
    return [axis for group in _hf_axes(spec) for axis in group]


class _Checkpoint(contextlib.ExitStack):
    """The tensors of a checkpoint directory by name (as `rename` reads the stored names): its safetensors
    files, opened lazily, or its pytorch_model.bin."""

    def __init__(self, path: Path, rename: Callable[[str], str]):
        super().__init__()
        self.path, self._handles, self._arrays = path, {}, {}
        index = path / _INDEX
        files = sorted(path.glob("*.safetensors"))
        if index.exists():
            self.where = str(index)
            stored = json.loads(index.read_text())["weight_map"]
        elif files:
            self.where = ", ".join(str(f) for f in files)
            stored = {}
            for f in files:
                with safe_open(f, framework="numpy") as handle:
                    stored.update({name: f.name for name in handle.keys()})
        elif (path / _TORCH).exists():
            self.where = str(path / _TORCH)
            stored = {}
            self._arrays = {rename(name): array for name, array in _torch_state(path / _TORCH).items()}
        else:
            raise FileNotFoundError(f"{path}: no *.safetensors files, no {_INDEX} and no {_TORCH}")
        self._files = {rename(name): (file, name) for name, file in stored.items()}

    def _tensor(self, name: str):
        """The tensor `name`: a numpy array, or a lazily read safetensors slice."""
        if name in self._arrays:
            return self._arrays[name]
        if name not in self._files:
            raise ValueError(f"missing tensor {name!r} in checkpoint {self.where}")
        file, stored = self._files[name]
        if file not in self._handles:
            self._handles[file] = self.enter_context(safe_open(self.path / file, framework="numpy"))
        return self._handles[file].get_slice(stored)

    def file(self, name: str) -> str:
        """Where tensor `name` is stored."""
        return str(self.path / self._files[name][0]) if name in self._files else self.where

    def shape(self, name: str) -> tuple[int, ...]:
        tensor = self._tensor(name)
        return tuple(tensor.shape if isinstance(tensor, np.ndarray) else tensor.get_shape())

    def read(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
        return self._tensor(name)[index]


def _torch_state(file: Path) -> dict[str, np.ndarray]:
    """A torch state dict as float32 numpy arrays."""
    try:
        import torch
    except ImportError:
        raise ImportError(f"{file}: reading it needs torch; or convert it to model.safetensors") from None
    return {name: t.float().numpy() for name, t in
            torch.load(file, map_location="cpu", weights_only=True).items()}


def _check_shapes(ckpt: _Checkpoint, table: Table) -> None:
    """Every tensor exists with the expected shape, before anything is read."""
    for spec in table.values():
        for name in _hf_names(spec):
            got = ckpt.shape(name)
            if got != _hf_shape(spec):
                raise ValueError(f"tensor {name!r} in {ckpt.file(name)} has shape {list(got)}, "
                                 f"expected {list(_hf_shape(spec))}")


def _read_local(ckpt: _Checkpoint, spec: ParamSpec, name: str, index: tuple[slice, ...]) -> np.ndarray:
    """ours[index] for one layer's tensor `name`, reading from it only the rows that cover the block."""
    shape = spec.layer().shape
    hf_index, read_shape, trim = [], [], []
    for group in _hf_axes(spec):
        outer = range(*index[group[0]].indices(shape[group[0]]))
        inner = math.prod(shape[a] for a in group[1:])
        hf_index.append(slice(outer.start * inner, outer.stop * inner))  # contiguous rows covering the block
        read_shape += [len(outer)] + [shape[a] for a in group[1:]]
        trim += [slice(None)] + [index[a] for a in group[1:]]
    data = ckpt.read(name, tuple(hf_index))
    return data.reshape(read_shape)[tuple(trim)].transpose(np.argsort(_hf_order(spec)))


def _reader(ckpt: _Checkpoint, spec: ParamSpec, dtype: np.dtype) -> Callable[[tuple], np.ndarray]:
    """Callback: global index of the (stacked) param -> numpy array of that block, in `dtype`."""
    names = _hf_names(spec)

    def read(index) -> np.ndarray:
        index = tuple(index) + (slice(None),) * (len(spec.shape) - len(tuple(index)))
        if not spec.stacked:
            return _read_local(ckpt, spec, names[0], index).astype(dtype)
        layers = range(*index[0].indices(spec.shape[0]))
        return np.stack([_read_local(ckpt, spec, names[i], index[1:]).astype(dtype) for i in layers])

    return read


def _load(path: Path, table: Table, dtype, shardings: dict | None = None,
          rename: Callable[[str], str] = str) -> dict:
    """The params of `table` from the checkpoint at `path`, in `dtype`; sharded by `shardings` when given.
    `rename` gives the table's name of a stored tensor."""
    specs = layout.tree(table)
    if shardings is not None and jax.tree.structure(shardings) != jax.tree.structure(specs):
        raise ValueError("shardings must mirror the params pytree (see param_shardings)")
    np_dtype = jnp.dtype(dtype)
    with _Checkpoint(path, rename) as ckpt:
        _check_shapes(ckpt, table)
        if shardings is None:
            return jax.tree.map(lambda s: jnp.asarray(_reader(ckpt, s, np_dtype)(())), specs)
        return jax.tree.map(lambda s, sharding: jax.make_array_from_callback(
            s.shape, sharding, _reader(ckpt, s, np_dtype)), specs, shardings)


def load_hf(path: str | os.PathLike, dtype=jnp.float32, shardings: dict | None = None, *, value: bool = False
            ) -> tuple[ModelConfig, dict]:
    """(config, params) of a decoder from a HF checkpoint directory; params sharded by `shardings` when
    given. `value=True`: a value model as `save_hf(value=True)` writes it (its head: `score.weight` [1, D]
    and `score.bias` [1]), on the host."""
    cfg = read_hf_config(path)
    if not value:
        return cfg, _load(Path(path), param_table(cfg), dtype, shardings)
    if shardings is not None:
        raise ValueError("load_hf(value=True) reads a value model onto the host: place it afterwards")
    table = param_table(cfg, value=True)
    params = _load(Path(path), {k: s for k, s in table.items() if s.hf is not None}, dtype)
    head = {}
    with _Checkpoint(Path(path), str) as ckpt:
        for ours, name, shape in (("kernel", "score.weight", (1, cfg.hidden_size)),
                                  ("bias", "score.bias", (1,))):
            if ckpt.shape(name) != shape:
                raise ValueError(f"tensor {name!r} in {ckpt.file(name)} has shape {list(ckpt.shape(name))}, "
                                 f"expected {list(shape)}")
            head[ours] = jnp.asarray(np.asarray(ckpt.read(name, (slice(None),) * len(shape)), dtype)
                                     .reshape(table["value_head", ours].shape))
    return cfg, {**params, "value_head": head}


def load_bert(path: str | os.PathLike, dtype=jnp.float32, *, classifier: bool = False
              ) -> tuple[BertConfig, dict]:
    """(config, params) of a BERT encoder from a HF checkpoint directory (BertModel, or any BertFor* model's
    encoder); `classifier=True`: a cross-encoder's (BertForSequenceClassification: the pooler and classifier
    too)."""
    cfg = read_hf_config(path, bert_from_hf_config)
    return cfg, _load(Path(path), bert.param_table(cfg, classifier=classifier), dtype, rename=bert.hf_name)


def _host(x: jax.Array) -> np.ndarray:
    """The whole array on this host (gathered across processes when needed)."""
    if getattr(x, "is_fully_addressable", True):
        return np.asarray(x)
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def _to_hf(spec: ParamSpec, ours: np.ndarray) -> np.ndarray:
    """One layer's array of ours as HF stores it."""
    return np.ascontiguousarray(ours.transpose(_hf_order(spec)).reshape(_hf_shape(spec)))


def _default_modes(directory: Path) -> None:
    """The modes a plain mkdir and open would give `directory` and its files under the process's umask:
    mkdtemp makes the directory rwx------ and safetensors its file rw-------, and an exported model is for
    others (a serving engine, a colleague) to read."""
    umask = os.umask(0o022)
    os.umask(umask)
    directory.chmod(0o777 & ~umask)
    for path in directory.iterdir():
        path.chmod(0o666 & ~umask)


def save_hf(cfg: ModelConfig, params: dict, path: str | os.PathLike, *, value: bool = False) -> None:
    """Write config.json, generation_config.json and model.safetensors at `path`, atomically.

    `value=True`: `params` is a value model (`value_params_from_policy`), written as transformers'
    `<Arch>ForTokenClassification` with num_labels=1, verl's critic (the backbone under the decoder's names;
    our head, kernel [D] and bias [], as `score.weight` [1, D] and `score.bias` [1]), which
    `load_hf(value=True)` and `AutoModelForTokenClassification` read.
    Files go to a temporary sibling directory that is renamed into place, so `path` never holds a half-written
    checkpoint. In a multi-process run every process must call this; process 0 writes.
    """
    path = Path(path)
    specs = layout.tree(param_table(cfg, value=value))
    keys = jax.tree_util.keystr
    expected = {keys(k) for k, _ in jax.tree_util.tree_leaves_with_path(specs)}
    got = {keys(k) for k, _ in jax.tree_util.tree_leaves_with_path(params)}
    if expected != got:
        raise ValueError(f"params do not match the layout of {cfg.family}: missing {sorted(expected - got)}, "
                         f"unexpected {sorted(got - expected)}")
    tensors: dict[str, np.ndarray] = {}
    for spec, array in zip(jax.tree.leaves(specs), jax.tree.leaves(params)):
        if spec.hf is None:  # the value head, below
            continue
        names = _hf_names(spec)
        if tuple(array.shape) != spec.shape:
            raise ValueError(f"param for {names[0]!r} has shape {list(array.shape)}, "
                             f"expected {list(spec.shape)}")
        host = _host(array)
        for i, name in enumerate(names):
            tensors[name] = _to_hf(spec, host[i] if spec.stacked else host)
    if value:
        head = params["value_head"]
        tensors["score.weight"] = _host(head["kernel"]).reshape(1, -1)
        tensors["score.bias"] = _host(head["bias"]).reshape(1)
    if jax.process_index() != 0:
        return
    dtype = str(jnp.dtype(params["embed"].dtype))
    config = to_hf_config(cfg, dtype)
    if value:
        config.update(architectures=[a.replace("ForCausalLM", VALUE_SUFFIX) for a in config["architectures"]],
                      num_labels=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        generation = {k: v for k, v in to_hf_config(cfg).items()
                      if k in ("bos_token_id", "eos_token_id", "pad_token_id") and v is not None}
        (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
        _default_modes(tmp)
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
