"""AutoSearch: Search-R1's env with an intermediate answer after every search and turn-level rewards for
format, answer-quality gains and the minimal sufficient search depth (`env`, `rewards`), and its RL baselines
as other rewards of that env (`baseline_rewards`: StepSearch, HiPRAG); its pilot study at forced depth
(`pilot`, `forced_depth`), over- and under-search rates (`search_rates`), prompting baselines (`baselines`,
`prompts`), its part of the evaluation report (`analysis`: results by hop count, the minimal depths) and CPU
miniature (`demo`, `scripted`, and its `config.demo` in `config`)."""
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
