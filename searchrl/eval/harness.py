"""Greedy evaluation of a search-QA policy over QA datasets: per-question rows, then `report.aggregate`.

One run rolls out every question at the environment's search budget (env.max_turns). With the depth analysis
on, that run also records an intermediate answer after every search (AutoSearch's self-answering, on a side
branch of the cache: the trajectory and final answer are those of a run without it). Each extra search budget
b is one more run with env.max_turns = b. Batches keep one static shape (the last is padded by repeating a
question, its extra rows dropped) and every engine is warmed up once, so nothing compiles mid-evaluation.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from tqdm import tqdm

from searchrl import checkpoint as checkpoint_lib
from searchrl import experiment, models
from searchrl.envs.search_qa import SearchQAEnv
from searchrl.eval import report
from searchrl.retrieval import make_retriever
from searchrl.rewards import qa
from searchrl.rl.trainer import rollout_config
from searchrl.rollout.engine import RolloutConfig, RolloutEngine
from searchrl.rollout.sampling import SamplingParams
from searchrl.rollout.trajectory import Trajectory
from searchrl.text.tokenizer import load_tokenizer

DEFAULT_ANSWER_PROMPT = "\n<answer>"  # elicits the intermediate answers when env.answer_prompt is unset


def minimal_sufficient_depth(golds: Sequence[str], intermediate_answers: Sequence[str], final_answer: str,
                             searches: int) -> int | None:
    """The first search step after which the policy's answer is an exact match, or None.

    Step j's answer is its intermediate answer; the final answer (given after the last search) also counts, at
    depth `searches`, so a right final answer without any search is depth 0. Unlike the reward's
    `autosearch.minimal_depth` (which needs d < n: a later search to penalise), every step counts here.
    """
    for step, answer in enumerate(intermediate_answers, start=1):
        if qa.exact_match(answer, golds):
            return step
    return searches if qa.exact_match(final_answer, golds) else None


def _hops(example: Mapping[str, Any]) -> int | None:
    """metadata.hops of a synthetic-world record as an int (None when absent)."""
    hops = (example.get("metadata") or {}).get("hops")
    if hops is None:
        return None
    try:
        return int(hops)
    except (TypeError, ValueError):
        raise ValueError(f"Question {example.get('id')!r} of {example.get('dataset')!r}: metadata.hops "
                         f"must be an integer, got {hops!r}") from None


def question_rows(traj: Trajectory, examples: Sequence[Mapping[str, Any]], depth: bool
                  ) -> list[dict[str, Any]]:
    """One JSON-able row per example (the first len(examples) rows of `traj`): answer, metrics, searches, the
    response text and, with `depth`, the intermediate answers and the minimal sufficient depth."""
    rows = []
    for b, example in enumerate(examples):
        action = traj.final_actions[b]
        answer = action.content if action is not None and action.kind == "answer" else ""
        golds = list(example["golden_answers"])
        row = {
            "dataset": example.get("dataset", ""), "id": example.get("id"), "question": example["question"],
            "golden_answers": golds, "hops": _hops(example), "answer": answer,
            "em": qa.exact_match(answer, golds), "cover_em": qa.cover_em(answer, golds),
            "f1": qa.f1(answer, golds), "searches": int(traj.num_searches[b]),
            "finish_reason": traj.finish_reasons[b], "response": traj.response_text(b),
        }
        if depth:
            intermediate = list(traj.intermediate_answers[b])
            row["intermediate_answers"] = intermediate
            row["depth"] = minimal_sufficient_depth(golds, intermediate, answer, row["searches"])
        rows.append(row)
    return rows


def rollout_rows(engine: RolloutEngine, params, examples: Sequence[Mapping[str, Any]], batch_size: int,
                 depth: bool, desc: str = "eval") -> list[dict[str, Any]]:
    """Greedy rollouts of `examples` in batches of exactly `batch_size` rows; one question row per example."""
    rows = []
    for start in tqdm(range(0, len(examples), batch_size), desc=desc, disable=jax.process_index() != 0):
        chunk = list(examples[start:start + batch_size])
        padded = chunk + [chunk[-1]] * (batch_size - len(chunk))
        traj = engine.run(params, padded, jax.random.key(0))
        rows.extend(question_rows(traj, chunk, depth))
    return rows


def _check_inputs(datasets: Mapping[str, Sequence[dict]], batch_size: int, budgets: Sequence[int]) -> None:
    for name, records in datasets.items():
        if not records:
            raise ValueError(f"Dataset {name!r} has no questions to evaluate.")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if any(not isinstance(b, (int, np.integer)) or b < 0 for b in budgets):
        raise ValueError(f"Search budgets must be integers >= 0, got {list(budgets)}")


def evaluate_policy(model_cfg: models.ModelConfig, params, tokenizer, env: SearchQAEnv,
                    datasets: Mapping[str, Sequence[dict]], rollout: RolloutConfig, batch_size: int,
                    budgets: Sequence[int] | None = None, depth: bool = True, warmup: bool = True
                    ) -> dict[str, Any]:
    """Greedy evaluation of `params` on each dataset; returns `report.aggregate`'s summaries plus "meta" and
    "predictions" (the main run's question rows).

    rollout: its sampling is replaced by greedy decoding. budgets: extra runs with env.max_turns = b each (the
    accuracy-vs-budget curve). depth: record intermediate answers (with env.answer_prompt, or
    DEFAULT_ANSWER_PROMPT when unset) for the minimal-sufficient-depth distribution.
    """
    budgets = sorted(set(budgets or ()))
    _check_inputs(datasets, batch_size, budgets)
    rollout = dataclasses.replace(rollout, sampling=SamplingParams(temperature=0.0))
    params = jax.tree.map(jnp.asarray, params)
    examples = [{**r, "dataset": r.get("dataset", name)}
                for name, records in datasets.items() for r in records]
    answer_prompt = env.answer_prompt or DEFAULT_ANSWER_PROMPT

    def run(run_env: SearchQAEnv, with_depth: bool, desc: str) -> list[dict[str, Any]]:
        engine = RolloutEngine(model_cfg, tokenizer, run_env, rollout)
        if warmup:
            engine.warmup(params, batch_size)
        return rollout_rows(engine, params, examples, batch_size, with_depth, desc)

    main_env = dataclasses.replace(env, answer_prompt=answer_prompt) if depth else env
    rows = run(main_env, depth, f"eval (max_turns={env.max_turns})")
    budget_runs = {b: rows if b == env.max_turns
                   else run(dataclasses.replace(env, max_turns=b), False, f"eval (budget {b})")
                   for b in budgets}
    results = report.aggregate(rows, budget_runs, env.max_turns if depth else None)
    meta = {"datasets": ",".join(datasets), "questions": len(examples), "max_turns": env.max_turns,
            "batch_size": batch_size, "decoding": "greedy"}
    if depth:
        meta |= {"answer_prompt": answer_prompt, "answer_prompt_is_default": env.answer_prompt is None}
    return {"meta": meta, **results, "predictions": rows}


# ---- Checkpoints and the config-driven entry point ----

def _is_hf_dir(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def resolve_checkpoint(path: str | os.PathLike) -> tuple[str, Path]:
    """("hf", dir) for a Hugging Face model dir, ("orbax", dir) for a trainer's checkpoint dir (or the run
    workdir holding `checkpoints/`)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"Checkpoint not found: {str(path)!r}")
    if _is_hf_dir(path):
        return "hf", path
    for candidate in (path, path / "checkpoints"):
        if candidate.is_dir() and any(p.is_dir() and p.name.isdigit() for p in candidate.iterdir()):
            return "orbax", candidate
    raise FileNotFoundError(f"{str(path)!r} is neither a Hugging Face model directory (config.json + "
                            "*.safetensors) nor a searchrl checkpoint directory (<step>/ subdirectories, "
                            "or a run dir with checkpoints/).")


def load_checkpoint(path: str | os.PathLike, step: int | None = None, dtype: str = "float32"
                    ) -> tuple[models.ModelConfig, dict, dict[str, Any]]:
    """(model config, policy params, info) of a trainer checkpoint (default: its latest step) or a Hugging
    Face model dir; info: {"kind": "orbax" | "hf", "checkpoint": dir, "step": int | None}."""
    kind, directory = resolve_checkpoint(path)
    if kind == "hf":
        if step is not None:
            raise ValueError(f"A step ({step}) was given, but {str(directory)!r} is a Hugging Face model "
                             "(no steps).")
        cfg, params = models.load_hf(directory, dtype=jnp.dtype(dtype))
        return cfg, params, {"kind": kind, "checkpoint": str(directory), "step": None}
    with checkpoint_lib.Checkpointer(directory, max_to_keep=None, read_only=True) as ckpt:
        step = ckpt.latest_step() if step is None else step
        cfg = checkpoint_lib.model_config_from_json(ckpt.record(step)[checkpoint_lib.MODEL_CONFIG])
        params = ckpt.restore_policy(step, cfg)
    params = jax.tree.map(lambda x: jnp.asarray(x, jnp.dtype(dtype)), params)
    return cfg, params, {"kind": kind, "checkpoint": str(directory), "step": step}


def _require_groups(config: ml_collections.ConfigDict) -> None:
    missing = [g for g in ("data", "env", "retrieval", "rollout", "train", "model") if g not in config]
    if missing:
        raise ValueError(f"The config has no {missing} group(s): start evaluation configs from "
                         "configlib.experiment_config().")


def default_out_dir(config: ml_collections.ConfigDict, info: Mapping[str, Any]) -> Path:
    """<checkpoint>/eval (plus step_<N> for trainer checkpoints), or <config.workdir>/eval without one."""
    if info["kind"] == "config":
        return Path(config.workdir) / "eval"
    out = Path(info["checkpoint"]) / "eval"
    return out / f"step_{info['step']}" if info.get("step") is not None else out


def evaluate_checkpoint(config: ml_collections.ConfigDict, checkpoint: str = "", *, step: int | None = None,
                        datasets: str = "", split: str = "", limit: int | None = None,
                        budgets: Sequence[int] = (), batch_size: int = 0, depth: bool = True
                        ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Evaluates a checkpoint (trainer checkpoint dir, run workdir or HF model dir; empty: the config's own
    policy) with the environment, retriever and rollout budgets of `config`. Empty / None arguments take the
    config's values (data.eval, data.eval_split, data.eval_limit, train.batch_size).

    Returns (results, info); info as `load_checkpoint`'s, with kind "config" when no checkpoint was given."""
    _require_groups(config)
    names = datasets or config.data.eval
    split = split or config.data.eval_split
    limit = config.data.eval_limit if limit is None else limit
    data = experiment.load_examples(config.data, names, split)  # fails fast on an unknown dataset
    if not data:
        raise ValueError(f"No dataset named in {names!r}.")
    if limit > 0:
        data = {name: records[:limit] for name, records in data.items()}
    info: dict[str, Any] = {"kind": "config", "checkpoint": config.model.path or None, "step": None}
    if checkpoint:
        model_cfg, params, info = load_checkpoint(checkpoint, step, config.model.param_dtype)
    hf_dir = info["checkpoint"] if info["kind"] == "hf" else ""
    tokenizer_dir = config.tokenizer or config.model.path or hf_dir
    if not tokenizer_dir:
        raise ValueError("No tokenizer: set config.tokenizer (or config.model.path) to a local tokenizer "
                         "directory.")
    tokenizer = load_tokenizer(tokenizer_dir)
    if not checkpoint:
        model_cfg, params = experiment.load_policy(config, tokenizer)
    if model_cfg.vocab_size < len(tokenizer):
        raise ValueError(f"The model's vocab_size {model_cfg.vocab_size} is smaller than the tokenizer's "
                         f"{len(tokenizer)} tokens ({tokenizer_dir}).")
    env = experiment.make_env(config, make_retriever(config.retrieval.to_dict()))
    results = evaluate_policy(model_cfg, params, tokenizer, env, data, rollout_config(config.rollout),
                              batch_size or config.train.batch_size, budgets, depth)
    results["meta"] = {**info, "split": split, **results["meta"]}
    return results, info
