"""Training checkpoints: a whole training state (any pytree of arrays) plus a JSON record, written by orbax;
export of the policy to Hugging Face.

Each step is a directory `<dir>/<step>/` with two items: `state` (every array of the state; for RL, the
`TrainState`: policy, critic, reference, optimizer states, RNG, KL coefficient, step) and `meta` (JSON: the
`ModelConfig`, plus whatever the trainer records: data position, config snapshot, metrics). orbax writes a
step into a temporary directory and renames it into place only when complete, so a crash mid-save leaves the
previous checkpoints intact and the partial one is never listed (and is removed when the next writable
`Checkpointer` opens the directory). Saves are asynchronous: the arrays are copied to host, then written in
the background; call `wait_until_finished` (or `close`) before exiting.

A step is sealed as it completes: `<step>/checksums.json`, the sha256 of each of its files, is written into
the temporary directory before orbax renames it into place (`_SealedStep`), so a step that is listed is a
step that can be verified, whenever the process that saved it was killed. Restores verify them. Restoring
the latest step falls back to the newest intact one, with a logged warning, when newer ones are corrupt
(changed or missing files), fail to restore or are refused by the caller's `validate`; a writable
Checkpointer renames those `<step>.corrupt` (kept for inspection, no longer listed) so that the run can save
those steps again. A step without checksums (saved before steps were sealed) restores unverified, with a
warning.

A step saved under another state structure, other shapes or other dtypes (another model, critic or reference
on or off, another compute dtype) is not corrupt: restoring it raises CheckpointMismatchError naming the
differences, and no step is set aside. `restore(..., fallback=make_state)` restores such a step anyway: every
array whose name and shape match (cast to the target's dtype), the rest from `make_state()`.

    python -m searchrl.checkpoint export --checkpoint DIR [--step N] --out DIR [--tokenizer DIR] [--overwrite]

Export accepts a checkpoint dir or the run workdir holding `checkpoints/` (as `searchrl.eval` does), refuses a
non-empty --out unless --overwrite, and writes the run's tokenizer beside the weights (the one the checkpoint
records, or --tokenizer), so the result loads in transformers and vLLM as it is. An --out that is the run
(its workdir, or the checkpoint dir when it is in none), inside it or above it is always refused: replacing it
would delete what the export reads, and the run's metrics and logs with it.
"""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from absl import flags
import jax
from jax.experimental import multihost_utils
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from searchrl import cli, models

STATE, META = "state", "meta"
MODEL_CONFIG = "model_config"  # key of the ModelConfig in the JSON record
TOKENIZER = "tokenizer"  # key of the run's tokenizer directory (absolute) in the JSON record
CRITIC_DIR = "critic"  # an export's critic, beside the policy's files
CHECKSUMS = "checksums.json"  # in each step directory: {"sha256": {relative path: hex digest}}
# orbax's own records of a step's commit, rewritten as it renames the step into place (after the seal)
COMMIT_RECORDS = ("_CHECKPOINT_METADATA", "commit_success.txt")
CORRUPT = ".corrupt"  # suffix of a step directory set aside as unusable
PARTIAL = ".orbax-checkpoint-tmp-"  # in the name of a step directory orbax has not finished writing

log = logging.getLogger(__name__)


def _read_only_options() -> ocp.CheckpointManagerOptions:
    """A reader's options, with every setting orbax would otherwise override (and warn about) already off."""
    return ocp.CheckpointManagerOptions(read_only=True, save_interval_steps=0, max_to_keep=None, create=False,
                                        cleanup_tmp_directories=False, enable_async_checkpointing=False)



class _ReadOnlyNotice(logging.Filter):
    """Drops orbax's warning on opening any read-only manager ("Given directory is read only"): export and
    evaluation read checkpoints by design, and the warning would be the only line they log."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Given directory is read only")


logging.getLogger("absl").addFilter(_ReadOnlyNotice())  # orbax logs through absl's logger


class CorruptCheckpointError(RuntimeError):
    """A checkpoint step whose files do not match its checksums, or no usable step at all."""


class CheckpointMismatchError(ValueError):
    """A checkpoint step whose arrays (names, shapes or dtypes) are not those of the state to restore."""


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


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            digest.update(block)
    return digest.hexdigest()


def write_checksums(step_dir: Path) -> None:
    """Writes `step_dir`/checksums.json, the sha256 of each file under `step_dir` but orbax's commit records
    (`COMMIT_RECORDS`), atomically."""
    own = {step_dir / name for name in (CHECKSUMS, f"{CHECKSUMS}.tmp", *COMMIT_RECORDS)}
    files = sorted(p for p in step_dir.rglob("*") if p.is_file() and p not in own)
    sums = {p.relative_to(step_dir).as_posix(): _sha256(p) for p in files}
    tmp = step_dir / f"{CHECKSUMS}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"sha256": sums}, f, indent=0, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, step_dir / CHECKSUMS)


def checksum_problems(step_dir: Path, items: Sequence[str]) -> list[str] | None:
    """The files of `items` (subdirectories; "" for the step's own files) that are missing or changed
    since `write_checksums`: [] when intact, None when `step_dir` has no checksums."""
    try:
        sums = json.loads((step_dir / CHECKSUMS).read_text(encoding="utf-8"))["sha256"]
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as error:
        return [f"unreadable {CHECKSUMS} ({error!r})"]
    problems = []
    for name, expected in sorted(sums.items()):
        if (name.split("/")[0] if "/" in name else "") not in items:
            continue
        path = step_dir / name
        if not path.is_file():
            problems.append(f"{name} is missing")
        elif _sha256(path) != expected:
            problems.append(f"{name} has changed")
    return problems


def _leaf_name(path: Sequence[Any]) -> str:
    """A pytree leaf's dotted name as orbax records it ("policy.embed", "actor_opt.0.mu.embed")."""
    keys = (getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))) for k in path)
    return ".".join(str(k) for k in keys)


def array_specs(tree: Any) -> dict[str, tuple[tuple[int, ...], str]]:
    """{dotted name: (shape, dtype name)} of every array of `tree` (arrays, ShapeDtypeStructs or orbax's
    array metadata; None subtrees have none)."""
    return {_leaf_name(path): (tuple(leaf.shape), np.dtype(leaf.dtype).name)
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _groups(names: Sequence[str]) -> str:
    """Dotted names summarised by their first part: "critic (12 arrays), critic_opt (24 arrays)"."""
    counts: dict[str, int] = {}
    for name in names:
        counts[name.split(".")[0]] = counts.get(name.split(".")[0], 0) + 1
    return ", ".join(f"{group} ({n} array{'s' * (n != 1)})" for group, n in counts.items())


def state_mismatch(saved: Mapping[str, tuple], wanted: Mapping[str, tuple]) -> list[str]:
    """How the arrays of a checkpoint (`array_specs`) differ from those of the state to restore: missing or
    extra arrays (by group), then each shape and dtype that differs. [] when they are the same."""
    problems = []
    if missing := sorted(wanted.keys() - saved.keys()):
        problems.append(f"the checkpoint has no {_groups(missing)}")
    if extra := sorted(saved.keys() - wanted.keys()):
        problems.append(f"this run's state has no {_groups(extra)}")
    for name in sorted(saved.keys() & wanted.keys()):
        (saved_shape, saved_dtype), (shape, dtype) = saved[name], wanted[name]
        if saved_shape != shape:
            problems.append(f"{name} has shape {saved_shape} in the checkpoint, {shape} in this run")
        if saved_dtype != dtype:
            problems.append(f"{name} is {saved_dtype} in the checkpoint, {dtype} in this run")
    return problems


def _listed(problems: Sequence[str], limit: int = 5) -> str:
    more = f" (and {len(problems) - limit} more)" if len(problems) > limit else ""
    return "; ".join(problems[:limit]) + more


class _SealedStep(ocp.path.atomicity.AtomicRenameTemporaryPath):
    """orbax's atomic rename, with the step's checksums written into its temporary directory first (process
    0): the step appears complete and sealed at once. The items' own temporary directories (`state`, `meta`),
    renamed before the step's, are written the same way as orbax's."""

    async def finalize(self):
        step_dir = Path(self.get())
        if Path(self.get_final()).name.isdigit() and jax.process_index() == 0:
            await asyncio.to_thread(write_checksums, step_dir)
        await super().finalize()


def _remove_partial_saves(directory: Path) -> None:
    """Deletes the step directories a crash left half-written (process 0; orbax never lists them)."""
    if jax.process_index() != 0 or not directory.is_dir():
        return
    for partial in directory.glob(f"*{PARTIAL}*"):
        log.warning("removing the partial checkpoint save %s", partial)
        shutil.rmtree(partial, ignore_errors=True)


class Checkpointer:
    """Saves and restores training states under `directory`, keeping the newest `max_to_keep` steps.

    Opening a writable Checkpointer removes partial saves left by a crash; open read-only to watch a directory
    that a running trainer writes to.
    """

    def __init__(self, directory: str | os.PathLike, *, max_to_keep: int | None = 3, async_save: bool = True,
                 read_only: bool = False):
        """`read_only`: only restore (export, evaluation next to a running trainer): no saves, no cleanup."""
        options = _read_only_options() if read_only else ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, enable_async_checkpointing=async_save, temporary_path_class=_SealedStep)
        self.directory = Path(directory).absolute()
        self._read_only = read_only
        if not read_only:
            _remove_partial_saves(self.directory)
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=(STATE, META))

    def save(self, step: int, state: Any, *, model: models.ModelConfig,
             record: Mapping[str, Any] | None = None) -> None:
        """Starts writing `state` and the JSON `record` (+ the model config) as checkpoint `step` (sealed with
        its checksums as it completes)."""
        meta = {**_jsonable(dict(record or {})), MODEL_CONFIG: model_config_to_json(model)}
        self._manager.save(step, args=ocp.args.Composite(**{STATE: ocp.args.StandardSave(state),
                                                            META: ocp.args.JsonSave(meta)}))

    def restore(self, target: Any, step: int | None = None, *, fallback: Callable[[], Any] | None = None,
                validate: Callable[[Any], str | None] | None = None) -> tuple[Any, dict]:
        """(state, record) of `step` (default: the newest usable step), with arrays placed as `target`'s
        shardings say; see the module docstring for corrupt steps.

        `target` is an abstract state (`train_state.abstract_train_state`): the mesh may differ from the one
        that saved it. A given `step` that is corrupt raises CorruptCheckpointError. A step saved under other
        array names, shapes or dtypes raises CheckpointMismatchError, unless `fallback` is given (it makes a
        state like `target`, called only then): the arrays that match are restored, the others taken from it.
        `validate(state)` says why a restored state is unusable (None: it is usable), e.g. arrays that are
        not finite where only finite states are saved: such a step is corrupt.
        """
        if step is not None:
            return self._restore_step(target, self._resolve(step), fallback, validate)
        failed: list[tuple[int, Exception]] = []
        for candidate in reversed(self.all_steps()):
            try:
                restored = self._restore_step(target, candidate, fallback, validate)
            except CheckpointMismatchError:
                raise
            except Exception as error:  # orbax and tensorstore raise many types for unreadable files
                log.warning("checkpoint step %d in %s is unusable, trying the previous step: %s", candidate,
                            self.directory, error)
                failed.append((candidate, error))
                continue
            self._set_aside([bad for bad, _ in failed])
            return restored
        if not failed:
            raise FileNotFoundError(f"no complete checkpoint in {self.directory}")
        reasons = "; ".join(f"step {bad}: {error}" for bad, error in failed)
        raise CorruptCheckpointError(f"no usable checkpoint in {self.directory}: {reasons}") from failed[0][1]

    def _restore_step(self, target: Any, step: int, fallback: Callable[[], Any] | None = None,
                      validate: Callable[[Any], str | None] | None = None) -> tuple[Any, dict]:
        state, record = self._read_step(target, step, fallback)
        if validate is not None and (problem := validate(state)):
            raise CorruptCheckpointError(f"checkpoint step {step} in {self.directory} is corrupt: {problem}")
        return state, record

    def _read_step(self, target: Any, step: int, fallback: Callable[[], Any] | None) -> tuple[Any, dict]:
        self._verify(step, ("", STATE, META))
        saved = array_specs(self._state_metadata(step))
        if problems := state_mismatch(saved, array_specs(target)):
            if fallback is None:
                raise CheckpointMismatchError(
                    f"checkpoint step {step} in {self.directory} holds another state than this run's: "
                    f"{_listed(problems)}. It was saved under another config (model, critic, reference or "
                    "dtypes); resume it with that config, or start in another workdir.")
            log.warning("checkpoint step %d in %s holds another state than this run's: %s; restoring the "
                        "arrays that match, the others from this run's initial state", step, self.directory,
                        _listed(problems))
            return self._restore_matching(target, step, fallback()), self.record(step)
        restored = self._manager.restore(step, args=ocp.args.Composite(
            **{STATE: ocp.args.StandardRestore(target), META: ocp.args.JsonRestore()}))
        return restored[STATE], restored[META]

    def _restore_matching(self, target: Any, step: int, fallback: Any) -> Any:
        """`fallback` with each array whose name and shape `step` also holds replaced by the saved one (cast
        to `target`'s dtype, placed with its sharding)."""
        saved = self._state_metadata(step).tree
        as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), saved)
        with ocp.CheckpointManager(self.directory, item_names=(STATE,),
                                   options=_read_only_options()) as reader:
            restored = reader.restore(step, args=ocp.args.Composite(
                **{STATE: ocp.args.PyTreeRestore(restore_args=as_numpy)}))[STATE]
        arrays = {_leaf_name(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(restored)[0]}

        def pick(path, want, initial):
            array = arrays.get(_leaf_name(path))
            if array is None or tuple(array.shape) != tuple(want.shape):
                return initial
            array = np.asarray(array).astype(want.dtype)
            return jax.make_array_from_callback(array.shape, want.sharding, lambda index: array[index])

        return jax.tree_util.tree_map_with_path(pick, target, fallback)

    def _state_metadata(self, step: int) -> Any:
        """The saved state's tree of array metadata (names, shapes, dtypes), without reading any array."""
        return ocp.StandardCheckpointHandler().metadata(self._step_dir(step) / STATE)

    def record(self, step: int | None = None) -> dict:
        """The JSON record of `step` (default: the latest) alone."""
        step = self._resolve(step)
        self._verify(step, (META,))
        return self._manager.restore(step, args=ocp.args.Composite(**{META: ocp.args.JsonRestore()}))[META]

    def restore_policy(self, step: int | None = None, model: models.ModelConfig | None = None) -> dict:
        """The policy params of `step` as host numpy arrays (model config: from the record unless given)."""
        return self._restore_params(step, model, "policy")

    def restore_critic(self, step: int | None = None, model: models.ModelConfig | None = None) -> dict | None:
        """The critic (value model) params of `step` as host numpy arrays; None for a run without one."""
        step = self._resolve(step)
        self._verify(step, (STATE,))
        saved = self._state_metadata(step)
        if "critic" not in saved.keys() or not saved["critic"]:
            return None
        return self._restore_params(step, model, "critic")

    def _restore_params(self, step: int | None, model: models.ModelConfig | None, name: str) -> dict:
        """The state's `name` params ("policy", or "critic": a value model in float32) at `step`, on the
        host."""
        step = self._resolve(step)
        model = model or model_config_from_json(self.record(step)[MODEL_CONFIG])
        self._verify(step, (STATE,))
        init = functools.partial(models.init_params, model, value=name == "critic")
        abstract = jax.eval_shape(init, jax.random.key(0))
        as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), abstract)
        # A separate manager: restoring a subtree needs the PyTree handler, this one has the Standard one.
        with ocp.CheckpointManager(self.directory, item_names=(STATE,),
                                   options=_read_only_options()) as reader:
            restored = reader.restore(step, args=ocp.args.Composite(**{STATE: ocp.args.PyTreeRestore(
                item={name: abstract}, restore_args={name: as_numpy}, partial_restore=True)}))
        return restored[STATE][name]

    def latest_step(self) -> int | None:
        """The newest complete checkpoint (partial saves are never listed)."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def wait_until_finished(self) -> None:
        """Waits for the save in flight (sealed as it completes)."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Waits for pending saves, then releases the manager."""
        self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _step_dir(self, step: int) -> Path:
        return self.directory / str(step)

    def _verify(self, step: int, items: Sequence[str]) -> None:
        """Raises CorruptCheckpointError if the files of `items` in `step` do not match their checksums."""
        problems = checksum_problems(self._step_dir(step), items)
        if problems is None:
            log.warning("checkpoint step %d in %s has no %s: restoring it unverified", step, self.directory,
                        CHECKSUMS)
        elif problems:
            more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
            raise CorruptCheckpointError(f"checkpoint step {step} in {self.directory} is corrupt: "
                                         f"{', '.join(problems[:5])}{more}")

    def _set_aside(self, steps: Sequence[int]) -> None:
        """Renames the unusable `steps` `<step>.corrupt` (writable Checkpointers only; never deletes)."""
        if not steps or self._read_only:
            return
        if jax.process_index() == 0:
            for step in steps:
                source, n = self._step_dir(step), 0
                target = source.with_name(f"{step}{CORRUPT}")
                while target.exists():
                    n += 1
                    target = source.with_name(f"{step}{CORRUPT}-{n}")
                source.rename(target)
                log.warning("set aside unusable checkpoint step %d as %s", step, target)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices("searchrl.checkpoint: set aside unusable steps")
        self._manager.reload()

    def _resolve(self, step: int | None) -> int:
        steps = self.all_steps()
        if step is None:
            if not steps:
                raise FileNotFoundError(f"no complete checkpoint in {self.directory}")
            return steps[-1]
        if step not in steps:
            raise FileNotFoundError(f"no checkpoint for step {step} in {self.directory}; steps: {steps}")
        return step


def steps_dir(path: str | os.PathLike) -> Path | None:
    """The checkpoint directory (with <step>/ subdirectories) that `path` is or, as a run workdir, holds in
    `checkpoints/`; None when neither."""
    path = Path(path)
    for candidate in (path, path / "checkpoints"):
        if candidate.is_dir() and any(p.is_dir() and p.name.isdigit() for p in candidate.iterdir()):
            return candidate
    return None


def run_dir(steps: Path) -> Path:
    """The run a checkpoint dir belongs to: the trainer's workdir when it is one's `checkpoints/`, else the
    checkpoint dir itself."""
    steps = steps.resolve()
    return steps.parent if steps.name == "checkpoints" else steps


def check_out_dir(out_dir: str | os.PathLike, overwrite: bool, source: str | os.PathLike | None = None
                  ) -> None:
    """Raises FileExistsError when `out_dir` is a non-empty directory (or a file) and `overwrite` is off:
    an export replaces its output directory whole, and must never delete what a user keeps there. Raises
    ValueError, overwrite or not, when `out_dir` is `source` (the run exported), inside it or above it."""
    out = Path(out_dir)
    if source is not None:
        run, target = Path(source).resolve(), out.resolve()
        if target == run or run in target.parents or target in run.parents:
            where = "is" if target == run else "is inside" if run in target.parents else "holds"
            raise ValueError(f"--out {out} {where} the run it exports ({run}): writing there would replace "
                             "the checkpoints it reads; choose an --out outside it.")
    if overwrite or not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return
    raise FileExistsError(f"{out} exists and is not an empty directory; pass --overwrite to replace it.")


def export_hf(checkpoint_dir: str | os.PathLike, step: int | None, out_dir: str | os.PathLike,
              model_cfg: models.ModelConfig | None = None, *, tokenizer_dir: str | None = None,
              overwrite: bool = False) -> tuple[int, str | None]:
    """Writes the policy of checkpoint `step` (default: the latest) in Hugging Face format, with the tokenizer
    of `tokenizer_dir` (default: the one the checkpoint records, if any); returns (step, tokenizer dir or None).
    A run with a critic gets it at `out_dir`/critic (value head and trunk, `models.save_hf(value=True)`), which
    `config.model.critic_path` starts a later run's critic from (verl's critic.model.path).

    `checkpoint_dir` is a checkpoint dir or a run workdir; the model config comes from the checkpoint's record
    unless given. A non-empty `out_dir` is refused unless `overwrite`, one that overlaps the run always.
    """
    directory = steps_dir(checkpoint_dir)
    if directory is None:
        raise FileNotFoundError(f"{str(checkpoint_dir)!r} is not a searchrl checkpoint directory (<step>/ "
                                "subdirectories) or a run workdir with checkpoints/.")
    check_out_dir(out_dir, overwrite, source=run_dir(directory))
    with Checkpointer(directory, max_to_keep=None, read_only=True) as checkpointer:
        step = checkpointer._resolve(step)
        record = checkpointer.record(step)
        model_cfg = model_cfg or model_config_from_json(record[MODEL_CONFIG])
        policy = checkpointer.restore_policy(step, model_cfg)
        critic = checkpointer.restore_critic(step, model_cfg)
    tokenizer_dir = tokenizer_dir or record.get(TOKENIZER)
    tokenizer = _load_tokenizer(tokenizer_dir) if tokenizer_dir else None
    models.save_hf(model_cfg, policy, out_dir)
    if critic is not None:
        models.save_hf(model_cfg, critic, Path(out_dir, CRITIC_DIR), value=True)
    if tokenizer is not None and jax.process_index() == 0:
        tokenizer.save_pretrained(out_dir)
    return step, tokenizer_dir


def _load_tokenizer(path: str) -> Any:
    from searchrl.text.tokenizer import load_tokenizer  # local: transformers only when exporting one

    return load_tokenizer(path)


def main(argv: Sequence[str] | None = None) -> None:
    """The one command, `export`: writes a checkpoint's policy (and the run's tokenizer) in Hugging Face
    format, and its critic, if any, in <out>/critic."""
    values = flags.FlagValues()
    checkpoint = flags.DEFINE_string("checkpoint", None, "checkpoint directory (holds <step>/ dirs) or the run "
                                     "workdir holding checkpoints/", required=True, flag_values=values)
    step = flags.DEFINE_integer("step", None, "step to export (default: the latest)", flag_values=values)
    out = flags.DEFINE_string("out", None, "output directory (config.json, generation_config.json, "
                              "model.safetensors and the tokenizer's files)", required=True, flag_values=values)
    tokenizer = flags.DEFINE_string("tokenizer", None, "tokenizer directory to write beside the weights "
                                    "(default: the one the checkpoint records)", flag_values=values)
    overwrite = flags.DEFINE_bool("overwrite", False, "replace --out when it is a non-empty directory",
                                  flag_values=values)
    cli.parse_command(values, argv, __doc__, commands=("export",))
    try:
        exported, tokenizer_dir = export_hf(checkpoint.value, step.value, out.value,
                                            tokenizer_dir=tokenizer.value, overwrite=overwrite.value)
    except (FileExistsError, FileNotFoundError, ValueError) as error:
        cli.fail(str(error))
    note = f"with the tokenizer of {tokenizer_dir}" if tokenizer_dir else "without a tokenizer (pass --tokenizer)"
    print(f"exported step {exported} of {checkpoint.value} to {out.value} {note}")


if __name__ == "__main__":
    cli.run(main)
