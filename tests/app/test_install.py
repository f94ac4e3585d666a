"""`make install`: the optional Lucene backend is installed when Java is on PATH, and skipped with a one-line
note (never apt-get, which needs root) when it is not; the rest of the install runs either way."""
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def make_install(tmp_path: Path, with_java: bool) -> tuple[subprocess.CompletedProcess, str]:
    """`make install` on a PATH with the recipe's tools (and a stand-in `java` if asked), with a stand-in
    python that records its arguments instead of installing; (make's result, the recorded calls)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "touch", "test", "grep"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    calls = tmp_path / "calls.txt"
    for name, body in (("python", f'echo "$@" >> {calls}'), *((("java", "exit 0"),) if with_java else ())):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    done = subprocess.run([shutil.which("make"), "install", f"PY={bin_dir / 'python'}",
                           f"STAMP={tmp_path / 'stamp'}", f"RUNTIME={tmp_path / 'runtime'}"], cwd=ROOT, env={"PATH": str(bin_dir)},
                          capture_output=True, text=True, timeout=60)
    return done, calls.read_text()


@pytest.mark.parametrize("with_java", [False, True])
def test_make_install_with_and_without_java(tmp_path, with_java):
    done, installed = make_install(tmp_path, with_java)
    assert done.returncode == 0, done.stderr
    assert "apt-get" not in done.stdout + done.stderr and (tmp_path / "stamp").is_file()
    assert "requirements.txt" in installed and "-e ." in installed
    assert ("requirements-lucene.txt" in installed and "pyserini" in installed) == with_java
    assert ("skipped the optional Lucene backend" in done.stdout) != with_java
    # torch alone from PyTorch's CPU index first, then the pinned files (whose torch pin is then met)
    torch_call = next(line for line in installed.splitlines() if "--extra-index-url" in line)
    assert "--no-deps" in torch_call and "download.pytorch.org/whl/cpu" in torch_call
    assert installed.index("--extra-index-url") < installed.index("requirements-test.txt")


def test_make_demo_installs_the_runtime_only(tmp_path):
    """`make demo`'s install: requirements.txt and searchrl, none of the tests' packages (torch, ...)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "touch", "test"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    calls = tmp_path / "calls.txt"
    (bin_dir / "python").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (bin_dir / "python").chmod(0o755)
    done = subprocess.run([shutil.which("make"), "-n", "demo", f"PY={bin_dir / 'python'}",
                           f"RUNTIME={tmp_path / 'runtime'}", f"STAMP={tmp_path / 'stamp'}"], cwd=ROOT,
                          env={"PATH": str(bin_dir)}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "-r requirements.txt" in done.stdout and "-e ." in done.stdout
    assert "requirements-test.txt" not in done.stdout and "torch" not in done.stdout


def test_license_file_matches_pyproject():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'license = "Apache-2.0"' in pyproject and 'license-files = ["LICENSE"]' in pyproject
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text
