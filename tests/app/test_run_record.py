"""The run folder explains its run (searchrl.run_record): the resolved config, loadable again, the command
line, the commit, package versions and devices, written at the start; a resume names what changed. (A real
resume through `searchrl.main train`: tests/rl/test_multihost.py; from a wheel: tests/app/test_package.py.)"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import jax

from configs import autosearch, search_r1
from searchrl import run_config, run_record

ROOT = Path(__file__).resolve().parents[2]


def load_module(path: Path):
    spec = importlib.util.spec_from_file_location("run_config_loader", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_record_holds_config_command_commit_versions_and_devices_and_loads_again(tmp_path):
    config = run_config.parse(autosearch.get_config("tiny"))  # a task's env group and a demo group
    assert run_record.start(config, tmp_path, ["searchrl train", "--config", "x.py:tiny", "train"]) == []
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["command"] == ["searchrl train", "--config", "x.py:tiny", "train"]
    assert record["config"]["env"]["name"] == "autosearch" and record["config"]["rl"]["actor"]["lr"] == 1e-4
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert record["commit"] == head.stdout.strip() and isinstance(record["dirty"], bool)
    assert record["versions"]["jax"] == jax.__version__ and "ml_collections" in record["versions"]
    assert record["devices"] == {**record["devices"], "backend": "cpu", "count": jax.device_count()}
    # config.py beside it gives the same run config back, as an experiment config (--config.x overridable)
    loaded = load_module(tmp_path / "config.py").get_config()
    assert run_config.parse(loaded) == config
    loaded.rl.actor.lr = 3e-4
    assert run_config.parse(loaded).rl.actor.lr == 3e-4


def test_a_resume_names_what_changed_and_keeps_the_earlier_record(tmp_path):
    config = search_r1.get_config("tiny")
    run_record.start(run_config.parse(config), tmp_path, ["first"])
    config.rl.actor.lr = 2e-4
    changed = run_record.start(run_config.parse(config), tmp_path, ["second"])
    assert changed == ["config.rl.actor.lr: 0.0001 -> 0.0002"]
    assert json.loads((tmp_path / "run.json").read_text())["command"] == ["second"]
    history = [json.loads(line) for line in (tmp_path / "run_history.jsonl").read_text().splitlines()]
    assert [h["command"] for h in history] == [["first"]]
    before = json.loads((tmp_path / "run.json").read_text())
    after = {**before, "commit": "0" * 40, "devices": {**before["devices"], "count": 1024},
             "versions": {**before["versions"], "jax": "0.0.1", "a-package-only-this-run-imported": "1.0"}}
    assert run_record.changes(before, after) == [
        f"commit: {before['commit']!r} -> {'0' * 40!r}", f"devices.count: {jax.device_count()} -> 1024",
        f"versions.jax: {jax.__version__!r} -> '0.0.1'"]


def test_the_written_loader_is_a_config_file_the_entry_point_takes(tmp_path):
    run_record.start(run_config.parse(search_r1.get_config("tiny")), tmp_path / "run", ["x"])
    loader = tmp_path / "run" / "config.py"
    done = subprocess.run([sys.executable, "-m", "searchrl.main", f"--config={loader}",
                           "--config.rl.actor.lr=0.0003", "info"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    workdir = run_config.parse(search_r1.get_config("tiny")).workdir
    assert "lr: 0.0003" in done.stdout and f"workdir: {workdir}" in done.stdout
