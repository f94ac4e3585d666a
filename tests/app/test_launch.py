"""The launch scripts' dry runs (DRY_RUN=1): what each host of a cluster would run, quoted as it would run;
and `local.sh` run for real on a fresh checkout."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
OVERRIDE = "--config.env.prompt_template=Q: {question} A:"  # spaces and braces survive the quoting


def dry_lines(script: str, *args: str, cwd: Path = REPO, **env: str) -> list[str]:
    """Each host's command line as printed; asserts the hosts are numbered 0..n-1."""
    out = subprocess.run(["bash", str(REPO / "launch" / script), *args], cwd=cwd, capture_output=True,
                         text=True, env={**os.environ, "DRY_RUN": "1", **env}, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split(":", 1)[0] for line in lines] == [f"host {i}" for i in range(len(lines))], lines
    return [line.split(": ", 1)[1] for line in lines]


def dry_run(script: str, *args: str, cwd: Path = REPO, **env: str) -> list[list[str]]:
    """Each host's command line, split as bash would split it."""
    return [shlex.split(line) for line in dry_lines(script, *args, cwd=cwd, **env)]


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


def worker_job(words: list[str]) -> list[str]:
    """The job a TPU worker's line starts detached (the `setsid nohup bash -c JOB` argument), split."""
    start = words.index("setsid")
    assert words[start:start + 4] == ["setsid", "nohup", "bash", "-c"]
    return shlex.split(words[start + 4])


def test_tpu_pod_starts_the_job_detached_on_every_worker_with_a_log_each():
    hosts = dry_run("tpu_pod.sh", "my-tpu", "us-central2-b", "configs/autosearch.py:paper", "/idx", OVERRIDE,
                    WORKERS="4", RUN_DIR="runs/my run")
    assert len(hosts) == 4 and hosts[0] == hosts[3]
    words = hosts[0]
    assert words[:6] == ["cd", "searchrl", "&&", "source", ".venv/bin/activate", "&&"]  # the README's venv
    assert ">runs/my run/logs/worker_$i.log" in " ".join(words) and "</dev/null" in words
    job = worker_job(words)
    assert job[:4] == ["bash", "launch/retrieval_server.sh", "/idx", "8000"]
    args = train_args(job)
    assert "--config.distributed.enabled=True" in args and args[-1] == OVERRIDE


def test_a_tpu_workers_job_outlives_its_ssh_session_and_stops_by_its_pid_file(tmp_path):
    """A worker's line run for real with stand-ins for the TPU metadata (curl) and python: the line returns at
    once, the job keeps running in its own session, logs to worker_<n>.log, and its pid file stops it."""
    [line] = dry_lines("tpu_pod.sh", "tpu", "zone", "configs/rpl.py:paper_qwen3_4b", "-", OVERRIDE,
                       REMOTE_DIR=str(tmp_path / "repo"))
    (tmp_path / "repo" / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / "repo" / ".venv" / "bin" / "activate").write_text("")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("curl", "echo 3"), ("python", 'echo "args: $*"; echo ready; exec sleep 60')):
        (bin_dir / name).write_text(f"#!/usr/bin/env bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    out = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=30,
                         env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    assert out.returncode == 0 and out.stdout.startswith("worker 3: started"), out
    logs = tmp_path / "repo" / "runs" / "tpu" / "logs"
    pid = int((logs / "worker_3.pid").read_text())
    try:
        for _ in range(100):
            if "ready" in (logs / "worker_3.log").read_text():
                break
            time.sleep(0.1)
        log = (logs / "worker_3.log").read_text()
        assert log.startswith("args: -m searchrl.main --config configs/rpl.py:paper_qwen3_4b "
                              "--config.distributed.enabled=True "
                              "--config.env.prompt_template=Q: {question} A: train"), log
        assert os.getsid(pid) == pid  # a session of its own: the ssh session's hangup does not reach it
    finally:
        os.killpg(pid, signal.SIGTERM)
    for _ in range(100):
        if not os.path.exists(f"/proc/{pid}"):
            break
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{pid}")


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


def fake_gcloud(tmp_path: Path, check_status: int = 0) -> Path:
    """A stand-in gcloud that records each call's arguments (one list per line, JSON) and exits with
    `check_status` for the check on worker 0."""
    gcloud = tmp_path / "gcloud"
    gcloud.write_text(f"""#!/usr/bin/env python3
import json, sys
with open({str(tmp_path / "calls")!r}, "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
sys.exit({check_status} if "--worker=0" in sys.argv else 0)
""")
    gcloud.chmod(0o755)
    return gcloud


def tpu_pod(tmp_path: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    """launch/tpu_pod.sh run for real against the stand-in gcloud: its result and gcloud's calls."""
    out = subprocess.run(["bash", "launch/tpu_pod.sh", "my-tpu", "zone-a", *args], cwd=REPO,
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}", **env})
    calls = tmp_path / "calls"
    return out, [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []


def test_tpu_pod_checks_worker_0_then_prints_how_to_follow_and_stop_the_job(tmp_path):
    """The launch itself: `searchrl check` on worker 0 (with the index it will serve and the pod's worker
    count), then the job on every worker."""
    fake_gcloud(tmp_path)
    out, [check, start] = tpu_pod(tmp_path, "configs/autosearch.py:paper,v5p8", "/idx", OVERRIDE)
    assert out.returncode == 0, out.stderr
    ssh = ["compute", "tpus", "tpu-vm", "ssh", "my-tpu", "--zone", "zone-a"]
    assert check[:9] == [*ssh, "--worker=0", "--command"]
    line, hosts = check[9].split(" --hosts=")
    words = shlex.split(line)
    assert words[words.index("python"):] == ["python", "-m", "searchrl.check", "configs/autosearch.py:paper,v5p8",
                                              "--config.retrieval.index_dir=/idx", OVERRIDE]
    assert hosts.startswith("$(curl") and "worker-network-endpoints" in hosts
    assert start[:8] == [*ssh, "--worker=all"] and "setsid nohup bash -c" in start[9]
    follow, stop = out.stdout.splitlines()
    assert shlex.split(follow.split(": ", 1)[1])[-1] == "tail -f searchrl/runs/my-tpu/logs/worker_0.log"
    stop_words = shlex.split(stop.split(": ", 1)[1])
    assert stop_words[-3] == "--worker=all" and "searchrl/runs/my-tpu/logs/worker_*.pid" in stop_words[-1]
    assert "kill -- -" in stop_words[-1]


def test_tpu_pod_starts_nothing_when_the_check_fails(tmp_path):
    fake_gcloud(tmp_path, check_status=1)
    out, calls = tpu_pod(tmp_path, "configs/autosearch.py:paper,v5p8", "-")
    assert out.returncode == 1 and "the check on worker 0 failed" in out.stderr
    assert len(calls) == 1 and "--worker=0" in calls[0] and "index_dir" not in calls[0][-1]
    fake_gcloud(tmp_path, check_status=1)
    (tmp_path / "calls").unlink()
    out, [start] = tpu_pod(tmp_path, "configs/autosearch.py:paper,v5p8", "-", CHECK="0")
    assert out.returncode == 0 and "--worker=all" in start


def test_slurm_finds_the_repository_from_any_directory(tmp_path):
    """Run from elsewhere (the script's own place), as sbatch runs it (a copy, the repository the submit
    directory) and with SEARCHRL_ROOT; no repository anywhere is a clear error."""
    args = ("configs/autosearch.py:paper", "/idx")
    [here] = dry_run("slurm.sbatch", *args, cwd=tmp_path)
    assert here == dry_run("slurm.sbatch", *args)[0]
    copy = tmp_path / "spool" / "slurm_script"
    copy.parent.mkdir()
    shutil.copy(REPO / "launch" / "slurm.sbatch", copy)

    def run_copy(**env: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(copy), *args], cwd=tmp_path, capture_output=True, text=True,
                              timeout=60, env={**os.environ, "DRY_RUN": "1", **env})

    for env in ({"SLURM_SUBMIT_DIR": str(REPO)}, {"SEARCHRL_ROOT": str(REPO), "SLURM_SUBMIT_DIR": "/"}):
        out = run_copy(**env)
        assert out.returncode == 0 and shlex.split(out.stdout.split(": ", 1)[1]) == here, out.stderr
    lost = run_copy(SLURM_SUBMIT_DIR=str(tmp_path))
    assert lost.returncode == 1 and "no searchrl repository" in lost.stderr and "SEARCHRL_ROOT" in lost.stderr
    wrong = run_copy(SEARCHRL_ROOT=str(tmp_path))
    assert wrong.returncode == 1 and f"SEARCHRL_ROOT={tmp_path} holds no searchrl repository" in wrong.stderr


def test_an_index_of_dash_runs_the_configs_own_retriever():
    [host] = dry_run("gpu_host.sh", "configs/deepretrieval.py:literature", "-", OVERRIDE)
    assert host[:3] == ["python", "-m", "searchrl.main"] and "retrieval_server.sh" not in " ".join(host)
    assert train_args(host) == ["--config", "configs/deepretrieval.py:literature", OVERRIDE]


def readme_launch_lines() -> list[list[str]]:
    """The launch commands in README.md's bash blocks (continuation lines joined), split."""
    blocks = re.findall(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    lines = "\n".join(blocks).replace("\\\n", " ").splitlines()
    return [shlex.split(line, comments=True) for line in lines if "launch/" in line]


def test_every_paper_preset_in_the_readme_has_a_launch_line_that_dry_runs():
    """Each README launch line dry-runs as written, names a config preset that parses, and every paper
    config (search_r1, autosearch, deepretrieval, rpl) has at least one."""
    from searchrl import run_config

    launched = set()
    for words in readme_launch_lines():
        env = dict(w.split("=", 1) for w in words if re.fullmatch(r"[A-Z_]+=.*", w))
        words = [w for w in words if not re.fullmatch(r"[A-Z_]+=.*", w)]
        script = next(w for w in words if w.startswith("launch/"))
        args = words[words.index(script) + 1:]
        config = args[2] if script.endswith("tpu_pod.sh") else args[0]
        [host, *_] = dry_run(script.removeprefix("launch/"), *args, **env, WORKERS="2",
                             SLURM_JOB_NUM_NODES="2")
        inner = worker_job(host) if script.endswith("tpu_pod.sh") else host
        assert train_args(inner)[:2] == ["--config", config]
        file, preset = config.split(":")
        spec = importlib.util.spec_from_file_location(Path(file).stem, REPO / file)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        run_config.parse(module.get_config(preset))
        launched.add(Path(file).stem)
    assert launched == {"search_r1", "autosearch", "deepretrieval", "rpl"}


def test_a_launch_stops_at_the_check_when_an_input_is_missing(tmp_path):
    """gpu_host.sh runs `searchrl check` first (with the index it would serve): a missing model, dataset or
    index stops it before any server or trainer starts, each missing input listed with its command."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO), "RUN_DIR": str(tmp_path / "run"),
           "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])}  # this python
    out = subprocess.run(["bash", "launch/gpu_host.sh", "configs/search_r1.py:paper", str(tmp_path / "idx"),
                          f"--config.model.path={tmp_path / 'Qwen2.5-3B'}", f"--config.data.dir={tmp_path}",
                          "--config.data.eval=nq"], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 1 and out.stderr.startswith("error: 6 of 10 not ready (model, "), out.stderr
    assert "missing  index" in out.stdout and f"--out {tmp_path / 'idx'}" in out.stdout
    assert "--names Qwen/Qwen2.5-3B" in out.stdout and not (tmp_path / "run").exists()  # no server started
