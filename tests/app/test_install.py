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
    for tool in ("sh", "touch", "test"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    calls = tmp_path / "calls.txt"
    for name, body in (("python", f'echo "$@" >> {calls}'), *((("java", "exit 0"),) if with_java else ())):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    done = subprocess.run([shutil.which("make"), "install", f"PY={bin_dir / 'python'}",
                           f"STAMP={tmp_path / 'stamp'}"], cwd=ROOT, env={"PATH": str(bin_dir)},
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


def test_license_file_matches_pyproject():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'license = { text = "Apache-2.0" }' in pyproject
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text
