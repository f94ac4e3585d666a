"""launch/gpu_check.sh at tiny size on CPU (the kernels interpreted): every check is there with finite figures
and the kernels agree with the reference; without its packages the script stops at once; the paper size's
programs compile for an H100 with JAX's CUDA plugin (from `make aot-gpu`'s venv where it is built)."""
import dataclasses
import json
import math
import os
import pathlib
import subprocess
import sys

import pytest

from searchrl.benchmarks.gpu_check import failures, markdown, roofline, spread, timed_rounds
from searchrl.benchmarks.hardware import GPU_TARGETS
from searchrl.benchmarks.jaxpr_cost import MatmulCost

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "launch" / "gpu_check.sh"
GPU_PYTHON = ROOT / ".venv-gpu" / "bin" / "python"


def test_roofline_takes_the_slower_bound():
    """1 TFLOP and 6.7 GB on an H100 (989 TFLOP/s, 3.35 TB/s): 2 ms of memory, against 1 ms of compute."""
    chip = GPU_TARGETS["h100"].chip
    found = roofline(MatmulCost(flops=0.989e12, bytes=6.7e9), seconds=4e-3, chip=chip)
    assert found["bound"] == "memory"
    assert found["predicted_ms"] == pytest.approx(2.0)
    assert found["fraction_of_peak"] == pytest.approx(0.5)
    assert roofline(MatmulCost(1.0, 1.0), 1.0, None)["fraction_of_peak"] is None


def test_timed_rounds_stop_at_the_budget():
    calls = []
    times = timed_rounds(lambda: calls.append(1), rounds=1000, budget_s=0.0)
    assert len(times) == 1 and len(calls) == 2  # one untimed call, then one round however short the budget
    assert spread([0.002, 0.004, 0.003], per=2)["ms"] == pytest.approx(1.5)


def test_the_summary_names_the_peaks_and_a_failed_check():
    chip = GPU_TARGETS["h100"].chip
    row = {"check": "paged", "kernel": "pallas_gpu", "rows": 64, "max_error": 0.001, "tolerance": 0.02,
           "agrees": True, **spread([1e-3]), **roofline(MatmulCost(1e9, 1.675e9), 1e-3, chip)}
    table = markdown({"size": "paper", "device": "NVIDIA H100 80GB HBM3", "chip": dataclasses.asdict(chip),
                      "checks": [row, {"check": "flash", "error": "RuntimeError: a | b\nc"}]})
    assert "Peaks: 989 TFLOP/s bf16, 3.35 TB/s HBM" in table
    assert ("| paged | kernel pallas_gpu, rows 64 | 1 (1-1, 1) | 0.001 / 1.68 | 0.5 (memory) | 50.0% |"
            in table)
    assert "| flash | failed: RuntimeError: a / b c |" in table
    assert failures({"checks": [row, {"check": "flash", "error": "..."}, row | {"agrees": False}]}) == [
        "flash", "paged"]


def test_the_tiny_check_runs_on_cpu(tmp_path):
    env = {**os.environ, "GPU_CHECK_SIZE": "tiny", "GPU_CHECK_PYTHON": sys.executable, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(["bash", str(SCRIPT), str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    found = {}
    for r in result["checks"]:
        found.setdefault(r["check"], []).append(r)
    assert sorted(found) == ["decode", "flash", "micro_batch", "paged"]
    assert [r["live"] for r in found["decode"]] == [64, 256]
    for r in result["checks"]:
        figures = [r[k] for k in ("ms", "ms_min", "ms_max", "model_tflop")]
        assert all(math.isfinite(x) and x > 0 for x in figures), r
        assert r["ms_min"] <= r["ms"] <= r["ms_max"]
        assert r["fraction_of_peak"] is None  # no peak figures for a CPU
        # bytes where the cost model knows them: decode steps and the paged kernel, not flash attention's
        assert (r["model_gb"] is not None) == (r["check"] in ("decode", "paged"))
        assert r["model_gb"] is None or (math.isfinite(r["model_gb"]) and r["model_gb"] > 0)
    (micro_batch,) = found["micro_batch"]
    assert found["decode"][0]["paged"] == "pallas_gpu" and micro_batch["attention"] == "pallas_mha"
    assert micro_batch["tokens"] > 0 and micro_batch["remat"]
    for r in found["flash"] + found["paged"]:
        assert r["agrees"] and 0 <= r["max_error"] <= r["tolerance"], r
    table = (tmp_path / "gpu_check.md").read_text()
    assert all(f"| {name} |" in table for name in ("decode", "micro_batch", "flash", "paged"))
    assert "failed" not in table


def test_the_script_stops_at_once_without_its_packages(tmp_path):
    """No package index: one line saying which package could not be installed, and no check runs."""
    env = {**os.environ, "GPU_CHECK_VENV": str(tmp_path / "venv"), "PIP_NO_INDEX": "1"}
    done = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 1
    assert done.stderr.startswith("gpu_check: a package of requirements.txt") and "jax" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_the_paper_size_refuses_a_cpu(tmp_path):
    """Without a GPU (JAX's CUDA plugin missing) the paper size stops at once instead of running for hours."""
    command = [sys.executable, "-m", "searchrl.benchmarks.gpu_check", "--size=paper", f"--out={tmp_path}"]
    done = subprocess.run(command, cwd=ROOT, env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1 and "--size paper needs a GPU" in done.stderr
    assert not (tmp_path / "gpu_check.json").exists()


@pytest.mark.slow
@pytest.mark.skipif(not GPU_PYTHON.exists(), reason="needs JAX's CUDA plugin: make aot-gpu")
def test_the_paper_check_compiles_for_an_h100(tmp_path):
    """--dry_run h100:1 in `make aot-gpu`'s venv (JAX_PLATFORMS=cpu: no driver needed): every program of the
    paper size compiles for one H100 and fits JAX's default 0.75 of its memory."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
    command = [str(GPU_PYTHON), "-m", "searchrl.benchmarks.gpu_check", "--size", "paper",
               "--dry_run", "h100:1", "--out", str(tmp_path)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    dry = json.loads((tmp_path / "gpu_check.json").read_text())["dry_run"]
    assert dry["device_kind"] == GPU_TARGETS["h100"].description
    names = [p["program"] for p in dry["programs"]]
    assert names == ["decode search_r1:paper", "decode search_r1:paper_7b", "micro_batch", "flash",
                     "flash reference", "paged", "paged reference"]
    for program in dry["programs"]:
        assert program["fits"] and program["total_gib"] <= 0.75 * program["hbm_gib"], program
