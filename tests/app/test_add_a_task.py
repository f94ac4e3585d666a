"""Adding a task as docs/development.md says: one package (here, this module) and one config file, registered
through `searchrl.task.TASKS` alone. Its miniature runs end to end through the substrate's entry points (the
demo, smoke, reproduce and publish paths a paper's miniature goes through), and nothing under searchrl/
names it."""
from __future__ import annotations

import ast
import json
import random
import re
import shutil
import statistics
from pathlib import Path

import pytest

from searchrl import experiment, run_config, task
from searchrl.configlib import ConfigError, group, ranged
from searchrl.demo import miniature, publish, reproduce
from searchrl.demo.config import preset
from searchrl.demo.results import claim, on_every_seed, paired, seed_intervals
from searchrl.tasks.search_r1 import env as search_r1
from tests.app.test_layers import BASELINE

NAME = "toy_counting"
POLICIES, METRICS = ("base", "tuned"), ("score",)


@group
class ToyDemoConfig:
    """The toy miniature's `config.demo`: its seeds and how many numbers its world draws."""

    seeds: tuple[int, ...] = ranged((0, 1, 2), "[0, inf)")
    parallel_seeds: int = ranged(1, "[1, inf)")
    draws: int = ranged(20, "[1, inf)")


def draws(seed: int, n: int) -> list[float]:
    """The toy world: `n` numbers drawn from `seed`."""
    rng = random.Random(seed)
    return [rng.random() for _ in range(n)]


def build_world(config: run_config.RunConfig, demo: ToyDemoConfig) -> Path:
    path = Path(config.data.dir) / "toy" / "draws.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(draws(config.seed, demo.draws)))
    return path


def cold_start(config: run_config.RunConfig, world: Path) -> list[float]:
    return json.loads(world.read_text())


def arms(config: run_config.RunConfig, numbers: list[float]) -> dict:
    """Two "policies": the draws' mean, and their mean with the largest draw counted twice."""
    base = statistics.fmean(numbers)
    return {"base": {"score": base}, "tuned": {"score": statistics.fmean([*numbers, max(numbers)])}}


def claims(per_seed) -> list[dict]:
    gain = paired(per_seed, "tuned", "base", "score")
    return [claim(NAME, "tuned_beats_base", "tuned - base score", gain, "> 0 on every seed",
                  on_every_seed(g > 0 for g in gain["per_seed"].values()))]


def markdown(per_seed) -> str:
    return "\n".join(f"seed {seed}: " + ", ".join(f"{p} {r[p]['score']:.3f}" for p in POLICIES)
                     for seed, r in per_seed.items())


MINIATURE = miniature.Miniature(
    world=build_world, cold_start=cold_start, arms=arms, claims=claims, markdown=markdown,
    over_seeds=lambda per_seed: seed_intervals(per_seed, POLICIES, METRICS))

CONFIG_FILE = '''from searchrl import run_config
from searchrl.configlib import miniature_workdir, to_config
from tests.app.test_add_a_task import NAME, ToyDemoConfig


def get_config(preset="tiny"):
    config = miniature_workdir(run_config.experiment_config(NAME), "{workdir}/" + preset)
    config.demo = to_config(ToyDemoConfig(seeds=(0,) if preset == "smoke" else (0, 1, 2)))
    return config
'''


def notebook(block: str) -> str:
    cell = {"cell_type": "markdown", "metadata": {},
            "source": ["# The toy\n", "\n", f"<!-- generated: {block} -->\n", "<!-- end generated -->"]}
    return json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}, indent=1) + "\n"


@pytest.fixture
def checkout(tmp_path, monkeypatch) -> Path:
    """A checkout with the toy task registered (one config file, one notebook) and the files publish writes
    into; the registry is as it was after the test."""
    task.load_all()  # every task package registered first: the copy below holds them all
    monkeypatch.setattr(task.TASKS, "_entries", dict(task.TASKS._entries))
    root = tmp_path / "checkout"
    for path in publish.blocks():  # the papers' notebooks and the README
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(publish.ROOT / path, root / path)
    (root / "notebooks/toy.ipynb").write_text(notebook(f"claims {NAME}"))
    config_file = tmp_path / "toy.py"
    config_file.write_text(CONFIG_FILE.format(workdir=tmp_path / "runs"))
    demo = task.Demo(lambda: MINIATURE, reproduce=f"{config_file}:tiny", smoke=f"{config_file}:smoke",
                     notebook="notebooks/toy.ipynb")
    task.TASKS.register(NAME)(task.Task(search_r1.Config, search_r1.make, demo=demo,
                                        demo_config=ToyDemoConfig))
    monkeypatch.setattr(publish, "ROOT", root)
    return root


def expected(seed: int) -> dict:
    numbers = draws(seed, ToyDemoConfig().draws)
    return {"base": {"score": statistics.fmean(numbers)},
            "tuned": {"score": statistics.fmean([*numbers, max(numbers)])}}


def without_seconds(results: dict) -> dict:
    return {seed: {k: v for k, v in r.items() if k != "seconds"} for seed, r in results["held_out"].items()}


def test_a_task_with_a_miniature_runs_through_demo_reproduce_and_publish(checkout, tmp_path):
    assert NAME in task.with_demo() and "search_r1" not in task.with_demo()
    with pytest.raises(ConfigError, match=rf"task 'search_r1' .* has no miniature; tasks with one: .*{NAME}"):
        miniature.run(run_config.parse(run_config.experiment_config("search_r1")))

    # the demo path (`python -m searchrl.demo --config toy.py:tiny`) and `make smoke`
    config = run_config.parse(preset(task.get(NAME).demo.reproduce))
    assert experiment.miniature(config)
    miniature.run(config)
    results = json.loads((Path(config.workdir) / "results.json").read_text())
    assert without_seconds(results) == {str(seed): expected(seed) for seed in (0, 1, 2)}
    assert (Path(config.workdir) / "seed1" / "toy" / "draws.json").is_file()  # each seed's own world
    gain = [expected(s)["tuned"]["score"] - expected(s)["base"]["score"] for s in (0, 1, 2)]
    assert results["over_seeds"]["tuned"]["score"]["n"] == 3
    assert results["claims"][0]["measured"]["per_seed"] == dict(zip("012", gain))
    assert results["claims"][0]["holds"]
    assert "seed 2: base " in (Path(config.workdir) / "results.md").read_text()
    miniature.smoke([NAME])
    smoke = json.loads((tmp_path / "runs" / "smoke" / "results.json").read_text())
    assert without_seconds(smoke) == {"0": expected(0)}

    # `make reproduce --papers toy_counting`, then `python -m searchrl.demo.publish --claims ...`
    out = tmp_path / "reproduce"
    reproduce.main([f"--papers={NAME}", "--seeds=0,1", f"--out={out}"])
    record = json.loads((out / reproduce.CLAIMS_FILE).read_text())
    assert record["papers"][NAME]["preset"].endswith("toy.py:tiny") and record["all_hold"]
    assert [c["paper"] for c in record["claims"]] == [NAME]
    publish.main([f"--claims={out / reproduce.CLAIMS_FILE}"])
    row = f"| {NAME} | tuned - base score | "
    assert row in (checkout / "README.md").read_text()
    cell = "".join(json.loads((checkout / "notebooks/toy.ipynb").read_text())["cells"][0]["source"])
    assert row in cell and "seeds 0, 1" in cell
    page = (checkout / publish.RESULTS_PAGE).read_text()
    assert f"## {NAME}" in page and f"| 1 | tuned | score | {expected(1)['tuned']['score']:.3f} |" in page
    publish.main(["--check"])  # the published record gives the generated files



# Substrate files whose code names a task, and why that is no task table.
NAMES_A_TASK = {"benchmarks/project.py": "the papers' authors' public wall times, each beside the config "
                                         "it compares with (a citation, not where the substrate finds tasks)"}


def code_strings(path: Path) -> list[str]:
    """The string constants of a module's code: its docstrings and comments left out."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
            and isinstance(node.value, str) and id(node) not in docstrings]


def test_the_substrate_holds_no_task_table():
    """No string in the code of searchrl/ outside searchrl/tasks names a paper's task package: the substrate
    finds tasks, their miniatures, presets, notebooks and main tables through the registry. (The common
    baseline, search_r1, is the benchmarks' reference workload and the usage examples' config.)"""
    root = publish.ROOT / "searchrl"
    names = [p.name for p in (root / "tasks").iterdir()
             if (p / "__init__.py").is_file() and p.name != BASELINE]
    word = re.compile(r"\b(" + "|".join(names) + r")\b")
    naming = {str(path.relative_to(root)): found for path in sorted(root.rglob("*.py"))
              if path.relative_to(root).parts[0] != "tasks"
              and (found := sorted({m for s in code_strings(path) for m in word.findall(s)}))}
    assert set(naming) == set(NAMES_A_TASK), naming
