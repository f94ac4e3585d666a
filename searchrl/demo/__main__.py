"""`make demo`: `python -m searchrl.demo --config configs/autosearch.py:tiny [--config.train.steps=...]`
runs the CPU miniature of the config's task (`config.env.name`, its `searchrl.task.Demo`), e.g.
`configs/deepretrieval.py:tiny`.

`make smoke`: `python -m searchrl.demo --size smoke` runs the smoke preset of every task with a miniature in
turn (`searchrl.task.Demo.smoke`, `searchrl.demo.miniature.smoke`): the miniatures end to end at their
smallest, each under its own workdir (--config and its overrides are not read then; `--config
configs/rpl.py:smoke` runs one of them)."""
from absl import app, flags
from ml_collections import config_flags

from searchrl import cli, run_config, task
from searchrl.demo import miniature

_CONFIG = config_flags.DEFINE_config_file("config", None, "Demo config: FILE:PRESET of a task with a "
                                          "miniature (`searchrl.task.Demo`).")
_SIZE = flags.DEFINE_enum("size", "", ["", "smoke"], "smoke: every miniature's smoke preset in turn, "
                          "in place of --config.")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments {argv[1:]}")
    if _SIZE.value == "smoke":
        miniature.smoke()
    elif _CONFIG.value is None:
        raise app.UsageError(f"pass --config FILE:PRESET (a miniature's, e.g. configs/<task>.py:tiny; tasks "
                             f"with one: {task.with_demo()}) or --size smoke")
    else:
        miniature.run(run_config.parse(_CONFIG.value))


if __name__ == "__main__":
    cli.run_app(main)
