"""The hardware a benchmark runs on: accelerator chips' published figures, and the name a result records."""
from __future__ import annotations

import dataclasses
import os

import jax

GiB, MiB = 2**30, 2**20


@dataclasses.dataclass(frozen=True)
class Chip:
    """One accelerator chip's published figures (Cloud TPU system architecture pages, NVIDIA's data
    sheets)."""

    hbm_bytes: float
    peak_flops: float  # dense bf16 FLOP/s
    hbm_bandwidth: float  # bytes/s


CHIPS = {
    "v4": Chip(32 * GiB, 275e12, 1.2e12),  # cloud.google.com/tpu/docs/v4: 275 TFLOP/s, 32 GiB, 1200 GBps
    "v5e": Chip(16 * GiB, 197e12, 819e9),
    "v5p": Chip(95 * GiB, 459e12, 2.765e12),
    "v6e": Chip(32 * GiB, 918e12, 1.64e12),
}

# TPU generations whose chip's two TensorCores JAX drives as one device ("megacore"), with the chip's HBM
# and FLOP/s, as on their pods (JAX's `pallas.mosaic.tpu_info.ChipVersion.supports_megacore`).
MEGACORE = frozenset({"v4", "v5p"})


@dataclasses.dataclass(frozen=True)
class GpuTarget:
    """An NVIDIA GPU as XLA compiles for one it cannot see (its GpuTargetConfigProto): the device
    properties CUDA reports for it (cudaGetDeviceProperties; memory as nvidia-smi shows it)."""

    description: str  # the device kind, as JAX names it
    chip: Chip
    compute_capability: tuple[int, int]
    multiprocessors: int
    fp32_cores_per_multiprocessor: int
    shared_memory_per_multiprocessor: int
    shared_memory_per_block_optin: int
    l2_cache_bytes: int
    clock_rate_ghz: float

    def target_config(self, cuda: tuple[int, int] = (12, 9), cudnn: tuple[int, int] = (9, 28)) -> str:
        """The GpuTargetConfigProto text XLA's CUDA compiler takes, for CUDA and cuDNN versions `cuda` and
        `cudnn` (those `pip install jax[cuda12]==0.10.2` installs)."""
        return (
            "gpu_device_info {\n"
            "  threads_per_block_limit: 1024\n  threads_per_warp: 32\n  shared_memory_per_block: 49152\n"
            f"  shared_memory_per_core: {self.shared_memory_per_multiprocessor}\n"
            "  threads_per_core_limit: 2048\n"
            f"  core_count: {self.multiprocessors}\n  fpus_per_core: {self.fp32_cores_per_multiprocessor}\n"
            "  block_dim_limit_x: 2147483647\n  block_dim_limit_y: 65535\n  block_dim_limit_z: 65535\n"
            f"  memory_bandwidth: {int(self.chip.hbm_bandwidth)}\n  l2_cache_size: {self.l2_cache_bytes}\n"
            f"  clock_rate_ghz: {self.clock_rate_ghz}\n  device_memory_size: {int(self.chip.hbm_bytes)}\n"
            f"  shared_memory_per_block_optin: {self.shared_memory_per_block_optin}\n"
            f"  cuda_compute_capability {{ major: {self.compute_capability[0]} "
            f"minor: {self.compute_capability[1]} }}\n"
            "  registers_per_core_limit: 65536\n  registers_per_block_limit: 65536\n}\n"
            'platform_name: "CUDA"\n'
            f"dnn_version_info {{ major: {cudnn[0]} minor: {cudnn[1]} }}\n"
            f"runtime_version {{ major: {cuda[0]} minor: {cuda[1]} }}\n"
            f'device_description_str: "{self.description}"\n')


# Topology generations for NVIDIA GPUs: "h100:8" is one host of 8 H100s, "a100:2x8" two hosts of 8 A100s.
GPU_TARGETS = {
    "a100": GpuTarget("NVIDIA A100-SXM4-80GB", Chip(81920 * MiB, 312e12, 2.039e12), (8, 0), 108, 64,
                      167936, 166912, 40 * MiB, 1.41),
    "h100": GpuTarget("NVIDIA H100 80GB HBM3", Chip(81559 * MiB, 989e12, 3.35e12), (9, 0), 132, 128,
                      233472, 232448, 50 * MiB, 1.98),
    "h200": GpuTarget("NVIDIA H200", Chip(143771 * MiB, 989e12, 4.8e12), (9, 0), 132, 128,
                      233472, 232448, 50 * MiB, 1.98),
}
# Device kinds as JAX names them -> their chip: the first name a kind contains wins.
DEVICE_CHIPS = (
    ("H200", GPU_TARGETS["h200"].chip),
    ("H100 PCIe", Chip(81559 * MiB, 756e12, 2.0e12)),
    ("H100", GPU_TARGETS["h100"].chip),
    ("A100-SXM4-80GB", GPU_TARGETS["a100"].chip),
    ("A100 80GB PCIe", Chip(81920 * MiB, 312e12, 1.935e12)),
    ("A100", Chip(40960 * MiB, 312e12, 1.555e12)),
    ("TPU v5 lite", CHIPS["v5e"]),
    ("TPU v6 lite", CHIPS["v6e"]),
    ("TPU v5", CHIPS["v5p"]),
    ("TPU v4", CHIPS["v4"]),
)


def chip_of(topology: str) -> Chip:
    """The chip of a topology name ("v5p:2x2x2", "h100:8")."""
    generation = topology.split(":")[0]
    if generation in GPU_TARGETS:
        return GPU_TARGETS[generation].chip
    if generation not in CHIPS:
        raise ValueError(f"topology {topology!r}: unknown generation {generation!r}; "
                         f"known: {sorted(CHIPS) + sorted(GPU_TARGETS)}")
    return CHIPS[generation]


def device_chip(device_kind: str) -> Chip | None:
    """The chip of a device kind ("NVIDIA H100 80GB HBM3", "TPU v5 lite"); None for one not listed (CPUs)."""
    return next((chip for name, chip in DEVICE_CHIPS if name in device_kind), None)


def cpu_model(cpuinfo: str) -> str:
    """'<model name>, family F model M' of the first processor listed in /proc/cpuinfo's text."""
    first = cpuinfo.split("\n\n")[0].splitlines()
    pairs = (line.split(":", 1) for line in first if ":" in line)
    fields = {key.strip(): value.strip() for key, value in pairs}
    return (f"{fields.get('model name', 'unknown')}, family {fields.get('cpu family', '?')} "
            f"model {fields.get('model', '?')}")


def device_name() -> str:
    """JAX's device kind, on the CPU with the processor (`cpu_model`) where /proc/cpuinfo exists: the matmul
    libraries' relative speed differs between CPU generations."""
    kind = jax.devices()[0].device_kind
    if jax.default_backend() != "cpu" or not os.path.exists("/proc/cpuinfo"):
        return kind
    with open("/proc/cpuinfo") as f:
        return f"{kind} ({cpu_model(f.read())})"
