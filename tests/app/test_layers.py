"""The package's layers: every import points down (or stays inside its own part), never up or sideways."""
from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2] / "searchrl"

# Bottom to top. Parts on one level do not import each other.
LAYERS = [
    {"configlib", "cli", "shapes", "metric_writer", "text"},
    {"models", "retrieval", "rewards"},
    {"checkpoint", "distributed", "episode", "data", "programs"},
    {"rollout", "envs"},
    {"rl"},
    {"run_config", "experiment", "program_mutation"},
    {"eval", "benchmarks"},
    {"demo", "main"},
]
LEVEL = {part: level for level, parts in enumerate(LAYERS) for part in parts}


def part_of(module: str) -> str:
    return module.split(".")[1]


def imported_parts(path: pathlib.Path) -> set[str]:
    """The searchrl parts a file imports (absolute imports: searchrl has no relative ones)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        if isinstance(node, ast.ImportFrom) and node.module == "searchrl":
            names = [f"searchrl.{a.name}" for a in node.names]
        out |= {part_of(n) for n in names if n.startswith("searchrl.")}
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
