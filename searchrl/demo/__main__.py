"""`make demo`: `python -m searchrl.demo [--config configs/autosearch.py:tiny] [--config.train.steps=...]`
runs the CPU miniature of the config's task (`config.env.name`): `configs/autosearch.py:tiny`,
`configs/deepretrieval.py:tiny` or `configs/rpl.py:tiny`."""
from absl import app
from ml_collections import config_flags

from searchrl import cli, run_config, task

_CONFIG = config_flags.DEFINE_config_file("config", "configs/autosearch.py:tiny", "Demo config.")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments {argv[1:]}")
    config = run_config.parse(_CONFIG.value)
    demo = task.get(config.task).demo
    if demo is None:
        raise app.UsageError(f"Task {config.task!r} (config.env.name) has no demo; tasks with one: "
                             f"{[n for n in task.TASKS if task.TASKS.get(n).demo is not None]}")
    demo(config)


if __name__ == "__main__":
    cli.run_app(main)
