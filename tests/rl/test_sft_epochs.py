"""SFT by epochs: shuffled passes that hold every example once, a linear schedule over all epochs, and the
per-epoch checkpoints `main sft` saves (DeepRetrieval's SQL cold start keeps epoch 1 of its public SFT)."""
from __future__ import annotations

import dataclasses
import functools
import importlib.util

import jax
import numpy as np
import pytest

from searchrl import main, models, run_config
from searchrl.rl import sft
from searchrl.rl.config import OptimConfig, SFTConfig
from searchrl.text.tokenizer import load_tokenizer, train_bpe_tokenizer
from tests.app.test_presets import ROOT
from tests.data.retrieval_helpers import spider_dir, spider_questions, write_json
from tests.rl.test_sft import TRAIN, WORDS

COLOURS = [[(f"say {w} {v} :", False), (f"<answer> {v} </answer>", True)]
           for w in WORDS[:4] for v in WORDS[4:]]


def test_epochs_are_shuffled_passes_holding_every_example_once():
    config = SFTConfig(epochs=2.5, batch_size=4, seed=3)
    batches = list(sft.minibatches(config, 11))
    assert len(batches) == config.num_steps(11) == 8 and config.steps_per_epoch(11) == 3  # ceil(2.5 * 3)
    assert all(b.shape == (4,) for b in batches)
    passes = [np.concatenate(batches[i:i + 3]) for i in (0, 3)]
    for rows in passes:
        assert sorted(rows[rows >= 0]) == list(range(11)) and list(rows).count(-1) == 1
        assert (rows[-1:] == -1).all()  # the pass's last minibatch holds its empty row
    assert list(passes[0]) != list(passes[1])  # reshuffled
    half = np.concatenate(batches[6:])  # the half epoch: 2 of the third pass's minibatches, no repeat
    assert len(set(half)) == 8 and half.min() >= 0


def test_the_step_count_path_draws_the_same_minibatches_as_before():
    config = SFTConfig(steps=5, batch_size=3, seed=7)
    rng = np.random.default_rng(7)
    expected = [rng.choice(10, 3, replace=False) for _ in range(5)]
    assert [list(b) for b in sft.minibatches(config, 10)] == [list(b) for b in expected]


def test_save_epochs_must_end_within_the_run():
    with pytest.raises(ValueError, match=r"sft.save_epochs=\(1, 3\): epochs \[3\]"):
        SFTConfig(epochs=2, save_epochs=(1, 3))
    with pytest.raises(ValueError, match="do not end within sft.epochs=0.0"):
        SFTConfig(save_epochs=(1,))


def test_a_linear_decay_without_decay_steps_ends_at_the_last_step():
    config = SFTConfig(epochs=3, batch_size=4, optim=OptimConfig(lr=1.0, decay="linear"))
    assert config.schedule(10).decay_steps == 9  # 3 epochs of ceil(10 / 4) minibatches
    assert SFTConfig(optim=OptimConfig(lr=1.0, decay="linear", decay_steps=5)).schedule(10).decay_steps == 5


@pytest.fixture(scope="module")
def tokenizer():
    rng = np.random.default_rng(0)
    return train_bpe_tokenizer([" ".join(rng.choice(WORDS, 10)) for _ in range(200)], vocab_size=300)


def test_epoch_one_of_three_is_a_one_epoch_run_on_the_same_schedule(tokenizer):
    """12 examples in minibatches of 8: each pass's second minibatch has 4 empty rows."""
    cfg = dataclasses.replace(models.get_preset("tiny"), vocab_size=len(tokenizer))
    tokens, mask = sft.encode(tokenizer, COLOURS[:12], max_len=24)
    mesh = models.make_mesh(-1, 1, 1)
    optim = OptimConfig(lr=3e-3, decay="linear", weight_decay=0.0)
    three = SFTConfig(epochs=3, batch_size=8, save_epochs=(1,), optim=optim)
    saved = {}
    init = functools.partial(models.init_params, cfg, jax.random.key(0))

    def keep(epoch, params):
        saved[epoch] = jax.device_get(params)

    _, losses = sft.train(cfg, init(), tokens, mask, three, mesh, TRAIN, on_epoch_end=keep)
    assert sorted(saved) == [1, 2, 3] and len(losses) == 6 and np.isfinite(losses).all()
    assert losses[-1] < losses[0]
    # one epoch on the three-epoch schedule (train donates the params it is given: a fresh copy)
    one = dataclasses.replace(three, epochs=1, save_epochs=(),
                              optim=dataclasses.replace(optim, decay_steps=6))
    first, first_losses = sft.train(cfg, init(), tokens, mask, one, mesh, TRAIN)
    assert first_losses == losses[:2]
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=1e-6), saved[1],
                 jax.device_get(first))
    moved = jax.tree.leaves(jax.tree.map(lambda a, b: np.abs(a - b).max(), saved[1], saved[2]))
    assert max(moved) > 1e-4  # epoch 2 trained on


def test_an_empty_row_changes_nothing(tokenizer):
    """A minibatch with empty rows steps as one of only its examples: the loss is their token mean."""
    cfg = dataclasses.replace(models.get_preset("tiny"), vocab_size=len(tokenizer))
    tokens, mask = sft.encode(tokenizer, COLOURS[:12], max_len=24)
    params = models.init_params(cfg, jax.random.key(1))
    rows = next(sft.minibatches(SFTConfig(epochs=1, batch_size=8), 12))
    rows[4:] = -1
    full = (rows >= 0)[:, None]
    padded = float(sft.nll(cfg, params, tokens[rows] * full, mask[rows] * full, TRAIN))
    alone = float(sft.nll(cfg, params, tokens[rows[:4]], mask[rows[:4]], TRAIN))
    np.testing.assert_allclose(padded, alone, rtol=1e-6)


def test_main_sft_saves_epoch_one_beside_the_final_model(tmp_path):
    """`main sft` on the tiny SQL preset (its public 4 epochs, epoch 1 kept), shortened to 2 epochs."""
    spider = spider_dir(tmp_path, split="train")
    write_json(spider / "train.json", (spider_questions() * 4)[:10])
    train_bpe_tokenizer(["SELECT Name FROM singer WHERE Singer_ID = 1", '{"sql": "x"}'], 300,
                        out_dir=str(tmp_path / "tok"))
    spec = importlib.util.spec_from_file_location("deepretrieval_config", f"{ROOT}/configs/deepretrieval.py")
    presets = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(presets)
    config = presets.get_config("tiny_sql")
    assert config.sft.save_epochs == (1,) and config.sft.optim.decay == "linear"
    config.update_from_flattened_dict({
        "workdir": str(tmp_path / "run"), "tokenizer": str(tmp_path / "tok"), "data.dir": str(tmp_path),
        "data.train": "spider", "env.user_template": "{schema} {question}", "env.reasoning": False,
        "env.assistant_prefix": "<answer>", "sft.epochs": 2.0, "sft.batch_size": 8, "sft.max_len": 256})
    main.sft(run_config.parse(config))
    out = tmp_path / "run" / "sft"
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["sft"]  # the staging folder is gone
    final_cfg, final = models.load_hf(out)
    epoch_cfg, epoch_1 = models.load_hf(out / "epoch_1")
    assert epoch_cfg == final_cfg
    assert len(load_tokenizer(str(out / "epoch_1"))) == len(load_tokenizer(str(tmp_path / "tok")))
    moved = jax.tree.leaves(jax.tree.map(lambda a, b: np.abs(np.asarray(a) - np.asarray(b)).max(),
                                         epoch_1, final))
    assert max(moved) > 0  # two different checkpoints
