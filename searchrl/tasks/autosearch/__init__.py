"""AutoSearch: Search-R1's env with an intermediate answer after every search and turn-level rewards for
format, answer-quality gains and the minimal sufficient search depth (`env`, `rewards`); its pilot study at
forced depth (`pilot`, `forced_depth`), prompting baselines (`baselines`, `prompts`), depth tables (`tables`)
and CPU miniature (`demo`, `scripted`)."""
from typing import Any

from searchrl.task import TASKS, Task
from searchrl.tasks.autosearch import analysis, config, env


def run_demo(config: Any) -> Any:
    """The miniature (`searchrl.tasks.autosearch.demo`), imported when run: configs import this package."""
    from searchrl.tasks.autosearch import demo as miniature

    return miniature.run(config)


def build_world(config: Any) -> Any:
    """The miniature's world (`demo.build_world`) for `config` and its `config.demo`, imported when run."""
    from searchrl.tasks.autosearch import demo as miniature

    return miniature.build_world(config, config.demo)


TASKS.register("autosearch")(Task(env.Config, env.make, demo=run_demo, demo_config=config.DemoConfig,
                                  world=build_world, report=analysis.REPORT, side_branch=env.side_branch))
