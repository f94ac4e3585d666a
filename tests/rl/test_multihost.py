"""Multi-host training: `python -m searchrl.main train` as two local processes (`PROCESSES=2 bash
launch/local.sh`: gloo on 127.0.0.1, 4 CPU devices each) trains, checkpoints, resumes and evaluates like one
process with 8 devices; and the row split of a global batch on one process. (Program mutation across
processes: tests/tasks/rpl/test_program_mutation.py.)

The run is AutoSearch's tiny preset on a small synthetic world: side-branch intermediate answers, BM25 over a
local index (each process opens its own), PPO with a critic and a reference on a (2, 2, 2) mesh. Rollouts run
on fewer decode rows than episodes, refilled as episodes end, and still give the one-process run's episodes.
"""
from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from configs import autosearch
from searchrl import distributed, models, run_config
from searchrl.checkpoint import Checkpointer
from searchrl.demo.config import world_config
from searchrl.models.config import DistributedConfig
from searchrl.tasks.autosearch import demo
from searchrl.tasks.autosearch.config import DemoConfig
from tests.processes import wait

REPO = Path(__file__).resolve().parents[2]
TIMING = ("rollout/seconds", "rollout/host_fraction", "perf/")  # wall-clock figures (perf/*), not results
EVAL_QUESTIONS = 12  # two eval batches of 8 rows, the second padded: process 1 has no real row in it


def overrides(world: Path, workdir: Path, steps: int, decode_rows: int) -> list[str]:
    return [f"--config.rollout.decode_rows={decode_rows}", "--config.rollout.extend_rows=1",
            "--config.rollout.parked_rows=2",
            f"--config.workdir={workdir}", f"--config.tokenizer={world / 'tokenizer'}",
            f"--config.data.dir={world}", f"--config.retrieval.index_dir={world / 'index'}",
            "--config.model.num_layers=2", "--config.rollout.obs_buckets=(64,)",
            "--config.env.max_turns=2", "--config.rollout.max_len=264",  # shorter episodes than the demo's
            f"--config.train.steps={steps}", "--config.train.batch_size=4",
            "--config.train.checkpoint_every=1", "--config.train.eval_every=2",
            "--config.train.async_checkpoints=False",
            f"--config.data.eval_limit={EVAL_QUESTIONS}",
            "--config.rl.responses_per_prompt=2", "--config.rl.minibatch_size=8",
            "--config.rl.micro_batch_size=4",
            # Adam divides by |g| + eps: with the default 1e-8, a coordinate whose gradient is round-off turns
            # the update's round-off into an O(lr) step (as in tests/rl/test_ppo.py).
            "--config.rl.actor.eps=1e-5", "--config.rl.critic.eps=1e-5",
            "--config.mesh.data=2", "--config.mesh.fsdp=2", "--config.mesh.tensor=2"]


def launch(world: Path, workdir: Path, steps: int, processes: int, cache: Path) -> subprocess.Popen:
    """`bash launch/local.sh` with `processes` processes over 8 CPU devices in all; output in workdir/log.
    XLA_FLAGS are the suite's (tests/conftest.py: cheaper code generation): local.sh sets the device count.
    Each process rolls out its rows of a batch of 8 on half as many decode rows (one per row block of its
    mesh), refilled as episodes end, appended to one row a call, rows waiting for the env parked."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO),
           "JAX_COMPILATION_CACHE_DIR": str(cache), "PROCESSES": str(processes), "DEVICES": "4",
           "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])}  # this python
    with open(workdir / "log", "a") as log:
        return subprocess.Popen(["bash", "launch/local.sh", "configs/autosearch.py:tiny",
                                 *overrides(world, workdir, steps, decode_rows=4 // processes)],
                                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)


def metrics(workdir: Path) -> dict[int, dict[str, float]]:
    """metrics.jsonl by step (train and eval records of one step merged)."""
    out: dict[int, dict[str, float]] = {}
    for line in (workdir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        out.setdefault(record.pop("step"), {}).update(record)
    return out


@pytest.mark.slow
def test_two_processes_train_resume_and_evaluate_like_one(tmp_path):
    world, cache = tmp_path / "world", tmp_path / "jax_cache"  # the cache: the resumed launch compiles less
    config = autosearch.get_config("tiny")
    config.workdir = str(world)
    demo.build_world(world_config(run_config.parse(config)), DemoConfig(entities=40, vocab_size=400))

    one, two = tmp_path / "one", tmp_path / "two"
    single = launch(world, one, 2, processes=1, cache=cache)
    wait([launch(world, two, 1, processes=2, cache=cache)], [two])  # stops at its checkpoint, step 1
    before = metrics(two)
    wait([launch(world, two, 2, processes=2, cache=cache), single], [two, one])

    assert sorted(os.listdir(two / "checkpoints")) == ["1", "2"]
    log = (two / "log").read_text()
    assert "process 0 of 2: rows 0-3 of each batch of 8" in log and "process 1 of 2: rows 4-7" in log
    # the run folder's record (searchrl.run_record): the resume named what changed since the first launch: of
    # the config, train.steps and the coordinator's port (local.sh takes a free one each launch)
    assert "(at step 1) changed since its last start:\n" in log, log[-3000:]
    changed = log.split("changed since its last start:\n", 1)[1].splitlines()
    changed = [line.strip() for line in itertools.takewhile(lambda line: line.startswith("  "), changed)]
    config_changes = [line.split(":")[0] for line in changed if line.startswith("config.")]
    assert config_changes == ["config.distributed.coordinator_address", "config.train.steps"], changed
    assert "config.train.steps: 1 -> 2" in changed
    record = json.loads((two / "run.json").read_text())
    assert record["config"]["train"]["steps"] == 2 and record["devices"]["processes"] == 2
    assert record["command"][-1] == "train" and record["versions"]["jax"] == jax.__version__
    with Checkpointer(one / "checkpoints") as a, Checkpointer(two / "checkpoints") as b:
        policies = {name: c.restore_policy(2) for name, c in (("one", a), ("two", b))}
        earlier = b.restore_policy(1)
    trained = jax.tree.leaves(jax.tree.map(lambda x, y: float(np.abs(x - y).max()), policies["two"], earlier))
    assert max(trained) > 1e-4  # the resumed step changed the policy ...
    for want, got in zip(jax.tree.leaves(policies["one"]), jax.tree.leaves(policies["two"])):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)  # ... as it did in one process
    one, two = metrics(one), metrics(two)
    assert sorted(one) == sorted(two) == [1, 2]
    assert two[1] == before[1]  # not run again: its timings would differ
    assert "eval/em" in one[2] and "eval/em" in two[2]
    for step in (1, 2):
        assert set(one[step]) == set(two[step]), step
        assert np.isfinite(list(one[step].values())).all(), one[step]
        for name, value in one[step].items():
            if not name.startswith(TIMING):
                np.testing.assert_allclose(two[step][name], value, rtol=1e-5, atol=1e-6,
                                           err_msg=f"step {step} {name}")


def test_the_memory_fraction_goes_to_jax_unless_the_environment_sets_one(monkeypatch):
    name = "XLA_PYTHON_CLIENT_MEM_FRACTION"
    monkeypatch.setenv(name, "unset")
    monkeypatch.delenv(name)  # restored to this process's own state after the test
    distributed.initialize(DistributedConfig(memory_fraction=0.0))
    assert name not in os.environ  # JAX's default
    distributed.initialize(DistributedConfig(memory_fraction=0.9))
    assert os.environ[name] == "0.9"
    monkeypatch.setenv(name, "0.5")
    distributed.initialize(DistributedConfig(memory_fraction=0.9))
    assert os.environ[name] == "0.5"  # the user's own setting wins
    with pytest.raises(ValueError, match=r"memory_fraction=1.5 is out of range: allowed \[0, 1\)"):
        distributed.initialize(DistributedConfig(memory_fraction=1.5))


def test_local_rows_on_one_process():
    mesh = models.make_mesh(2, 2, 2)
    assert distributed.local_rows(mesh, 8) == slice(0, 8)
    with pytest.raises(ValueError, match="does not split into the mesh's 4 row blocks"):
        distributed.local_rows(mesh, 6)
    local = {"x": np.arange(16).reshape(8, 2), "t": np.float32(2)}
    rows = distributed.host_local_batch_to_global(mesh, local)
    assert rows["x"].sharding.spec == jax.sharding.PartitionSpec(("data", "fsdp"))
    np.testing.assert_array_equal(rows["x"], np.arange(16).reshape(8, 2))
    assert rows["t"].shape == () and float(rows["t"]) == 2.0


def test_a_process_block_takes_whole_arrays_without_a_copy():
    """`to_process_mesh` onto a block of the mesh (here: the data=0 half, as process 0 of two would hold):
    an array whole on that block (sharded over its tensor axis only) becomes an array on the block, made of
    the same device buffers; one sharded over the data axis has no whole copy there."""
    mesh = models.make_mesh(2, 2, 2)
    assert models.process_mesh(mesh) is mesh and distributed.all_processes({"a": 1}) == [{"a": 1}]
    block = jax.sharding.Mesh(mesh.devices[:1], mesh.axis_names, axis_types=mesh.axis_types)
    P = jax.sharding.PartitionSpec
    values = np.arange(32.0).reshape(4, 8)
    whole = jax.device_put(values, jax.sharding.NamedSharding(mesh, P(None, "tensor")))
    local = models.to_process_mesh({"w": whole}, block)["w"]
    assert local.sharding.mesh == block and local.sharding.spec == P(None, "tensor")
    np.testing.assert_array_equal(local, values)
    buffers = {s.device: s.data.unsafe_buffer_pointer() for s in whole.addressable_shards}
    assert all(buffers[s.device] == s.data.unsafe_buffer_pointer() for s in local.addressable_shards)
    split = jax.device_put(values, jax.sharding.NamedSharding(mesh, P("data", None)))
    with pytest.raises(ValueError, match="no whole copy"):
        models.to_process_mesh(split, block)
