"""The tiny presets from any directory and any workdir, and the one-line errors of a mistyped override and of
an offline download."""
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from searchrl import cli, run_config, task
from searchrl.benchmarks.aot_setups import config_module

ROOT = Path(__file__).resolve().parents[2]
MINIATURES = [(f"{paper}.py", preset) for paper in ("autosearch", "deepretrieval", "rpl")
              for preset in ("tiny", "smoke")]


def run(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "XLA_FLAGS": "", **env})


@pytest.mark.parametrize("file, preset", MINIATURES)
def test_a_miniature_builds_and_reads_its_world_under_its_workdir(file, preset):
    config = config_module(file).get_config(preset)
    config.workdir = "/elsewhere/run"
    parsed = run_config.parse(config)
    assert (parsed.tokenizer, parsed.retrieval.index_dir) == ("/elsewhere/run/tokenizer", "/elsewhere/run/index")
    assert parsed.data.dir == "/elsewhere/run" and task.get(parsed.task).demo is not None
    config.tokenizer = "/my/tokenizer"  # a path set by hand stays, and moves nothing else
    assert (config.tokenizer, config.workdir) == ("/my/tokenizer", "/elsewhere/run")


def test_the_world_command_writes_only_under_the_workdir_from_another_directory(tmp_path):
    cwd, workdir = tmp_path / "elsewhere", tmp_path / "run"
    cwd.mkdir()
    out = run("-m", "searchrl.main", f"--config={ROOT}/configs/deepretrieval.py:smoke",
              f"--config.workdir={workdir}", "world", cwd=cwd, JAX_PLATFORMS="cpu")
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"built the world under {workdir}" in out.stdout
    assert {"tokenizer", "index", "rewrite_world"} <= {p.name for p in workdir.iterdir()}
    assert list(cwd.iterdir()) == []


def test_a_mistyped_override_is_one_line_naming_the_nearest_field():
    out = run("-m", "searchrl.main", "--config=configs/search_r1.py:tiny", "--config.rl.lamda=1", "info",
              cwd=ROOT, JAX_PLATFORMS="cpu")
    assert out.returncode != 0 and len(out.stderr.strip().splitlines()) <= 3, out.stderr
    assert "no field rl.lamda in --config (--config.rl.lamda=1); did you mean rl.lam?" in out.stderr


def test_override_error_names_an_inner_group_and_ignores_other_errors():
    error = AttributeError("'\\'actr\\'\\nDid you mean \"actor\" instead of \"actr\"?'")
    assert cli.override_error(error, ["--config=c.py:tiny", "--config.rl.actr.lr=1"]) == (
        "no field rl.actr in --config (--config.rl.actr.lr=1); did you mean rl.actor?")
    assert cli.override_error(AttributeError("'x'"), ["--config.rl.lam=1"]) is None


def test_an_offline_download_is_one_line(tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = run("-m", "searchrl.data.download", "qa", "--names", "nq", "--out", str(tmp_path), "--dry_run",
              cwd=ROOT, HF_HUB_OFFLINE="0", HF_ENDPOINT=f"http://127.0.0.1:{port}")
    assert out.returncode == 1 and len(out.stderr.strip().splitlines()) <= 3, out.stderr
    assert f"error: cannot reach the hub at http://127.0.0.1:{port}" in out.stderr
