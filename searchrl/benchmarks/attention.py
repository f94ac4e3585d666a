"""Forward and backward time of each attention implementation against the reference, at one layer's shape.

Each implementation this backend runs computes the gradient of one layer's causal attention over `seq`
tokens (a training row without a cache, the shape of a PPO micro-batch), jitted, against the reference
(`searchrl.models.attention`) in interleaved rounds (`interleave`: the median ratio, reference seconds over
the implementation's, and its range). With `--packed`, each row packs sequences of a quarter to a half of
its length (then padding, as `packing.pack` lays out a PPO micro-batch): every implementation gets their
`Segments`, and "blockwise" computes only their block pairs. Implementations that compile only for another
backend are skipped and named; on CPU the Pallas kernels run interpreted with `--interpret` (at a tiny
shape: interpretation is slow and says nothing about an accelerator's speed). Run:
`python -m searchrl.benchmarks.attention [--json] [--preset qwen2p5_3b] [--batch 4] [--seq 2048] [--packed]
[--rounds 5] [--calls 3] [--dtype bfloat16] [--interpret]`.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from searchrl import cli
from searchrl.benchmarks.hardware import device_name
from searchrl.benchmarks.interleave import compare, describe
from searchrl.models import AttentionConfig, ModelConfig, get_preset
from searchrl.models import attention as attention_lib
from searchrl.models.attention_base import PALLAS_KERNELS, Segments, runs_here, visible_block_pairs


def packed_ids(batch: int, seq: int, seed: int = 0) -> np.ndarray:
    """Segment ids [batch, seq] of rows packed with sequences of seq/4 to seq/2 tokens (ids 1, 2, ..), then
    padding (0)."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((batch, seq), np.int32)
    for row in ids:
        start = segment = 0
        while start + (n := int(rng.integers(seq // 4, seq // 2 + 1))) <= seq:
            segment += 1
            row[start:start + n] = segment
            start += n
    return ids


def attention_call(cfg: ModelConfig, batch: int, seq: int, dtype: str, config: AttentionConfig,
                   ids: np.ndarray | None = None) -> Callable[[], None]:
    """A jitted forward and backward of one layer's causal attention over `seq` tokens by `config.impl`;
    over the packed rows of segment `ids` (0: padding) if given, with their block pairs of
    `models.pair_block(config)` slots."""
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((batch, seq, cfg.num_heads, cfg.head_dim)), dtype)
    k, v = (jnp.asarray(rng.standard_normal((batch, cfg.num_kv_heads, seq, cfg.head_dim)), dtype)
            for _ in range(2))
    key_valid = jnp.ones((batch, seq), bool) if ids is None else jnp.asarray(ids > 0)
    query_slot = jnp.broadcast_to(jnp.arange(seq, dtype=jnp.int32), (batch, seq))
    segments = None
    if ids is not None:
        block = attention_lib.pair_block(config)
        segments = Segments(jnp.asarray(ids), jnp.asarray(visible_block_pairs(ids, ids > 0, block)) if block
                            else None)

    def loss(q, k, v):
        out = attention_lib.attention(q, k, v, key_valid, query_slot, config, segments)
        return out.astype(jnp.float32).sum()

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    return lambda: jax.block_until_ready(grad(q, k, v))


def attention_impls(interpreted: bool = False) -> list[AttentionConfig]:
    """The implementations besides the reference that this backend compiles (or, `interpreted`, runs at all:
    the Pallas kernels interpreted on CPU)."""
    interpret = interpreted and jax.default_backend() == "cpu"
    return [AttentionConfig(name, interpret=interpret and name in PALLAS_KERNELS)
            for name in attention_lib.ATTENTION if name != "reference" and runs_here(name, interpreted)]


def compare_impls(cfg: ModelConfig, batch: int, seq: int, dtype: str, rounds: int, calls: int,
                  configs: list[AttentionConfig], ids: np.ndarray | None = None
                  ) -> tuple[dict, dict[str, str]]:
    """(each implementation's `interleave` summary against the reference, prefixed `attention_<impl>`; the
    error of each that failed: a kernel that does not compile for this device leaves the others timed),
    over packed rows of segment `ids` if given."""
    reference = attention_call(cfg, batch, seq, dtype, AttentionConfig(), ids)
    timed, failed = {}, {}
    for config in configs:
        try:
            timed |= compare(attention_call(cfg, batch, seq, dtype, config, ids), reference, rounds,
                             calls=calls).summary(f"attention_{config.impl}")
        except Exception as e:  # noqa: BLE001
            failed[config.impl] = f"{type(e).__name__}: {e}"[:2000]
    return timed, failed


def run(preset: str, batch: int, seq: int, rounds: int, calls: int, dtype: str, interpreted: bool,
        packed: bool = False) -> dict:
    """Each implementation's timing against the reference, those skipped here, and those that failed."""
    cfg = get_preset(preset)
    configs = attention_impls(interpreted)
    timed, failed = compare_impls(cfg, batch, seq, dtype, rounds, calls, configs,
                                  packed_ids(batch, seq) if packed else None)
    ran = {config.impl for config in configs} - set(failed)
    return {"preset": preset, "batch": batch, "seq": seq, "packed": packed, "heads": cfg.num_heads,
            "kv_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim, "dtype": dtype, "device": device_name(),
            "backend": jax.default_backend(),
            "interpreted": interpreted and jax.default_backend() == "cpu", "implementations": sorted(ran),
            "skipped": [name for name in attention_lib.ATTENTION if name != "reference"
                        and name not in ran | set(failed)],
            "failed": failed, **timed}


def main(argv: Sequence[str] | None = None) -> None:
    values = flags.FlagValues()
    preset = flags.DEFINE_string("preset", "qwen2p5_3b", "model preset whose heads are timed",
                                 flag_values=values)
    batch = flags.DEFINE_integer("batch", 4, "rows", flag_values=values)
    seq = flags.DEFINE_integer("seq", 2048, "tokens per row", flag_values=values)
    rounds = flags.DEFINE_integer("rounds", 5, "interleaved rounds (implementation, then reference)",
                                  flag_values=values)
    calls = flags.DEFINE_integer("calls", 3, "timed calls per side and round, after one warm-up call",
                                 flag_values=values)
    dtype = flags.DEFINE_enum("dtype", "bfloat16", ("float32", "bfloat16"), "q, k, v dtype",
                              flag_values=values)
    packed = flags.DEFINE_boolean("packed", False, "rows packed with several sequences each (see above)",
                                  flag_values=values)
    interpret = flags.DEFINE_boolean("interpret", False, "on CPU, run the Pallas kernels interpreted",
                                     flag_values=values)
    as_json = flags.DEFINE_boolean("json", False, "print one JSON object instead of lines",
                                   flag_values=values)
    cli.parse(values, argv, __doc__)
    r = run(preset.value, batch.value, seq.value, rounds.value, calls.value, dtype.value, interpret.value,
            packed.value)
    if as_json.value:
        print(json.dumps(r))
        return
    rows = "rows packed with sequences of a quarter to a half of a row" if r["packed"] else "rows"
    print(f"one layer's causal attention over {rows}, forward+backward: {r['preset']} heads "
          f"({r['heads']} query, {r['kv_heads']} key, head {r['head_dim']}), batch {r['batch']} x seq "
          f"{r['seq']}, {r['dtype']}, {r['device']}{', Pallas interpreted' if r['interpreted'] else ''}")
    for impl in r["implementations"]:
        prefix = f"attention_{impl}"
        print(f"{impl} against the reference: {r[f'{prefix}_searchrl_s'] * 1e3:.2f} against "
              f"{r[f'{prefix}_peer_s'] * 1e3:.2f} ms")
        print("  " + describe(r, prefix))
    for impl, error in r["failed"].items():
        print(f"{impl} failed: {error}")
    if r["skipped"]:
        hint = "" if interpret.value else "; --interpret runs the Pallas ones on CPU"
        print(f"skipped (another backend's kernels{hint}): {', '.join(r['skipped'])}")


if __name__ == "__main__":
    cli.run(main)
