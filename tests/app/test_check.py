"""`searchrl check CONFIG`: every input a preset needs on this machine, listed at once with its state, size
and the command that fetches or builds it; exit 1 (one line, no traceback) when one is missing or short."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from searchrl import check, cli
from tests.processes import free_port

ROOT = Path(__file__).resolve().parents[2]


def run_check(monkeypatch, *args: str) -> int:
    """`searchrl check ARGS` in this process (config_flags reads the overrides from sys.argv); its exit
    status."""
    monkeypatch.setattr(sys, "argv", ["searchrl check", *args])
    try:
        check.main(list(args))
    except SystemExit as e:
        return e.code
    return 0


def lines_of(capsys) -> tuple[list[str], str]:
    out = capsys.readouterr()
    return out.out.splitlines(), out.err


def entries(lines: list[str]) -> dict[str, tuple[str, str, str]]:
    """what -> (state, where, the command line under it or ""), from check's columns (two spaces apart)."""
    found, last = {}, None
    for line in lines[1:]:
        if line.startswith(" "):
            found[last] = (*found[last][:2], line.strip())
            continue
        state, last, where = re.split(r"\s{2,}", line, maxsplit=2)
        found[last] = (state, where, "")
    return found


def test_the_paper_preset_on_this_machine_lists_every_missing_input_with_its_command(tmp_path):
    """The command line, from outside the checkout: Search-R1's paper run with its inputs under tmp_path."""
    models, data, index = tmp_path / "models", tmp_path / "flash rag", tmp_path / "indexes" / "wiki18_e5_flat"
    (data / "nq").mkdir(parents=True)
    (data / "nq" / "test.jsonl").write_text('{"id": "1", "question": "q", "golden_answers": ["a"]}\n')
    done = subprocess.run(
        [sys.executable, "-m", "searchrl", "check", str(ROOT / "configs" / "search_r1.py:paper"),
         f"--config.model.path={models / 'Qwen2.5-3B'}", f"--config.data.dir={data}",
         f"--config.retrieval.index_dir={index}", "--config.data.eval=nq,triviaqa"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"},
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: 6 of 11 not ready (model, ")
    found = entries(done.stdout.splitlines())
    missing = {what: command for what, (state, _, command) in found.items() if state == "missing"}
    assert set(missing) == {"model", "tokenizer", "dataset nq (train)", "dataset hotpotqa (train)",
                            "dataset triviaqa (test)", "index"}
    assert found["dataset nq (test)"][0] == "ok" and found["retrieval server"][0] == "-"
    assert missing["model"] == cli.fetch_model(models / "Qwen2.5-3B")
    assert shlex.split(missing["model"].removeprefix("fetch it with: ")) == [
        "python", "-m", "searchrl.data.download", "model", "--names", "Qwen/Qwen2.5-3B", "--out", str(models)]
    assert found["model"][1].endswith("[~5.7 GiB (3.09B parameters, Qwen/Qwen2.5-3B)]")
    assert shlex.split(missing["dataset hotpotqa (train)"].removeprefix("fetch it with: ")) == [
        "python", "-m", "searchrl.data.download", "qa", "--names", "hotpotqa", "--splits", "train", "--out",
        str(data)]
    assert missing["index"] == cli.make_index(index)
    # the AOT figures of the preset's setups; the disk where the inputs go, against the model's known size
    aot = json.loads(check.AOT_RESULTS.read_text())["runs"]
    decode = next(r for r in aot if r["config"] == "search_r1.py:paper,a100x8")["report"]["programs"][2]
    assert f"a100x8 (8 x NVIDIA A100-SXM4-80GB): {decode['total_gib']:.1f} GiB (decode) of 60.0" in \
        found["memory per device"][1]
    assert found["disk"][0] == "ok" and "5.7 GiB needed (known sizes)" in found["disk"][1]


def test_a_mesh_the_devices_do_not_divide_is_one_line(monkeypatch, capsys):
    """On the suite's 8 CPU devices: a100x8's mesh fits; 3 tensor shards do not (one line, exit 1); on 2 hosts
    the mesh spans both."""
    config = str(ROOT / "configs" / "search_r1.py:paper,a100x8")
    assert run_check(monkeypatch, config, "--config.data.eval=nq") == 1
    found = entries(lines_of(capsys)[0])
    assert found["devices vs mesh"][:2] == (
        "ok", "8 cpu device(s) (cpu): mesh {'data': 1, 'fsdp': 8, 'tensor': 1}")
    assert run_check(monkeypatch, config, "--config.data.eval=nq", "--config.mesh.tensor=3") == 1
    lines, err = lines_of(capsys)
    assert entries(lines)["devices vs mesh"][:2] == (
        "no", "8 cpu device(s) (cpu): mesh {'data': 1, 'fsdp': 8, 'tensor': 3} does not divide the 8 devices")
    assert "devices vs mesh" in err and err.count("\n") == 1
    assert run_check(monkeypatch, config, "--config.data.eval=nq", "--config.mesh.fsdp=16", "--hosts=2") == 1
    assert entries(lines_of(capsys)[0])["devices vs mesh"][1].startswith("2 hosts x 8 cpu device(s)")


def test_figures_of_other_programs_say_so_and_a_remote_server_is_asked(monkeypatch, capsys):
    """An override that changes the compiled programs is named beside the AOT figures; a remote retriever's
    server is probed (nothing listens on a free port: missing, with how to start one)."""
    port = free_port()
    assert run_check(monkeypatch, str(ROOT / "configs" / "search_r1.py:paper,h100x8"),
                     "--config.rollout.max_len=4096", "--config.retrieval.kind=remote",
                     f"--config.retrieval.url=http://127.0.0.1:{port}/retrieve") == 1
    found = entries(lines_of(capsys)[0])
    assert found["memory per device"][1].endswith("this config's overrides change its programs")
    state, where, command = found["retrieval server"]
    assert (state, command) == ("missing", "start it with: bash launch/retrieval_server.sh INDEX_DIR PORT")
    assert where.startswith(f"http://127.0.0.1:{port}/retrieve: no answer") and "index" not in found


def test_a_run_with_everything_in_place_is_ready(tmp_path, monkeypatch, capsys):
    """search_r1.py:tiny (a random model) with its tokenizer, datasets and index in place: exit 0."""
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text("{}")
    for split in ("train", "test"):
        (tmp_path / "data" / "nq").mkdir(parents=True, exist_ok=True)
        (tmp_path / "data" / "nq" / f"{split}.jsonl").write_text("{}\n")
    (tmp_path / "index").mkdir()
    (tmp_path / "index" / "searchrl_index.json").write_text('{"kind": "bm25"}')
    assert run_check(monkeypatch, str(ROOT / "configs" / "search_r1.py:tiny"),
                     f"--config.tokenizer={tmp_path / 'tok'}", f"--config.data.dir={tmp_path / 'data'}",
                     "--config.data.train=nq", "--config.data.eval=nq",
                     f"--config.retrieval.index_dir={tmp_path / 'index'}",
                     f"--config.workdir={tmp_path / 'run'}") == 0
    lines, err = lines_of(capsys)
    assert err == "" and lines[-1] == "all 9 ready"
    found = entries(lines[:-1])
    assert found["model"] == ("-", "preset tiny, initialised at random: nothing to fetch", "")
    assert found["index"][1].startswith(f"{tmp_path / 'index'} (bm25)")
    assert found["memory per device"][0] == "-" and "no AOT figures for search_r1.py:tiny" in \
        found["memory per device"][1]


def test_a_config_that_does_not_load_is_one_line(monkeypatch, capsys):
    assert run_check(monkeypatch, str(ROOT / "configs" / "search_r1.py:tiny"), "--config.rl.lamda=1") == 1
    err = lines_of(capsys)[1]
    assert err.count("\n") == 1 and "lamda" in err
