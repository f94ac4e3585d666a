"""Ahead-of-time compilation of an experiment's jitted programs for a TPU topology or NVIDIA GPUs, on a
machine without either: does a preset fit its chips' memory?

    python -m searchrl.benchmarks.aot --config configs/autosearch.py:paper --topology v5p:2x2x2 \
        [--mesh 1,8,1] [--json] [--config.model.preset=qwen2p5_7b ...]

libtpu compiles for any topology it knows (v4:2x2x1, v5e:4x4, v5p:2x2x2, v6e:2x4, ...) on a CPU-only host:
`make libtpu` installs it in the checkout's .libtpu/ (or pass --libtpu PATH to libtpu.so). JAX's CUDA plugin
(`pip install 'jax[cuda12]'`; no GPU or driver needed) compiles for the GPUs of `hardware.GPU_TARGETS`:
--topology h100:8 is one host of 8 H100s, a100:2x8 two hosts of 8 A100s. Programs, at the
config's shapes and dtypes, on a (data, fsdp, tensor) mesh over the topology's devices (config.mesh, or
--mesh):

  learn    the PPO step (`searchrl.rl.ppo.learn`: scoring by policy, critic and reference, advantages, the
           PPO epochs) on train.batch_size x rl.responses_per_prompt rows of rollout.max_len tokens (the
           widest the trainer pads a batch to); with rl.pack (the default), as the trainer runs it, on those
           rows packed (`searchrl.rl.packing`) with a Search-R1-like mix of lengths (`lengths`);
  prefill  an `extend` of prompts (rollout.max_prompt_tokens) into rollout.extend_rows rows (0: all);
           none with rollout.chunked_prefill, whose prompt chunks run the extend program;
  extend   observations appended into rollout.extend_rows rows, at the widest of rollout.obs_buckets (with
           room for a side branch's prompt where the env runs one that continues the trajectory);
  decode   one decode chunk (`decode_chunk`, rollout.chunk_steps steps), with the side branch's turn limits
           and stop sequences where the env runs one.
The page pool is the engine's (`searchrl.rollout.pages.pool_pages`): `rollout.pool_pages` pages a device, else
every decode and parked row at its largest, with a side branch's pages beside it.

The rollout programs take the policy as the trainer's engine samples with it (cast to rl.compute_dtype, so
the KV cache is in that dtype too) laid out by the sampling rules (config.mesh.sample_rules, by default
`SAMPLE_RULES`: weights tensor-parallel only), with the rows and the cache sharded over the data axes, for the
whole batch at once as the trainer rolls it out (or on `rollout.decode_rows` rows, refilled as episodes end).

Per program: bytes per device from XLA's memory analysis of the compiled program (arguments, outputs,
temporaries, code; a donated argument counts once) against the device's HBM. How long the programs take is
`searchrl.benchmarks.project`'s: it counts their work with the attention kernels' loops at stated lengths,
which a compiled Pallas kernel does not declare.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import pathlib
import re
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from absl import flags
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from ml_collections import config_flags

from searchrl import cli, models, run_config, task
from searchrl.benchmarks.hardware import GPU_TARGETS, MEGACORE, GiB, Chip, GpuTarget, chip_of
from searchrl.benchmarks.lengths import packing_of, search_r1_lengths
from searchrl.episode import SideBranch
from searchrl.rl import advantages, ppo
from searchrl.rl.config import batch_rows as rl_batch_rows
from searchrl.rollout import generate
from searchrl.rollout.config import chunk_widths
from searchrl.rollout.pages import pool_pages
from searchrl.run_config import RunConfig

DEFAULT_LIBTPU = str(pathlib.Path(__file__).resolve().parents[2] / ".libtpu" / "libtpu" / "libtpu.so")
# Stop sequences and EOS ids of the decode chunk (their values do not change the program's cost).
STOP_TABLE, EOS_IDS = (4, 8), (2,)


def topology_devices(topology: str, libtpu: str) -> list[jax.Device]:
    """The devices of a topology, one per chip as JAX on it sees them: a TPU one compiled for by libtpu at
    `libtpu` (a megacore chip's two TensorCores as one device), a GPU one ("h100:8") by JAX's CUDA plugin from
    `GpuTarget.target_config`. Neither needs the accelerator."""
    generation = topology.partition(":")[0]
    if generation in GPU_TARGETS:
        return _gpu_devices(GPU_TARGETS[generation], gpu_topology(topology))
    if not os.path.isfile(libtpu):
        raise FileNotFoundError(f"libtpu not found at {libtpu}: run `make libtpu` or pass --libtpu PATH")
    os.environ["TPU_LIBRARY_PATH"] = os.path.abspath(libtpu)
    # Compiling only, so several processes may load libtpu at once (else the second fails on its lockfile).
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies  # noqa: PLC0415 (after TPU_LIBRARY_PATH is set)
    # libtpu's default v4 chip config has a device per TensorCore, which JAX's meshes reject.
    options = {"chip_config_name": "megacore"} if generation in MEGACORE else {}
    return list(topologies.get_topology_desc(topology_name=topology, platform="tpu", **options).devices)


def gpu_topology(topology: str) -> str:
    """XLA's GPU topology string ("slices x hosts x GPUs per host") of "h100:8" (one host of 8) or
    "h100:2x8" (two hosts of 8)."""
    dims = topology.partition(":")[2].split("x")
    if not 1 <= len(dims) <= 2 or not all(d.isdigit() and int(d) > 0 for d in dims):
        raise ValueError(f"GPU topology {topology!r}: expected GEN:GPUS or GEN:HOSTSxGPUS, e.g. h100:8")
    hosts, per_host = (1, int(dims[0])) if len(dims) == 1 else map(int, dims)
    return f"1x{hosts}x{per_host}"


def _gpu_devices(target: GpuTarget, topology: str) -> list[jax.Device]:
    from jax.experimental import topologies  # noqa: PLC0415
    try:
        return list(topologies.get_topology_desc(platform="cuda", target_config=target.target_config(),
                                                 topology=topology).devices)
    except (RuntimeError, ValueError, jax.errors.JaxRuntimeError) as e:
        raise RuntimeError(f"JAX gave no {target.description} topology ({e}); compiling for GPUs needs "
                           f"JAX's CUDA plugin (no GPU needed): pip install 'jax[cuda12]=={jax.__version__}'"
                           ) from None


def parse_mesh(text: str) -> tuple[int, int, int]:
    """"data,fsdp,tensor" sizes (one may be -1)."""
    try:
        data, fsdp, tensor = (int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--mesh {text!r}: expected three comma-separated sizes data,fsdp,tensor") from None
    return data, fsdp, tensor


def _abstract(tree, shardings):
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), tree, shardings)


def _rows_sharded(shape: tuple[int, ...], dtype, mesh: Mesh, rules: models.ShardingRules):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=models.rows_sharding(shape, mesh, rules))


def batch_rows(config: RunConfig) -> int:
    """Rows of a training batch (and so of its rollout): train.batch_size x rl.responses_per_prompt."""
    return rl_batch_rows(config.train, config.rl)


def learn_inputs(config: RunConfig, cfg: models.ModelConfig, mesh: Mesh) -> dict[str, tuple[Any, tuple]]:
    """The PPO step's programs (`ppo.learn_programs`: "learn", and "score" where the scoring pass is a
    program of its own) with their abstract (state, batch) at the config's shapes."""
    rows, width = batch_rows(config), config.rollout.max_len
    ppo_config = ppo.PPOConfig.create(config.rl, cfg, models.Placement.of(config.mesh, mesh).train)
    rules = ppo_config.spec.rules

    def per_token(dtype):
        return _rows_sharded((rows, width), dtype, mesh, rules)

    anchored = advantages.ADVANTAGES.get(config.rl.advantage).needs_anchor_states
    batch = ppo.Batch(tokens=per_token(jnp.int32), attention_mask=per_token(jnp.bool_),
                      loss_mask=per_token(jnp.float32), sampler_logprobs=per_token(jnp.float32),
                      token_rewards=per_token(jnp.float32),
                      group_ids=_rows_sharded((rows,), jnp.int32, mesh, rules),
                      anchor_ids=per_token(jnp.int32) if anchored else None)
    if config.rl.pack:
        shards = mesh.shape["data"] * mesh.shape["fsdp"]
        plan = packing_of(search_r1_lengths(rows, config.rollout), config.rl, width, shards,
                          models.pair_block(ppo_config.compute.attention))
        replicated = NamedSharding(mesh, PartitionSpec())
        batch = batch._replace(packing=jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated), plan))
    return ppo.learn_programs(batch, ppo_config, mesh)


# What no program of `report` reads: the RunConfig groups besides the env's side branch (`side_branch`), and
# the fields of `train` that only schedule the host loop (a model's architecture is its preset's: `report`
# reads no checkpoint, so `model.path` is left out too).
UNCOMPILED = ("task", "env", "seed", "workdir", "resume", "tokenizer", "data", "retrieval", "sft", "demo")
UNCOMPILED_TRAIN = ("steps", "log_every", "eval_every", "eval_batches", "checkpoint_every",
                    "keep_checkpoints", "async_checkpoints", "max_nonfinite_steps")


def program_signature(config: RunConfig) -> str:
    """A digest of what decides the programs `report` compiles for `config`: the config without the fields
    none of them reads (`UNCOMPILED`, `UNCOMPILED_TRAIN`, `model.path`) and with the env's side branch. Every
    other field counts, even one that only changes a constant: two configs of one signature compile the same
    programs."""
    kept = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name not in UNCOMPILED}
    kept["model"] = dataclasses.replace(config.model, path="")
    kept["train"] = {k: v for k, v in dataclasses.asdict(config.train).items() if k not in UNCOMPILED_TRAIN}
    kept["side_branch"] = side_branch(config)
    return hashlib.sha256(repr(kept).encode()).hexdigest()[:16]


def side_branch(config: RunConfig) -> SideBranch | None:
    """The side branch the trainer's rollout runs: the one its env declares under `config.env`
    (`Task.side_branch`)."""
    return task.get(config.task).side_branch(config.env)


def rollout_inputs(config: RunConfig, cfg: models.ModelConfig, mesh: Mesh) -> dict[str, tuple[Any, tuple]]:
    """Each rollout program's name -> (jitted function, its arguments: abstract arrays and static
    settings), on the rollout's decode rows (`rollout.decode_rows`, else one a row of the batch), with its
    page pool as the engine sizes it (`pages.pool_pages`: side branches' pages counted) and, where the env
    runs a side branch, its rows' slots, widest append and turn limits as the engine's."""
    rollout, branch = config.rollout, side_branch(config)
    rows, compute = rollout.decode_rows or batch_rows(config), models.Placement.of(config.mesh, mesh).sample
    rules = compute.rules
    widest = chunk_widths(rollout, branch)[-1]
    slots = rollout.slots(widest)
    dtype = jnp.dtype(config.rl.compute_dtype)
    params = _abstract(jax.eval_shape(lambda: models.unstack_layers(models.init_params(cfg, jax.random.key(0),
                                                                                       dtype))),
                       models.unstack_shardings(models.param_shardings(cfg, mesh, rules), cfg.num_layers))
    state = jax.tree.map(
        lambda axes, x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                             sharding=models.logical_to_sharding(axes, mesh, rules, x.shape)),
        generate.state_logical_axes(),
        jax.eval_shape(lambda: generate.init_state(rows, slots, rollout.page_size, jax.random.key(0))),
        is_leaf=lambda axes: type(axes) is tuple)
    shards = models.row_shards(dict(mesh.shape), rules, rows)
    pages = pool_pages(rollout, rows, shards, state.pages.shape[1], branch is not None) * shards
    pool_sharding = models.pool_sharding(cfg, mesh, rules, rows)
    pool = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=pool_sharding),
                        jax.eval_shape(lambda: models.KVPool.init(cfg, pages, rollout.page_size, dtype)))
    # rows an append call computes: `rollout.extend_rows`, an equal share of each block (`RolloutEngine`)
    per_call = min(-(-(rollout.extend_rows or rows) // shards), rows // shards) * shards

    def chunk(width: int) -> tuple:  # the rows appended to, their tokens and lengths, those starting a turn
        shapes = (((per_call, width), jnp.int32), ((per_call,), jnp.int32), ((per_call,), jnp.bool_))
        index = None if per_call == rows else _rows_sharded((per_call,), jnp.int32, mesh, rules)
        return (index,) + tuple(_rows_sharded(shape, kind, mesh, rules) for shape, kind in shapes)

    limits = None if branch is None else generate.TurnLimits(branch.max_tokens, slots - 1, branch.sampling)
    spec = generate.DecodeSpec(rollout.max_turn_tokens, rollout.max_len, rollout.sampling,
                               steps=rollout.chunk_steps, branch=limits, compute=compute)
    replicated = NamedSharding(mesh, PartitionSpec())
    # the episodes' stop sequences, then the side branch's
    stops = (jax.ShapeDtypeStruct(STOP_TABLE, jnp.int32, sharding=replicated),) * (1 if branch is None else 2)
    eos = jax.ShapeDtypeStruct(EOS_IDS, jnp.int32, sharding=replicated)
    allowed = _rows_sharded((rows,), jnp.bool_, mesh, rules)
    joins = _rows_sharded((rows,), jnp.int32, mesh, rules)  # a GRPO group's responses start on one prefill
    prefill = {} if rollout.chunked_prefill else {
        "prefill": (generate.extend, (cfg, params, pool, state, *chunk(rollout.max_prompt_tokens),
                                      rollout.sampling, compute, joins))}
    return prefill | {
        "extend": (generate.extend, (cfg, params, pool, state, *chunk(widest), rollout.sampling, compute,
                                     joins)),
        "decode": (generate.decode_chunk, (cfg, params, pool, state, allowed, stops, eos, spec)),
    }


def compiler_options(mesh: Mesh) -> dict[str, Any]:
    """XLA options for compiling on `mesh`. Without the GPU, XLA cannot autotune its matmuls, and some of
    its untuned Triton GEMM tilings fail to compile ("Couldn't find output tile sizes"): cuBLAS runs them."""
    return {"xla_gpu_enable_triton_gemm": False} if mesh.devices.flat[0].platform == "gpu" else {}


def analyse(name: str, jitted, args: tuple, mesh: Mesh, chip: Chip) -> dict[str, Any]:
    """Compiles one program on `mesh` and returns its per-device memory against the chip's HBM. A program
    XLA cannot fit into HBM does not compile: its row says so (`compile_error`, XLA's message) and has no
    memory figures. (Its time: `searchrl.benchmarks.project`, which counts the attention kernels' work.)"""
    hbm = chip.hbm_bytes
    with jax.set_mesh(mesh):
        try:
            memory = jitted.trace(*args).lower().compile(compiler_options(mesh)).memory_analysis()
        except jax.errors.JaxRuntimeError as e:
            if "RESOURCE_EXHAUSTED" not in str(e):
                raise
            return {"program": name, "hbm_gib": hbm / GiB, "fits": False, "compile_error": str(e).splitlines()[0]}
    used = (memory.argument_size_in_bytes + memory.output_size_in_bytes - memory.alias_size_in_bytes
            + memory.temp_size_in_bytes + memory.generated_code_size_in_bytes)
    return {
        "program": name, "hbm_gib": hbm / GiB, "fits": used <= hbm, "total_gib": used / GiB,
        "arguments_gib": memory.argument_size_in_bytes / GiB, "outputs_gib": memory.output_size_in_bytes / GiB,
        "aliased_gib": memory.alias_size_in_bytes / GiB, "temporaries_gib": memory.temp_size_in_bytes / GiB,
        "code_gib": memory.generated_code_size_in_bytes / GiB}


def report(config: RunConfig, topology: str, devices: Sequence[jax.Device],
           mesh_sizes: tuple[int, int, int] | None = None, programs: Sequence[str] | None = None) -> dict:
    """Every program's analysis (`analyse`) for `config` on `devices` of `topology`."""
    # the preset's architecture; no checkpoint is read
    cfg = models.config_from_source(dataclasses.replace(config.model, path=""))
    data, fsdp, tensor = mesh_sizes or (config.mesh.data, config.mesh.fsdp, config.mesh.tensor)
    mesh = models.make_mesh(data, fsdp, tensor, devices=devices)
    jobs = {**learn_inputs(config, cfg, mesh), **rollout_inputs(config, cfg, mesh)}
    unknown = set(programs or ()) - set(jobs)
    if unknown:
        raise ValueError(f"unknown programs {sorted(unknown)}; known: {list(jobs)}")
    rows = [analyse(name, fn, args, mesh, chip_of(topology))
            for name, (fn, args) in jobs.items() if not programs or name in programs]
    return {"topology": topology, "devices": len(devices), "device_kind": devices[0].device_kind,
            "mesh": dict(mesh.shape), "model": config.model.preset,
            "memory_fraction": config.distributed.memory_fraction, "rollout": rollout_layout(config, jobs),
            "programs": rows}


def rollout_layout(config: RunConfig, jobs: dict[str, tuple[Any, tuple]]) -> dict[str, Any]:
    """What the rollout programs (`rollout_inputs`) hold: the episodes of a step, the rows decoded at once,
    whether a side branch runs, and the KV page pool's pages and GiB on each device."""
    _, _, pool, state, *_ = jobs["decode"][1]
    per_device = sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize for x in pool.k + pool.v)
    return {"episodes": batch_rows(config), "decode_rows": state.tokens.shape[0],
            "side_branch": side_branch(config) is not None,
            "pool_pages": pool.k[0].sharding.shard_shape(pool.k[0].shape)[1], "pool_gib": per_device / GiB}


def format_report(result: dict) -> str:
    """A Markdown table of `report`'s result."""
    head = (f"{result['model']} on {result['topology']} ({result['devices']} x {result['device_kind']}), "
            f"mesh {result['mesh']}\n\n"
            "| program | args GiB | out GiB | temp GiB | total GiB / HBM | fits |\n|---|---|---|---|---|---|\n")
    def memory(r: dict) -> str:
        if "compile_error" in r:  # XLA: "... the total memory required for X (N G) exceeds available HBM"
            needed = re.search(r"required for (.+?) \(([\d.]+G)\)", r["compile_error"])
            what = f"{needed[1]}: {needed[2]}" if needed else r["compile_error"]
            return f"- | - | - | {what} / {r['hbm_gib']:.0f} | no"
        return (f"{r['arguments_gib']:.2f} | {r['outputs_gib']:.2f} | {r['temporaries_gib']:.2f} "
                f"| {r['total_gib']:.2f} / {r['hbm_gib']:.0f} | {'yes' if r['fits'] else 'no'}")

    return head + "".join(f"| {r['program']} | {memory(r)} |\n" for r in result["programs"])


def main(argv: Sequence[str] | None = None) -> None:
    values = flags.FlagValues()
    config = config_flags.DEFINE_config_file("config", None, "Experiment config: configs/FILE.py:PRESET.",
                                             flag_values=values)
    topology = flags.DEFINE_string("topology", "v5p:2x2x2", "a TPU topology (v5p:2x2x2) or GPUs (h100:8)",
                                  flag_values=values)
    mesh = flags.DEFINE_string("mesh", "", "data,fsdp,tensor sizes (default: config.mesh)",
                               flag_values=values)
    programs = flags.DEFINE_list("programs", [], "programs to compile (default: all)", flag_values=values)
    libtpu = flags.DEFINE_string("libtpu", DEFAULT_LIBTPU, "path of libtpu.so", flag_values=values)
    as_json = flags.DEFINE_boolean("json", False, "print one JSON object instead of a table",
                                   flag_values=values)
    flags.mark_flag_as_required("config", flag_values=values)
    cli.parse(values, argv, __doc__)
    devices = topology_devices(topology.value, libtpu.value)
    mesh_sizes = parse_mesh(mesh.value) if mesh.value else None
    result = report(run_config.parse(config.value), topology.value, devices, mesh_sizes,
                    programs.value)
    print(json.dumps(result) if as_json.value else format_report(result))


if __name__ == "__main__":
    cli.run(main)
