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
    ("NVIDIA H200", hardware.Chip(141e9, 989e12, 4.8e12)),
    ("NVIDIA H100 80GB HBM3", hardware.Chip(80e9, 989e12, 3.35e12)),
    ("NVIDIA H100 PCIe", hardware.Chip(80e9, 756e12, 2.0e12)),
    ("NVIDIA A100-SXM4-40GB", hardware.Chip(40e9, 312e12, 1.555e12)),
    ("TPU v5 lite", hardware.CHIPS["v5e"]),
    ("TPU v5", hardware.CHIPS["v5p"]),
    ("cpu", None),
])
def test_device_chip(kind, chip):
    assert hardware.device_chip(kind) == chip


def test_chip_of_a_topology():
    assert hardware.chip_of("v5p:2x2x2") == hardware.CHIPS["v5p"]
    with pytest.raises(ValueError, match="unknown TPU generation 'v9'"):
        hardware.chip_of("v9:2x2")
