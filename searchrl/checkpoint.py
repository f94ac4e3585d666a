"""Training checkpoints: a whole training state (any pytree of arrays) plus a JSON record, written by orbax;
export of the policy to Hugging Face.

Each step is a directory `<dir>/<step>/` with two items: `state` (every array of the state; for RL, the
`TrainState`: policy, critic, reference, optimizer states, RNG, KL coefficient, step) and `meta` (JSON: the
`ModelConfig`, plus whatever the trainer records: data position, config snapshot, metrics). orbax writes a
step into a temporary directory and renames it into place only when complete, so a crash mid-save leaves the
previous checkpoints intact and the partial one is never listed (and is removed by the next writable
`Checkpointer` on the directory). Saves are asynchronous: the arrays are copied to host, then written in the
background; call `wait_until_finished` (or `close`) before exiting.

    python -m searchrl.checkpoint export --checkpoint DIR [--step N] --out DIR
"""
from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from absl import flags
import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from searchrl import cli, models

STATE, META = "state", "meta"
MODEL_CONFIG = "model_config"  # key of the ModelConfig in the JSON record


def model_config_to_json(cfg: models.ModelConfig) -> dict:
    """A JSON-able dict that `model_config_from_json` turns back into `cfg`."""
    return dataclasses.asdict(cfg)


def model_config_from_json(fields: Mapping[str, Any]) -> models.ModelConfig:
    fields = dict(fields)
    if fields.get("rope_scaling") is not None:
        fields["rope_scaling"] = models.RopeScaling(**fields["rope_scaling"])
    return models.ModelConfig(**fields)


def _jsonable(x):
    """Plain JSON values from nested dicts/ConfigDicts/lists of Python, numpy and (replicated) jax scalars."""
    if isinstance(x, ml_collections.ConfigDict):
        return _jsonable(x.to_dict())
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (jax.Array, np.ndarray, np.generic)):
        return np.asarray(x).tolist()
    return x


class Checkpointer:
    """Saves and restores training states under `directory`, keeping the newest `max_to_keep` steps.

    Opening a writable Checkpointer removes partial saves left by a crash; open read-only to watch a directory
    that a running trainer writes to.
    """

    def __init__(self, directory: str | os.PathLike, *, max_to_keep: int | None = 3, async_save: bool = True,
                 read_only: bool = False):
        """`read_only`: only restore (export, evaluation next to a running trainer): no saves, no cleanup."""
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, enable_async_checkpointing=async_save and not read_only,
            cleanup_tmp_directories=not read_only, create=not read_only, read_only=read_only)
        self.directory = Path(directory).absolute()
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=(STATE, META))

    def save(self, step: int, state: Any, *, model: models.ModelConfig,
             record: Mapping[str, Any] | None = None) -> None:
        """Starts writing `state` and the JSON `record` (+ the model config) as checkpoint `step`."""
        meta = {**_jsonable(dict(record or {})), MODEL_CONFIG: model_config_to_json(model)}
        self._manager.save(step, args=ocp.args.Composite(**{STATE: ocp.args.StandardSave(state),
                                                            META: ocp.args.JsonSave(meta)}))

    def restore(self, target: Any, step: int | None = None) -> tuple[Any, dict]:
        """(state, record) of `step` (default: the latest), with arrays placed as `target`'s shardings say.

        `target` is an abstract state (`train_state.abstract_train_state`): the mesh may differ from the one
        that saved it.
        """
        step = self._resolve(step)
        restored = self._manager.restore(step, args=ocp.args.Composite(
            **{STATE: ocp.args.StandardRestore(target), META: ocp.args.JsonRestore()}))
        return restored[STATE], restored[META]

    def record(self, step: int | None = None) -> dict:
        """The JSON record of `step` (default: the latest) alone."""
        step = self._resolve(step)
        return self._manager.restore(step, args=ocp.args.Composite(**{META: ocp.args.JsonRestore()}))[META]

    def restore_policy(self, step: int | None = None, model: models.ModelConfig | None = None) -> dict:
        """The policy params of `step` as host numpy arrays (model config: from the record unless given)."""
        step = self._resolve(step)
        model = model or model_config_from_json(self.record(step)[MODEL_CONFIG])
        abstract = jax.eval_shape(functools.partial(models.init_params, model), jax.random.key(0))
        as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), abstract)
        # A separate manager: restoring a subtree needs the PyTree handler, this one has the Standard one.
        with ocp.CheckpointManager(self.directory, item_names=(STATE,),
                                   options=ocp.CheckpointManagerOptions(read_only=True)) as reader:
            restored = reader.restore(step, args=ocp.args.Composite(**{STATE: ocp.args.PyTreeRestore(
                item={"policy": abstract}, restore_args={"policy": as_numpy}, partial_restore=True)}))
        return restored[STATE]["policy"]

    def latest_step(self) -> int | None:
        """The newest complete checkpoint (partial saves are never listed)."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def wait_until_finished(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Waits for pending saves, then releases the manager."""
        self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _resolve(self, step: int | None) -> int:
        steps = self.all_steps()
        if step is None:
            if not steps:
                raise FileNotFoundError(f"no complete checkpoint in {self.directory}")
            return steps[-1]
        if step not in steps:
            raise FileNotFoundError(f"no checkpoint for step {step} in {self.directory}; steps: {steps}")
        return step


def export_hf(checkpoint_dir: str | os.PathLike, step: int | None, out_dir: str | os.PathLike,
              model_cfg: models.ModelConfig | None = None) -> int:
    """Writes the policy of checkpoint `step` (default: the latest) in Hugging Face format; returns the
    step. The model config comes from the checkpoint's record unless given."""
    with Checkpointer(checkpoint_dir, max_to_keep=None, read_only=True) as checkpointer:
        step = checkpointer._resolve(step)
        model_cfg = model_cfg or model_config_from_json(checkpointer.record(step)[MODEL_CONFIG])
        models.save_hf(model_cfg, checkpointer.restore_policy(step, model_cfg), out_dir)
    return step


def main(argv: Sequence[str] | None = None) -> None:
    """The one command, `export`: writes a checkpoint's policy in Hugging Face format."""
    values = flags.FlagValues()
    checkpoint = flags.DEFINE_string("checkpoint", None, "checkpoint directory (holds <step>/ dirs)",
                                     required=True, flag_values=values)
    step = flags.DEFINE_integer("step", None, "step to export (default: the latest)", flag_values=values)
    out = flags.DEFINE_string("out", None, "output directory (config.json + model.safetensors)",
                              required=True, flag_values=values)
    cli.parse_command(values, argv, __doc__, commands=("export",))
    exported = export_hf(checkpoint.value, step.value, out.value)
    print(f"exported step {exported} of {checkpoint.value} to {out.value}")


if __name__ == "__main__":
    cli.run(main)
