"""The hardware a benchmark runs on: accelerator chips' published figures, and the name a result records."""
from __future__ import annotations

import dataclasses
import os

import jax

GiB = 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
    """One accelerator chip's published figures (Cloud TPU system architecture pages, NVIDIA's data
    sheets)."""

    hbm_bytes: float
    peak_flops: float  # dense bf16 FLOP/s
    hbm_bandwidth: float  # bytes/s


CHIPS = {
    "v4": Chip(32 * GiB, 275e12, 1.2e12),
    "v5e": Chip(16 * GiB, 197e12, 819e9),
    "v5p": Chip(95 * GiB, 459e12, 2.765e12),
    "v6e": Chip(32 * GiB, 918e12, 1.64e12),
}
# Device kinds as JAX names them -> their chip: the first name a kind contains wins.
DEVICE_CHIPS = (
    ("H200", Chip(141e9, 989e12, 4.8e12)),
    ("H100 PCIe", Chip(80e9, 756e12, 2.0e12)),
    ("H100", Chip(80e9, 989e12, 3.35e12)),
    ("A100-SXM4-80GB", Chip(80e9, 312e12, 2.039e12)),
    ("A100 80GB PCIe", Chip(80e9, 312e12, 1.935e12)),
    ("A100", Chip(40e9, 312e12, 1.555e12)),
    ("TPU v5 lite", CHIPS["v5e"]),
    ("TPU v6 lite", CHIPS["v6e"]),
    ("TPU v5", CHIPS["v5p"]),
    ("TPU v4", CHIPS["v4"]),
)


def chip_of(topology: str) -> Chip:
    """The chip of a topology name ("v5p:2x2x2")."""
    generation = topology.split(":")[0]
    if generation not in CHIPS:
        raise ValueError(f"topology {topology!r}: unknown TPU generation {generation!r}; "
                         f"known: {sorted(CHIPS)}")
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
