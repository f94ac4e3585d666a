"""A GRPO rollout for the tests as one of several processes: each process rolls out its rows of a batch of
prompts with two responses each on its block of a (2, 2, 2) mesh (tests/rollout/test_engine.py).

Run as `python -m tests.rollout.engine_processes OUT PROCESS_ID NUM_PROCESSES PORT` (4 CPU devices per
process); each process writes its episodes to OUT/process<ID>.npz and OUT/process<ID>.json.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import numpy as np

from searchrl import distributed, models
from searchrl.models.config import DistributedConfig


def rollout(rows: slice) -> tuple[dict[str, np.ndarray], dict]:
    """Episodes `rows` of the GRPO batch (`tests.rollout.test_engine.GRPO_EXAMPLES`) on the (2, 2, 2) mesh,
    a decode row a local device (two a block of rows: a group's responses may share their prompt's pages):
    arrays, and the turn texts, finish reasons and shared prompts."""
    from tests.rollout.test_engine import GRPO_EXAMPLES, ScriptedEnv, build_model, build_tokenizer, make_engine

    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    engine = make_engine(model, tokenizer, ScriptedEnv(branch_prompt=" <answer>"), mesh=models.make_mesh(2, 2, 2),
                         decode_rows=jax.local_device_count(), extend_rows=2, page_size=4)
    traj = engine.run(model[1], GRPO_EXAMPLES[rows], jax.random.key(5), first_row=rows.start)
    arrays = {"tokens": traj.tokens, "logprobs": traj.logprobs, "loss_mask": traj.loss_mask}
    return arrays, {"turns": [[t.text for t in row] for row in traj.turns], "finish": traj.finish_reasons,
                    "shared_prompts": engine.stats.shared_prompts}


def main(out: str, process_id: str, num_processes: str, port: str) -> None:
    """One process of the run: joins the others before anything touches a device."""
    jax.config.update("jax_default_matmul_precision", "highest")  # as the test suite computes
    distributed.initialize(DistributedConfig(True, f"127.0.0.1:{port}", int(num_processes), int(process_id)))
    from tests.rollout.test_engine import GRPO_EXAMPLES

    share = len(GRPO_EXAMPLES) // int(num_processes)
    arrays, texts = rollout(slice(int(process_id) * share, (int(process_id) + 1) * share))
    np.savez(Path(out, f"process{process_id}.npz"), **arrays)
    Path(out, f"process{process_id}.json").write_text(json.dumps(texts))


if __name__ == "__main__":
    main(*sys.argv[1:])
