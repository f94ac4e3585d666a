"""One GPU check that fits 8 minutes: what a lent GPU is worth measuring first, each figure beside what the
cost model predicts for it.

    python -m searchrl.benchmarks.gpu_check --size paper --out DIR [--dry_run h100:1]

Checks, on one device, with the attention a hardware setup runs (configs/hardware.py's h100x8: "pallas_mha"
for rows without a cache, "pallas_gpu" over the paged KV cache; on a CPU the same kernels interpreted):

  decode       ms per decode step (a `decode_chunk` of `Size.decode_steps` steps, bf16, and a `truncate` back
               to the live length) of one GPU's share of each run's rollout rows (rollout.decode_rows or the
               batch's rows, over the run's devices), every row holding `Size.live` tokens, at two live
               lengths;
  micro_batch  the forward and backward pass of one GPU's packed PPO micro-batch (`ppo.actor_loss`, what
               the update accumulates, rl.micro_batch_size sequences over the run's devices, packed into
               one row of rollout.max_len as `packing.pack` lays them out from a Search-R1-like mix of
               lengths), with the run's remat, logits chunks and bf16 compute;
  flash        the forward and backward pass of "pallas_mha" on a packed row of rollout.max_len tokens
               against the reference attention: the largest error of the output and the gradients, relative
               to the reference's largest magnitude;
  paged        a decode step's attention by "pallas_gpu" over one GPU's decode rows against the reference
               paged attention: the largest error of the output.

Each timed check compiles, then runs rounds until `Size.rounds` or its share of the time budget is spent:
the median and range of its rounds. Beside each: the cost model's FLOPs and bytes (`jaxpr_cost`), the
roofline time they imply at the chip's peak FLOP/s and HBM bandwidth (`hardware.device_chip`; none on a
CPU), and the achieved fraction of the bound that sets it. The cost model counts programs traced with the
reference attention: JAX's Pallas kernels declare no cost estimate, and counted from their grid a paged
kernel would read the whole pool per program. So a decode step's bytes are its weights and its rows' live
pages; attention FLOPs are every query times every key of its row (as MFU counts them). Where attention runs
in a flash kernel (the micro-batch, flash) only FLOPs are counted: the reference's bytes are mostly its
materialised scores, which the kernel never writes. MFU counts the micro-batch's FLOPs without
recomputation, the roofline those it executes.

Results go to DIR/gpu_check.json (rewritten after each check: a run cut short keeps what it measured) and
DIR/gpu_check.md; a check that fails (its error recorded) or a kernel out of tolerance ends the run with
exit status 1, after the others ran. `--dry_run TOPOLOGY` compiles every program instead, for one GPU of a
topology (`aot.topology_devices`; GPUs need JAX's CUDA plugin, no GPU: JAX_PLATFORMS=cpu), and reports each
one's memory (`aot.analyse`; exit status 1 if one does not fit).
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import pathlib
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags
from jax.sharding import NamedSharding, PartitionSpec

from searchrl import cli, models, run_config
from searchrl.benchmarks import aot
from searchrl.benchmarks.attention import packed_ids
from searchrl.benchmarks.hardware import Chip, chip_of, device_chip, device_name
from searchrl.benchmarks.jaxpr_cost import MatmulCost, matmul_cost
from searchrl.benchmarks.lengths import packing_of, search_r1_lengths
from searchrl.models import attention as attention_lib
from searchrl.models.paged_attention import pages_a_step, paged_attention
from searchrl.rl import ppo
from searchrl.rollout import generate
from searchrl.run_config import RunConfig

SETUP = "h100x8"  # the hardware setup whose attention the checks run
DTYPE = jnp.bfloat16
NEVER = ((-2,),)  # a stop sequence and EOS id no token has: rows decode until their chunk ends
# Largest error of a kernel against the reference, relative to the reference's largest magnitude (bf16:
# 8 bits of mantissa, and another order of summation).
TOLERANCE = 2e-2


@dataclasses.dataclass(frozen=True)
class Size:
    """What the checks run: the runs (config file, preset) whose shapes they take, and their bounds."""

    runs: tuple[tuple[str, str], ...]  # decode is checked for each; the micro-batch and kernels the first's
    live: tuple[int, int]  # tokens every decode row holds
    decode_steps: int  # decode steps a timed chunk
    rounds: int  # timed rounds of a check at most
    budget_s: float  # seconds a check may time, after compiling


SIZES = {
    "paper": Size((("search_r1", "paper"), ("search_r1", "paper_7b")), (1024, 4096), 16, 5, 20.0),
    "tiny": Size((("search_r1", "tiny"),), (64, 256), 4, 2, 2.0),
}


def load_run(file: str, preset: str) -> RunConfig:
    """configs/FILE.py's PRESET laid out for `SETUP` (importing configs/ from the repository root)."""
    return run_config.parse(importlib.import_module(f"configs.{file}").get_config(f"{preset},{SETUP}"))


def setup_attention(run: RunConfig) -> models.AttentionConfig:
    """The run's attention, its Pallas kernels interpreted on a CPU."""
    return dataclasses.replace(run.mesh.attention, interpret=jax.default_backend() == "cpu")


def run_devices(run: RunConfig) -> int:
    """The devices a run's mesh spreads its rows over."""
    return run.mesh.data * run.mesh.fsdp * run.mesh.tensor


def gpu_rows(run: RunConfig) -> int:
    """One GPU's share of the run's decode rows."""
    rows = run.rollout.decode_rows or aot.batch_rows(run)
    return max(1, rows // run_devices(run))


# A program: a jitted function and the function that makes its arguments (jitted on the device, or traced
# for their shapes alone).
Program = tuple[Callable, Callable[[], tuple]]


def decode_program(run: RunConfig, rows: int, steps: int) -> tuple[Callable, Callable[[int], tuple]]:
    """A decode chunk of `steps` steps of `rows` rows, and the function that makes its arguments with every
    row holding `live` tokens (pending: one sampled, not yet in the cache) in pages of the rollout's slots
    per row."""
    cfg = models.config_from_source(dataclasses.replace(run.model, path=""))
    rollout = run.rollout
    compute = models.Placement.of(run.mesh).sample._replace(attention=setup_attention(run))
    slots = rollout.slots(max(rollout.obs_buckets))
    spec = generate.DecodeSpec(slots, slots - 1, rollout.sampling, steps=steps, compute=compute)

    def arguments(live: int | jax.Array) -> tuple:
        pages, table = generate.owned_pages(rows, slots, rollout.page_size)
        state = generate.init_state(rows, slots, rollout.page_size, jax.random.key(0))
        state = state._replace(pages=jnp.asarray(table), length=jnp.full((rows,), live, jnp.int32),
                               active=jnp.ones((rows,), bool), pending=jnp.ones((rows,), bool))
        params = models.unstack_layers(models.init_params(cfg, jax.random.key(1), DTYPE))
        pool = models.KVPool.init(cfg, pages, rollout.page_size, DTYPE)
        return (params, pool, state, jnp.ones((rows,), bool), (generate.stop_table(NEVER),),
                jnp.asarray(NEVER[0], jnp.int32))

    def chunk(params, pool, state, allowed, stops, eos):
        return generate.decode_chunk(cfg, params, pool, state, allowed, stops, eos, spec)

    return jax.jit(chunk, donate_argnums=(1, 2)), arguments


def _micro_batch_inputs(run: RunConfig, cfg: models.ModelConfig, block: int) -> Callable[[], tuple]:
    """The arguments of one GPU's packed micro-batch: the policy, its packed rows and per-sequence arrays
    (every token trained on but a sequence's first: where its prompt ends changes no compute), and the
    batch's tokens."""
    rl, rollout = run.rl, run.rollout
    rows, width, gpus = aot.batch_rows(run), rollout.max_len, run_devices(run)
    lengths = search_r1_lengths(rows, rollout)
    share = dataclasses.replace(rl, micro_batch_size=max(1, rl.micro_batch_size // gpus))
    plan = jax.tree.map(lambda x: x[0, 0, 0], packing_of(lengths, share, width, 1, block))
    sequence_lengths = np.where(plan.sequences < rows, lengths[np.minimum(plan.sequences, rows - 1)], 0)
    slot = np.arange(width)
    loss_mask = (slot >= 1) & (slot < sequence_lengths[:, None])

    def arguments() -> tuple:
        keys = jax.random.split(jax.random.key(2), 4)
        tokens = jax.random.randint(keys[0], (rows, width), 0, cfg.vocab_size, jnp.int32)
        x = {"sources": jnp.asarray(plan.sources), "starts": jnp.asarray(plan.starts),
             "block_pairs": jnp.asarray(plan.block_pairs), "loss_mask": jnp.asarray(loss_mask, jnp.float32),
             "old_logprobs": -jax.random.uniform(keys[1], loss_mask.shape, jnp.float32, 0.0, 3.0),
             "advantages": jax.random.normal(keys[2], loss_mask.shape, jnp.float32)}
        return models.init_params(cfg, keys[3]), x, tokens

    return arguments


def micro_batch_program(run: RunConfig, attention: models.AttentionConfig, remat: bool) -> Program:
    """The actor's gradients of one GPU's packed micro-batch (module docstring), computing attention by
    `attention`, recomputing each layer's activations in the backward pass with `remat`."""
    cfg = models.config_from_source(dataclasses.replace(run.model, path=""))
    rl = dataclasses.replace(run.rl, remat=remat)
    compute = models.Placement.of(run.mesh).train._replace(attention=attention)
    config = ppo.PPOConfig.create(rl, cfg, compute)

    def gradients(policy, x, tokens):
        return jax.grad(lambda p: ppo.actor_loss(config, p, x, 1.0, tokens))(policy)

    return jax.jit(gradients), _micro_batch_inputs(run, cfg, models.pair_block(attention))


def flash_program(run: RunConfig, attention: models.AttentionConfig) -> Program:
    """One layer's attention over a packed row of rollout.max_len tokens (sequences of a quarter to a half
    of it, `attention.packed_ids`) by `attention.impl`: its output and the gradients of q, k and v."""
    cfg = models.config_from_source(dataclasses.replace(run.model, path=""))
    seq = run.rollout.max_len
    ids = packed_ids(1, seq)
    block = attention_lib.pair_block(attention)
    pairs = models.visible_block_pairs(ids, ids > 0, block) if block else None

    def arguments() -> tuple:
        keys = jax.random.split(jax.random.key(3), 4)
        q = jax.random.normal(keys[0], (1, seq, cfg.num_heads, cfg.head_dim), DTYPE)
        k, v = (jax.random.normal(key, (1, cfg.num_kv_heads, seq, cfg.head_dim), DTYPE) for key in keys[1:3])
        return q, k, v, jax.random.normal(keys[3], q.shape, DTYPE)

    def forward_backward(q, k, v, cotangent):  # padding's queries are unspecified: masked out
        segments = models.Segments(jnp.asarray(ids), None if pairs is None else jnp.asarray(pairs))
        valid = jnp.asarray(ids > 0)
        query_slot = jnp.arange(seq, dtype=jnp.int32)[None]

        def attend(q, k, v):
            out = attention_lib.attention(q, k, v, valid, query_slot, attention, segments)
            return jnp.where(valid[:, :, None, None], out, 0)

        out, pull = jax.vjp(attend, q, k, v)
        return (out, *pull(cotangent))

    return jax.jit(forward_backward), arguments


def paged_program(run: RunConfig, rows: int, live: int, attention: models.AttentionConfig) -> Program:
    """One layer's decode-step attention of `rows` rows holding `live` tokens each over random pages, by
    `attention.paged`."""
    cfg = models.config_from_source(dataclasses.replace(run.model, path=""))
    page_size = run.rollout.page_size
    pages, table = generate.owned_pages(rows, live, page_size)

    def arguments() -> tuple:
        keys = jax.random.split(jax.random.key(4), 3)
        q = jax.random.normal(keys[0], (rows, 1, cfg.num_heads, cfg.head_dim), DTYPE)
        k, v = (jax.random.normal(key, (cfg.num_kv_heads, pages, page_size, cfg.head_dim), DTYPE)
                for key in keys[1:])
        query_slot, length = jnp.full((rows, 1), live - 1, jnp.int32), jnp.full((rows,), live, jnp.int32)
        return q, k, v, jnp.asarray(table), query_slot, length

    def attend(q, k, v, table, query_slot, length):
        return paged_attention(q, k, v, table, query_slot, length, attention)

    return jax.jit(attend), arguments


def traced_cost(program: Program, trips: dict[str, float] | None = None) -> MatmulCost:
    """The cost model's FLOPs and bytes of one run of `program` (nothing is allocated: traced on shapes)."""
    fn, arguments = program
    return matmul_cost(fn.trace(*jax.eval_shape(arguments)).jaxpr, while_trips=1, trips=trips)


def paged_trips(run: RunConfig, live: int) -> dict[str, float]:
    """The reference paged attention's loop trips over rows of `live` tokens: its blocks of live pages."""
    page_size = run.rollout.page_size
    per_step = pages_a_step(run.mesh.attention, page_size)
    return {"paged_attention.reference": -(-live // (page_size * per_step))}


def roofline(cost: MatmulCost, seconds: float, chip: Chip | None, memory: bool = True) -> dict[str, Any]:
    """The cost model beside a measurement: TFLOP and GB, the time they take at the chip's peak FLOP/s and
    HBM bandwidth (the slower of the two), which one bounds it, and the achieved fraction of that bound
    (`seconds` against it); no times or fractions without a chip. Without `memory` the FLOPs alone: the
    bytes of a program whose attention runs in a kernel are not known (the reference's are its scores)."""
    out: dict[str, Any] = {"model_tflop": cost.flops / 1e12, "model_gb": cost.bytes / 1e9 if memory else None}
    if chip is None:
        return out | {"predicted_ms": None, "bound": None, "fraction_of_peak": None}
    compute_s, memory_s = cost.flops / chip.peak_flops, cost.bytes / chip.hbm_bandwidth if memory else 0.0
    bound_s = max(compute_s, memory_s)
    return out | {"predicted_ms": 1e3 * bound_s, "bound": "compute" if compute_s >= memory_s else "memory",
                  "fraction_of_peak": bound_s / seconds}


def timed_rounds(call: Callable[[], Any], rounds: int, budget_s: float) -> list[float]:
    """Seconds of each timed call of `call` (which blocks until done), after one untimed (compiling) call:
    `rounds` of them, fewer once `budget_s` seconds are spent (at least one)."""
    call()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < rounds and (not times or time.perf_counter() - start < budget_s):
        begin = time.perf_counter()
        call()
        times.append(time.perf_counter() - begin)
    return times


def spread(times: Sequence[float], per: float = 1.0) -> dict[str, Any]:
    """Median and range of `times` (seconds) in ms, each divided by `per` (e.g. the steps a call takes)."""
    ms = [1e3 * t / per for t in times]
    return {"ms": statistics.median(ms), "ms_min": min(ms), "ms_max": max(ms), "rounds": len(ms)}


def max_error(got: Sequence[jax.Array], want: Sequence[jax.Array]) -> float:
    """The largest |got - want| over arrays, each relative to its reference's largest magnitude."""
    def one(a, b):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30))
    return max(one(a, b) for a, b in zip(got, want, strict=True))


def check_decode(run: RunConfig, name: str, size: Size, chip: Chip | None) -> list[dict]:
    """Per live length: ms a decode step of one GPU's rows (`decode_program`), beside the cost model."""
    rows, results = gpu_rows(run), []
    chunk, arguments = decode_program(run, rows, size.decode_steps)
    reference = dataclasses.replace(run, mesh=run.mesh.with_attention(paged="reference"))
    ref_fn, ref_arguments = decode_program(reference, rows, 1)
    for live in size.live:
        params, pool, state, *rest = jax.jit(arguments)(live)
        carry = [pool, state]

        def step() -> None:  # `steps` steps, then back to `live` tokens a row (in place)
            pool, state = chunk(params, *carry, *rest)
            state = generate.truncate(state, jnp.full((rows,), live, jnp.int32))
            carry[:] = pool, jax.block_until_ready(state)

        times = spread(timed_rounds(step, size.rounds, size.budget_s / len(size.live)), size.decode_steps)
        cost = traced_cost((ref_fn, functools.partial(ref_arguments, live)), paged_trips(run, live))
        results.append({"check": "decode", "run": name, "model": run.model.preset, "rows": rows, "live": live,
                        "paged": setup_attention(run).paged, **times,
                        **roofline(cost, times["ms"] / 1e3, chip)})
        del params, carry
    return results


def check_micro_batch(run: RunConfig, name: str, size: Size, chip: Chip | None) -> dict:
    """The forward and backward pass of one GPU's packed micro-batch, beside the cost model; MFU counts its
    FLOPs without recomputation."""
    attention = setup_attention(run)
    program = micro_batch_program(run, attention, run.rl.remat)
    jitted, arguments = program
    args = jax.jit(arguments)()
    times = spread(timed_rounds(lambda: jax.block_until_ready(jitted(*args)), size.rounds, size.budget_s))
    reference = dataclasses.replace(attention, impl="reference")
    executed = traced_cost(micro_batch_program(run, reference, run.rl.remat))
    model = traced_cost(micro_batch_program(run, reference, False))
    seconds, x = times["ms"] / 1e3, args[1]
    sources, trained = np.asarray(x["sources"]), np.asarray(x["loss_mask"])
    return {"check": "micro_batch", "run": name, "model": run.model.preset, "packed_width": sources.shape[-1],
            "sequences": int(np.sum(trained.any(axis=1))), "tokens": int(np.sum(sources < args[2].size)),
            "attention": attention.impl,
            "remat": run.rl.remat, **times, **roofline(executed, seconds, chip, memory=False),
            "mfu": None if chip is None else model.flops / seconds / chip.peak_flops}


def check_kernel(kind: str, program: Program, reference: Program, cost: MatmulCost, memory: bool, size: Size,
                 chip: Chip | None, **shape) -> dict:
    """A kernel's largest error against the reference (same arguments), its time and the reference's."""
    (jitted, arguments), (ref_jitted, _) = program, reference
    args = jax.jit(arguments)()
    error = max_error(jax.tree.leaves(jitted(*args)), jax.tree.leaves(ref_jitted(*args)))
    times = spread(timed_rounds(lambda: jax.block_until_ready(jitted(*args)), size.rounds, size.budget_s / 2))
    ref_times = spread(timed_rounds(lambda: jax.block_until_ready(ref_jitted(*args)), size.rounds,
                                    size.budget_s / 2))
    return {"check": kind, **shape, "max_error": error, "tolerance": TOLERANCE, "agrees": error <= TOLERANCE,
            **times, "reference_ms": ref_times["ms"], **roofline(cost, times["ms"] / 1e3, chip, memory)}


def check_flash(run: RunConfig, size: Size, chip: Chip | None) -> dict:
    """The run's flash kernel against the reference on a packed row; its FLOPs as the reference computes
    them (every query times every key of the row)."""
    attention = setup_attention(run)
    reference = flash_program(run, dataclasses.replace(attention, impl="reference"))
    cost = traced_cost(reference)
    return check_kernel("flash", flash_program(run, attention), reference, cost, False, size, chip,
                        kernel=attention.impl, model=run.model.preset, seq=run.rollout.max_len)


def check_paged(run: RunConfig, size: Size, chip: Chip | None) -> dict:
    """The run's paged kernel against the reference on one GPU's decode rows at the longer live length; its
    bytes the live pages the reference reads."""
    attention, rows, live = setup_attention(run), gpu_rows(run), max(size.live)
    reference = paged_program(run, rows, live, dataclasses.replace(attention, paged="reference"))
    cost = traced_cost(reference, paged_trips(run, live))
    return check_kernel("paged", paged_program(run, rows, live, attention), reference, cost, True, size, chip,
                        kernel=attention.paged, model=run.model.preset, rows=rows, live=live)


def checks(size: Size) -> list[tuple[str, Callable[[Chip | None], dict | list[dict]]]]:
    """Every check of `size`, named, in the order they run: the kernels (quick to compile), then the first
    run's decode and micro-batch, then the other runs' decode (a run stopped at its time limit has the
    first run's figures)."""
    runs = {f"{file}:{preset}": load_run(file, preset) for file, preset in size.runs}
    first_name, first = next(iter(runs.items()))
    decode = [(f"decode {name}", lambda chip, run=run, name=name: check_decode(run, name, size, chip))
              for name, run in runs.items()]
    return [("flash", lambda chip: check_flash(first, size, chip)),
            ("paged", lambda chip: check_paged(first, size, chip)), decode[0],
            ("micro_batch", lambda chip: check_micro_batch(first, first_name, size, chip)), *decode[1:]]


def programs(size: Size) -> dict[str, Program]:
    """Every program the checks of `size` run, named (what `--dry_run` compiles)."""
    out: dict[str, Program] = {}
    for file, preset in size.runs:
        run = load_run(file, preset)
        fn, arguments = decode_program(run, gpu_rows(run), size.decode_steps)
        out[f"decode {file}:{preset}"] = fn, functools.partial(arguments, max(size.live))
    file, preset = size.runs[0]
    run = load_run(file, preset)
    attention = setup_attention(run)
    reference = dataclasses.replace(attention, impl="reference", paged="reference")
    rows, live = gpu_rows(run), max(size.live)
    return out | {"micro_batch": micro_batch_program(run, attention, run.rl.remat),
                  "flash": flash_program(run, attention), "flash reference": flash_program(run, reference),
                  "paged": paged_program(run, rows, live, attention),
                  "paged reference": paged_program(run, rows, live, reference)}


def dry_run(size: Size, topology: str, libtpu: str = aot.DEFAULT_LIBTPU) -> dict:
    """Every program of `size` compiled for one device of `topology` (not run): its memory (`aot.analyse`)."""
    devices = aot.topology_devices(topology, libtpu)[:1]
    mesh = models.make_mesh(1, 1, 1, devices=devices)
    replicated = NamedSharding(mesh, PartitionSpec())
    rows = []
    for name, (fn, arguments) in programs(size).items():
        args = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=replicated),
                            jax.eval_shape(arguments))
        row = aot.analyse(name, fn, args, mesh, chip_of(topology))
        rows.append({key: row[key] for key in ("program", "hbm_gib", "fits", "total_gib", "arguments_gib",
                                               "temporaries_gib", "compile_error") if key in row})
    return {"topology": topology, "device_kind": devices[0].device_kind, "programs": rows}


def markdown(result: dict) -> str:
    """The results as a Markdown summary."""
    def number(x, fmt: str = ".3g") -> str:
        return "-" if x is None else (f"{x:{fmt}}" if isinstance(x, float) else str(x))

    lines = [f"# GPU check ({result['size']}), {result['device']}", ""]
    if result.get("chip"):
        chip = result["chip"]
        lines += [f"Peaks: {chip['peak_flops'] / 1e12:.0f} TFLOP/s bf16, {chip['hbm_bandwidth'] / 1e12:.2f} "
                  "TB/s HBM. The cost model's TFLOP and GB (counted with the reference attention) at those "
                  "peaks give the predicted time; the fraction of peak is it over the measured time.", ""]
    if "dry_run" in result:
        dry = result["dry_run"]
        lines += [f"Dry run: compiled for one {dry['device_kind']} ({dry['topology']}), not run.", "",
                  "| program | GiB / HBM | fits |", "|---|---|---|"]
        lines += [f"| {p['program']} | {number(p.get('total_gib'))} / {p['hbm_gib']:.0f} | "
                  f"{'yes' if p['fits'] else 'no'} |" for p in dry["programs"]]
        return "\n".join(lines) + "\n"
    lines += ["| check | shape | ms (min-max, rounds) | model TFLOP / GB | predicted ms (bound) | "
              "fraction of peak | other |", "|---|---|---|---|---|---|---|"]
    other_keys = ("max_error", "tolerance", "agrees", "reference_ms", "mfu")
    skip = {"check", "ms", "ms_min", "ms_max", "rounds", "model_tflop", "model_gb", "predicted_ms", "bound",
            "fraction_of_peak", "check_s", *other_keys}
    for r in result["checks"]:
        if "error" in r:
            error = " ".join(r["error"][:300].replace("|", "/").split())
            lines.append(f"| {r['check']} | failed: {error} | | | | | |")
            continue
        shape = ", ".join(f"{k} {number(v)}" for k, v in r.items() if k not in skip)
        other = ", ".join(f"{k} {number(r[k])}" for k in other_keys if k in r)
        lines.append(f"| {r['check']} | {shape} | {r['ms']:.3g} ({r['ms_min']:.3g}-{r['ms_max']:.3g}, "
                     f"{r['rounds']}) | {r['model_tflop']:.3g} / {number(r['model_gb'])} | "
                     f"{number(r['predicted_ms'])} ({r['bound'] or '-'}) | "
                     f"{number(r['fraction_of_peak'], '.1%')} "
                     f"| {other} |")
    return "\n".join(lines) + "\n"


def failures(result: dict) -> list[str]:
    """The checks that failed, or whose kernel disagrees with the reference; in a dry run, the programs that
    do not fit."""
    if "dry_run" in result:
        return [p["program"] for p in result["dry_run"]["programs"] if not p["fits"]]
    return [r["check"] for r in result["checks"] if "error" in r or r.get("agrees") is False]


def write(result: dict, out: pathlib.Path) -> None:
    """DIR/gpu_check.json and DIR/gpu_check.md."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "gpu_check.md").write_text(markdown(result))


def run_checks(size_name: str, out: pathlib.Path) -> dict:
    """Runs every check of the size, writing the results after each; a failed check is recorded (its error)
    and the others still run."""
    chip = device_chip(jax.devices()[0].device_kind)
    result = {"size": size_name, "device": device_name(), "backend": jax.default_backend(),
              "jax": jax.__version__,
              "chip": None if chip is None else dataclasses.asdict(chip), "checks": []}
    for name, check in checks(SIZES[size_name]):
        start = time.perf_counter()
        try:
            found = check(chip)
        except Exception as e:  # noqa: BLE001 (a kernel that fails on this device leaves the others measured)
            found = {"check": name, "error": f"{type(e).__name__}: {e}"[:2000]}
        rows = found if isinstance(found, list) else [found]
        result["checks"] += [r | {"check_s": time.perf_counter() - start} for r in rows]
        write(result, out)
        print(f"{name}: {time.perf_counter() - start:.1f} s", flush=True)
    return result


def main(argv: Sequence[str] | None = None) -> None:
    values = flags.FlagValues()
    size = flags.DEFINE_enum("size", "paper", sorted(SIZES), "the paper runs' shapes, or tiny ones (CPU)",
                             flag_values=values)
    out = flags.DEFINE_string("out", "runs/gpu_check", "directory of gpu_check.json and gpu_check.md",
                              flag_values=values)
    dry = flags.DEFINE_string("dry_run", "", "compile for one GPU of this topology (h100:1), run nothing",
                              flag_values=values)
    cli.parse(values, argv, __doc__)
    if dry.value:
        result = {"size": size.value, "device": f"none (dry run for {dry.value})",
                  "dry_run": dry_run(SIZES[size.value], dry.value)}
        write(result, pathlib.Path(out.value))
    else:
        if size.value == "paper" and jax.default_backend() == "cpu":
            cli.fail(f"--size paper needs a GPU; JAX sees only the CPU (JAX {jax.__version__}: is its CUDA "
                     "plugin installed? pip install -r requirements-gpu.txt)")
        result = run_checks(size.value, pathlib.Path(out.value))
    print(markdown(result))
    if failures(result):
        cli.fail(f"failed, out of tolerance or too big: {', '.join(failures(result))} ({out.value})")


if __name__ == "__main__":
    cli.run(main)
