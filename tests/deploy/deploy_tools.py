"""Locate the external tools the deploy checks run, and run them.

`scripts/install-tools.sh` (run by `make install-test`) puts promtool, helm and kubeconform in
<repo>/.tools/bin; hadolint comes with the [test] extra into the virtual environment's bin.
A missing tool fails the test with instructions: these checks never skip.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
TOOLS_BIN = REPO_ROOT / ".tools" / "bin"
VENV_BIN = Path(sys.executable).parent


def find_tool(name: str) -> str:
    for directory in (TOOLS_BIN, VENV_BIN):
        candidate = directory / name
        if candidate.is_file():
            return str(candidate)
    on_path = shutil.which(name)
    if on_path:
        return on_path
    pytest.fail(f"{name} is not installed: run `make install-test` (it runs "
                f"scripts/install-tools.sh and installs the [test] extra)", pytrace=False)


def run_tool(name: str, *args: str, cwd: Path = REPO_ROOT,
             input: str | None = None) -> subprocess.CompletedProcess:
    """Run a tool and return the finished process; the caller checks returncode."""
    return subprocess.run([find_tool(name), *args], cwd=cwd, input=input, text=True,
                          capture_output=True, timeout=300)


def check_tool(name: str, *args: str, cwd: Path = REPO_ROOT, input: str | None = None) -> str:
    """Run a tool that must succeed; return its stdout."""
    result = run_tool(name, *args, cwd=cwd, input=input)
    assert result.returncode == 0, (
        f"{name} {' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return result.stdout
