"""The launch scripts' dry runs (DRY_RUN=1): what each host of a cluster would run, quoted as it would run;
and `local.sh` run for real on a fresh checkout."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
OVERRIDE = "--config.env.prompt_template=Q: {question} A:"  # spaces and braces survive the quoting


def dry_run(script: str, *args: str, **env: str) -> list[list[str]]:
    """Each host's command line, split as bash would split it; asserts the hosts are numbered 0..n-1."""
    out = subprocess.run(["bash", f"launch/{script}", *args], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, "DRY_RUN": "1", **env}, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split(":", 1)[0] for line in lines] == [f"host {i}" for i in range(len(lines))], lines
    return [shlex.split(line.split(": ", 1)[1]) for line in lines]


def train_args(words: list[str]) -> list[str]:
    """The arguments of a host's `python -m searchrl.main ... train`."""
    start = words.index("python")
    assert words[start:start + 3] == ["python", "-m", "searchrl.main"] and words[-1] == "train"
    return words[start + 3:-1]


def test_slurm_runs_a_retrieval_server_and_the_same_trainer_on_every_node():
    hosts = dry_run("slurm.sbatch", "configs/autosearch.py:paper", "/data/my index", OVERRIDE,
                    SLURM_JOB_NUM_NODES="3")
    assert len(hosts) == 3 and hosts[0] == hosts[1] == hosts[2]
    assert hosts[0][:4] == ["bash", "launch/retrieval_server.sh", "/data/my index", "8000"]
    args = train_args(hosts[0])
    assert args[:2] == ["--config", "configs/autosearch.py:paper"] and args[-1] == OVERRIDE
    assert {"--config.distributed.enabled=True", "--config.retrieval.kind=remote",
            "--config.retrieval.url=http://127.0.0.1:8000/retrieve"} <= set(args)


def test_tpu_pod_runs_on_every_worker():
    hosts = dry_run("tpu_pod.sh", "my-tpu", "us-central2-b", "configs/autosearch.py:paper", "/idx", OVERRIDE,
                    WORKERS="4")
    assert len(hosts) == 4 and hosts[0][:2] == ["cd", "~/searchrl"]
    args = train_args(hosts[0])
    assert "--config.distributed.enabled=True" in args and args[-1] == OVERRIDE


def test_one_gpu_host_serves_retrieval_then_trains():
    [host] = dry_run("gpu_host.sh", "configs/autosearch.py:paper", "/idx", OVERRIDE)
    assert "retrieval_server.sh" in host[1] and "--config.distributed.enabled=True" not in host
    assert train_args(host)[-1] == OVERRIDE


def test_local_processes_share_a_coordinator_on_localhost():
    hosts = dry_run("local.sh", "configs/autosearch.py:tiny", OVERRIDE, PROCESSES="2", DEVICES="4",
                    XLA_FLAGS="--some_flag=1 --xla_force_host_platform_device_count=8")
    assert len(hosts) == 2
    args = [train_args(h) for h in hosts]
    assert [a[-1] for a in args] == ["--config.distributed.process_id=0", "--config.distributed.process_id=1"]
    coordinators = {x for a in args for x in a if x.startswith("--config.distributed.coordinator_address=")}
    assert len(coordinators) == 1 and coordinators.pop().split("=")[1].startswith("127.0.0.1:")
    # Each process's own device count replaces the one in XLA_FLAGS; the other flags are kept.
    [flags] = [w.split("=", 1)[1].split() for w in hosts[0] if w.startswith("XLA_FLAGS=")]
    assert flags == ["--some_flag=1", "--xla_force_host_platform_device_count=4"]
    [single] = dry_run("local.sh", "configs/autosearch.py:tiny", OVERRIDE)
    assert train_args(single) == ["--config", "configs/autosearch.py:tiny", OVERRIDE]


@pytest.mark.slow
def test_local_sh_trains_the_tiny_preset_on_a_fresh_checkout(tmp_path):
    """`launch/local.sh configs/autosearch.py:tiny` in a copy of the tracked files (a fresh clone, nothing
    built): it builds the miniature's world, then trains; everything it writes is under runs/."""
    checkout = tmp_path / "searchrl"
    for name in subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True,
                               check=True).stdout.split("\0"):
        if name and (REPO / name).is_file():
            (checkout / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, checkout / name)
    before = set(os.listdir(checkout))
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])}  # this python
    env.pop("PYTHONPATH", None)  # the checkout's own package, as a clone runs it
    out = subprocess.run(["bash", "launch/local.sh", "configs/autosearch.py:tiny", "--config.train.steps=1",
                          "--config.train.batch_size=8", "--config.rl.minibatch_size=8",
                          "--config.rl.micro_batch_size=8", "--config.train.checkpoint_every=1",
                          "--config.model.num_layers=1"],
                         cwd=checkout, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "autosearch: built the world under runs/demo" in out.stdout
    run = checkout / "runs" / "demo"
    assert {"tokenizer", "index", "world", "metrics.jsonl"} <= set(os.listdir(run))
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1]
    assert set(os.listdir(checkout)) - before == {"runs"}
