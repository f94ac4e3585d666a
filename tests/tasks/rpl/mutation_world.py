"""A miniature Retrieval Program Learning run for the program-mutation tests: 16 documents (4 organisations in
each of 4 cities) under a real BM25 index, a tiny random policy and a trainer on them, and a scripted engine
whose programs show too few of a city's documents.

Run as `python -m tests.tasks.rpl.mutation_world ROOT PROCESS_ID NUM_PROCESSES PORT` (4 CPU devices per
process), it is one process of a multi-process run of `mutate_and_distill`; process 0 writes the result to
ROOT/result.json and the distilled policy to ROOT/hf.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import jax

from searchrl import distributed, models, run_config, task
from searchrl.configlib import from_config
from searchrl.episode import Action, Turn
from searchrl.rl.hooks import RunHandle
from searchrl.rl.trainer import Trainer
from searchrl.tasks.rpl import distill as program_mutation
from searchrl.tasks.rpl import env as rpl
from searchrl.tasks.rpl.config import MutationConfig
from searchrl.text import tags
from searchrl.text.tokenizer import PROTOCOL_TAGS, train_bpe_tokenizer

CITIES = ("arno", "beni", "cora", "dune")
DOCS = [(f"{c}{i}", f"Org{i} {c}", f"organisation {i} is headquartered in {c}")
        for c in CITIES for i in range(4)]
WEAK = "show(sparse_retrieval('headquartered {city}', 2))"  # shows 2 of the city's 4 documents
BEST = "show(sparse_retrieval('headquartered {city}', 4))"  # all 4: no edit improves it
ANSWERED = ("cora", "dune")  # the rows whose rolled-out episode answers (the others end after the program)


def build_trainer(root: Path, mesh: tuple[int, int, int] | None = None) -> Trainer:
    """The index, tokenizer and trainer under `root`; 8 training rows (each city twice), batches of 8 rows,
    on a (data, fsdp, tensor) `mesh` (default: all devices on data)."""
    from searchrl.retrieval.bm25 import BM25Retriever  # here: bm25s runs a JAX op when imported (see main)

    root.mkdir(parents=True, exist_ok=True)
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": i, "contents": f"{t}\n{x}"}) + "\n" for i, t, x in DOCS))
    BM25Retriever.build(corpus, root / "index", show_progress=False)
    program_tags = (tags.open_tag(tags.PROGRAM), tags.close_tag(tags.PROGRAM))
    texts = [x for _, _, x in DOCS] + [WEAK.format(city=c) for c in CITIES]
    tokenizer = train_bpe_tokenizer(texts * 10, 400, special_tokens=(*PROTOCOL_TAGS, *program_tags))
    config = run_config.experiment_config("rpl")
    config.workdir = str(root / "run")
    config.env.update(dict(max_turns=1, prompt_template="{question}"))
    config.retrieval.index_dir = str(root / "index")
    config.train.update(dict(steps=3, batch_size=8, checkpoint_every=1000, async_checkpoints=False))
    config.rollout.update(dict(max_prompt_tokens=16, max_turn_tokens=8, max_obs_tokens=16, obs_buckets=(16,),
                               max_len=16 + 8 + 16 + 8, chunk_steps=8))
    config.rl.update(dict(minibatch_size=8, micro_batch_size=8))
    if mesh is not None:
        config.mesh.update(dict(zip(("data", "fsdp", "tensor"), mesh)))
    config = run_config.parse(config)
    env = task.build(config.task, config.env, config.retrieval)
    ids = {c: [f"{c}{i}" for i in range(4)] for c in CITIES}
    examples = [{"question": f"which organisations are in {c}", "golden_answers": ids[c],
                 "metadata": {"type": "count", "evidence_ids": ids[c]}} for c in CITIES]
    cfg = models.get_preset("tiny")
    cfg = type(cfg)(**{**cfg.__dict__, "vocab_size": len(tokenizer), "eos_token_id": tokenizer.eos_token_id})
    return Trainer(config, cfg, models.init_params(cfg, jax.random.key(0)), tokenizer, env, examples * 2)


class ScriptedEngine:
    """Stands in for the rollout engine: global rows 0-3 write the weak program of their city, the others the
    best one; rows 0-3 of the ANSWERED cities then answer with 2 of the city's documents."""

    def __init__(self, engine):
        self.engine, self.tokenizer = engine, engine.tokenizer
        self.rows_run: list[int] = []  # the global rows this process rolled out

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def run(self, params, examples, key, first_row: int = 0):
        rows = []
        for row, example in enumerate(examples, first_row):
            city = example["question"][-4:]
            program = (WEAK if row < len(CITIES) else BEST).format(city=city)
            turns = [Turn(0, 1, "<think>go</think>" + tags.block(tags.PROGRAM, f" {program}\n"),
                          Action(rpl.PROGRAM, program))]
            if row < len(CITIES) and city in ANSWERED:  # answer F1 2/3
                turns.append(Turn(1, 2, "", Action(tags.ANSWER, f"{city}0, {city}1", done=True)))
            rows.append(turns)
            self.rows_run.append(row)
        return Rows(rows)


class Rows:
    """The scripted engine's trajectories: their turns."""

    def __init__(self, turns: list[list[Turn]]):
        self.turns = turns

    def first_rows(self, n: int) -> "Rows":
        return Rows(self.turns[:n])


# The policy's (scripted) answer after each city's best program: arno's and cora's beat their rolled-out
# episodes, dune's does not, beni's turn is no answer.
ANSWERS = {"arno": "<answer> arno0, arno1, arno2 </answer>", "beni": None,
           "cora": "<answer> cora0, cora1, cora2 </answer>", "dune": "<answer> dune0 </answer>"}


def scripted_answers(run: RunHandle, prefixes: list[str], key: jax.Array, greedy: bool = True
                     ) -> list[str | None]:
    """Stands in for `program_mutation.policy_answers` (the random policy answers nothing)."""
    return [ANSWERS[next(c for c in CITIES if f"in {c}" in prefix)] for prefix in prefixes]


def mutate_and_distill(trainer: Trainer, saved: Path) -> dict[str, Any]:
    """Program mutation on all 8 training rows, then two SFT steps of distillation, with a `ScriptedEngine` as
    the trainer's engine and `scripted_answers` as `program_mutation.policy_answers`; the distilled policy
    saved as a Hugging Face model at `saved`. Returns the kept trajectories, the counts, the SFT losses and
    the rows each process rolled out."""
    config = from_config(MutationConfig, {"max_variants": 64, "max_shown": 4, "sft": {
        "steps": 2, "batch_size": 4, "max_len": 64, "optim": {"lr": 1e-3, "warmup_steps": 0}}},
        "config.env.mutation")  # no warm-up: each step moves every param by about lr
    segments, counts = program_mutation.mutation_examples(trainer.handle(), trainer.train_examples, config,
                                                          jax.random.key(0))
    losses = program_mutation.distill(trainer.handle(), segments, config)
    models.save_hf(trainer.model_cfg, trainer.state.policy, saved)
    return {"segments": segments, "counts": counts, "losses": losses,
            "rows_run": distributed.all_processes(trainer.engine.rows_run)}


def main(root: str, process_id: str, num_processes: str, port: str) -> None:
    """One process of the run: joins the others before anything touches a device."""
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.config.update("jax_default_matmul_precision", "highest")  # as the test suite computes
    jax.distributed.initialize(f"127.0.0.1:{port}", int(num_processes), int(process_id))
    trainer = build_trainer(Path(root) / f"process{process_id}", mesh=(2, 2, 2))
    trainer.engine = ScriptedEngine(trainer.engine)
    program_mutation.policy_answers = scripted_answers
    try:
        result = mutate_and_distill(trainer, Path(root) / "hf")
    finally:
        trainer.close()
    if jax.process_index() == 0:
        (Path(root) / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:])
