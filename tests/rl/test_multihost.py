"""Two CPU processes (4 devices each) running one sharded PPO update match one process with 8 devices."""
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from searchrl import distributed, models
from tests.rl import multihost_worker as worker

WORKER = Path(worker.__file__)
REPO = WORKER.parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_match_one(tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    coordinator = f"127.0.0.1:{free_port()}"
    outs = [tmp_path / f"process{i}.npz" for i in range(2)]
    logs = [tmp_path / f"process{i}.log" for i in range(2)]  # files, not pipes: nobody reads them meanwhile
    procs = []
    try:
        for i, (out, log) in enumerate(zip(outs, logs)):
            with open(log, "w") as f:
                command = [sys.executable, str(WORKER), coordinator, "2", str(i), str(out)]
                procs.append(subprocess.Popen(command, env=env, stdout=f, stderr=subprocess.STDOUT))
        # The single-process reference runs while the two processes start up and compile.
        mesh = models.make_mesh(2, 2, 2)
        state, metrics = worker.run_update(mesh, worker.host_batch())
        want = {jax.tree_util.keystr(k): np.asarray(v)
                for k, v in jax.tree_util.tree_leaves_with_path(state.policy)}
        metrics = {name: np.asarray(value) for name, value in metrics.items()}
        for proc in procs:
            proc.wait(timeout=240)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for proc, log in zip(procs, logs):
        assert proc.returncode == 0, log.read_text()[-5000:]
    got = [np.load(out) for out in outs]
    assert [tuple(g["rows"]) for g in got] == [(0, 4), (4, 8)]  # each process fed its own half

    # The initial embedding as run_update makes it: one jitted init (eagerly, each shape would compile apart).
    start = jax.jit(lambda: models.init_params(worker.CFG, jax.random.key(0))["embed"])()
    assert max(float(np.abs(want["['embed']"] - np.asarray(start)).max()), 0) > 1e-3  # it trained
    for name, value in want.items():
        np.testing.assert_allclose(got[0][name], value, atol=1e-6, rtol=0, err_msg=name)
    for name, value in metrics.items():
        np.testing.assert_allclose(got[0][f"metric/{name}"], value, rtol=1e-5, atol=1e-7, err_msg=name)


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
