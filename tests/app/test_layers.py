"""The package's layers: every import points down (or stays inside its own part), never up or sideways; the
substrate imports no task, and a task imports no other task but the common baseline (search_r1)."""
from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2] / "searchrl"

# Bottom to top. Parts on one level do not import each other.
LAYERS = [
    {"configlib"},  # config groups and their ranges: what every layer's config dataclasses are made with
    {"cli", "shapes", "metric_writer", "registry", "episode", "run_lock", "generated", "progress"},
    {"model_families"},  # what text (chat markers) and models (config.json) read of a decoder family
    {"text", "models"},
    {"retrieval", "checkpoint", "distributed"},
    {"data", "serving", "task", "rollout"},
    {"rl"},
    {"run_config"},
    {"experiment", "run_record"},
    {"eval", "benchmarks"},
    {"demo", "main", "check", "curves"},
    {"tasks"},  # one package per paper, on top of the task-free substrate
    {"__main__"},  # the `searchrl` command: runs the entry points by module name
]
BASELINE = "search_r1"  # the task the others may build on
LEVEL = {part: level for level, parts in enumerate(LAYERS) for part in parts}


def imported_parts(path: pathlib.Path, package: str = "searchrl") -> set[str]:
    """The parts of `package` (its subpackages and modules) a file imports (absolute imports: searchrl has no
    relative ones)."""
    out, depth = set(), package.count(".") + 1
    for node in ast.walk(ast.parse(path.read_text())):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        if isinstance(node, ast.ImportFrom) and node.module == package:
            names = [f"{package}.{a.name}" for a in node.names]
        out |= {n.split(".")[depth] for n in names if n.startswith(f"{package}.")
                and not n.split(".")[depth].startswith("__")}  # the package's own attributes (__version__)
    return out


def test_every_part_has_a_layer():
    parts = {p.stem if p.suffix == ".py" else p.name for p in ROOT.iterdir()
             if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()}
    assert parts == set(LEVEL), parts ^ set(LEVEL)


def test_imports_point_down():
    wrong = []
    for path in ROOT.rglob("*.py"):
        here = path.relative_to(ROOT).parts[0].removesuffix(".py")
        if here == "__init__":
            continue
        for there in imported_parts(path) - {here}:
            if LEVEL[there] >= LEVEL[here]:
                wrong.append(f"{path.relative_to(ROOT.parent)} imports searchrl.{there}")
    assert not wrong, "\n".join(sorted(wrong))


def test_a_task_imports_no_other_task_but_the_baseline():
    wrong = []
    for path in (ROOT / "tasks").rglob("*.py"):
        own = path.relative_to(ROOT / "tasks").parts[0]
        wrong += [f"{path.relative_to(ROOT.parent)} imports searchrl.tasks.{other}"
                  for other in imported_parts(path, "searchrl.tasks") - {own, BASELINE}]
    assert not wrong, "\n".join(sorted(wrong))
