"""Everything a run is built from, from its config alone: tokenizer, policy, retriever, environment, data.

`searchrl.main train` and `searchrl.eval` both call `build`, so a checkpoint is always evaluated with the
environment, prompt and retriever it was trained with.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from ml_collections import config_dict

from searchrl import models
from searchrl.data import flashrag
from searchrl.envs.search_qa import SEARCH_R1_PROMPT, SearchQAEnv
from searchrl.retrieval import make_retriever
from searchrl.rewards import autosearch
from searchrl.text.tokenizer import load_tokenizer


def default_config() -> ml_collections.ConfigDict:
    """`config.tokenizer`, `config.data`, `config.retrieval` and `config.env` with their defaults."""
    config = ml_collections.ConfigDict()
    config.tokenizer = ""  # a local HF tokenizer directory; empty: config.model.path
    config.data = ml_collections.ConfigDict(dict(
        dir="",  # FlashRAG layout: dir/<dataset>/{train,dev,test}.jsonl (or .parquet from Search-R1)
        train="nq,hotpotqa",  # datasets mixed for training (Search-R1 trains on NQ + HotpotQA)
        train_split="train",
        eval="nq,triviaqa,popqa,hotpotqa,2wikimultihopqa,musique,bamboogle",
        eval_split="test",
        eval_limit=0,  # > 0: the first N questions of each eval set (quick looks)
    ))
    config.retrieval = ml_collections.ConfigDict(dict(
        kind="local", index_dir="", url="", timeout_s=30.0, retries=3, batch_size=256,
    ))
    config.env = ml_collections.ConfigDict(dict(
        name="search_qa",
        reward="search_r1",  # em | search_r1 | autosearch
        topk=3,
        max_turns=4,
        prompt_template=SEARCH_R1_PROMPT,
        answer_prompt=config_dict.placeholder(str),  # AutoSearch's intermediate-answer prompt
        autosearch=autosearch.default_config(),
    ))
    return config


@dataclasses.dataclass
class Experiment:
    """The built pieces of a run."""

    model_cfg: models.ModelConfig
    policy: dict
    tokenizer: Any
    env: SearchQAEnv
    train_examples: list[dict]


def dataset_path(data: ml_collections.ConfigDict, name: str, split: str) -> str:
    """dir/<name>/<split>.jsonl, or .parquet when that is what exists."""
    for ext in (".jsonl", ".parquet"):
        path = os.path.join(data.dir, name, split + ext)
        if os.path.exists(path):
            return path
    raise FileNotFoundError(f"No {split}.jsonl or {split}.parquet for dataset {name!r} under {data.dir!r} "
                            f"(config.data.dir).")


def load_examples(data: ml_collections.ConfigDict, names: str, split: str) -> dict[str, list[dict]]:
    """Each named dataset's records (FlashRAG JSONL or Search-R1 parquet), tagged with their dataset name."""
    out = {}
    for name in [n.strip() for n in names.split(",") if n.strip()]:
        path = dataset_path(data, name, split)
        records = (flashrag.read_search_r1_parquet(path) if path.endswith(".parquet")
                   else flashrag.read_flashrag_jsonl(path))
        out[name] = [{**r, "dataset": name} for r in records]
    return out


def load_policy(config: ml_collections.ConfigDict, tokenizer: Any) -> tuple[models.ModelConfig, dict]:
    """The HF checkpoint at config.model.path, or a random-initialised preset sized to the tokenizer."""
    dtype = jnp.dtype(config.model.param_dtype)
    cfg = models.config_from_dict(config.model)
    if config.model.path:
        return cfg, models.load_hf(config.model.path, dtype=dtype)[1]
    # A new model speaks its tokenizer's language: vocabulary size (unless set) and special ids come from it.
    vocab = len(tokenizer) if config.model.vocab_size is None else cfg.vocab_size
    cfg = dataclasses.replace(cfg, vocab_size=vocab, eos_token_id=tokenizer.eos_token_id,
                              bos_token_id=tokenizer.bos_token_id, pad_token_id=tokenizer.pad_token_id)
    return cfg, models.init_params(cfg, jax.random.key(config.seed), dtype)


def make_env(config: ml_collections.ConfigDict, retriever) -> SearchQAEnv:
    env = config.env
    if env.name != "search_qa":
        raise ValueError(f"config.env.name {env.name!r} is not a known environment (known: search_qa)")
    return SearchQAEnv(retriever, topk=env.topk, max_turns=env.max_turns, prompt_template=env.prompt_template,
                       answer_prompt=env.answer_prompt, reward=env.reward, autosearch_config=env.autosearch)


def build(config: ml_collections.ConfigDict, *, train_data: bool = True) -> Experiment:
    """Tokenizer, policy, retriever, environment and (optionally) the training examples of `config`."""
    tokenizer = load_tokenizer(config.tokenizer or config.model.path)
    model_cfg, policy = load_policy(config, tokenizer)
    env = make_env(config, make_retriever(config.retrieval.to_dict()))
    train = []
    if train_data:
        for records in load_examples(config.data, config.data.train, config.data.train_split).values():
            train.extend(records)
    return Experiment(model_cfg, policy, tokenizer, env, train)
