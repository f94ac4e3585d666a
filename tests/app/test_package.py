"""searchrl as a package: its wheel, installed into a fresh virtual environment outside the checkout, declares
its requirements, puts a `searchrl` command on PATH and runs a tiny training run from it.

Offline: the wheel is built without build isolation (setuptools from requirements-test.txt) and installed with
--no-deps; the new environment finds the requirements in this one's site-packages through a .pth file (a
path line: the editable install of this checkout there stays inactive, so `searchrl` comes from the wheel).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import venv
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from searchrl.text.tokenizer import train_bpe_tokenizer

ROOT = Path(__file__).resolve().parents[2]
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
QUESTIONS = [("who wrote the velo saga", "ana"), ("where is the river orin", "north"),
             ("what colour is the stone of kel", "grey"), ("who built the tower of mar", "ilo")]


def run(command: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: int = 240
        ) -> subprocess.CompletedProcess:
    """`command`'s result, asserting it succeeded; without PYTHONPATH unless `env` says otherwise (pip and
    the new environment must not see the checkout's package)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} if env is None else env
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{command}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def build_wheel(tmp: Path) -> Path:
    """The wheel of the checkout's package files (copied out first: the build leaves build/ behind)."""
    source = tmp / "source"
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "searchrl", source / "searchrl", ignore=shutil.ignore_patterns("__pycache__"))
    run([*PIP, "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(tmp / "dist"),
         str(source)], tmp)
    [wheel] = (tmp / "dist").glob("searchrl-*.whl")
    return wheel


def fresh_environment(tmp: Path, wheel: Path) -> Path:
    """A new venv holding the wheel alone, its requirements read from this environment's site-packages."""
    env_dir = tmp / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    run([*PIP, "--python", str(python), "install", "--quiet", "--no-deps", "--no-index", str(wheel)], tmp)
    purelib = run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp)
    Path(purelib.stdout.strip(), "requirements_of_the_test.pth").write_text(sysconfig.get_paths()["purelib"])
    return env_dir


def tiny_inputs(tmp: Path) -> list[str]:
    """A tokenizer, a QA dataset and a BM25 index for configs/search_r1.py:tiny; its overrides."""
    passages = [f"the answer to {q} is {a}" for q, a in QUESTIONS]
    train_bpe_tokenizer([*passages, *(q for q, _ in QUESTIONS)] * 4, vocab_size=300, out_dir=str(tmp / "tok"))
    (tmp / "data" / "nq").mkdir(parents=True)
    rows = [{"id": str(i), "question": q, "golden_answers": [a]} for i, (q, a) in enumerate(QUESTIONS)]
    for split in ("train", "test"):
        (tmp / "data" / "nq" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp / "corpus.jsonl").write_text("".join(json.dumps({"id": str(i), "contents": p}) + "\n"
                                              for i, p in enumerate(passages)))
    return [f"--config.tokenizer={tmp / 'tok'}", f"--config.data.dir={tmp / 'data'}",
            "--config.data.train=nq", "--config.data.eval=nq",
            f"--config.retrieval.index_dir={tmp / 'index'}",
            f"--config.workdir={tmp / 'run'}", "--config.train.steps=1", "--config.train.batch_size=2",
            "--config.train.eval_every=0", "--config.rl.minibatch_size=2", "--config.rl.micro_batch_size=2",
            "--config.model.num_layers=1", "--config.env.max_turns=1", "--config.rollout.max_turn_tokens=8",
            "--config.rollout.max_len=192", "--config.rollout.obs_buckets=(32,)",
            "--config.rollout.max_obs_tokens=32", "--config.env.prompt_template=Q: {question} A:",
            "--config.rollout.max_prompt_tokens=32"]


def test_the_wheel_installs_declares_its_requirements_and_runs_from_a_fresh_environment(tmp_path):
    env_dir = fresh_environment(tmp_path, build_wheel(tmp_path))
    show = run([*PIP, "--python", str(env_dir / "bin" / "python"), "show", "searchrl"], tmp_path).stdout
    requires = {name.strip() for name in show.split("Requires:")[1].splitlines()[0].split(",")}
    assert {"jax", "flax", "optax", "orbax-checkpoint", "transformers", "bm25s"} <= requires, show
    assert "faiss-cpu" not in requires  # the cpu, tpu and test extras bring it; the gpu extra faiss-gpu

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {
        "PATH": f"{env_dir / 'bin'}{os.pathsep}{os.environ['PATH']}", "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    searchrl = str(env_dir / "bin" / "searchrl")
    usage = run([searchrl, "--help"], tmp_path, env).stdout
    assert "commands:" in usage and "  train " in usage and "  check " in usage
    where = run([str(env_dir / "bin" / "python"), "-c", "import searchrl; print(searchrl.__file__)"],
                tmp_path, env).stdout
    assert where.startswith(str(env_dir)), where  # the wheel's package, not the checkout's

    overrides = tiny_inputs(tmp_path)
    run([searchrl, "index", "--kind", "bm25", "--corpus", str(tmp_path / "corpus.jsonl"), "--out",
         str(tmp_path / "index")], tmp_path, env)
    config = str(ROOT / "configs" / "search_r1.py:tiny")
    trained = run([searchrl, "train", "--config", config, *overrides], tmp_path, env)
    assert "process 0 of 1" in trained.stdout, trained.stdout
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in metrics] == [1]
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["commit"] is None and record["config"]["train"]["steps"] == 1  # a wheel: no checkout
    assert record["command"][1:4] == [searchrl, "train", "--config"]  # as typed
    assert record["versions"]["searchrl"] == "0.1.0"


def test_the_pinned_files_are_a_lock_of_the_declared_ranges():
    """Every pin of requirements*.txt lies in pyproject's range for it (the runtime's in the dependencies,
    each machine's in its extra); FAISS's CPU build is in no extra that brings the GPU one."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    locks = [("requirements.txt", project["dependencies"] + extras["cpu"]),
             ("requirements-gpu.txt", extras["gpu"]), ("requirements-tpu.txt", extras["tpu"]),
             ("requirements-lucene.txt", extras["lucene"]), ("requirements-test.txt", extras["test"])]
    for requirements, declared in locks:
        ranges = {canonicalize_name(r.name): r for r in map(Requirement, declared) if r.marker is None
                  or r.marker.evaluate()}
        for line in (ROOT / requirements).read_text().splitlines():
            line = line.split("#")[0].strip()
            if not line:
                continue
            pin = Requirement(line)
            if pin.marker is not None and not pin.marker.evaluate():
                continue
            name = canonicalize_name(pin.name)
            assert name in ranges, (requirements, line)
            version = next(iter(pin.specifier)).version
            assert ranges[name].specifier.contains(version, prereleases=True), (requirements, line)
    gpu = {canonicalize_name(Requirement(r).name) for r in extras["gpu"]}
    assert "faiss-gpu" in gpu and "faiss-cpu" not in gpu
    base = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}
    assert not any(name.startswith("faiss") for name in base)
