"""Hardware setups: a `,SETUP` suffix on any preset (e.g. `configs/autosearch.py:paper,a100x8`) lays the run
out for the machines a paper used, at the paper's own batch, micro-batch and lengths.

  a100x2, a100x4, a100x8   one host of 2, 4 or 8 A100-80GB (DeepRetrieval: 3B on 2, Coder-7B SQL on 4;
                           Search-R1 and AutoSearch: 8)
  h100x8                   one host of 8 H100-80GB (Search-R1's 7B; RPL's Qwen3-4B/8B)
  v5p8                     8 TPU v5p chips (topology 2x2x2)

Every setup shards the params, optimizer state and rows over all of its devices (FSDP), computes attention
without a score matrix (`config.mesh.attention`: JAX's Pallas flash attention kernels, Triton on GPUs and
Mosaic on TPUs, for the PPO step's rows; JAX's Pallas paged attention for the rollout's decode steps over its
paged KV cache, `config.mesh.attention.paged`),
recomputes each layer in the backward pass (`rl.remat`) and, as every run does, computes the LM head in
chunks of `rl.logits_chunk` positions and packs the PPO step's rows (`rl.pack`). On 2 and 4 A100s
(DeepRetrieval) the reference model waits in host memory between scoring passes (`rl.offload_reference`), as
DeepRetrieval's scripts keep it (`actor_rollout_ref.ref.fsdp_config.param_offload=True`): the scoring pass is
then a program of its own, and the PPO epochs never hold the reference. On 4 (Coder-7B) both models keep
Adam's first moment in bfloat16 (`OptimConfig.mu_dtype`; verl keeps it in float32), a quarter less optimizer
state, which lets the PPO step fit JAX's default 0.75 of each GPU's memory.
`python -m searchrl.benchmarks.aot --config configs/FILE.py:PRESET,SETUP --topology ...` compiles every
program of the run for the setup's devices without them and reports its memory (docs/benchmarks.md).
"""
from typing import NamedTuple


class Setup(NamedTuple):
    """How a setup lays out a run (`apply`)."""

    devices: int
    topology: str  # its chips as `searchrl.benchmarks.aot --topology` compiles for them
    attention: str  # the attention implementation (names in searchrl.models.attention.ATTENTION)
    paged: str  # the paged KV cache's (names in searchrl.models.paged_attention.PAGED_ATTENTION)
    # whether the reference model waits in host memory between scoring passes (`rl.offload_reference`: on 2
    # or 4 A100s the float32 masters and Adam moments of the policy and the critic take most of the memory)
    offload_reference: bool = False
    # the dtype both models keep Adam's first moment in (`OptimConfig.mu_dtype`; "": float32, as verl)
    mu_dtype: str = ""


SETUPS = {
    "a100x2": Setup(2, "a100:2", "pallas_mha", "pallas_gpu", offload_reference=True),
    # Coder-7B's policy and critic: their float32 masters and Adam moments took 62.7 GiB, over JAX's default
    # 0.75 of 80; with bfloat16 first moments the PPO step takes 55.4
    "a100x4": Setup(4, "a100:4", "pallas_mha", "pallas_gpu", offload_reference=True, mu_dtype="bfloat16"),
    "a100x8": Setup(8, "a100:8", "pallas_mha", "pallas_gpu"),
    "h100x8": Setup(8, "h100:8", "pallas_mha", "pallas_gpu"),
    "v5p8": Setup(8, "v5p:2x2x2", "pallas_tpu", "pallas_tpu"),
}


def split(arg: str) -> tuple[str, str | None]:
    """`arg` without its hardware suffix, and the setup it names (None without one)."""
    preset, _, last = arg.rpartition(",")
    return (preset, last) if preset and last in SETUPS else (arg, None)


def apply(config, setup: str | None):
    """`config` laid out for `setup` (unchanged for None)."""
    if setup is None:
        return config
    laid_out = SETUPS[setup]
    config.mesh.update(dict(data=1, fsdp=laid_out.devices, tensor=1))
    config.mesh.attention.update(dict(impl=laid_out.attention, paged=laid_out.paged))
    config.rl.update(dict(remat=True, offload_reference=laid_out.offload_reference))
    if laid_out.mu_dtype:
        config.rl.actor.mu_dtype = config.rl.critic.mu_dtype = laid_out.mu_dtype
    return config
