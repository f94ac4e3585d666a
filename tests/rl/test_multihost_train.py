"""`python -m searchrl.main train` as two local processes (gloo on 127.0.0.1, 4 CPU devices each) trains,
checkpoints, resumes and evaluates exactly like one process with 8 devices.

The run is AutoSearch's tiny preset on a small synthetic world: side-branch intermediate answers, BM25 over a
local index (each process opens its own), PPO with a critic and a reference on a (2, 2, 2) mesh.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np

from configs import autosearch
from searchrl.demo import autosearch as demo
from searchrl.demo.config import DemoConfig, world_config

REPO = Path(__file__).resolve().parents[2]
TIMING = ("rollout/seconds", "rollout/host_fraction")  # wall-clock figures, not results
EVAL_QUESTIONS = 12  # two eval batches of 8 rows, the second padded: process 1 has no real row in it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def overrides(world: Path, workdir: Path, steps: int) -> list[str]:
    return [f"--config.workdir={workdir}", f"--config.tokenizer={world / 'tokenizer'}",
            f"--config.data.dir={world}", f"--config.retrieval.index_dir={world / 'index'}",
            "--config.model.num_layers=2", "--config.rollout.obs_buckets=(64,)",
            f"--config.train.steps={steps}", "--config.train.batch_size=4", "--config.train.checkpoint_every=2",
            "--config.train.eval_every=3", "--config.train.async_checkpoints=False",
            f"--config.data.eval_limit={EVAL_QUESTIONS}",
            "--config.rl.responses_per_prompt=2", "--config.rl.minibatch_size=8", "--config.rl.micro_batch_size=4",
            "--config.mesh.data=2", "--config.mesh.fsdp=2", "--config.mesh.tensor=2"]


def launch(world: Path, workdir: Path, steps: int, processes: int, cache: Path) -> list[subprocess.Popen]:
    """`main train` as `processes` processes over 8 devices in all; their output goes to workdir/log<i>."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO), "JAX_COMPILATION_CACHE_DIR": str(cache),
           "XLA_FLAGS": f"--xla_force_host_platform_device_count={8 // processes}"}
    coordinator = f"127.0.0.1:{free_port()}"
    procs = []
    for i in range(processes):
        distributed = [] if processes == 1 else [
            "--config.distributed.enabled=True", f"--config.distributed.coordinator_address={coordinator}",
            f"--config.distributed.num_processes={processes}", f"--config.distributed.process_id={i}"]
        command = [sys.executable, "-m", "searchrl.main", "--config=configs/autosearch.py:tiny",
                   *overrides(world, workdir, steps), *distributed, "train"]
        with open(workdir / f"log{i}", "a") as log:
            procs.append(subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT))
    return procs


def wait(procs: list[subprocess.Popen], workdir: Path) -> None:
    try:
        for proc in procs:
            proc.wait(timeout=600)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for i, proc in enumerate(procs):
        assert proc.returncode == 0, (workdir / f"log{i}").read_text()[-6000:]


def metrics(workdir: Path) -> dict[int, dict[str, float]]:
    """metrics.jsonl by step (train and eval records of one step merged)."""
    out: dict[int, dict[str, float]] = {}
    for line in (workdir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        out.setdefault(record.pop("step"), {}).update(record)
    return out


def test_two_processes_train_resume_and_evaluate_like_one(tmp_path):
    world, cache = tmp_path / "world", tmp_path / "jax_cache"  # the cache: the resumed launch compiles less
    config = autosearch.get_config("tiny")
    config.workdir = str(world)
    demo.build_world(world_config(config), DemoConfig(entities=40, vocab_size=400))

    single = launch(world, tmp_path / "one", 3, processes=1, cache=cache)
    first = launch(world, tmp_path / "two", 2, processes=2, cache=cache)  # stops at its checkpoint, step 2
    wait(first, tmp_path / "two")
    before = metrics(tmp_path / "two")
    resumed = launch(world, tmp_path / "two", 3, processes=2, cache=cache)
    wait(resumed + single, tmp_path / "two")

    one, two = metrics(tmp_path / "one"), metrics(tmp_path / "two")
    assert sorted(one) == sorted(two) == [1, 2, 3]
    assert sorted(os.listdir(tmp_path / "two" / "checkpoints")) == ["2", "3"]
    assert [two[1], two[2]] == [before[1], before[2]]  # not run again: their timings would differ
    assert "eval/em" in one[3] and "eval/em" in two[3]
    for step in (1, 2, 3):
        assert set(one[step]) == set(two[step]), step
        assert np.isfinite(list(one[step].values())).all(), one[step]
        for name, value in one[step].items():
            if name not in TIMING:
                np.testing.assert_allclose(two[step][name], value, rtol=1e-5, atol=1e-6,
                                           err_msg=f"step {step} {name}")
