"""DeepRetrieval: RL-trained query rewriting rewarded by retrieval metrics from a real retriever. Its env and
prompts (`env`, `prompts`), rewards (`rewards`, `sql_sandbox`), data formats (`data`: literature, BEIR,
Spider, BIRD) and their preparation (`prepare`), search-engine retrievers (`engines`: PubMed,
ClinicalTrials.gov); its part of the evaluation report (`analysis`: the raw query beside the rewrite), API
model rows (`api_rewrites`), knowledge-injection audit (`injection`), rewrite analyses (`rewrites`),
end-to-end runtime comparison (`end_to_end`) and CPU miniature (`demo`, `world`, and its `config.demo` in
`config`)."""
from typing import Any

from searchrl.task import TASKS, Task
# data and engines register the data formats and retrievers the task reads
from searchrl.tasks.deepretrieval import analysis, config, data, engines, env  # noqa: F401


def run_demo(config: Any) -> Any:
    """The miniature (`searchrl.tasks.deepretrieval.demo`), imported when run: configs import this package."""
    from searchrl.tasks.deepretrieval import demo as miniature

    return miniature.run(config)


def build_world(config: Any) -> Any:
    """The miniature's world (`demo.build_world`) for `config` and its `config.demo`, imported when run."""
    from searchrl.tasks.deepretrieval import demo as miniature

    return miniature.build_world(config, config.demo)


TASKS.register("deepretrieval")(Task(env.Config, env.make, demo=run_demo,
                                     demo_config=config.RewriteDemoConfig, world=build_world,
                                     report=analysis.REPORT))
