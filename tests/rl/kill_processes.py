"""Processes that tests/rl/test_kills.py and test_runs.py stop or kill, each printing a line when it reaches
the point to stop it at:

    python -m tests.rl.kill_processes train WORKDIR STEPS CHECKPOINT_EVERY
        the toy RL run of tests/rl/test_trainer.py, ending as `searchrl.main train` does (`train`, then
        `close` whatever happened); prints "done N" when N steps are done, before the next one starts
    python -m tests.rl.kill_processes save DIR PHASE
        saves steps 1 and 2 (asynchronously) and prints "paused" at PHASE of step 2's save (`PHASES`), then
        sleeps
    python -m tests.rl.kill_processes hold WORKDIR
        takes the workdir's lock (`searchrl.run_lock`), prints "held PID" and sleeps
"""
from __future__ import annotations

import sys
import time

PHASES = (
    "writing",  # save() returned: orbax writes the arrays in the background
    "sealing",  # every file written in the temporary directory, no checksums yet
    "sealed",  # checksums written, the directory not yet renamed into place
    "listed",  # the save finished: step 2 is listed
)


def pause() -> None:
    print("paused", flush=True)
    time.sleep(600)


def saved_state(step: int) -> dict:
    """Step `step`'s state: 8 MB of arrays, so that writing them takes a while."""
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(step)
    return {"w": jnp.asarray(rng.normal(size=(1024, 2048)), jnp.float32), "step": jnp.int32(step)}


def save(directory: str, phase: str) -> None:
    from searchrl import checkpoint, models

    model = models.get_preset("tiny")

    real = checkpoint.write_checksums

    def pausing(step_dir):  # called by the save's finalize, in its temporary directory
        if step_dir.name.startswith("2.") and phase == "sealing":
            pause()
        real(step_dir)
        if step_dir.name.startswith("2.") and phase == "sealed":
            pause()

    checkpoint.write_checksums = pausing
    ckpt = checkpoint.Checkpointer(directory, async_save=True)
    ckpt.save(1, saved_state(1), model=model)
    ckpt.wait_until_finished()
    ckpt.save(2, saved_state(2), model=model)
    if phase == "writing":
        pause()
    ckpt.wait_until_finished()
    pause()


class Announce:
    """A train hook printing the steps done before each step."""

    def before_step(self, run) -> dict[str, float]:
        print(f"done {run.step}", flush=True)
        return {}


def train(workdir: str, steps: str, checkpoint_every: str) -> None:
    from tests.rl.test_trainer import make_config, make_trainer, toy_tokenizer

    config = make_config(workdir)
    config.train.update(dict(steps=int(steps), checkpoint_every=int(checkpoint_every),
                             async_checkpoints=True))
    trainer = make_trainer(config, toy_tokenizer())
    trainer.hooks = [Announce()]
    try:
        trainer.train()
    finally:
        trainer.close()


def hold(workdir: str) -> None:
    import os

    from searchrl.run_lock import WorkdirLock

    lock = WorkdirLock.acquire(workdir)
    print(f"held {os.getpid()}", flush=True)
    time.sleep(600)
    lock.release()


if __name__ == "__main__":
    {"train": train, "save": save, "hold": hold}[sys.argv[1]](*sys.argv[2:])
