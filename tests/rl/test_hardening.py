"""Training-state hardening: non-finite steps are skipped and stop the run, corrupt checkpoints are detected
and passed over, a resumed run logs each step once, and verl's loss aggregation."""
import dataclasses
import json
import logging
import os
import shutil
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from searchrl import checkpoint, models
from searchrl.metric_writer import MetricWriter, read_metrics
from searchrl.rl import losses, ppo
from searchrl.rl import trainer as trainer_lib
from searchrl.rl.trainer import NonFiniteError
from tests.rl import test_ppo
from tests.rl.test_trainer import LowTokensEnv, make_config, make_trainer, tokenizer  # noqa: F401 (fixture)

CFG = dataclasses.replace(models.get_preset("tiny"), vocab_size=128)
# Critic-free, one epoch, minibatches in batch order (rows 0-3, then 4-7). It also scores every test's batch:
# the old logprobs depend on the initial policy only, so one scoring program serves every update config here.
CRITIC_FREE = test_ppo.rl_config(use_critic=False, ppo_epochs=1, shuffle=False)


# Loss aggregation as verl's agg_loss.

MAT = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
MASK = jnp.array([[1, 1, 0], [1, 0, 0], [0, 0, 0]], jnp.float32)  # the last row is fully masked


@pytest.mark.parametrize("mode,max_length,expected", [
    ("token-mean", None, (1 + 2 + 4) / 3),
    ("seq-mean-token-sum", None, (3 + 4) / 2),  # row sums 3 and 4 over the 2 non-empty rows
    ("seq-mean-token-mean", None, (1.5 + 4) / 2),  # row means 1.5 and 4 over the 2 non-empty rows
    ("seq-mean-token-sum-norm", None, (3 + 4) / 3),  # sum of the row sums / T = 3, not divided by rows
    ("seq-mean-token-sum-norm", 10, (3 + 4) / 10),
])
def test_agg_loss_matches_verl_with_a_fully_masked_row(mode, max_length, expected):
    np.testing.assert_allclose(losses.agg_loss(MAT, MASK, mode, max_length), expected, rtol=1e-6)
    assert float(losses.agg_loss(MAT, jnp.zeros_like(MASK), mode, max_length)) == 0.0


@pytest.mark.parametrize("mode", ["seq-mean-token-sum-norm", "seq-mean-token-mean"])
def test_gradient_accumulation_equals_full_minibatch_with_empty_rows(mode):
    data = test_ppo.make_data(1)
    for key in ("loss_mask", "advantages", "returns"):
        data[key][2] = 0.0  # one fully masked row in the first micro-batch of 2 rows
    whole = test_ppo.rl_config(micro_batch_size=4, loss_agg_mode=mode, use_critic=False, ppo_epochs=1)
    accumulated = test_ppo.rl_config(micro_batch_size=2, loss_agg_mode=mode, use_critic=False, ppo_epochs=1)
    batch = test_ppo.make_batch(CRITIC_FREE, data)
    state_w, metrics_w = ppo.ppo_update(test_ppo.new_state(whole, test_ppo.ONE), batch, whole, test_ppo.ONE)
    state_a, metrics_a = ppo.ppo_update(test_ppo.new_state(accumulated, test_ppo.ONE), batch, accumulated,
                                        test_ppo.ONE)
    for name in ("actor/pg_loss", "actor/grad_norm"):
        np.testing.assert_allclose(metrics_a[name], metrics_w[name], rtol=1e-5, err_msg=name)
    assert test_ppo.max_abs_diff(test_ppo.host(state_w.policy), test_ppo.host(state_a.policy)) < 1e-6


# Non-finite rewards, losses or gradients.

def rollout_batch(seed: int, nan_reward: bool = False) -> ppo.Batch:
    data = test_ppo.make_data(seed)
    rewards = np.zeros_like(data["loss_mask"])
    rewards[:, -1] = np.random.default_rng(seed).normal(size=rewards.shape[0])
    if nan_reward:
        rewards[3, -1] = np.nan
    return ppo.Batch(tokens=data["tokens"], attention_mask=data["attention_mask"],
                     loss_mask=data["loss_mask"], sampler_logprobs=np.zeros_like(data["noise"]),
                     token_rewards=rewards, group_ids=np.repeat(np.arange(4, dtype=np.int32), 2))


def test_nonfinite_rewards_skip_the_update_in_the_same_program():
    config = test_ppo.rl_config(use_critic=False, advantage="grpo", use_reference=True, kl_in_reward=True,
                                kl_controller="adaptive")
    state = test_ppo.new_state(config, test_ppo.ONE)
    state, metrics = ppo.learn(state, rollout_batch(0), config, test_ppo.ONE)
    assert float(metrics["train/nonfinite"]) == 0.0
    before = test_ppo.host(state)
    state, metrics = ppo.learn(state, rollout_batch(1, nan_reward=True), config, test_ppo.ONE)
    assert float(metrics["train/nonfinite"]) == 1.0
    assert int(state.step) == 2  # the iteration counts; its update does not
    for name in ("policy", "actor_opt", "kl"):
        kept = test_ppo.host(getattr(state, name))
        jax.tree.map(np.testing.assert_array_equal, kept, getattr(before, name))
    state, metrics = ppo.learn(state, rollout_batch(2), config, test_ppo.ONE)
    assert float(metrics["train/nonfinite"]) == 0.0
    assert test_ppo.max_abs_diff(test_ppo.host(state.policy), before.policy) > 1e-5
    jitted = ppo._program(ppo._learn, rollout_batch(0), config, test_ppo.ONE, donate=True)[0]
    assert jitted._cache_size() == 1


def _update(config, batch: ppo.PPOBatch):
    return ppo.ppo_update(test_ppo.new_state(config, test_ppo.ONE), batch, config, test_ppo.ONE)


def _second_minibatch_nonfinite(config) -> tuple[ppo.PPOBatch, ppo.PPOBatch, ppo.PPOBatch]:
    """(a batch of two minibatches, rows 0-3 and 4-7; the same with an infinite advantage in the second;
    the first minibatch alone)."""
    data = test_ppo.make_data(3)
    batch = test_ppo.make_batch(config, data)
    row = int(np.argmax(data["loss_mask"][4:].sum(1))) + 4
    advantages = batch.advantages.copy()
    advantages[row, np.argmax(data["loss_mask"][row])] = np.inf
    first_rows = ppo.PPOBatch(*(x[:4] if isinstance(x, np.ndarray) else x for x in batch))
    return batch, batch._replace(advantages=advantages), first_rows


def test_a_nonfinite_loss_stops_the_update_at_its_minibatch():
    config = CRITIC_FREE
    start = test_ppo.host(test_ppo.new_state(config, test_ppo.ONE))
    _, nonfinite, first_rows = _second_minibatch_nonfinite(config)
    state, metrics = _update(config, nonfinite)
    assert float(metrics["train/nonfinite"]) == 1.0
    assert bool(ppo.all_finite(state))
    assert test_ppo.max_abs_diff(test_ppo.host(state.policy), start.policy) > 1e-5  # minibatch 1 applied
    first_only, _ = _update(config, first_rows)
    assert test_ppo.max_abs_diff(test_ppo.host(state.policy), test_ppo.host(first_only.policy)) < 1e-6


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
def test_a_step_to_nonfinite_params_from_finite_gradients_is_not_applied():
    """Issue 67: `lr=nan` once applied a NaN update with train/nonfinite 0, the guard reading the losses and
    gradients only. A NaN rate is now refused by the config (tests/app/test_run_config.py); a rate finite in
    Python that overflows float32 (1e39) makes the same update, and the new params are checked too."""
    config = test_ppo.rl_config(use_critic=False, ppo_epochs=1, shuffle=False, actor__lr=1e39)
    start = test_ppo.host(test_ppo.new_state(config, test_ppo.ONE))
    state, metrics = _update(config, test_ppo.make_batch(config, test_ppo.make_data(3)))
    assert bool(ppo.all_finite(state))  # the first of its two minibatches once made the params infinite
    assert float(metrics["train/nonfinite"]) == 1.0 and np.isfinite(float(metrics["actor/grad_norm"]))
    jax.tree.map(np.testing.assert_array_equal, test_ppo.host(state.policy), start.policy)
    with pytest.raises(ValueError, match=r"lr=nan is out of range: allowed \[0, inf\)"):
        test_ppo.rl_config(actor__lr=float("nan"))


def test_the_critic_steps_before_a_nonfinite_actor_loss_of_its_minibatch():
    """The critic takes its step before the actor's gradients are made (`ppo._minibatch_step`): an actor loss
    that is non-finite in the second minibatch skips the actor's step there, not the critic's, whose loss
    does not read the advantages."""
    config = test_ppo.rl_config(ppo_epochs=1, shuffle=False)  # with a critic
    batch, nonfinite, first_rows = _second_minibatch_nonfinite(config)
    state, metrics = _update(config, nonfinite)
    assert float(metrics["train/nonfinite"]) == 1.0
    (full, _), (first_only, _) = _update(config, batch), _update(config, first_rows)
    assert test_ppo.max_abs_diff(test_ppo.host(state.policy), test_ppo.host(first_only.policy)) < 1e-6
    assert test_ppo.max_abs_diff(test_ppo.host(state.critic), test_ppo.host(full.critic)) < 1e-6
    assert test_ppo.max_abs_diff(test_ppo.host(full.critic), test_ppo.host(first_only.critic)) > 1e-5


@dataclasses.dataclass
class NaNRewardEnv(LowTokensEnv):
    """LowTokensEnv whose rewards are NaN in one row at the given (1-based) steps."""

    nan_steps: tuple[int, ...] = ()
    calls: int = 0

    def rewards(self, traj, examples):
        self.calls += 1
        rewards = super().rewards(traj, examples)
        if self.calls in self.nan_steps:
            rewards[0] = [float("nan")]
        return rewards


def test_nonfinite_steps_are_skipped_then_stop_the_run_without_losing_checkpoints(tmp_path, tokenizer):
    config = make_config(tmp_path)
    config.train.update(checkpoint_every=1, keep_checkpoints=2, max_nonfinite_steps=2)
    trainer = make_trainer(config, tokenizer)
    trainer.env = NaNRewardEnv(trainer.model_cfg.vocab_size, nan_steps=(2, 4, 5))  # rewards come from here
    trainer.train(1)
    after_1 = test_ppo.host(trainer.state.policy)
    trainer.train(2)  # step 2: NaN reward, skipped
    assert test_ppo.max_abs_diff(test_ppo.host(trainer.state.policy), after_1) == 0.0
    trainer.train(3)  # a finite step in between resets the count
    assert test_ppo.max_abs_diff(test_ppo.host(trainer.state.policy), after_1) > 0.0
    with pytest.raises(NonFiniteError, match=r"steps 4\.\.5: .* 2 steps in a row"):
        trainer.train(10)
    trainer.checkpointer.wait_until_finished()
    assert trainer.checkpointer.all_steps() == [3, 4]  # 5 not saved, and rotation kept finite states only
    restored, _ = trainer.checkpointer.restore(jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), trainer.state))
    assert bool(ppo.all_finite(restored))
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["train/nonfinite"] for r in rows] == [0, 1, 0, 1, 1]
    assert [r["train/nonfinite_in_a_row"] for r in rows] == [0, 1, 0, 1, 2]
    trainer.state = trainer.state._replace(kl=trainer.state.kl._replace(coef=jnp.float32(np.nan)))
    with pytest.raises(NonFiniteError, match="not finite; not saved"):
        trainer.save()
    trainer.close()


# Checksums, and falling back to the newest intact checkpoint.

def small_state(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"w": jnp.asarray(rng.normal(size=(64, 32)), jnp.float32), "b": jnp.asarray(rng.normal(size=32)),
            "step": jnp.int32(seed)}


def abstract(state):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)


def array_files(step_dir):
    return sorted(p for p in (step_dir / "state").rglob("*") if p.is_file() and "/d/" in p.as_posix())


def truncate(step_dir):
    for path in array_files(step_dir):
        os.truncate(path, path.stat().st_size // 2)


def garbage_metadata(step_dir):
    (step_dir / "meta" / "metadata").write_text("{not json")


def empty_state_dir(step_dir):
    shutil.rmtree(step_dir / "state")
    (step_dir / "state").mkdir()


def flip_64_bytes(step_dir):
    path = max(array_files(step_dir), key=lambda p: p.stat().st_size)
    data = bytearray(path.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 64):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture
def two_steps(tmp_path):
    """Steps 1 and 2 of different small states, saved asynchronously."""
    with checkpoint.Checkpointer(tmp_path / "ckpt") as ckpt:
        for step in (1, 2):
            ckpt.save(step, small_state(step), model=CFG, record={"data_position": step})
    return tmp_path / "ckpt"


def test_a_step_is_sealed_the_moment_it_is_listed(tmp_path):
    """Issue 67: checksums were written when the next save started, so a run killed after a save restored
    its newest step unverified. A step's checksums are now in its directory before orbax renames it into
    place: caught the moment it appears, mid-way through an asynchronous save, it verifies."""
    ckpt = checkpoint.Checkpointer(tmp_path, async_save=True)
    ckpt.save(1, small_state(1), model=CFG)
    for _ in range(10_000):  # no wait: watch the directory while the save runs in the background
        if (tmp_path / "1").is_dir():
            break
        time.sleep(0.001)
    assert (tmp_path / "1" / checkpoint.CHECKSUMS).is_file()
    assert checkpoint.checksum_problems(tmp_path / "1", ("", "state", "meta")) == []
    ckpt.close()
    sums = json.loads((tmp_path / "1" / checkpoint.CHECKSUMS).read_text())["sha256"]
    assert {"meta/metadata", "state/_METADATA"} <= set(sums)
    assert not set(sums) & {checkpoint.CHECKSUMS, *checkpoint.COMMIT_RECORDS}  # orbax rewrites those later
    with checkpoint.Checkpointer(tmp_path) as reopened:
        restored, record = reopened.restore(abstract(small_state(1)))
    jax.tree.map(np.testing.assert_array_equal, restored, small_state(1))


def test_a_state_the_caller_refuses_falls_back_to_the_previous_step(tmp_path, caplog):
    """A step whose bytes restore as a non-finite state (which the trainer never saves) is damaged, whatever
    its checksums say: the trainer's `validate` sets it aside and resumes from the step before it."""
    with checkpoint.Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, small_state(1), model=CFG, record={"data_position": 1})
        broken = {**small_state(2), "w": jnp.full((64, 32), jnp.nan)}
        ckpt.save(2, broken, model=CFG, record={"data_position": 2})
    with checkpoint.Checkpointer(tmp_path) as ckpt, caplog.at_level(logging.WARNING, "searchrl.checkpoint"):
        restored, record = ckpt.restore(abstract(small_state(1)), validate=trainer_lib._not_finite)
        assert record["data_position"] == 1 and ckpt.all_steps() == [1]
    jax.tree.map(np.testing.assert_array_equal, restored, small_state(1))
    assert "checkpoint step 2" in caplog.text and "not all finite" in caplog.text
    assert (tmp_path / "2.corrupt").is_dir()


@pytest.mark.parametrize("corrupt", [truncate, garbage_metadata, empty_state_dir, flip_64_bytes])
def test_corrupt_latest_step_falls_back_to_the_previous_one(two_steps, corrupt, caplog):
    corrupt(two_steps / "2")
    with checkpoint.Checkpointer(two_steps, read_only=True) as reader:  # never renames
        with pytest.raises(checkpoint.CorruptCheckpointError, match="step 2 .* is corrupt"):
            reader.restore(abstract(small_state(2)), step=2)
        with caplog.at_level(logging.WARNING, logger="searchrl.checkpoint"):
            restored, record = reader.restore(abstract(small_state(2)))
        assert record["data_position"] == 1 and reader.all_steps() == [1, 2]
    jax.tree.map(np.testing.assert_array_equal, restored, small_state(1))
    assert "checkpoint step 2" in caplog.text and "unusable" in caplog.text
    with checkpoint.Checkpointer(two_steps) as ckpt:
        restored, _ = ckpt.restore(abstract(small_state(2)))
        jax.tree.map(np.testing.assert_array_equal, restored, small_state(1))
        assert ckpt.all_steps() == [1]
        ckpt.save(2, small_state(3), model=CFG)  # the resumed run saves step 2 again
    assert (two_steps / "2.corrupt").is_dir()  # set aside, not deleted
    with checkpoint.Checkpointer(two_steps, read_only=True) as reader:
        restored, _ = reader.restore(abstract(small_state(2)))
    jax.tree.map(np.testing.assert_array_equal, restored, small_state(3))


def test_no_intact_step_is_a_clear_error(two_steps):
    truncate(two_steps / "1")
    garbage_metadata(two_steps / "2")
    with checkpoint.Checkpointer(two_steps) as ckpt:
        with pytest.raises(checkpoint.CorruptCheckpointError,
                           match="(?s)no usable checkpoint .* step 2: .* step 1"):
            ckpt.restore(abstract(small_state(1)))
        assert ckpt.all_steps() == [1, 2]  # nothing set aside without a step to resume from


# A resumed run (here past a corrupt checkpoint) logs each step once.

def test_metric_writer_drops_rows_past_the_resumed_step(tmp_path):
    writer = MetricWriter(str(tmp_path), enabled=True)
    for step in (1, 2, 3):
        writer.write(step, {"x": step})
    writer.write(2, {"eval/x": 0.5})
    writer.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "x"')  # torn by a crash
    writer = MetricWriter(str(tmp_path), enabled=True, resume_step=2)
    writer.write(3, {"x": 30})
    writer.close()
    assert read_metrics(tmp_path / "metrics.jsonl") == [
        {"step": 1, "x": 1}, {"step": 2, "x": 2}, {"step": 2, "eval/x": 0.5}, {"step": 3, "x": 30}]


@pytest.mark.parametrize("damage", [b"\xff\xfe\x00garbage\n", b'{"x": 3}\n', b'{"step": "3"}\n', b"[1, 2]\n",
                                    b'{"step": true}\n', b"[" * 100_000 + b"\n"])
def test_a_damaged_metrics_file_is_set_aside_not_a_failed_resume(tmp_path, caplog, damage):
    """Non-UTF-8 bytes after the last row, or a row edited by hand, once stopped the resume."""
    path = tmp_path / "metrics.jsonl"
    rows = b'{"step": 2, "x": 2}\n{"step": 3, "x": 3}\n'
    path.write_bytes(b'{"step": 1, "x": 1}\n' + damage + rows + damage)
    with caplog.at_level(logging.WARNING, logger="searchrl.metric_writer"):
        MetricWriter(str(tmp_path), enabled=True, resume_step=2).close()
    assert read_metrics(path) == [{"step": 1, "x": 1}, {"step": 2, "x": 2}]
    assert (tmp_path / "metrics.jsonl.corrupt").read_bytes() == damage * 2  # kept, not lost
    assert f"{path}: set aside 2 damaged line(s) (lines 2, 5) in {path}.corrupt" in caplog.text


def test_resume_past_a_corrupt_checkpoint_logs_each_step_once(tmp_path, tokenizer, caplog):
    config = make_config(tmp_path)
    config.train.checkpoint_every = 2
    first = make_trainer(config, tokenizer)
    first.train(3)  # checkpoints at 2 and 3 (the last step)
    first.close()
    truncate(tmp_path / "checkpoints" / "3")
    with caplog.at_level(logging.WARNING, logger="searchrl.checkpoint"):
        resumed = make_trainer(config, tokenizer)
    assert resumed.step_count == 2 and "unusable" in caplog.text
    assert [row["step"] for row in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]
    resumed.train(4)
    resumed.close()
    assert [row["step"] for row in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4]
    assert (tmp_path / "checkpoints" / "3.corrupt").is_dir()
