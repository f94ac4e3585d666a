"""The PPO step's compute on padding: the matmul FLOPs of `ppo.learn` per FLOP of the real tokens, with the
batch padded to its longest row and packed (`searchrl.rl.packing`, what the trainer runs with rl.pack).

    python -m searchrl.benchmarks.padding --config configs/search_r1.py:paper [--attention blockwise]
        [--seed 0] [--json]

The batch: train.batch_size x rl.responses_per_prompt rows with a Search-R1-like mix of lengths
(`lengths.search_r1_lengths`), padded as the trainer pads them (`shapes.padded_width` of the longest) and
packed as it packs them (`packing.pack`: rows of that width or a little wider), one a data-parallel shard
per micro-batch, on a mesh over this machine's devices as config.mesh lays it out
(XLA_FLAGS=--xla_force_host_platform_device_count=8 for 8 CPU devices).
FLOPs are counted on the programs' jaxprs (`jaxpr_cost`, every loop's trip count; nothing runs). The real
tokens' FLOPs are the step's on each row alone at its own length, with dense attention (every query times
every key of its row, as model-FLOP counts take it): per row, the padded program's FLOPs are a quadratic in
its width (linear layers, attention), fitted exactly at three widths. The padded step computes dense
attention too; the packed one computes attention by `--attention`: "blockwise" computes only the block
pairs that hold a visible (query, key) pair (`models.Segments`: no work across sequences, on padding, or
above the causal diagonal's blocks), "reference" a dense [S, S] a packed row.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

import numpy as np
from absl import flags
from ml_collections import config_flags

from searchrl import cli, models, run_config
from searchrl.benchmarks.lengths import packing_of, search_r1_lengths
from searchrl.benchmarks.learn import learn_flops, synthetic_batch
from searchrl.rl import ppo
from searchrl.rl.config import batch_rows
from searchrl.run_config import RunConfig
from searchrl.shapes import padded_width


def _row_flops(config: ppo.PPOConfig, mesh, rows: int, max_len: int, vocab: int) -> np.poly1d:
    """The padded step's FLOPs per row as a quadratic in the width, fitted at three widths."""
    widths = np.array([max_len // 4, max_len // 2, max_len])
    flops = [learn_flops(synthetic_batch(rows, int(w), 1, vocab, 1), config, mesh) / rows for w in widths]
    return np.poly1d(np.polyfit(widths, flops, 2))


def run(config: RunConfig, packed_attention: str = "blockwise", seed: int = 0) -> dict:
    """The padded and packed steps' FLOPs per FLOP of the real tokens, the packed step computing attention
    by the implementation `packed_attention` (module docstring)."""
    cfg = models.config_from_source(dataclasses.replace(config.model, path=""))  # the preset's architecture
    rl, rollout = config.rl, config.rollout
    placement = models.placement_of(config.mesh)
    mesh, train = placement.mesh, placement.train
    padded_config = ppo.PPOConfig.create(dataclasses.replace(rl, pack=False), cfg,
                                         train.with_attention(impl="reference"))
    packed_config = ppo.PPOConfig.create(dataclasses.replace(rl, pack=True), cfg,
                                         train.with_attention(impl=packed_attention))
    rows = batch_rows(config.train, rl)
    lengths = search_r1_lengths(rows, rollout, seed)
    width = padded_width(int(lengths.max()), rollout.max_len)
    batch = synthetic_batch(rows, width, 1, cfg.vocab_size, rl.responses_per_prompt, seed)
    batch = batch._replace(attention_mask=np.arange(width)[None] < lengths[:, None])
    shards = mesh.shape["data"] * mesh.shape["fsdp"]
    plan = packing_of(lengths, rl, width, shards, models.pair_block(packed_config.compute.attention), seed)
    real = float(np.sum(_row_flops(padded_config, mesh, rl.minibatch_size, rollout.max_len,
                                   cfg.vocab_size)(lengths)))
    padded = learn_flops(batch, padded_config, mesh)
    packed = learn_flops(batch._replace(packing=plan), packed_config, mesh)
    return {"config": config.model.preset, "attention": packed_attention, "rows": rows, "width": width,
            "shards": shards,
            "tokens": int(lengths.sum()), "length_mean": float(lengths.mean()),
            "length_max": int(lengths.max()),
            "packed_width": plan.width, "packed_micro_batches": plan.micro_batches,
            "block_pairs": plan.block_pairs.shape[-2],
            "real_tflop": real / 1e12,
            "padded_tflop": padded / 1e12, "packed_tflop": packed / 1e12,
            "padded_ratio": padded / real, "packed_ratio": packed / real,
            "padded_slot_ratio": rows * width / lengths.sum(),
            "packed_slot_ratio": plan.sources.size / rl.ppo_epochs / lengths.sum()}


def format_result(r: dict) -> str:
    """The result as a few lines of text."""
    return "\n".join([
        f"PPO step, {r['config']}, {r['rows']} rows of a Search-R1-like mix: mean {r['length_mean']:.0f}, "
        f"longest {r['length_max']} tokens ({r['tokens']} in all); padded to {r['width']}, packed into "
        f"{r['shards']} row(s) of {r['packed_width']} a micro-batch, {r['packed_micro_batches']} a "
        "minibatch; "
        f"packed attention: {r['attention']}" + (f", {r['block_pairs']} block pairs a row" if r['block_pairs']
                                                else ""),
        f"  matmul TFLOP: real tokens {r['real_tflop']:.2f}, padded {r['padded_tflop']:.2f}, "
        f"packed {r['packed_tflop']:.2f}",
        f"  FLOPs / real tokens' FLOPs: padded {r['padded_ratio']:.3f}, packed {r['packed_ratio']:.3f} "
        f"(slots / real tokens: padded {r['padded_slot_ratio']:.3f}, packed {r['packed_slot_ratio']:.3f})"])


def main(argv: Sequence[str] | None = None) -> None:
    values = flags.FlagValues()
    config = config_flags.DEFINE_config_file("config", None, "Experiment config: configs/FILE.py:PRESET.",
                                             flag_values=values)
    attention = flags.DEFINE_enum("attention", "blockwise", ["blockwise", "reference"],
                                  "attention of the packed step", flag_values=values)
    seed = flags.DEFINE_integer("seed", 0, "seed of the lengths and the update's orders", flag_values=values)
    as_json = flags.DEFINE_boolean("json", False, "print one JSON object instead of text", flag_values=values)
    flags.mark_flag_as_required("config", flag_values=values)
    cli.parse(values, argv, __doc__)
    result = run(run_config.parse(config.value), attention.value, seed.value)
    print(json.dumps(result) if as_json.value else format_result(result))


if __name__ == "__main__":
    cli.run(main)
