"""The hardware a benchmark records: chips by device kind or topology, the processor from /proc/cpuinfo."""
import pytest

from searchrl.benchmarks import hardware
from searchrl.benchmarks.hardware import cpu_model

_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC 9B45 128-Core Processor
flags\t\t: fpu avx512f

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC 9B14
"""


def test_cpu_model_names_the_first_processor():
    assert cpu_model(_CPUINFO) == "AMD EPYC 9B45 128-Core Processor, family 26 model 2"


def test_cpu_model_marks_missing_fields():
    assert cpu_model("processor\t: 0\nflags\t\t: fpu\n") == "unknown, family ? model ?"


@pytest.mark.parametrize("kind,chip", [
    ("NVIDIA H200", hardware.Chip(143771 * 2**20, 989e12, 4.8e12)),
    ("NVIDIA H100 80GB HBM3", hardware.Chip(81559 * 2**20, 989e12, 3.35e12)),
    ("NVIDIA H100 PCIe", hardware.Chip(81559 * 2**20, 756e12, 2.0e12)),
    ("NVIDIA A100-SXM4-80GB", hardware.Chip(81920 * 2**20, 312e12, 2.039e12)),
    ("NVIDIA A100-SXM4-40GB", hardware.Chip(40960 * 2**20, 312e12, 1.555e12)),
    ("TPU v5 lite", hardware.CHIPS["v5e"]),
    ("TPU v5", hardware.CHIPS["v5p"]),
    ("TPU v6 lite", hardware.CHIPS["v6e"]),
    ("TPU v4", hardware.CHIPS["v4"]),
    ("cpu", None),
])
def test_device_chip(kind, chip):
    assert hardware.device_chip(kind) == chip


def test_chip_of_a_topology():
    assert hardware.chip_of("v5p:2x2x2") == hardware.CHIPS["v5p"]
    assert hardware.chip_of("h100:2x8") == hardware.device_chip("NVIDIA H100 80GB HBM3")
    with pytest.raises(ValueError, match="unknown generation 'v9'; known: .*'a100', 'h100', 'h200'"):
        hardware.chip_of("v9:2x2")


def test_a_gpu_target_config_names_the_device_as_cuda_reports_it():
    text = hardware.GPU_TARGETS["a100"].target_config(cuda=(12, 8), cudnn=(9, 1))
    assert text.count("{") == text.count("}") == 4
    for line in ["  core_count: 108", "  fpus_per_core: 64", "  shared_memory_per_core: 167936",
                 "  shared_memory_per_block_optin: 166912", f"  l2_cache_size: {40 * 2**20}",
                 "  memory_bandwidth: 2039000000000", f"  device_memory_size: {81920 * 2**20}",
                 "  cuda_compute_capability { major: 8 minor: 0 }", "  clock_rate_ghz: 1.41",
                 "runtime_version { major: 12 minor: 8 }", "dnn_version_info { major: 9 minor: 1 }",
                 'device_description_str: "NVIDIA A100-SXM4-80GB"']:
        assert line in text.splitlines()
    assert hardware.device_chip(hardware.GPU_TARGETS["h200"].description) == hardware.GPU_TARGETS["h200"].chip
