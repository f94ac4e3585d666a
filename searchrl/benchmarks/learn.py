"""The PPO step on this machine's devices: an experiment's `ppo.learn` (scoring by policy, critic and
reference, advantages, the PPO epochs) at the config's shapes and dtypes, on a synthetic rollout batch.

    python -m searchrl.benchmarks.learn --config configs/autosearch.py:paper [--steps 3] [--json] \
        [--config.model.preset=qwen2p5_1p5b --config.train.batch_size=16 ...]

Prints the step time (median of `--steps` timed steps after one that compiles), tokens per second, the
step's FLOPs and the utilisation they imply against the devices' peak bf16 FLOP/s where the device is a known
accelerator (`device_chip`): MFU counts the model's FLOPs (`model_flops`: no recomputation), HFU the
matmul FLOPs the step executes (`jaxpr_cost`: recomputed activations included). On devices that report
memory statistics (GPU, TPU), the first device's peak bytes in use: policy, critic and reference with their
optimiser states, gradients and activations. The batch fills every slot (rollout.max_len tokens a row, the
first rollout.max_prompt_tokens the prompt, the rest trained on): the widest batch the trainer pads to.
"""
from __future__ import annotations

import dataclasses
import json
import statistics
import time
from collections.abc import Sequence

import jax
import numpy as np
from absl import flags
from ml_collections import config_flags

from searchrl import cli, models, run_config
from searchrl.benchmarks import aot
from searchrl.benchmarks.hardware import GiB, device_chip, device_name
from searchrl.benchmarks.jaxpr_cost import matmul_cost
from searchrl.rl import ppo
from searchrl.rl.config import RLConfig
from searchrl.rl.train_state import init_train_state
from searchrl.run_config import RunConfig


def synthetic_batch(rows: int, width: int, prompt: int, vocab: int, responses_per_prompt: int,
                    seed: int = 0) -> ppo.Batch:
    """A full rollout batch: random tokens, every slot attended, the tokens after the prompt trained on,
    random sampler log-probs, a reward of 1 on the last token of every other row."""
    if not 0 < prompt < width:
        raise ValueError(f"a prompt of {prompt} tokens (rollout.max_prompt_tokens) leaves no response tokens "
                         f"in rows of {width} (rollout.max_len)")
    rng = np.random.default_rng(seed)
    shape = (rows, width)
    loss_mask = np.zeros(shape, np.float32)
    loss_mask[:, prompt:] = 1.0
    rewards = np.zeros(shape, np.float32)
    rewards[::2, -1] = 1.0
    return ppo.Batch(tokens=rng.integers(0, vocab, shape, dtype=np.int32),
                     attention_mask=np.ones(shape, bool),
                     loss_mask=loss_mask, sampler_logprobs=-rng.uniform(0.0, 3.0, shape).astype(np.float32),
                     token_rewards=rewards, group_ids=np.arange(rows, dtype=np.int32) // responses_per_prompt)


def model_flops(cfg: models.ModelConfig, rl: RLConfig, rows: int, width: int) -> float:
    """The model FLOPs of one PPO step on `rows` x `width` tokens, as MFU counts them (PaLM's appendix B):
    per token, a forward pass through N matmul weights costs 2N, plus attention's two products per head and
    layer, 4 x width x head_dim (searchrl computes every key, masked or not); a backward pass twice the
    forward. The step scores the batch with the policy, the reference and the critic (forward passes), then
    trains the policy and the critic (forward and backward) for each PPO epoch. The policy's N counts the LM
    head, the critic's its one-wide value head."""
    layers = cfg.num_layers * (cfg.hidden_size * cfg.head_dim * (2 * cfg.num_heads + 2 * cfg.num_kv_heads)
                               + 3 * cfg.hidden_size * cfg.intermediate_size)
    attention = 4 * cfg.num_layers * cfg.num_heads * width * cfg.head_dim
    policy = 2 * (layers + cfg.hidden_size * cfg.vocab_size) + attention
    critic = (2 * (layers + cfg.hidden_size) + attention) if rl.use_critic else 0
    forward = policy * (2 if rl.use_reference else 1) + critic
    return rows * width * (forward + rl.ppo_epochs * 3 * (policy + critic))


def learn_flops(batch: ppo.Batch, config: ppo.PPOConfig, mesh) -> float:
    """Matmul FLOPs of one `learn` step on `batch` (all devices together), as its programs run them: counted
    on their jaxprs."""
    with jax.set_mesh(mesh):
        return sum(matmul_cost(program.trace(*args).jaxpr).flops
                   for program, args in ppo.learn_programs(batch, config, mesh).values())


def run(config: RunConfig, steps: int) -> dict:
    """Times `steps` PPO steps of `config` after one untimed (compiling) step; see the module docstring."""
    cfg = models.config_from_source(dataclasses.replace(config.model, path=""))  # the preset, random weights
    rl, rollout = config.rl, config.rollout
    placement = models.placement_of(config.mesh)
    mesh, ppo_config = placement.mesh, ppo.PPOConfig.create(rl, cfg, placement.train)
    rows = aot.batch_rows(config)
    batch = synthetic_batch(rows, rollout.max_len, rollout.max_prompt_tokens, cfg.vocab_size,
                            rl.responses_per_prompt)
    key = jax.random.key(0)
    state = init_train_state(ppo_config.spec, mesh, models.init_params(cfg, key), key,
                             kl_coef=ppo_config.rl.kl_coef)
    times = []
    for i in range(steps + 1):
        start = time.perf_counter()
        state, metrics = ppo.learn(state, batch, ppo_config, mesh)
        jax.block_until_ready((state, metrics))
        if i:
            times.append(time.perf_counter() - start)
    step_s = statistics.median(times)
    model, executed = model_flops(cfg, rl, rows, rollout.max_len), learn_flops(batch, ppo_config, mesh)
    device = jax.devices()[0]
    chip = device_chip(device.device_kind)
    peak = None if chip is None else chip.peak_flops * mesh.size
    memory = device.memory_stats() or {}
    return {
        "config": config.model.preset, "device": device_name(), "devices": mesh.size,
        "mesh": dict(mesh.shape), "rows": rows, "width": rollout.max_len, "compute_dtype": rl.compute_dtype,
        "remat": rl.remat, "ppo_epochs": rl.ppo_epochs, "critic": rl.use_critic,
        "reference": rl.use_reference,
        "params": sum(x.size for x in jax.tree.leaves(state.policy)), "steps": steps, "step_s": step_s,
        "tokens_per_s": rows * rollout.max_len / step_s, "model_tflop_per_step": model / 1e12,
        "executed_tflop_per_step": executed / 1e12,
        "mfu": None if peak is None else model / step_s / peak,
        "hfu": None if peak is None else executed / step_s / peak,
        "peak_memory_gib": memory["peak_bytes_in_use"] / GiB if "peak_bytes_in_use" in memory else None,
        "finite": not bool(metrics["train/nonfinite"]),
    }


def format_result(r: dict) -> str:
    """The result as a few lines of text."""
    if r["mfu"] is None:
        utilisation = "MFU and HFU n/a (no peak FLOP/s figure for this device)"
    else:
        utilisation = f"MFU {r['mfu']:.1%}, HFU {r['hfu']:.1%}"
    memory = "n/a" if r["peak_memory_gib"] is None else f"{r['peak_memory_gib']:.1f} GiB"
    return "\n".join([
        f"PPO step, {r['config']} ({r['params'] / 1e6:.1f}M params), {r['rows']} rows x {r['width']} tokens, "
        f"{r['compute_dtype']}, remat {r['remat']}, {r['ppo_epochs']} epoch(s), critic {r['critic']}, "
        f"reference {r['reference']}, on {r['devices']} x {r['device']}, mesh {r['mesh']}",
        f"  step {r['step_s']:.3f} s (median of {r['steps']}), {r['tokens_per_s']:.0f} tokens/s",
        f"  TFLOP per step: model {r['model_tflop_per_step']:.2f}, executed matmuls "
        f"{r['executed_tflop_per_step']:.2f}; {utilisation}",
        f"  peak device memory {memory}"])


def main(argv: Sequence[str] | None = None) -> None:
    values = flags.FlagValues()
    config = config_flags.DEFINE_config_file("config", None, "Experiment config: configs/FILE.py:PRESET.",
                                             flag_values=values)
    steps = flags.DEFINE_integer("steps", 3, "timed steps, after one that compiles", flag_values=values)
    as_json = flags.DEFINE_boolean("json", False, "print one JSON object instead of a table",
                                   flag_values=values)
    flags.mark_flag_as_required("config", flag_values=values)
    cli.parse(values, argv, __doc__)
    result = run(run_config.parse(config.value), steps.value)
    print(json.dumps(result) if as_json.value else format_result(result))


if __name__ == "__main__":
    cli.run(main)
