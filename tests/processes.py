"""Helpers for tests that need a free local port or run searchrl as several local processes (JAX's
distributed runtime on 127.0.0.1)."""
from __future__ import annotations

import socket
import subprocess
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for the coordinator)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(procs: list[subprocess.Popen], workdirs: list[Path]) -> None:
    """Waits for `procs` (killed past 10 minutes) and asserts that each exited 0, showing the end of its
    workdir's log when not."""
    try:
        for proc in procs:
            proc.wait(timeout=600)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for proc, workdir in zip(procs, workdirs):
        assert proc.returncode == 0, (workdir / "log").read_text()[-6000:]
