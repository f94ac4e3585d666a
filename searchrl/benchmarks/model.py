"""Training-step throughput of the searchrl decoder against transformers' PyTorch model on the same config.

Both sides compute the gradient of the mean next-token NLL of the same batch, in the same dtype, on the same
kind of device (JAX's default backend; PyTorch on CUDA when JAX runs on a GPU), after warm-up (compilation for
JAX), in interleaved rounds (`interleave`: the median ratio and its range). The same rounds time one matmul
of the MLP's shape on each side ([batch * seq, hidden] x [hidden, intermediate]): the matmul libraries' own
ratio (XLA's against PyTorch's BLAS), the ceiling for a step made mostly of matmuls. And they time the
attention implementations (`searchrl.models.attention`) the backend compiles, each against the reference:
forward and backward of one layer's causal attention at the step's shape. Run:
`python -m searchrl.benchmarks.model [--json] [--preset bench_small] [--batch 4] [--seq 256] [--rounds 5]
[--steps 2] [--dtype float32|bfloat16]`.
"""
from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence

from absl import flags
import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers

from searchrl import cli
from searchrl.benchmarks.attention import attention_impls, compare_impls
from searchrl.benchmarks.hardware import device_name
from searchrl.benchmarks.interleave import compare, describe
from searchrl.models import (MeshConfig, ModelConfig, Placement, get_preset, init_params, to_hf_config,
                             token_logprobs)
from searchrl.rl.config import RLConfig


def torch_device() -> str:
    """PyTorch's device matching JAX's backend."""
    return "cuda" if jax.default_backend() == "gpu" and torch.cuda.is_available() else "cpu"


def torch_synchronize(device: str) -> None:
    """Waits for PyTorch's queued work on `device` (a no-op on the CPU, which runs it eagerly)."""
    if device == "cuda":
        torch.cuda.synchronize()


def searchrl_step(cfg: ModelConfig, tokens: np.ndarray, dtype: str) -> Callable[[], None]:
    """A jitted value-and-grad of the mean next-token NLL, as a default run's training step computes it."""
    params = init_params(cfg, jax.random.key(0), jnp.dtype(dtype))
    B, T = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    mask = jnp.ones((B, T), bool)
    rl, compute = RLConfig(), Placement.of(MeshConfig()).train

    def loss(params, tokens):
        return -token_logprobs(cfg, params, tokens, positions, mask, temperature=1.0, compute=compute,
                               remat=rl.remat, logits_chunk=rl.logits_chunk)[:, 1:].mean()

    grad = jax.jit(jax.value_and_grad(loss))
    tokens = jnp.asarray(tokens)
    return lambda: jax.block_until_ready(grad(params, tokens))


def torch_step(cfg: ModelConfig, tokens: np.ndarray, dtype: str) -> Callable[[], None]:
    """transformers' model on the same config: loss(labels=tokens) and backward."""
    hf = to_hf_config(cfg)
    config = transformers.AutoConfig.for_model(hf.pop("model_type"), **hf)
    torch.manual_seed(0)
    device = torch_device()
    model = transformers.AutoModelForCausalLM.from_config(config).to(device, getattr(torch, dtype)).train()
    ids = torch.from_numpy(tokens).long().to(device)

    def step():
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()
        torch_synchronize(device)

    return step


def matmul_calls(cfg: ModelConfig, rows: int, dtype: str) -> tuple[Callable[[], None], Callable[[], None]]:
    """One [rows, hidden] x [hidden, intermediate] matmul in JAX (jitted) and in PyTorch, same operands."""
    rng = np.random.default_rng(0)
    x, w = (rng.standard_normal(shape, np.float32) for shape in ((rows, cfg.hidden_size),
                                                                 (cfg.hidden_size, cfg.intermediate_size)))
    matmul = jax.jit(jnp.matmul)
    xj, wj = (jnp.asarray(a, dtype) for a in (x, w))
    device = torch_device()
    xt, wt = (torch.from_numpy(a).to(device, getattr(torch, dtype)) for a in (x, w))

    def torch_matmul():
        torch.matmul(xt, wt)
        torch_synchronize(device)

    return lambda: jax.block_until_ready(matmul(xj, wj)), torch_matmul


def run(preset: str, batch: int, seq: int, rounds: int, steps: int, dtype: str = "float32") -> dict:
    cfg = get_preset(preset)
    threads = len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, size=(batch, seq)).astype(np.int32)
    timed = compare(searchrl_step(cfg, tokens, dtype), torch_step(cfg, tokens, dtype), rounds, steps,
                    warmup=2).summary("step")
    timed |= compare(*matmul_calls(cfg, batch * seq, dtype), rounds, calls=10).summary("matmul")
    # Each attention implementation against the reference: its ratio is reference s / its s.
    attention, attention_failed = compare_impls(cfg, batch, seq, dtype, rounds, steps, attention_impls())
    timed |= attention
    shapes = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
    n_params = sum(x.size for x in jax.tree.leaves(shapes))
    return {
        "preset": preset, "params": n_params, "batch": batch, "seq": seq, "steps": steps, "threads": threads,
        "device": device_name(), "dtype": dtype, "attention_failed": attention_failed, **timed,
        "searchrl_tokens_per_s": batch * seq / timed["step_searchrl_s"],
        "torch_tokens_per_s": batch * seq / timed["step_peer_s"],
    }


def main(argv: Sequence[str] | None = None) -> None:
    values = flags.FlagValues()
    preset = flags.DEFINE_string("preset", "bench_small", "model preset (searchrl.models)",
                                 flag_values=values)
    batch = flags.DEFINE_integer("batch", 4, "sequences per step", flag_values=values)
    seq = flags.DEFINE_integer("seq", 256, "tokens per sequence", flag_values=values)
    rounds = flags.DEFINE_integer("rounds", 5, "interleaved rounds (searchrl, then transformers)",
                                  flag_values=values)
    steps = flags.DEFINE_integer("steps", 2, "timed steps per side and round, after 2 warm-up steps",
                                 flag_values=values)
    dtype = flags.DEFINE_enum("dtype", "float32", ("float32", "bfloat16"), "parameter and compute dtype",
                              flag_values=values)
    as_json = flags.DEFINE_boolean("json", False, "print one JSON object instead of a table",
                                   flag_values=values)
    cli.parse(values, argv, __doc__)
    r = run(preset.value, batch.value, seq.value, rounds.value, steps.value, dtype.value)
    if as_json.value:
        print(json.dumps(r))
        return
    print(f"forward+backward, {r['preset']} ({r['params'] / 1e6:.1f}M params), batch {r['batch']} x seq "
          f"{r['seq']}, {r['dtype']}, {r['device']}, {r['threads']} threads, {r['steps']} steps per round")
    print(f"{'impl':<22}{'step s':>10}{'tokens/s':>12}   (medians over the rounds)")
    print(f"{'searchrl (jax.jit)':<22}{r['step_searchrl_s']:>10.3f}{r['searchrl_tokens_per_s']:>12.0f}")
    print(f"{'transformers (torch)':<22}{r['step_peer_s']:>10.3f}{r['torch_tokens_per_s']:>12.0f}")
    print(describe(r, "step"))
    print(f"one matmul [{r['batch'] * r['seq']}, hidden] x [hidden, intermediate] alone, XLA against "
          f"PyTorch's BLAS: {r['matmul_searchrl_s'] * 1e3:.2f} against {r['matmul_peer_s'] * 1e3:.2f} ms")
    print("  " + describe(r, "matmul"))
    for config in attention_impls():
        prefix = f"attention_{config.impl}"
        if config.impl in r["attention_failed"]:
            print(f"one layer's attention, {config.impl}: failed: {r['attention_failed'][config.impl]}")
            continue
        print(f"one layer's attention forward+backward, {config.impl} against the reference: "
              f"{r[f'{prefix}_searchrl_s'] * 1e3:.2f} against {r[f'{prefix}_peer_s'] * 1e3:.2f} ms")
        print("  " + describe(r, prefix))


if __name__ == "__main__":
    cli.run(main)
