"""The absl entry point: config files, presets, command-line overrides, clear usage errors."""
import dataclasses
import os
import subprocess
import sys

import jax
import pytest

from searchrl import models, run_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_main(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "searchrl.main", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_info_applies_command_line_overrides():
    out = run_main("--config=configs/search_r1.py:tiny", "--config.model.num_layers=3",
                   "--config.mesh.fsdp=2", "info")
    assert out.returncode == 0, out.stderr
    assert "num_layers: 3" in out.stdout
    assert "mesh: {'data': 4, 'fsdp': 2, 'tensor': 1} over 8 cpu device(s)" in out.stdout
    cfg = dataclasses.replace(models.get_preset("tiny"), num_layers=3)
    count = sum(x.size for x in jax.tree.leaves(models.init_params(cfg, jax.random.key(0))))
    assert f"{count / 1e6:.2f}M parameters" in out.stdout


def test_unknown_config_key_and_command_are_clear_errors():
    out = run_main("--config=configs/search_r1.py:tiny", "--config.model.num_layerz=3", "info")
    assert out.returncode != 0 and "num_layerz" in out.stderr
    out = run_main("--config=configs/search_r1.py:tiny", "trian")
    assert out.returncode != 0 and "Expected one command out of" in out.stderr


def test_config_from_source_prefers_set_fields_over_the_preset():
    config = run_config.experiment_config("search_r1")
    config.model.preset = "tiny"
    config.model.hidden_size = 96
    cfg = models.config_from_source(run_config.parse(config).model)
    assert cfg.hidden_size == 96 and cfg.num_layers == models.get_preset("tiny").num_layers
    config.model.preset = "no_such_model"
    with pytest.raises(ValueError, match="no_such_model"):
        models.config_from_source(run_config.parse(config).model)


def test_building_and_parsing_every_preset_is_instant_and_imports_no_heavy_library():
    """configs/*.py import config dataclasses only (no JAX, transformers, orbax or torch), and every preset
    parses into its RunConfig, with and without each hardware setup."""
    code = ("import sys; sys.path.insert(0, 'configs'); import autosearch, deepretrieval, rpl, search_r1\n"
            "from hardware import SETUPS\n"
            "from searchrl.run_config import parse\n"
            "for setup in ('', *(',' + s for s in SETUPS)):\n"
            "    for name in autosearch.PRESETS: parse(autosearch.get_config(name + setup))\n"
            "    for name in search_r1.PRESETS: parse(search_r1.get_config(name + setup))\n"
            "    for name in deepretrieval.PRESETS:\n"
            "        parse(deepretrieval.get_config(name + ',no_reasoning' + setup))\n"
            "    for name in rpl.PRESETS: parse(rpl.get_config(name + ',dual,no_thinking' + setup))\n"
            "print(sorted(m for m in ('jax', 'transformers', 'orbax', 'torch', 'tensorflow') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_every_group_rejects_unknown_keys():
    out = run_main("--config=configs/autosearch.py:tiny", "--config.rl.lamda=0.9", "info")
    assert out.returncode != 0 and "lamda" in out.stderr

    config = run_config.experiment_config("search_r1")
    config.rl.lamda = 0.9  # a typo in a config file, not on the command line
    with pytest.raises(ValueError, match=r"config.rl: unknown key\(s\) \['lamda'\]"):
        run_config.parse(config)
    config = run_config.experiment_config("search_r1")
    config.rl.actor.learning_rate = 1e-3
    with pytest.raises(ValueError, match=r"config.rl.actor: unknown key\(s\) \['learning_rate'\]"):
        run_config.parse(config)


def test_sft_cold_starts_sql_on_gold_queries_and_saves_a_hugging_face_model(tmp_path):
    from tests.data.retrieval_helpers import spider_dir, spider_questions, write_json
    from searchrl.text.tokenizer import load_tokenizer, train_bpe_tokenizer

    spider = spider_dir(tmp_path, split="train")
    write_json(spider / "train.json", (spider_questions() * 3)[:8])
    train_bpe_tokenizer(["SELECT Name FROM singer WHERE Singer_ID = 1", '{"sql": "x"}'], 300,
                        out_dir=str(tmp_path / "tok"))
    workdir = tmp_path / "run"
    out = run_main("--config=configs/deepretrieval.py:tiny_sql", f"--config.workdir={workdir}",
                   f"--config.tokenizer={tmp_path / 'tok'}", f"--config.data.dir={tmp_path}",
                   "--config.data.train=spider", "--config.env.user_template={schema} {question}",
                   "--config.env.reasoning=False", "--config.env.assistant_prefix=<answer>",
                   "--config.sft.epochs=2", "--config.sft.batch_size=8",
                   "--config.sft.max_len=256", "sft")
    assert out.returncode == 0, out.stderr
    assert "SFT on 8 examples, 2 steps" in out.stdout
    cfg, params = models.load_hf(workdir / "sft")
    assert cfg.num_layers == models.get_preset("tiny").num_layers
    assert len(load_tokenizer(str(workdir / "sft"))) == len(load_tokenizer(str(tmp_path / "tok")))
    out = run_main("--config=configs/deepretrieval.py:tiny_classic", "--config.retrieval.index_dir=x",
                   f"--config.tokenizer={tmp_path / 'tok'}", f"--config.data.dir={tmp_path}", "sft")
    assert out.returncode != 0
