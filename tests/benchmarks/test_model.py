"""The model benchmark's processor description, read from /proc/cpuinfo's text."""
from searchrl.benchmarks.model import cpu_model

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
