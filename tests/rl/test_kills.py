"""Issue 67, cause 1: a run killed at any point of a save resumes from a verified step, damaged bytes in its
newest step fall back to the previous one, and SIGTERM ends a run with a sealed checkpoint and its workdir
released. Real processes (tests/rl/kill_processes.py), killed at the points they announce."""
from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np

from searchrl import checkpoint, run_lock
from searchrl.metric_writer import read_metrics
from tests.rl.kill_processes import PHASES, saved_state
from tests.rl.test_hardening import abstract, flip_64_bytes

REPO = Path(__file__).resolve().parents[2]


def start(log: Path, *args: str) -> subprocess.Popen:
    """`python -m tests.rl.kill_processes ARGS` in its own process (JAX on CPU, as the suite's), its stderr
    to `log`."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    with open(log, "w") as err:
        return subprocess.Popen([sys.executable, "-m", "tests.rl.kill_processes", *args], cwd=REPO, env=env,
                                stdout=subprocess.PIPE, stderr=err, text=True)


def wait_for(process: subprocess.Popen, pattern: str, log: Path) -> None:
    """Reads `process`'s output up to a line matching `pattern`; fails with its stderr if it ends before."""
    for line in process.stdout:
        if re.fullmatch(pattern, line.strip()):
            return
    process.wait()
    raise AssertionError(f"no {pattern!r} from {process.args}: {log.read_text()[-3000:]}")


def test_sigkill_at_any_point_of_a_save_resumes_from_a_verified_step(tmp_path, caplog):
    """Killed while orbax writes step 2's arrays, before its checksums, after them but before the rename, or
    once it is listed: every listed step verifies and the newest restores; damaged bytes in it then fall back
    to step 1 with a warning."""
    dirs = {phase: tmp_path / phase for phase in PHASES}
    processes = {phase: start(tmp_path / f"{phase}.log", "save", str(directory), phase)
                 for phase, directory in dirs.items()}
    try:
        for phase, process in processes.items():
            wait_for(process, "paused", tmp_path / f"{phase}.log")
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=60)
    finally:
        for process in processes.values():
            process.kill()
    for phase, directory in dirs.items():
        with checkpoint.Checkpointer(directory) as ckpt:  # what a resumed run opens
            steps = ckpt.all_steps()
            assert steps == {"writing": steps, "listed": [1, 2]}.get(phase, [1]), (phase, steps)
            assert not [p for p in os.listdir(directory) if checkpoint.PARTIAL in p]  # removed
            for step in steps:
                assert checkpoint.checksum_problems(directory / str(step), ("", "state", "meta")) == [], step
            restored, _ = ckpt.restore(abstract(saved_state(steps[-1])))
        jax.tree.map(np.testing.assert_array_equal, restored, saved_state(steps[-1]))

    listed = dirs["listed"]
    flip_64_bytes(listed / "2")
    with checkpoint.Checkpointer(listed) as ckpt, caplog.at_level(logging.WARNING, "searchrl.checkpoint"):
        restored, _ = ckpt.restore(abstract(saved_state(1)))
    jax.tree.map(np.testing.assert_array_equal, restored, saved_state(1))
    assert "checkpoint step 2" in caplog.text and "has changed" in caplog.text


def test_sigterm_ends_a_run_with_its_last_step_sealed_and_its_workdir_free(tmp_path, caplog):
    workdir, log = tmp_path / "run", tmp_path / "train.log"
    process = start(log, "train", str(workdir), "1000", "1000")  # no checkpoint before the last step
    try:
        wait_for(process, "done 2", log)  # step 3 is running
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=600)
    finally:
        process.kill()
    err = log.read_text()
    assert process.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    [stopped] = re.findall(r"stopped by SIGTERM after step (\d+), checkpointed in .*; the same command "
                           r"resumes the run", err)
    step = int(stopped)
    assert step >= 3  # the step in progress was finished, not dropped
    with checkpoint.Checkpointer(workdir / "checkpoints", read_only=True) as ckpt:
        assert ckpt.all_steps() == [step]
        assert ckpt.record(step)["data_position"] == 16 * step
    assert checkpoint.checksum_problems(workdir / "checkpoints" / str(step), ("", "state", "meta")) == []
    assert [row["step"] for row in read_metrics(workdir / "metrics.jsonl")] == list(range(1, step + 1))
    assert not (workdir / run_lock.LOCK).exists()
    with caplog.at_level(logging.WARNING, "searchrl.run_lock"):
        run_lock.WorkdirLock.acquire(workdir).release()
    assert "stale" not in caplog.text  # released, not left to be taken over
