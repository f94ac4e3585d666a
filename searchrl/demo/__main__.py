"""`make demo`: `python -m searchrl.demo --config configs/autosearch.py:tiny [--config.train.steps=...]`
runs the CPU miniature of the config's task (`config.env.name`, its `searchrl.task.Demo`), e.g.
`configs/deepretrieval.py:tiny`.

`make smoke`: `python -m searchrl.demo --size smoke` runs the smoke preset of every task with a miniature in
turn (`searchrl.task.Demo.smoke`): the miniatures end to end at their smallest, each under its own workdir
(--config and its overrides are not read then; `--config configs/rpl.py:smoke` runs one of them)."""
import time
from typing import Sequence

from absl import app, flags
from ml_collections import config_flags

from searchrl import cli, run_config, task
from searchrl.demo import config as demo_config, miniature

_CONFIG = config_flags.DEFINE_config_file("config", None, "Demo config: FILE:PRESET of a task with a "
                                          "miniature (`searchrl.task.Demo`).")
_SIZE = flags.DEFINE_enum("size", "", ["", "smoke"], "smoke: every miniature's smoke preset in turn, "
                          "in place of --config.")


def run_demo(config: run_config.RunConfig) -> None:
    """The miniature of `config`'s task."""
    if task.get(config.task).demo is None:
        raise app.UsageError(f"Task {config.task!r} (config.env.name) has no demo; tasks with one: "
                             f"{task.with_demo()}")
    miniature.run(config)


def smoke(names: Sequence[str] = ()) -> None:
    """The smoke preset of each miniature of `names` (default: every task's), one after another, with the time
    each took."""
    for name in names or task.with_demo():
        start = time.perf_counter()
        run_demo(run_config.parse(demo_config.preset(task.get(name).demo.smoke)))
        print(f"smoke: {name} done in {time.perf_counter() - start:.0f}s", flush=True)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments {argv[1:]}")
    if _SIZE.value == "smoke":
        smoke()
    elif _CONFIG.value is None:
        raise app.UsageError(f"pass --config FILE:PRESET (a miniature's, e.g. configs/<task>.py:tiny; tasks "
                             f"with one: {task.with_demo()}) or --size smoke")
    else:
        run_demo(run_config.parse(_CONFIG.value))


if __name__ == "__main__":
    cli.run_app(main)
