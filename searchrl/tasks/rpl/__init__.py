"""Retrieval Program Learning: the policy writes programs over a retrieval SDK, run in a sandbox.

    result = execute(source, sdk)  # never raises for any source (`sandbox`)
    result.shown  # the hits the program showed, in order
    result.error  # None, or "<rule or limit>: <detail> (line L, column C)"

Programs are untrusted input (the policy writes them): they are parsed with `ast`, checked against an
allow-list (`language`, `limits`, `values`) and run by searchrl's own tree-walking interpreter (`sandbox`),
never by Python's eval, exec or compile, over the SDK (`sdk`). Also here: the env (`env`), program mutation
(`mutation`) and its distillation inside an RL run (`distill`, a train hook of the env), GlobalQA
(`globalqa`), its part of the evaluation report (`analysis`: results by task type), Figures 4 and 5
(`figures`), one program run from the command line (`run`) and the CPU miniature (`demo`); `config` holds the
mutation's and the miniature's config groups.
"""
from typing import Any

from searchrl.task import TASKS, Demo, AnswerScorer, Task
from searchrl.tasks.rpl import analysis, config, env


def miniature() -> Any:
    """The miniature (`searchrl.tasks.rpl.demo`), imported when asked: configs import this package."""
    from searchrl.tasks.rpl import demo

    return demo.MINIATURE


def train_hooks(program_env: env.ProgramEnv) -> list[Any]:
    """Program mutation (`searchrl.tasks.rpl.distill`), imported when a run trains: it needs JAX."""
    from searchrl.tasks.rpl import distill

    return distill.train_hooks(program_env)


DEMO = Demo(miniature, reproduce="configs/rpl.py:tiny", smoke="configs/rpl.py:smoke",
            notebook="notebooks/04_rpl.ipynb")
TASKS.register("rpl")(Task(env.Config, env.make, demo=DEMO, demo_config=config.RPLDemoConfig,
                           report=analysis.REPORT, train_hooks=train_hooks,
                           answer_scorer=AnswerScorer(env.is_globalqa, env.globalqa_scores)))
