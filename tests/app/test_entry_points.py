"""Every command-line entry point: --help prints its usage and exits 0; flags spelled with dashes still work."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from searchrl import cli

ROOT = Path(__file__).resolve().parents[2]
ENTRY_POINTS = sorted(
    ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__main__")
    for path in (ROOT / "searchrl").rglob("*.py")
    if any(call in path.read_text() for call in ("cli.run(main)", "cli.run_app(main)")) and path.name != "cli.py")


def test_the_entry_points_are_found():
    assert {"searchrl.main", "searchrl.eval", "searchrl.demo", "searchrl.checkpoint"} <= set(ENTRY_POINTS)


# Modules whose flags an entry point defines through another module's function.
SHARED_FLAGS = {"searchrl.eval": ["searchrl/eval/selection.py"]}
DEFINED = re.compile(r"(?:flags|config_flags)\.DEFINE_\w+\(\s*\"(\w+)\"")


def own_flags(module: str) -> set[str]:
    """The flag names `module`'s source (and the modules of SHARED_FLAGS) define."""
    path = ROOT.joinpath(*module.split("."))
    path = path / "__main__.py" if path.is_dir() else path.with_suffix(".py")
    sources = [path, *(ROOT / shared for shared in SHARED_FLAGS.get(module, []))]
    return {name for source in sources for name in DEFINED.findall(source.read_text())}


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_help_exits_zero_with_usage_and_its_own_flags(module):
    done = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--" in done.stdout and len(done.stdout.splitlines()) >= 3, done.stdout
    shown = set(re.findall(r"--(?:\[no\])?(\w+)", done.stdout))
    assert own_flags(module) - shown == set(), f"{module} --help hides them"


def test_the_sql_worker_explains_itself():
    """It is started by path by the sandbox; --help once crashed on int('--help')."""
    done = subprocess.run([sys.executable, "-m", "searchrl.tasks.deepretrieval.sql_sandbox", "--help"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "usage: python -I sql_sandbox.py FD" in done.stdout, done.stderr


def test_dashed_flag_names_are_spelled_with_underscores():
    names = {"batch_size", "no_normalize", "out"}
    assert cli.underscored("--batch-size=8", names) == "--batch_size=8"
    assert cli.underscored("--batch-size", names) == "--batch_size"
    assert cli.underscored("--no-normalize", names) == "--no_normalize"
    assert cli.underscored("--query-prefix=a-b", names) == "--query-prefix=a-b"  # not a flag of the tool
    assert cli.underscored("a-b", names) == "a-b" and cli.underscored("--out=x-y", names) == "--out=x-y"


@pytest.mark.parametrize("command, own_flag", [("train", "--config"), ("export", "--out")])
def test_searchrl_commands_run_each_tools_own_entry_point(command, own_flag):
    """`python -m searchrl COMMAND --help` (the `searchrl` console script's main) is the tool's own help: an
    entry point on absl's global flags (`searchrl.main`) and one on flags of its own (`searchrl.checkpoint`)."""
    done = subprocess.run([sys.executable, "-m", "searchrl", command, "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert own_flag in done.stdout and "commands:" not in done.stdout


def test_searchrl_lists_its_commands_and_refuses_an_unknown_one(capsys):
    from searchrl.__main__ import COMMANDS, main

    with pytest.raises(SystemExit) as e:
        main(["--help"])
    usage = capsys.readouterr().out
    assert e.value.code == 0 and all(f"\n  {name} " in usage for name in COMMANDS)
    with pytest.raises(SystemExit) as e:
        main(["trian"])
    assert e.value.code == 2 and capsys.readouterr().err.startswith("searchrl: unknown command 'trian'")
