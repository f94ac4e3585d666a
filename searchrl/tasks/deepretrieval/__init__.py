"""DeepRetrieval: RL-trained query rewriting rewarded by retrieval metrics from a real retriever. Its env and
prompts (`env`, `prompts`), rewards (`rewards`, `sql_sandbox`), data formats (`data`: literature, BEIR,
Spider, BIRD), search-engine retrievers (`engines`: PubMed, ClinicalTrials.gov), raw-vs-rewritten tables and
rewrite analysis (`tables`, `rewrites`) and CPU miniature (`demo`, `world`)."""
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
