"""A run folder that explains its run: at the start of training, `<workdir>/run.json` records the resolved
config, the command line, the commit of searchrl's checkout (and whether it had uncommitted changes), the
versions of the packages the run imported and its devices; `<workdir>/config.py` loads that config again, so

    searchrl train --config <workdir>/config.py [--config.workdir=NEW_DIR] [--config.x.y=...]

runs it again (resuming that folder unless --config.workdir names another). A start in a folder that holds a
record (a resume) compares the two and names every difference (config values, commit, versions, devices);
the earlier record is appended to `<workdir>/run_history.jsonl`, so every start stays on file.
"""
from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping

import ml_collections

from searchrl import __version__, run_config
from searchrl.configlib import to_config
from searchrl.run_config import RunConfig

RECORD, LOADER, HISTORY = "run.json", "config.py", "run_history.jsonl"
GIT_TIMEOUT_S = 10.0
COMPARED = ("commit", "dirty", "versions", "devices")  # besides the config, what a resume names if it changed

_LOADER_TEXT = '''"""The resolved config of the run in this folder, as it last started (run.json beside this
file, written by searchrl.run_record). Run it again with
    searchrl train --config {path} [--config.workdir=NEW_DIR] [--config.x.y=...]
(without --config.workdir it resumes this folder)."""
import pathlib

from searchrl import run_record


def get_config(arg=None):
    return run_record.load_config(pathlib.Path(__file__).with_name(run_record.RECORD))
'''


def as_config(config: RunConfig) -> ml_collections.ConfigDict:
    """The experiment config (`configs/*.py`'s shape: the task as `env.name`) that `run_config.parse` turns
    back into `config`."""
    values = to_config(config)
    del values["task"]
    values.env.name = config.task
    if config.demo is None:
        del values["demo"]
    return values


def load_config(record: str | os.PathLike) -> ml_collections.ConfigDict:
    """The config a run record holds, as an experiment config (its groups typed as `configs/*.py`'s)."""
    with open(record) as f:
        values = json.load(f)["config"]
    return as_config(run_config.parse(ml_collections.ConfigDict(values)))


def _git(directory: Path, *args: str) -> str | None:
    """`git args` run in `directory` (its output), or None where git or a checkout is not there."""
    try:
        done = subprocess.run(["git", "-C", str(directory), *args], capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def checkout() -> dict[str, Any]:
    """The commit of the checkout searchrl is imported from and whether it has uncommitted changes (None
    for both where searchrl is installed from a wheel)."""
    package = Path(__file__).resolve().parent
    commit = _git(package, "rev-parse", "HEAD")
    status = _git(package, "status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def versions() -> dict[str, str]:
    """Python's version and each installed distribution's that provides a module this process imported."""
    provides = importlib.metadata.packages_distributions()
    names = {dist for module in list(sys.modules) if "." not in module for dist in provides.get(module, ())}
    found = {"python": platform.python_version(), "searchrl": __version__}
    for name in sorted(names, key=str.lower):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def devices() -> dict[str, Any]:
    """JAX's backend, device count and kind, and the processes of the run."""
    import jax  # local: the record's other parts need none of JAX

    return {"backend": jax.default_backend(), "count": jax.device_count(),
            "kind": jax.devices()[0].device_kind, "processes": jax.process_count(),
            "host": socket.gethostname()}


def record(config: RunConfig, argv: list[str]) -> dict[str, Any]:
    """The record of a run of `config` started by the command line `argv`."""
    return {"started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": argv, "cwd": os.getcwd(), **checkout(), "versions": versions(), "devices": devices(),
            "config": as_config(config).to_dict()}


def _flat(values: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """`values` by dotted name (nested mappings flattened)."""
    flat = {}
    for key, value in values.items():
        if isinstance(value, Mapping) and value:
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """What differs between two records, one "name: old -> new" each: config values (config.x.y), the
    commit, the checkout's state, devices (devices.x) and the versions of packages both runs imported
    (versions.NAME)."""
    old = _flat({"config": before.get("config", {}), **{k: before.get(k) for k in COMPARED}}, "")
    new = _flat({"config": after["config"], **{k: after[k] for k in COMPARED}}, "")
    names = sorted(name for name in old.keys() | new.keys()
                   if not name.startswith("versions.") or name in old.keys() & new.keys())

    def shown(values: Mapping[str, Any], name: str) -> str:
        return repr(values[name]) if name in values else "(none)"

    return [f"{name}: {shown(old, name)} -> {shown(new, name)}" for name in names
            if (name in old, old.get(name)) != (name in new, new.get(name))]


def start(config: RunConfig, workdir: str | os.PathLike, argv: list[str] | None = None) -> list[str]:
    """Writes the record of a run of `config` started by `argv` (default: the interpreter's command line, as
    typed) in `workdir` now, and the config loader beside it; returns what changed since the folder's previous
    record (none for a new folder). Called once per run, by the process that holds the workdir."""
    directory = Path(workdir)
    directory.mkdir(parents=True, exist_ok=True)
    now = json.loads(json.dumps(record(config, list(sys.orig_argv if argv is None else argv)), default=str))
    path = directory / RECORD
    changed: list[str] = []
    if path.is_file():
        before = json.loads(path.read_text())
        changed = changes(before, now)
        with open(directory / HISTORY, "a") as history:
            history.write(json.dumps(before) + "\n")
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(now, indent=2) + "\n")
    os.replace(temporary, path)
    (directory / LOADER).write_text(_LOADER_TEXT.format(path=directory / LOADER))
    return changed
