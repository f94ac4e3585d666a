"""A run and its files: a run owns its workdir (a second run gets an error naming the first and loses no row),
a checkpoint resumed under another config (training-set size, dtype, state structure, shapes) is an error
naming what changed unless `resume=force`, and partial saves are removed when a checkpointer opens."""
import dataclasses
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from searchrl import checkpoint, models, run_config, run_lock
from searchrl.metric_writer import read_metrics
from searchrl.rl import trainer as trainer_lib
from tests.rl.test_trainer import LowTokensEnv, make_config, tokenizer  # noqa: F401 (fixture)

REPO = Path(__file__).resolve().parents[2]
WORDS = "red green blue cyan magenta yellow black white".split()
CFG = dataclasses.replace(models.get_preset("tiny"), vocab_size=128)


def build(config, tokenizer, examples=WORDS * 4, **model):
    """A trainer of the toy task on `examples` words, its tiny model changed by `model`."""
    cfg = dataclasses.replace(models.get_preset("tiny"), vocab_size=len(tokenizer),
                              eos_token_id=tokenizer.eos_token_id, **model)
    examples = [{"word": w} for w in examples]
    return trainer_lib.Trainer(run_config.parse(config), cfg, models.init_params(cfg, jax.random.key(0)),
                               tokenizer, LowTokensEnv(cfg.vocab_size), examples)


# Cause 12: two runs on one workdir.

def test_a_second_run_on_a_workdir_is_an_error_and_the_first_loses_no_row(tmp_path, tokenizer):
    config = make_config(tmp_path)
    config.train.checkpoint_every = 1
    first = build(config, tokenizer)
    first.train(2)
    with pytest.raises(run_lock.WorkdirInUseError, match=f"pid {os.getpid()} on host {socket.gethostname()}"):
        build(config, tokenizer)
    first.train(4)  # the failed second run neither replaced metrics.jsonl nor touched the checkpoints
    first.close()
    assert [row["step"] for row in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4]
    assert first.checkpointer.all_steps() == [2, 3, 4]
    assert not (tmp_path / run_lock.LOCK).exists()
    after = build(config, tokenizer)  # once the first run closed, the workdir is free again
    assert after.step_count == 4
    after.close()


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_stale_lock_of_a_dead_local_process_is_taken_over(tmp_path, caplog):
    stale = {"host": socket.gethostname(), "pid": dead_pid(), "started": "2020-01-01T00:00:00+00:00"}
    (tmp_path / run_lock.LOCK).write_text(json.dumps(stale))
    with caplog.at_level(logging.WARNING, logger="searchrl.run_lock"):
        lock = run_lock.WorkdirLock.acquire(tmp_path)
    assert f"taking over the stale lock of pid {stale['pid']}" in caplog.text
    assert run_lock.read_holder(lock.path)["pid"] == os.getpid()
    lock.release()
    assert not lock.path.exists()


def test_a_remote_lock_is_never_taken_over(tmp_path):
    holder = {"host": "another-host", "pid": 1, "started": "2020-01-01T00:00:00+00:00"}  # cannot be checked
    (tmp_path / run_lock.LOCK).write_text(json.dumps(holder))
    with pytest.raises(run_lock.WorkdirInUseError, match="pid 1 on host another-host"):
        run_lock.WorkdirLock.acquire(tmp_path)
    assert run_lock.read_holder(tmp_path / run_lock.LOCK) == holder


def test_a_lock_naming_a_live_pid_that_holds_nothing_is_stale(tmp_path, caplog):
    """Issue 67, cause 3: a restarted container's trainer is pid 1 again, the pid its dead predecessor's lock
    names: a live pid is no proof of a live holder. Here the lock names this very process."""
    stale = {"host": socket.gethostname(), "pid": os.getpid(), "started": "2020-01-01T00:00:00+00:00"}
    (tmp_path / run_lock.LOCK).write_text(json.dumps(stale))
    with caplog.at_level(logging.WARNING, logger="searchrl.run_lock"):
        lock = run_lock.WorkdirLock.acquire(tmp_path)
    assert f"taking over the stale lock of pid {os.getpid()}" in caplog.text
    with pytest.raises(run_lock.WorkdirInUseError, match=f"pid {os.getpid()} on host"):
        run_lock.WorkdirLock.acquire(tmp_path)  # now really held
    lock.release()
    assert not lock.path.exists() and (tmp_path / run_lock.GUARD).exists()  # the guard is never deleted


HOLD = (sys.executable, "-m", "tests.rl.kill_processes", "hold")  # + WORKDIR: a process holding it
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def hold(workdir, *prefix: str) -> tuple[subprocess.Popen, int]:
    """A process holding `workdir` (`prefix`: the command it runs under) and its pid as it sees it."""
    process = subprocess.Popen([*prefix, *HOLD, str(workdir)], cwd=REPO, env=ENV, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    assert line.startswith("held "), process.communicate(timeout=60)[1][-3000:]
    return process, int(line.split()[1])


def killed(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)


def test_a_killed_holder_is_stale_and_a_live_one_is_not(tmp_path, caplog):
    workdir = tmp_path / "run"
    holder, pid = hold(workdir)
    try:
        with pytest.raises(run_lock.WorkdirInUseError, match=f"pid {pid} on host"):
            run_lock.WorkdirLock.acquire(workdir)
    finally:
        killed(holder)
    with caplog.at_level(logging.WARNING, logger="searchrl.run_lock"):
        run_lock.WorkdirLock.acquire(workdir).release()
    assert f"taking over the stale lock of pid {pid}" in caplog.text


def fresh_pid_namespace() -> list[str]:
    """The command prefix that runs a process as pid 1 of a new PID namespace (a restarted container); the
    test is skipped where this kernel or user may not make one."""
    prefix = ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--kill-child"]
    try:
        done = subprocess.run([*prefix, sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        pytest.skip("no unshare")
    if done.returncode != 0 or done.stdout.strip() != "1":
        pytest.skip(f"no new PID namespace here: {done.stderr.strip()}")
    return prefix


def test_a_restarted_container_takes_its_dead_runs_lock_back(tmp_path, caplog):
    """Each container's trainer is pid 1 of its own PID namespace: a live one holds the workdir against the
    others (and this process), and once it is killed the next one takes the lock over."""
    prefix, workdir = fresh_pid_namespace(), tmp_path / "run"
    first, pid = hold(workdir, *prefix)
    assert pid == 1
    try:
        with pytest.raises(run_lock.WorkdirInUseError, match="pid 1 on host"):
            run_lock.WorkdirLock.acquire(workdir)
        rival = subprocess.run([*prefix, *HOLD, str(workdir)], cwd=REPO, env=ENV, capture_output=True,
                               text=True, timeout=120)
        assert rival.returncode != 0 and "WorkdirInUseError" in rival.stderr and "held" not in rival.stdout
    finally:
        killed(first)
    restarted, pid = hold(workdir, *prefix)  # the restarted container: pid 1 again, as the lock names
    try:
        assert pid == 1 and run_lock.read_holder(workdir / run_lock.LOCK)["pid"] == 1
        with pytest.raises(run_lock.WorkdirInUseError, match="pid 1 on host"):
            run_lock.WorkdirLock.acquire(workdir)
    finally:
        killed(restarted)
    _, err = restarted.communicate()
    assert "taking over the stale lock of pid 1" in err


def test_releasing_leaves_another_runs_lock_alone(tmp_path):
    lock = run_lock.WorkdirLock.acquire(tmp_path)
    (tmp_path / run_lock.LOCK).write_text('{"host": "other", "pid": 7}')  # removed by hand, retaken
    lock.release()
    assert run_lock.read_holder(tmp_path / run_lock.LOCK) == {"host": "other", "pid": 7}


def test_presets_default_to_a_workdir_of_their_own():
    from configs import autosearch, deepretrieval, rpl, search_r1

    assert search_r1.get_config("tiny").workdir == "runs/search_r1_tiny"
    assert search_r1.get_config("paper_grpo").workdir == "runs/search_r1_paper_grpo"
    assert rpl.get_config("paper_qwen3_4b,pm").workdir == "runs/rpl_paper_qwen3_4b_pm"
    assert deepretrieval.get_config("classic").workdir == "runs/deepretrieval_classic"
    assert autosearch.get_config("tiny").workdir == "runs/demo"  # a demo keeps the workdir it chose


# Cause 13: a config change between save and resume.

@pytest.fixture(scope="module")
def saved_run(tmp_path_factory, tokenizer):
    """A workdir with a checkpoint at step 2 (PPO with a critic, no reference, float32)."""
    workdir = tmp_path_factory.mktemp("run")
    config = make_config(workdir)
    config.train.checkpoint_every = 2
    trainer = build(config, tokenizer)
    trainer.train(2)
    trainer.close()
    return workdir


@pytest.mark.parametrize("change,changed", [
    (dict(examples=WORDS * 3), "train_size: 32 -> 24"),
    (dict(rl=dict(compute_dtype="bfloat16")), "rl.compute_dtype: 'float32' -> 'bfloat16'"),
    (dict(rl=dict(use_reference=True)), "rl.use_reference: False -> True"),
    (dict(model=dict(intermediate_size=128)), "model.intermediate_size: 256 -> 128"),
])
def test_resuming_under_another_config_names_the_change_unless_forced(saved_run, tmp_path, tokenizer, change,
                                                                      changed):
    workdir = tmp_path / "run"
    shutil.copytree(saved_run, workdir)
    config = make_config(workdir, **change.get("rl", {}))
    args = dict(examples=change.get("examples", WORDS * 4), **change.get("model", {}))
    with pytest.raises(trainer_lib.ResumeMismatchError, match=f"step 2 .* another config: .*{changed}"):
        build(config, tokenizer, **args)
    assert not (workdir / run_lock.LOCK).exists()  # the failed run gave the workdir up
    assert sorted(os.listdir(workdir / "checkpoints")) == ["2"]  # nothing set aside

    config.resume = "force"
    resumed = build(config, tokenizer, **args)
    assert resumed.step_count == 2 and resumed.data_position == 2 * 16
    resumed.close()


def test_forcing_a_resume_across_state_structures_keeps_what_fits(saved_run, tmp_path, tokenizer, caplog):
    workdir = tmp_path / "run"
    shutil.copytree(saved_run, workdir)
    config = make_config(workdir, use_reference=True)
    config.resume = "force"
    with caplog.at_level(logging.WARNING):
        resumed = build(config, tokenizer)
    assert "the checkpoint has no ref (" in caplog.text
    with checkpoint.Checkpointer(workdir / "checkpoints", read_only=True) as reader:
        policy = reader.restore_policy(2)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(resumed.state.policy), policy)
    initial = models.init_params(resumed.model_cfg, jax.random.key(0))  # the reference: the initial policy
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(resumed.state.ref), jax.device_get(initial))
    resumed.train(3)
    resumed.close()


def small_state(seed: int, width: int = 32, dtype=jnp.float32, extra: bool = False) -> dict:
    rng = np.random.default_rng(seed)
    state = {"w": jnp.asarray(rng.normal(size=(64, width)), dtype), "step": jnp.int32(seed)}
    return state | ({"v": jnp.zeros(3)} if extra else {})


def abstract(state):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)


@pytest.mark.parametrize("newest,named", [
    (small_state(2, extra=True), r"this run's state has no v \(1 array\)"),
    (small_state(2, width=16), r"w has shape \(64, 16\) in the checkpoint, \(64, 32\) in this run"),
    (small_state(2, dtype=jnp.bfloat16), "w is bfloat16 in the checkpoint, float32 in this run"),
])
def test_a_newest_step_of_another_state_is_an_error_not_a_silent_rewind(tmp_path, newest, named):
    with checkpoint.Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, small_state(1), model=CFG)
        ckpt.save(2, newest, model=CFG)
    with checkpoint.Checkpointer(tmp_path) as ckpt:
        with pytest.raises(checkpoint.CheckpointMismatchError, match=f"step 2 .* another state .*{named}"):
            ckpt.restore(abstract(small_state(1)))
        restored, _ = ckpt.restore(abstract(small_state(1)), fallback=lambda: small_state(9))
        assert ckpt.all_steps() == [1, 2]  # not renamed .corrupt
    if newest["w"].shape == (64, 32):  # same shape: restored (cast); otherwise the fallback's
        np.testing.assert_array_equal(restored["w"], np.asarray(newest["w"]).astype(np.float32))
    else:
        np.testing.assert_array_equal(restored["w"], small_state(9)["w"])
    assert int(restored["step"]) == 2


def test_a_partial_save_is_removed_when_a_checkpointer_opens(tmp_path):
    with checkpoint.Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, small_state(1), model=CFG)
    partial = tmp_path / f"2{checkpoint.PARTIAL}1234567"
    shutil.copytree(tmp_path / "1", partial)
    with checkpoint.Checkpointer(tmp_path, read_only=True):
        assert partial.exists()  # read-only never deletes
    ckpt = checkpoint.Checkpointer(tmp_path)
    assert not partial.exists()  # on opening, not at the first save
    assert ckpt.all_steps() == [1]
    ckpt.close()
