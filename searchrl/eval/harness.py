"""Greedy evaluation of a policy on any environment: per-question rows (the env's own metrics), then
`report.aggregate`.

One run rolls out every question with the env as configured, its side branch included (for search QA with
intermediate answers on: the answer after every search and the minimal sufficient depth; the trajectories and
final answers are those of a run without it). For an env with a search budget (`with_max_turns`), each extra
budget b is one more run at max_turns = b, without the side branch (on each dataset's first
`budget_questions` questions, or all). Batches keep one static shape (the last is padded by repeating a
question, its extra rows dropped) and every engine is warmed up once, so nothing compiles mid-evaluation.

At scale, evaluation runs as training does: on a `mesh` (`config.mesh`; rows data-parallel, heads and MLP over
its tensor axis) and across processes (`config.distributed`), each process rolls out its rows of every batch
(`distributed.local_batches`) and the rows are gathered to every process in order
(`distributed.all_processes`).
Greedy decoding makes each question's rollout independent of its row, so the results are one device's.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from tqdm import tqdm

from searchrl import distributed, experiment, models, task
from searchrl.data import datasets as data_lib
from searchrl.episode import Env, Trajectory
from searchrl.eval import report
from searchrl.rollout.config import RolloutConfig, SamplingParams
from searchrl.rollout.engine import RolloutEngine
from searchrl.run_config import RunConfig
from searchrl.task import Report


def tagged_examples(datasets: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Every question of every dataset, in order, each with its "dataset" (its own, else the dataset's
    name)."""
    return [{**r, "dataset": r.get("dataset", name)} for name, records in datasets.items() for r in records]


def question_row(example: Mapping[str, Any], metrics: Mapping[str, Any]) -> dict[str, Any]:
    """One JSON-able result row: the example's dataset and id, then `metrics`."""
    return {"dataset": example.get("dataset", ""), "id": example.get("id"), **metrics}


def mesh_batch_size(batch_size: int, mesh: Mesh | None) -> int:
    """`batch_size` rounded up to a multiple of the mesh's row blocks (its data-parallel size), so that every
    device holds the same number of rows; `batch_size` itself without a mesh."""
    blocks = 1 if mesh is None else distributed.row_blocks(mesh)
    return -(-batch_size // blocks) * blocks


def process_rows(batch_size: int, mesh: Mesh | None) -> slice:
    """The rows of each batch this process rolls out: all without a mesh, else `distributed.local_rows`."""
    return slice(0, batch_size) if mesh is None else distributed.local_rows(mesh, batch_size)


def rollout_rows(engine: RolloutEngine, params, examples: Sequence[Mapping[str, Any]], batch_size: int,
                 rows_of: Callable[[Trajectory, list], list], mesh: Mesh | None = None, desc: str = "eval"
                 ) -> list[Any]:
    """`rows_of(trajectory, examples)` (JSON-able values, one per example) of the greedy rollouts of
    `examples` in batches of exactly `batch_size` rows (a multiple of `mesh`'s row blocks), on every process
    the same list, in the order of `examples`. With a `mesh` (the engine's), each process rolls out its rows
    of each batch (`distributed.local_rows`); the padding rows are dropped before `rows_of`."""
    key, batches = jax.random.key(0), []
    local = distributed.local_batches(list(examples), batch_size, process_rows(batch_size, mesh))
    total = -(-len(examples) // batch_size)
    for chunk, real, first_row in tqdm(local, desc=desc, total=total, disable=jax.process_index() != 0):
        traj = engine.run(params, chunk, key, first_row=first_row)
        batches.append(rows_of(traj.first_rows(real), chunk[:real]) if real else [])
    return [row for batch in zip(*distributed.all_processes(batches)) for rows in batch for row in rows]


def question_rows(env: Env, engine: RolloutEngine, params, examples: Sequence[Mapping[str, Any]],
                  batch_size: int, desc: str = "eval", mesh: Mesh | None = None) -> list[dict[str, Any]]:
    """Greedy rollouts of `examples` (`rollout_rows`); one JSON-able row per example: its dataset and id, the
    env's metrics of the row, how it finished and the response text."""
    def rows_of(traj: Trajectory, chunk: list) -> list[dict[str, Any]]:
        return [question_row(example, {**metrics, "finish_reason": traj.finish_reasons[b],
                                       "response": traj.response_text(b)})
                for b, (example, metrics) in enumerate(zip(chunk, env.metrics(traj, chunk)))]

    return rollout_rows(engine, params, examples, batch_size, rows_of, mesh, desc)


def _first_questions(datasets: Mapping[str, Sequence[Any]], n: int | None) -> list[int]:
    """The positions in `tagged_examples(datasets)` of each dataset's first `n` questions (all: None)."""
    positions, start = [], 0
    for records in datasets.values():
        positions += range(start, start + (len(records) if n is None else min(n, len(records))))
        start += len(records)
    return positions


def placed_params(model_cfg: models.ModelConfig, params, mesh: Mesh | None, rules: models.ShardingRules):
    """`params` on device, once: on `mesh` in the sampling layout `rules` (across processes, every
    process's host copy becomes one global array), else on the default device."""
    if mesh is None:
        return jax.tree.map(jnp.asarray, params)
    return jax.device_put(params, models.param_shardings(model_cfg, mesh, rules))


def _check_inputs(env: Env, datasets: Mapping[str, Sequence[dict]], batch_size: int, budgets: Sequence[int],
                  budget_questions: int | None) -> None:
    for name, records in datasets.items():
        if not records:
            raise ValueError(f"Dataset {name!r} has no questions to evaluate.")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if any(not isinstance(b, (int, np.integer)) or b < 0 for b in budgets):
        raise ValueError(f"Search budgets must be integers >= 0, got {list(budgets)}")
    if budget_questions is not None and budget_questions < 1:
        raise ValueError(f"budget_questions must be >= 1 (or None: every question), got {budget_questions}")
    if budgets and env.max_turns is None:
        raise ValueError(f"{type(env).__name__} has no search budget (max_turns): evaluate it without budgets.")


def evaluate_policy(model_cfg: models.ModelConfig, params, tokenizer, env: Env,
                    datasets: Mapping[str, Sequence[dict]], rollout: RolloutConfig, batch_size: int,
                    budgets: Sequence[int] | None = None, side_branch: bool = True, warmup: bool = True,
                    spec: Report = Report(), *, placement: models.Placement,
                    budget_questions: int | None = None) -> dict[str, Any]:
    """Greedy evaluation of `params` on each dataset; returns `report.aggregate`'s summaries plus "meta" and
    "predictions" (the main run's question rows).

    rollout: its sampling is replaced by greedy decoding. budgets: extra runs at env.max_turns = b each (the
    accuracy-vs-budget curve). budget_questions: those runs roll out only each dataset's first this many
    questions (a budget run costs a whole evaluation; None: all). side_branch: run the env's side branch in
    the main run. spec: what the task adds to the report (`searchrl.task.Report`). placement: its sampling
    layout and attention; on its mesh (if any), the rollout runs across the mesh's processes (`rollout_rows`)
    and batch_size is rounded up to a multiple of its data-parallel size.
    """
    mesh = placement.mesh
    budgets = sorted(set(budgets or ()))
    _check_inputs(env, datasets, batch_size, budgets, budget_questions)
    rollout = dataclasses.replace(rollout, sampling=SamplingParams(temperature=0.0))
    batch_size = mesh_batch_size(batch_size, mesh)
    params = placed_params(model_cfg, params, mesh, placement.sample.rules)
    examples = tagged_examples(datasets)

    def run(run_env: Env, with_branch: bool, desc: str, questions: list[dict[str, Any]]
            ) -> list[dict[str, Any]]:
        engine = RolloutEngine(model_cfg, tokenizer, run_env, rollout, side_branch=with_branch,
                               placement=placement)
        if warmup:
            mine = process_rows(batch_size, mesh)
            engine.warmup(params, mine.stop - mine.start)
        return question_rows(run_env, engine, params, questions, batch_size, desc, mesh)

    branch = env.side_branch if side_branch else None
    max_turns = env.max_turns
    rows = run(env, side_branch, "eval" if max_turns is None else f"eval (max_turns={max_turns})", examples)
    in_budget_runs = _first_questions(datasets, budget_questions)
    budget_examples = [examples[i] for i in in_budget_runs]
    budget_runs = {b: [rows[i] for i in in_budget_runs] if b == max_turns
                   else run(env.with_max_turns(b), False, f"eval (budget {b})", budget_examples)
                   for b in budgets}
    meta = {"env": type(env).__name__, "datasets": ",".join(datasets), "questions": len(examples),
            "max_turns": max_turns, "batch_size": batch_size, "decoding": "greedy"}
    if budgets:
        meta["budget_questions"] = len(budget_examples)
    if branch is not None:
        meta |= {"side_branch": branch.name, "side_branch_prompt": branch.prompt}
    return {"meta": meta, **report.aggregate(rows, budget_runs, spec, meta), "predictions": rows}


def default_out_dir(config: RunConfig, info: Mapping[str, Any]) -> Path:
    """Where an evaluation writes without --out, always under a run, never in a model store:
    <run>/eval/step_<N> for a trainer checkpoint (<run>: the workdir holding its `checkpoints/`, else the
    checkpoint dir), <config.workdir>/eval/<model dir name> for a Hugging Face model dir (it may be read-only
    or shared), <config.workdir>/eval for the config's own policy."""
    workdir_eval = Path(config.workdir) / "eval"
    if info["kind"] == "config":
        return workdir_eval
    checkpoint = Path(info["checkpoint"])
    if info["kind"] == "hf":
        return workdir_eval / checkpoint.name
    run = checkpoint.parent if checkpoint.name == "checkpoints" else checkpoint
    return run / "eval" / f"step_{info['step']}"


def load_eval_data(config: RunConfig, datasets: str = "", split: str = "", limit: int | None = None
                   ) -> tuple[dict[str, list[dict]], str]:
    """(questions by dataset, split) to evaluate; empty / None arguments take the config's values
    (data.eval, data.eval_split, data.eval_limit). An unknown dataset fails before anything is built."""
    names = datasets or config.data.eval
    split = split or config.data.eval_split
    limit = config.data.eval_limit if limit is None else limit
    task.load_all()  # a task's data formats register with it
    data = data_lib.load_examples(config.data.dir, names, split, config.data.format, config.data.tfds_dir)
    if not data:
        raise ValueError(f"No dataset named in {names!r}.")
    if limit > 0:
        data = {name: records[:limit] for name, records in data.items()}
    return data, split


def evaluate_checkpoint(config: RunConfig, checkpoint: str = "", *, step: int | None = None,
                        datasets: str = "", split: str = "", limit: int | None = None,
                        budgets: Sequence[int] = (), budget_questions: int | None = None, batch_size: int = 0,
                        side_branch: bool = True) -> tuple[dict[str, Any], dict[str, Any]]:
    """Evaluates a checkpoint (trainer checkpoint dir, run workdir or HF model dir; empty: the config's own
    policy) with the environment, retriever, rollout budgets and mesh of `config` (`experiment.build`,
    `models.mesh_of`), as every process of a multi-process run (`distributed.initialize` first). Empty / None
    arguments take the config's values (data.eval, data.eval_split, data.eval_limit, train.batch_size).

    Returns (results, info); info as `experiment.load_checkpoint`'s, with kind "config" when no checkpoint was
    given."""
    data, split = load_eval_data(config, datasets, split, limit)
    built = experiment.build(config, train_data=False, checkpoint=checkpoint, step=step)
    results = evaluate_policy(built.model_cfg, built.policy, built.tokenizer, built.env, data, built.rollout,
                              batch_size or config.train.batch_size, budgets, side_branch,
                              spec=task.get(config.task).report, placement=models.placement_of(config.mesh),
                              budget_questions=budget_questions)
    results["meta"] = {**built.source, "split": split, **results["meta"]}
    return results, built.source
