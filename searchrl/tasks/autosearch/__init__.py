"""AutoSearch: Search-R1's env with an intermediate answer after every search and turn-level rewards for
format, answer-quality gains and the minimal sufficient search depth (`env`, `rewards`); its pilot study at
forced depth (`pilot`, `forced_depth`), prompting baselines (`baselines`, `prompts`), depth tables (`tables`)
and CPU miniature (`demo`, `scripted`)."""
from typing import Any

from searchrl.task import TASKS, Demo, Task
from searchrl.tasks.autosearch import analysis, config, env


def miniature() -> Any:
    """The miniature (`searchrl.tasks.autosearch.demo`), imported when asked: configs import this package."""
    from searchrl.tasks.autosearch import demo

    return demo.MINIATURE


DEMO = Demo(miniature, reproduce="configs/autosearch.py:tiny_arms", smoke="configs/autosearch.py:smoke",
            notebook="notebooks/01_quickstart.ipynb")
TASKS.register("autosearch")(Task(env.Config, env.make, demo=DEMO, demo_config=config.DemoConfig,
                                  report=analysis.REPORT, side_branch=env.side_branch))
