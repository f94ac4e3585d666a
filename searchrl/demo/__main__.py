"""`make demo`: `python -m searchrl.demo [--config configs/autosearch.py:tiny] [--config.train.steps=...]`
runs the CPU miniature of the config's task (`config.env.name`): `configs/autosearch.py:tiny`,
`configs/deepretrieval.py:tiny` or `configs/rpl.py:tiny`.

`make smoke`: `python -m searchrl.demo --size smoke` runs each paper's `smoke` preset in turn (`SMOKE`): the
three miniatures end to end at their smallest, each under runs/smoke/<paper>
(--config and its overrides are not read then; `--config configs/rpl.py:smoke` runs one of them)."""
import os
import time

from absl import app, flags
from ml_collections import config_flags

from searchrl import cli, configlib, run_config, task

_CONFIG = config_flags.DEFINE_config_file("config", "configs/autosearch.py:tiny", "Demo config.")
_SIZE = flags.DEFINE_enum("size", "", ["", "smoke"], "smoke: each paper's smoke preset in turn (SMOKE), "
                          "in place of --config.")
SMOKE = ("autosearch", "deepretrieval", "rpl")  # configs/<name>.py:smoke
CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs")


def run_demo(config: run_config.RunConfig) -> None:
    """The miniature of `config`'s task."""
    demo = task.get(config.task).demo
    if demo is None:
        raise app.UsageError(f"Task {config.task!r} (config.env.name) has no demo; tasks with one: "
                             f"{[n for n in task.TASKS if task.TASKS.get(n).demo is not None]}")
    demo(config)


def smoke() -> None:
    """Each paper's smoke preset, one after another, with the time each took."""
    for name in SMOKE:
        start = time.perf_counter()
        path = os.path.join(CONFIGS, f"{name}.py")
        config = configlib.sibling(path, name).get_config("smoke")
        run_demo(run_config.parse(config))
        print(f"smoke: {name} done in {time.perf_counter() - start:.0f}s", flush=True)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments {argv[1:]}")
    if _SIZE.value == "smoke":
        smoke()
    else:
        run_demo(run_config.parse(_CONFIG.value))


if __name__ == "__main__":
    cli.run_app(main)
