"""A model, tokenizer, dataset or index that is not on disk: one line naming what and where, and a command
that makes it (the download tool's, checked against its real flags), from each place searchrl opens one and
through the command lines (exit status 1, no traceback)."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from searchrl import cli, experiment, models, run_config
from searchrl.data import datasets, download
from searchrl.retrieval import index_fingerprint, load_retriever
from searchrl.text.tokenizer import load_tokenizer

REPO = Path(__file__).resolve().parents[2]


def command_of(message: str, lead: str) -> list[str]:
    """The command after `lead` in a MissingInput's message, split as a shell would (up to "," or ";")."""
    words = shlex.split(message.split(lead, 1)[1].rstrip(")"))
    end = next((i for i, w in enumerate(words) if w.endswith((",", ";"))), len(words) - 1)
    return words[:end] + [words[end].rstrip(",;")]


def test_a_missing_model_names_its_path_and_the_download_command(tmp_path):
    path = tmp_path / "models" / "Qwen2.5-3B"
    with pytest.raises(cli.MissingInput) as e:
        models.load_hf(path)
    message = str(e.value)
    assert message.startswith(f"model not found: {path} (fetch it with: ") and "\n" not in message
    assert command_of(message, "fetch it with: ") == ["python", "-m", "searchrl.data.download", "model",
                                                      "--names", "Qwen/Qwen2.5-3B", "--out", str(path.parent)]
    assert "ORG" not in message  # the hub organisation comes from the model's name (cli.HUB_ORGANISATIONS)
    path.mkdir(parents=True)  # a folder without config.json: the file is named
    with pytest.raises(cli.MissingInput, match=f"model not found: {path / 'config.json'} "):
        models.load_hf(path)


def test_a_missing_tokenizer_dataset_or_index(tmp_path):
    with pytest.raises(cli.MissingInput, match=f"tokenizer not found: {tmp_path / 'tok'} \\(fetch it with: "
                                               f"python -m searchrl.data.download model --names ORG/tok "):
        load_tokenizer(str(tmp_path / "tok"))
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")  # a model folder without its tokenizer
    with pytest.raises(cli.MissingInput, match=r"tokenizer files \(tokenizer.json, .*\) not found: "):
        load_tokenizer(str(tmp_path / "model"))
    with pytest.raises(cli.MissingInput) as e:
        datasets.read_qa(str(tmp_path / "flash rag"), "nq", "train")
    assert str(e.value).startswith(f"dataset 'nq' (config.data.dir), split train (.jsonl or .parquet) not "
                                   f"found: {tmp_path / 'flash rag' / 'nq' / 'train.jsonl'} (fetch it with: ")
    fetch = command_of(str(e.value), "fetch it with: ")
    assert fetch == ["python", "-m", "searchrl.data.download", "qa", "--names", "nq", "--splits", "train",
                     "--out", str(tmp_path / "flash rag")]
    for open_index in (load_retriever, index_fingerprint):
        with pytest.raises(cli.MissingInput) as e:
            open_index(tmp_path / "idx")
        message = str(e.value)
        assert message.startswith(f"index dir not found: {tmp_path / 'idx'} (build it with: python -m "
                                  f"searchrl.retrieval.index --kind bm25 --corpus CORPUS.jsonl --out ")
        assert command_of(message, "Search-R1's e5 index: ") == [
            "python", "-m", "searchrl.data.download", "wiki18", "--out", "WIKI18_DIR", "--index_dir",
            str(tmp_path / "idx"), "--encoder", "E5_DIR"]


def test_the_download_commands_named_are_the_tools_own():
    """Each subcommand and flag a message names is one the download tool defines."""
    assert {"model", "qa", "wiki18"} <= set(download.COMMANDS)
    source = Path(download.__file__).read_text()
    for flag in ("names", "splits", "out", "index_dir", "encoder"):
        assert f'DEFINE_list("{flag}"' in source or f'DEFINE_string("{flag}"' in source, flag


def test_a_miniature_without_its_world_says_how_to_build_it(tmp_path):
    from configs import autosearch

    config = autosearch.get_config("tiny")
    config.workdir = config.data.dir = str(tmp_path / "demo")
    config.tokenizer = str(tmp_path / "demo" / "tok")
    config.retrieval.index_dir = str(tmp_path / "demo" / "i")
    with pytest.raises(cli.MissingInput, match="autosearch's miniature world not found: .*demo \\(build it "
                                               "with: python -m searchrl.main --config CONFIG world"):
        experiment.build(run_config.parse(config))


def run_tool(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, env=env,
                          timeout=120)


@pytest.mark.parametrize("argv, first_words", [
    (["searchrl.main", "--config", "configs/search_r1.py:paper", "--config.model.path=/nowhere/Qwen2.5-3B",
      "info"], "error: model not found: /nowhere/Qwen2.5-3B (fetch it with: python -m "
               "searchrl.data.download model --names Qwen/Qwen2.5-3B --out /nowhere)"),
    (["searchrl.serving.serve", "--index", "/nowhere/idx", "--print_fingerprint"],
     "index dir not found: /nowhere/idx (build it with: ")])
def test_the_command_lines_end_with_the_one_line(argv, first_words):
    """`main ... info` on a paper preset without its model folder (the issue's crash), and the retrieval
    server's start, without a traceback."""
    out = run_tool(*argv)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    [line] = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert first_words in line and out.stderr.strip().endswith(line[-40:])
