"""launch/retrieval_server.sh for real, on tiny indexes: it waits for its own server and passes the serve
flags through (depth 3000), refuses a port already in use (naming the index served there) unless it serves
the same index, stops what it started, and writes only under RUN_DIR; the cluster launchers stop their
servers at exit."""
import json
import os
import shlex
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from searchrl.retrieval import RetrievalConfig, index_fingerprint
from searchrl.retrieval.remote import RemoteRetriever
from tests.processes import free_port
from tests.serving.conftest import DEEP

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "launch" / "retrieval_server.sh"


def script(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """The script run from `cwd` with this Python first on PATH."""
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PATH": path, **env})


def health(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
        return json.load(response)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_start_refuse_stop(deep, rivers, tmp_path):
    cwd, run_dir, port = tmp_path / "cwd", tmp_path / "run", free_port()
    cwd.mkdir()
    started = script(str(deep), str(port), f"--max_topk={DEEP}", cwd=cwd, RUN_DIR=str(run_dir))
    assert started.returncode == 0, started.stderr
    assert f"retrieval server up on port {port}" in started.stdout
    pid_file = run_dir / f"retrieval_server.{socket.gethostname()}.{port}.pid"
    pid = int(pid_file.read_text())
    served = health(port)
    assert (served["pid"], served["fingerprint"]) == (pid, index_fingerprint(deep))
    assert (served["index"], served["kind"]) == (str(deep), "bm25")
    # The serve flags passed through: depth 3000 goes through.
    client = RemoteRetriever(RetrievalConfig(url=f"http://127.0.0.1:{port}",
                                             index_fingerprint=served["fingerprint"]))
    assert [len(hits) for hits in client.search(["alpha", "alpha word5"], DEEP)] == [DEEP, DEEP]

    again = script(str(rivers), str(port), cwd=cwd, RUN_DIR=str(run_dir))
    assert again.returncode == 1
    assert (f"port {port} is in use: a retrieval server (pid {pid}) serves the bm25 index {deep}, "
            f"fingerprint {index_fingerprint(deep)}; not index {rivers} (fingerprint "
            f"{index_fingerprint(rivers)})") in again.stderr
    assert health(port)["pid"] == pid and pid_file.read_text() == f"{pid}\n"  # the running one is untouched
    # The same index named by a relative path is the server already up, not another index.
    same = script(os.path.relpath(deep, cwd), str(port), cwd=cwd, RUN_DIR=str(run_dir))
    assert same.returncode == 0, same.stderr
    assert f"retrieval server already up on port {port} (pid {pid}," in same.stdout
    assert health(port)["pid"] == pid

    stopped = script("stop", cwd=cwd, RUN_DIR=str(run_dir))
    assert stopped.returncode == 0, stopped.stderr
    assert not alive(pid) and not pid_file.exists()
    assert os.listdir(cwd) == []  # everything went under RUN_DIR
    assert sorted(os.listdir(run_dir)) == [f"retrieval_server.{socket.gethostname()}.{port}.log"]


def test_a_port_held_by_something_else_is_refused_and_runs_go_under_runs(capitals, tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as other:
        port = other.getsockname()[1]
        out = script(str(capitals), str(port), cwd=tmp_path, RUN_DIR="")
    assert out.returncode == 1
    assert f"port {port} is in use: something that is not a retrieval server listens there" in out.stderr
    port = free_port()
    started = script(str(capitals), str(port), cwd=tmp_path, RUN_DIR="")  # empty: the default, runs/retrieval
    try:
        assert started.returncode == 0, started.stderr
        assert os.listdir(tmp_path) == ["runs"] and (tmp_path / "runs" / "retrieval").is_dir()
        assert health(port)["fingerprint"] == index_fingerprint(capitals)
    finally:
        assert script("stop", str(port), cwd=tmp_path, RUN_DIR="").returncode == 0
    log = f"retrieval_server.{socket.gethostname()}.{port}.log"
    assert os.listdir(tmp_path / "runs" / "retrieval") == [log]


def test_a_server_that_fails_to_start_is_reported(tmp_path):
    out = script(str(tmp_path / "no index"), str(free_port()), cwd=tmp_path, RUN_DIR=str(tmp_path / "run"))
    assert out.returncode != 0 and "index dir not found" in out.stderr


@pytest.mark.parametrize("launcher, args, env", [
    ("gpu_host.sh", ["c.py:paper", "/idx"], {}),
    ("slurm.sbatch", ["c.py:paper", "/idx"], {"SLURM_JOB_NUM_NODES": "2"}),
    ("tpu_pod.sh", ["tpu", "zone", "c.py:paper", "/idx"], {"WORKERS": "2"})])
def test_the_launchers_stop_their_servers_at_exit(launcher, args, env):
    out = subprocess.run(["bash", f"launch/{launcher}", *args, "--config.x=1"], cwd=REPO, capture_output=True,
                         text=True, timeout=60, env={**os.environ, "DRY_RUN": "1", "RUN_DIR": "/runs/my run",
                                                     "RETRIEVAL_FLAGS": "--max_topk=3000 --max_hits=300000",
                                                     **env})
    assert out.returncode == 0, out.stderr
    for line in out.stdout.splitlines():
        words = shlex.split(line.split(": ", 1)[1])
        if launcher == "tpu_pod.sh":  # the worker's job runs detached: `setsid nohup bash -c JOB`
            assert words[words.index("export") + 1] == "RUN_DIR=/runs/my run"  # ssh passes no environment
            words = shlex.split(words[words.index("setsid") + 4])
        start = words.index("bash")
        assert words[start + 2:start + 6] == ["/idx", "8000", "--max_topk=3000", "--max_hits=300000"]
        assert words[start + 1].endswith("launch/retrieval_server.sh") and words[start + 6] == "&&"
        stop = f"bash {words[start + 1]} stop 8000"
        assert words[start + 7:start + 11] == ["trap", stop, "EXIT", "&&"], words
