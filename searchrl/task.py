"""The task protocol: a task (one package per paper under `searchrl.tasks`) registers a `Task` by name in
`TASKS`; `config.env.name` picks one.

A task package defines its env, rewards, prompts, data readers, demo and analyses, and registers a `Task`:

    TASKS.register("<name>")(Task(Config, make))

`Config` is the dataclass of its `config.env` group and `make(config, retrieval)` builds its env over the
retriever that `config.retrieval` describes. The optional parts extend the substrate through declared hooks:
`demo` declares its CPU miniature (`Demo`: `python -m searchrl.demo`, `make reproduce`,
`searchrl.demo.publish`), `report` adds its own groupings and analyses to an evaluation report
(`searchrl.eval.report`), `train_hooks` extends the training loop (`searchrl.rl.hooks.TrainHook`). Nothing
here or in the rest of the substrate names a task; a task defined anywhere else (a test, a user's module)
registers the same way.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import pkgutil
from typing import Any, Callable, Mapping, Sequence

import ml_collections

from searchrl.configlib import to_config
from searchrl.episode import Env, SideBranch
from searchrl.registry import Registry

@dataclasses.dataclass(frozen=True)
class Analysis:
    """A task's own part of an evaluation report (`searchrl.eval.report`): `summarize(rows, meta)` gives its
    summary of the question rows (None: nothing to add, e.g. the rows lack what it reads), kept in the
    results under `name`; `markdown(summary, meta)` is its section of results.md and `plot(ax, summary)`, if
    any, its panel of the report's figure."""

    name: str
    summarize: Callable[[Sequence[Mapping[str, Any]], Mapping[str, Any]], Any]
    markdown: Callable[[Any, Mapping[str, Any]], str]
    plot: Callable[[Any, Any], None] | None = None


@dataclasses.dataclass(frozen=True)
class Report:
    """What a task adds to an evaluation report: `labels`, the fields of its question rows that describe a
    question rather than score it (never averaged); `groups`, the fields to tabulate (and draw budget curves)
    by, each with its title; its own `analyses`; `main_table`, the metrics of its paper's main table, the
    columns `searchrl.eval.merge --task` compares runs on."""

    labels: tuple[str, ...] = ()
    groups: Mapping[str, str] = dataclasses.field(default_factory=dict)
    analyses: tuple[Analysis, ...] = ()
    main_table: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class AnswerScorer:
    """How a task scores a free-form answer to one of its examples (a prompting baseline's, on any task's
    data): `applies(example)`, and `score(answer, shown, example)` -> metrics, `shown` the (name, id) of each
    document the prompt showed, in order."""

    applies: Callable[[Mapping[str, Any]], bool]
    score: Callable[[str, Sequence[tuple[str, str]], Mapping[str, Any]], dict[str, float]]


@dataclasses.dataclass(frozen=True)
class Demo:
    """A task's CPU miniature as the substrate runs and publishes it. `load()` gives its
    `searchrl.demo.miniature.Miniature` (its world, cold start, arms, claims and report; imported when asked:
    it needs JAX, and configs import the task). Its config presets, as --config names them ("FILE:PRESET",
    FILE relative to the checkout or absolute): `reproduce`, the one with every arm its claims compare
    (`make reproduce`); `smoke`, the smallest end to end (`make smoke`). `notebook`: the notebook (relative
    to the checkout) whose `claims <task>` block states its claims (`searchrl.demo.publish`), if any."""

    load: Callable[[], Any]
    reproduce: str
    smoke: str
    notebook: str = ""


@dataclasses.dataclass(frozen=True)
class Task:
    """What a task registers: its `config.env` dataclass and env factory, and its optional hooks."""

    config: type
    make: Callable[[Any, Any], Env]  # (its Config, a RetrievalConfig) -> Env
    demo: Demo | None = None  # its CPU miniature
    demo_config: type | None = None  # the dataclass of its miniature's `config.demo` group
    report: Report = Report()  # its part of an evaluation report
    train_hooks: Callable[[Env], list[Any]] | None = None  # (its env) -> `searchrl.rl.hooks.TrainHook`s
    answer_scorer: AnswerScorer | None = None  # its examples' answers scored its own way (else EM and F1)
    # (its Config) -> the side branch its env declares under it (`Env.side_branch`), read without building the
    # env: the rollout's shapes depend on it (`searchrl.benchmarks.aot`)
    side_branch: Callable[[Any], SideBranch | None] = lambda config: None


TASKS: Registry[Task] = Registry("task", "config.env.name")
TASK_PACKAGES = "searchrl.tasks"  # where load_all looks for task packages


@functools.cache
def load_all() -> None:
    """Imports every package under `searchrl.tasks` (once a process), so that each registers itself (and its
    data formats, retrievers, rewards). Found by name: the substrate depends on no task."""
    package = importlib.import_module(TASK_PACKAGES)
    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{TASK_PACKAGES}.{module.name}")


def with_demo() -> list[str]:
    """The tasks with a CPU miniature (`Task.demo`), by name, every task package imported."""
    load_all()
    return [name for name in TASKS if TASKS.get(name).demo is not None]


def answer_scorer(example: Mapping[str, Any]) -> AnswerScorer | None:
    """The scorer of the task whose examples `example` is one of (`Task.answer_scorer`), or None."""
    load_all()
    return next((scorer for name in TASKS if (scorer := TASKS.get(name).answer_scorer) is not None
                 and scorer.applies(example)), None)


def default_config(name: str) -> ml_collections.ConfigDict:
    """`config.env` of task `name`: its name and its `Config` defaults."""
    group = to_config(get(name).config())
    group.name = name
    return group


def build(name: str, env: Any, retrieval: Any) -> Env:
    """The env of task `name` from its parsed `config.env` (its `Config`) and `config.retrieval` (a
    `RetrievalConfig`)."""
    task = get(name)
    if not isinstance(env, task.config):
        raise TypeError(f"task {name!r} builds from a {task.config.__qualname__}, got {type(env).__qualname__}")
    return task.make(env, retrieval)


def get(name: str) -> Task:
    """The task registered as `name`: the package `searchrl.tasks.<name>` registers it when imported; a task
    registered elsewhere (a test, a user's module) is found as it is; an unknown name lists every task."""
    if name not in TASKS and importlib.util.find_spec(f"{TASK_PACKAGES}.{name}") is not None:
        importlib.import_module(f"{TASK_PACKAGES}.{name}")
    if name not in TASKS:
        load_all()
    return TASKS.get(name)
