"""AutoSearch: Search-R1's env with an intermediate answer after every search and turn-level rewards for
format, answer-quality gains and the minimal sufficient search depth (`env`, `rewards`), and its RL baselines
as other rewards of that env (`baseline_rewards`: StepSearch, HiPRAG); its pilot study at forced depth
(`pilot`, `forced_depth`), over- and under-search rates (`search_rates`), prompting baselines (`baselines`,
`prompts`), its part of the evaluation report (`analysis`: results by hop count, the minimal depths) and CPU
miniature (`demo`, `scripted`, and its `config.demo` in `config`)."""
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
