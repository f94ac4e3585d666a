"""Hardware setups: a `,SETUP` suffix on any preset (e.g. `configs/autosearch.py:paper,a100x8`) lays the run
out for the machines a paper used, at the paper's own batch, micro-batch and lengths.

  a100x2, a100x4, a100x8   one host of 2, 4 or 8 A100-80GB (DeepRetrieval: 3B on 2, Coder-7B SQL on 4;
                           Search-R1 and AutoSearch: 8)
  h100x8                   one host of 8 H100-80GB (Search-R1's 7B; RPL's Qwen3-4B/8B)
  v5p8                     8 TPU v5p chips (topology 2x2x2)

Every setup shards the params, optimizer state and rows over all of its devices (FSDP), computes attention
without a score matrix (`config.mesh.attention`: JAX's Pallas flash attention kernels, Triton on GPUs and
Mosaic on TPUs, for the PPO step's rows; the blockwise XLA implementation against the rollout's KV cache),
recomputes each layer in the backward pass (`rl.remat`) and, as every run does, computes the LM head in
chunks of `rl.logits_chunk` positions and packs the PPO step's rows (`rl.pack`). On 2 A100s the reference
model waits in host memory between scoring passes (`rl.offload_reference`).
`python -m searchrl.benchmarks.aot --config configs/FILE.py:PRESET,SETUP --topology ...` compiles every
program of the run for the setup's devices without them and reports its memory (docs/benchmarks.md).
"""

# The setup's device count, its attention implementation (names in searchrl.models.attention.ATTENTION) and
# whether the reference model waits in host memory between scoring passes (`rl.offload_reference`: on 2
# A100s a 3B run's float32 masters and Adam moments take most of the 60 GiB budget).
SETUPS = {
    "a100x2": (2, "pallas_mha", True),
    "a100x4": (4, "pallas_mha", False),
    "a100x8": (8, "pallas_mha", False),
    "h100x8": (8, "pallas_mha", False),
    "v5p8": (8, "pallas_tpu", False),
}


def split(arg: str) -> tuple[str, str | None]:
    """`arg` without its hardware suffix, and the setup it names (None without one)."""
    preset, _, last = arg.rpartition(",")
    return (preset, last) if preset and last in SETUPS else (arg, None)


def apply(config, setup: str | None):
    """`config` laid out for `setup` (unchanged for None)."""
    if setup is None:
        return config
    devices, attention, offload_reference = SETUPS[setup]
    config.mesh.update(dict(data=1, fsdp=devices, tensor=1))
    config.mesh.attention.impl = attention
    config.rl.update(dict(remat=True, offload_reference=offload_reference))
    return config
