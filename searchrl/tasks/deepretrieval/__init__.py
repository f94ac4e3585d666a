"""DeepRetrieval: RL-trained query rewriting rewarded by retrieval metrics from a real retriever. Its env and
prompts (`env`, `prompts`), rewards (`rewards`, `sql_sandbox`), data formats (`data`: literature, BEIR,
Spider, BIRD) and their preparation (`prepare`), search-engine retrievers (`engines`: PubMed,
ClinicalTrials.gov); its part of the evaluation report (`analysis`: the raw query beside the rewrite), API
model rows (`api_rewrites`), knowledge-injection audit (`injection`), rewrite analyses (`rewrites`),
end-to-end runtime comparison (`end_to_end`) and CPU miniature (`demo`, `world`, and its `config.demo` in
`config`)."""
from typing import Any

from searchrl.task import TASKS, Demo, Task
# data and engines register the data formats and retrievers the task reads
from searchrl.tasks.deepretrieval import analysis, config, data, engines, env  # noqa: F401


def miniature() -> Any:
    """The miniature (`searchrl.tasks.deepretrieval.demo`), imported when asked: configs import this
    package."""
    from searchrl.tasks.deepretrieval import demo

    return demo.MINIATURE


DEMO = Demo(miniature, reproduce="configs/deepretrieval.py:tiny", smoke="configs/deepretrieval.py:smoke",
            notebook="notebooks/03_deepretrieval.ipynb")
TASKS.register("deepretrieval")(Task(env.Config, env.make, demo=DEMO, demo_config=config.RewriteDemoConfig,
                                     report=analysis.REPORT))
