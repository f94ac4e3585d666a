"""Helpers for tests that need a free local port or run searchrl as several local processes (JAX's
distributed runtime on 127.0.0.1)."""
from __future__ import annotations

import os
import re
import socket
import subprocess
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for the coordinator)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def xla_flags_with_devices(devices: int) -> str:
    """The suite's XLA_FLAGS (tests/conftest.py) with `devices` fake CPU devices in place of its own count."""
    flags = re.sub(r" *--xla_force_host_platform_device_count=\d+", "", os.environ.get("XLA_FLAGS", ""))
    return f"{flags} --xla_force_host_platform_device_count={devices}".strip()


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
