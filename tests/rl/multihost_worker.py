"""One process of test_multihost's 2-process CPU run: a sharded PPO update over the global 8-device mesh.

    python multihost_worker.py COORDINATOR NUM_PROCESSES PROCESS_ID OUT.npz

The problem (model, config, batch) is defined here once and also run by the test in a single process.
"""
import dataclasses
import sys

import jax
import ml_collections
import numpy as np

from searchrl import distributed, models
from searchrl.rl import ppo, train_state
from searchrl.rl.config import OptimConfig, RLConfig

CFG = dataclasses.replace(models.get_preset("tiny"), vocab_size=128)
B, S = 8, 16


def ppo_config() -> ppo.PPOConfig:
    optim = OptimConfig(lr=1e-3, eps=1e-5)  # see tests/rl/test_ppo.py: Adam eps vs round-off
    rl = RLConfig(minibatch_size=4, micro_batch_size=2, ppo_epochs=2, use_reference=True, kl_loss_coef=0.1,
                  entropy_coef=0.01, actor=optim, critic=optim)
    return ppo.PPOConfig.create(rl, CFG)


def host_batch() -> dict:
    """The whole batch as numpy rows (old logprobs/values come from the model, on device)."""
    rng = np.random.default_rng(0)
    attention = np.arange(S)[None] < rng.integers(9, S + 1, size=B)[:, None]
    loss_mask = ((np.arange(S)[None] >= 4) & attention).astype(np.float32)
    return dict(tokens=rng.integers(0, CFG.vocab_size, (B, S)).astype(np.int32), attention_mask=attention,
                loss_mask=loss_mask, advantages=(rng.normal(size=(B, S)) * loss_mask).astype(np.float32),
                returns=(rng.normal(size=(B, S)) * loss_mask).astype(np.float32),
                noise=(0.1 * rng.normal(size=(B, S)) * loss_mask).astype(np.float32))


def run_update(mesh, rows: dict) -> tuple[train_state.TrainState, dict]:
    """Initial state, old logprobs/values/reference, one ppo_update; `rows` are global arrays or numpy."""
    config = ppo_config()
    init = jax.jit(lambda: models.init_params(CFG, jax.random.key(0)),
                   out_shardings=models.param_shardings(CFG, mesh))
    state = train_state.init_train_state(config.spec, mesh, init(), jax.random.key(1))
    logp, values, ref = ppo.score(state, rows["tokens"], rows["attention_mask"], 1.0, config, mesh)
    batch = ppo.PPOBatch(rows["tokens"], rows["attention_mask"], rows["loss_mask"], logp + rows["noise"],
                            rows["advantages"], returns=rows["returns"], old_values=values, ref_logprobs=ref)
    return ppo.ppo_update(state, batch, config, mesh)


def main(coordinator: str, num_processes: int, process_id: int, out: str) -> None:
    config = ml_collections.ConfigDict({"distributed": {
        "enabled": True, "coordinator_address": coordinator, "num_processes": num_processes,
        "process_id": process_id}})
    distributed.initialize(config)
    assert jax.process_count() == num_processes and jax.device_count() == 4 * num_processes
    mesh = models.make_mesh(2, 2, 2)
    rows = distributed.local_rows(mesh, B)
    local = {name: x[rows] for name, x in host_batch().items()}
    state, metrics = run_update(mesh, distributed.host_local_batch_to_global(mesh, local))
    from jax.experimental import multihost_utils
    policy = multihost_utils.process_allgather(state.policy, tiled=True)
    if process_id == 0:
        flat = {jax.tree_util.keystr(k): np.asarray(v)
                for k, v in jax.tree_util.tree_leaves_with_path(policy)}
        flat.update({f"metric/{k}": np.asarray(v) for k, v in metrics.items()})
        np.savez(out, rows=np.array([rows.start, rows.stop]), **flat)
    else:
        np.savez(out, rows=np.array([rows.start, rows.stop]))
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
