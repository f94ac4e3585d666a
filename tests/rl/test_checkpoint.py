"""Checkpoints: exact round trips (sharded, across meshes), keep-last-k, crash safety, Hugging Face export."""
from pathlib import Path
import dataclasses
import os
import select
import shutil
import signal
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import torch
import transformers

from searchrl import checkpoint, experiment, models
from searchrl.text import tokenizer as tokenizer_lib
from searchrl.rl import kl, train_state
from searchrl.rl.config import OptimConfig

TRAIN = models.Compute(models.TRAIN_RULES, models.AttentionConfig())  # as a default run trains

CFG = dataclasses.replace(models.get_preset("tiny"), vocab_size=128)
SPEC = train_state.StateSpec(CFG, OptimConfig(1e-3), OptimConfig(1e-3), reference=True,
                             rules=models.TRAIN_RULES)
MESH = models.make_mesh(2, 2, 2)


def make_state(mesh, seed: int) -> train_state.TrainState:
    """An initial state with every leaf changed (moments, counts, step, rng, KL coefficient too)."""
    state = train_state.init_train_state(SPEC, mesh, models.init_params(CFG, jax.random.key(0)),
                                         jax.random.key(1), kl_coef=0.05)
    rng = np.random.default_rng(seed)
    changed = jax.tree.map(lambda x: x + (0.01 * rng.normal(size=x.shape)).astype(x.dtype)
                           if np.issubdtype(x.dtype, np.floating) else x + seed, jax.device_get(state))
    return jax.device_put(changed, train_state.state_shardings(SPEC, mesh))


def assert_states_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(a), jax.device_get(b))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Two checkpoints (steps 1 and 2) of different states saved from the 8-device mesh."""
    directory = tmp_path_factory.mktemp("ckpt")
    states = {1: make_state(MESH, 1), 2: make_state(MESH, 2)}
    config = ml_collections.ConfigDict({"rl": {"lr": 1e-6}, "seed": 0})
    with checkpoint.Checkpointer(directory) as ckpt:
        for step, state in states.items():
            metrics = {"actor/pg_loss": jnp.float32(0.25 * step)}
            ckpt.save(step, state, model=CFG, record={"data_position": 8 * step, "config": config,
                                                      "metrics": metrics})
    return directory, jax.device_get(states)


def test_round_trip_is_exact_with_shardings_and_record(saved):
    directory, states = saved
    with checkpoint.Checkpointer(directory) as ckpt:
        assert ckpt.all_steps() == [1, 2] and ckpt.latest_step() == 2
        target = train_state.abstract_train_state(SPEC, MESH)
        restored, record = ckpt.restore(target)
        assert isinstance(restored, train_state.TrainState) and isinstance(restored.kl, kl.KLState)
        assert_states_equal(restored, states[2])
        assert jax.tree.map(lambda x: x.sharding, restored) == jax.tree.map(lambda x: x.sharding, target)
        assert record["data_position"] == 16 and record["metrics"] == {"actor/pg_loss": 0.5}
        assert record["config"] == {"rl": {"lr": 1e-6}, "seed": 0}
        assert checkpoint.model_config_from_json(record[checkpoint.MODEL_CONFIG]) == CFG
        assert_states_equal(ckpt.restore(target, step=1)[0], states[1])


@pytest.mark.parametrize("shape", [(1, 1, 1), (1, 4, 2)])
def test_restore_onto_another_mesh(saved, shape):
    directory, states = saved
    mesh = models.make_mesh(*shape, devices=jax.devices()[:int(np.prod(shape))])
    with checkpoint.Checkpointer(directory, read_only=True) as ckpt:
        restored, _ = ckpt.restore(train_state.abstract_train_state(SPEC, mesh), step=1)
    assert_states_equal(restored, states[1])
    q = restored.policy["layers"]["q"].sharding
    assert q.mesh.shape == mesh.shape and q == train_state.state_shardings(SPEC, mesh).policy["layers"]["q"]


def test_keep_last_k(tmp_path):
    state = make_state(MESH, 3)
    with checkpoint.Checkpointer(tmp_path, max_to_keep=2) as ckpt:
        for step in range(1, 5):
            ckpt.save(step, state, model=CFG)
        ckpt.wait_until_finished()
        assert ckpt.all_steps() == [3, 4]
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["3", "4"]


def test_partial_save_is_ignored_and_cleaned_up(saved, tmp_path):
    """A crash leaves `<step>.orbax-checkpoint-tmp-*` behind: never listed; a writer removes it (in the
    background from opening, awaited by its first save)."""
    directory, states = saved
    work = tmp_path / "ckpt"
    subprocess.run(["cp", "-r", str(directory), str(work)], check=True)
    partial = work / "3.orbax-checkpoint-tmp-1234567"
    subprocess.run(["cp", "-r", str(work / "2"), str(partial)], check=True)
    for victim in (partial / "state").rglob("*"):  # a half-written state: some files gone
        if victim.is_file() and hash(victim.name) % 2:
            victim.unlink()
    with checkpoint.Checkpointer(work, read_only=True) as reader:  # an exporter next to a running trainer
        assert reader.latest_step() == 2
    assert partial.exists()  # read-only never deletes
    with checkpoint.Checkpointer(work) as ckpt:
        assert ckpt.latest_step() == 2
        assert_states_equal(ckpt.restore(train_state.abstract_train_state(SPEC, MESH))[0], states[2])
        ckpt.save(3, make_state(MESH, 3), model=CFG)
    assert not partial.exists()
    with checkpoint.Checkpointer(work, read_only=True) as reader:
        assert reader.all_steps() == [1, 2, 3]


KILLED_SAVER = textwrap.dedent("""
    import sys, time
    import jax, numpy as np
    from searchrl import checkpoint, experiment, models
    from searchrl.rl.kl import KLState
    from searchrl.rl.train_state import TrainState
    cfg = models.ModelConfig("qwen3", 65536, 128, 512, 2, 4, 2, 32, qk_norm=True, tie_word_embeddings=True)
    policy = jax.tree.map(np.asarray, models.init_params(cfg, jax.random.key(0)))  # ~36 MB
    state = TrainState(np.int32(9), policy, None, None, (), None, np.zeros(2, np.uint32),
                       KLState(np.float32(0)))
    ckpt = checkpoint.Checkpointer(sys.argv[1])
    ckpt.save(9, state, model=cfg)
    print("saving", flush=True)
    time.sleep(120)
""")


def test_killed_mid_save_keeps_the_previous_checkpoint(saved, tmp_path):
    directory, states = saved
    work = tmp_path / "ckpt"
    subprocess.run(["cp", "-r", str(directory), str(work)], check=True)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    saver = subprocess.Popen([sys.executable, "-c", KILLED_SAVER, str(work)], stdout=subprocess.PIPE, env=env,
                             text=True)
    try:
        assert select.select([saver.stdout], [], [], 120)[0], "the saving process did not start in 120 s"
        assert saver.stdout.readline().strip() == "saving"
    finally:
        saver.send_signal(signal.SIGKILL)
        saver.wait(timeout=30)
    with checkpoint.Checkpointer(work) as ckpt:
        steps = ckpt.all_steps()
        assert steps in ([1, 2], [1, 2, 9])  # step 9 only if it completed before the kill
        restored = ckpt.restore(train_state.abstract_train_state(SPEC, MESH), step=2)[0]
        assert_states_equal(restored, states[2])
        if 9 in steps:
            assert ckpt.restore_policy(9)["embed"].shape == (65536, 128)


def test_export_cli_gives_transformers_the_same_logits(saved, tmp_path, capsys):
    directory, states = saved
    out = tmp_path / "hf"
    checkpoint.main(["export", "--checkpoint", str(directory), "--step", "1", "--out", str(out)])
    assert "exported step 1" in capsys.readouterr().out
    model = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").float().eval()
    tokens = np.random.default_rng(0).integers(0, CFG.vocab_size, (2, 11)).astype(np.int32)
    with torch.no_grad():
        theirs = model(input_ids=torch.from_numpy(tokens).long()).logits.numpy()
    ours = np.asarray(models.apply(CFG, states[1].policy, jnp.asarray(tokens), compute=TRAIN))
    assert np.abs(ours).max() > 0.05  # not comparing near-zero logits
    np.testing.assert_allclose(theirs, ours, atol=1e-4, rtol=0)
    assert not np.allclose(ours, models.apply(CFG, states[2].policy, jnp.asarray(tokens),
                                              compute=TRAIN), atol=1e-3)


def test_export_writes_the_critic_that_transformers_and_a_new_run_restore(saved, tmp_path):
    """The critic of step 1 (trunk and value head) lands in <out>/critic: transformers' token-classification
    model over it gives our values, `load_critic` restores it exactly, and a new run's state starts from it."""
    directory, states = saved
    out = tmp_path / "hf"
    checkpoint.export_hf(directory, 1, out)
    critic = states[1].critic
    tokens = np.random.default_rng(0).integers(0, CFG.vocab_size, (2, 11)).astype(np.int32)
    positions, mask = np.broadcast_to(np.arange(11), (2, 11)), np.ones((2, 11), bool)
    ours = np.asarray(models.values(CFG, critic, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask),
                                    compute=TRAIN, remat=False))
    model = transformers.AutoModelForTokenClassification.from_pretrained(
        out / checkpoint.CRITIC_DIR, attn_implementation="eager").float().eval()
    with torch.no_grad():
        theirs = model(input_ids=torch.from_numpy(tokens).long()).logits.numpy()
    assert theirs.shape == (2, 11, 1) and np.abs(ours).max() > 0.05
    np.testing.assert_allclose(theirs[..., 0], ours, atol=1e-4, rtol=0)

    source = models.ModelSource(path=str(out), critic_path=str(out / checkpoint.CRITIC_DIR))
    restored = experiment.load_critic(source, CFG)
    jax.tree.map(np.testing.assert_array_equal, restored, critic)
    carried = train_state.init_train_state(SPEC, MESH, states[1].policy, jax.random.key(5), kl_coef=0.05,
                                           critic=restored)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(carried.critic), critic)
    wider = dataclasses.replace(CFG, hidden_size=2 * CFG.hidden_size)
    with pytest.raises(ValueError, match=r"config.model.critic_path .* another shape"):
        experiment.load_critic(source, wider)


@pytest.fixture(scope="module")
def run_with_tokenizer(tmp_path_factory) -> tuple[Path, models.ModelConfig, dict]:
    """A run workdir whose one checkpoint (step 5: a tiny policy) records the tokenizer the run used."""
    root = tmp_path_factory.mktemp("run")
    texts = ["the quick brown fox jumps over the lazy dog", "a search agent answers questions"] * 20
    tokenizer = tokenizer_lib.train_bpe_tokenizer(texts, vocab_size=300, out_dir=str(root / "tokenizer"))
    cfg = dataclasses.replace(CFG, vocab_size=320, eos_token_id=tokenizer.eos_token_id,
                              pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    params = models.init_params(cfg, jax.random.key(3))
    with checkpoint.Checkpointer(root / "work" / "checkpoints") as ckpt:
        ckpt.save(5, {"policy": params}, model=cfg, record={checkpoint.TOKENIZER: str(root / "tokenizer")})
    return root / "work", cfg, jax.device_get(params)


def test_export_of_a_workdir_loads_and_generates_in_transformers(run_with_tokenizer, tmp_path, capsys):
    workdir, cfg, params = run_with_tokenizer
    out = tmp_path / "hf"
    checkpoint.main(["export", "--checkpoint", str(workdir), "--out", str(out)])
    assert "exported step 5" in capsys.readouterr().out
    assert not (out / checkpoint.CRITIC_DIR).exists()  # the run had no critic
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    model = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").float().eval()
    prompt = tokenizer("the quick brown", return_tensors="pt")
    with torch.no_grad():
        generated = model.generate(**prompt, max_new_tokens=4, do_sample=False)
    assert generated.shape[1] > prompt["input_ids"].shape[1]
    assert isinstance(tokenizer.decode(generated[0]), str) and model.generation_config.eos_token_id is not None
    ours = models.apply(cfg, params, jnp.asarray(prompt["input_ids"].numpy(), jnp.int32),
                        compute=TRAIN)
    assert int(generated[0, prompt["input_ids"].shape[1]]) == int(np.argmax(ours[0, -1]))  # greedy, as ours


def test_export_refuses_a_non_empty_dir_unless_told_to_overwrite(run_with_tokenizer, tmp_path, capsys):
    workdir, _, _ = run_with_tokenizer
    out = tmp_path / "kept"
    (out / "sub").mkdir(parents=True)
    (out / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit) as exit_info:
        checkpoint.main(["export", "--checkpoint", str(workdir), "--out", str(out)])
    assert exit_info.value.code == 1 and "--overwrite" in capsys.readouterr().err
    assert (out / "notes.txt").read_text() == "mine" and (out / "sub").is_dir()
    checkpoint.main(["export", "--checkpoint", str(workdir), "--out", str(out), "--overwrite"])
    assert (out / "model.safetensors").is_file() and not (out / "notes.txt").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    checkpoint.main(["export", "--checkpoint", str(workdir), "--out", str(empty)])  # an empty dir is fine
    assert (empty / "tokenizer.json").is_file()


def test_export_never_overwrites_the_run_it_reads(run_with_tokenizer, tmp_path, capsys):
    """Issue 67, cause 4: `--overwrite` with --out the run's workdir (or above it) replaced it whole:
    checkpoints/, metrics.jsonl and tensorboard/ gone. An --out that is the run, inside it or above it is
    refused with one line, overwrite or not, however the run is named (workdir, checkpoints/, a symlink)."""
    root = tmp_path / "runs"
    workdir = root / "work"
    shutil.copytree(run_with_tokenizer[0], workdir)
    (workdir / "metrics.jsonl").write_text('{"step": 5}\n')
    (tmp_path / "link").symlink_to(workdir)
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    for source, out in [(workdir, workdir), (workdir, workdir / "checkpoints"), (workdir, root),
                        (workdir, workdir / "export"), (workdir / "checkpoints", workdir),
                        (workdir / "checkpoints", workdir / "tensorboard"), (workdir, tmp_path / "link"),
                        (workdir / "checkpoints", workdir / "checkpoints" / "5")]:
        with pytest.raises(SystemExit) as exit_info:
            checkpoint.main(["export", "--checkpoint", str(source), "--out", str(out), "--overwrite"])
        err = capsys.readouterr().err
        assert exit_info.value.code == 1 and len(err.splitlines()) == 1, err
        assert err.startswith(f"error: --out {out} ") and f"the run it exports ({workdir.resolve()})" in err
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before  # nothing written or deleted
    checkpoint.main(["export", "--checkpoint", str(workdir), "--out", str(tmp_path / "hf"), "--overwrite"])
    assert (tmp_path / "hf" / "model.safetensors").is_file()


def test_export_on_the_command_line_prints_one_line(run_with_tokenizer, tmp_path):
    workdir, _, _ = run_with_tokenizer
    done = subprocess.run([sys.executable, "-m", "searchrl.checkpoint", "export", "--checkpoint", str(workdir),
                           "--out", str(tmp_path / "hf")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = (done.stdout + done.stderr).splitlines()
    assert len(lines) <= 2 and "exported step 5" in done.stdout, lines  # orbax alone logged 43 at INFO


def test_missing_steps_are_named(saved, tmp_path):
    directory, _ = saved
    with checkpoint.Checkpointer(directory, read_only=True) as ckpt:
        with pytest.raises(FileNotFoundError, match=r"no checkpoint for step 7 .* steps: \[1, 2\]"):
            ckpt.record(7)
    with checkpoint.Checkpointer(tmp_path / "empty") as ckpt:
        with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
            ckpt.restore(train_state.abstract_train_state(SPEC, MESH))
