"""Starts the real stack (textgen-launcher → router → shard) as a user would, for tests."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Mapping

import httpx

# --max-concurrent-requests of the session-wide server (conftest.py). It lives here, not in
# conftest.py, because another test folder's conftest module may own that name.
SESSION_MAX_CONCURRENT = 24


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launcher_command() -> list[str]:
    """The launcher installed beside this interpreter, else the first one on PATH."""
    exe = Path(sys.executable).parent / "textgen-launcher"
    if exe.exists():
        return [str(exe)]
    found = shutil.which("textgen-launcher")
    if found is None:
        raise RuntimeError(f"{exe} not found: install the project first (make install-test)")
    return [found]


class Server:
    """One launcher process and everything it spawns, on a free port. `env` is added to
    this process's environment for the launcher (and, through it, its children)."""

    def __init__(self, *flags: str, startup_timeout: float = 600.0,
                 env: Mapping[str, str] | None = None):
        self.port = free_port()
        self.workdir = Path(tempfile.mkdtemp(prefix="textgen-it-"))
        self.log_path = self.workdir / "launcher.log"
        command = launcher_command() + [
            "--port", str(self.port),
            "--hostname", "127.0.0.1",
            "--shard-uds-path", str(self.workdir / "shard"),
            *flags,
        ]
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            command, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, **(env or {})},
        )
        self.url = f"http://127.0.0.1:{self.port}"
        self._wait_ready(startup_timeout)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"launcher exited with {self.process.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"server not ready after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-20000:]

    def terminate(self) -> None:
        """SIGTERM the launcher, as an orchestrator would."""
        os.kill(self.process.pid, signal.SIGTERM)

    def stop(self, timeout: float = 60.0) -> int:
        if self.process.poll() is None:
            self.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._log.close()
        return self.process.returncode


def scrape_metrics(url: str) -> dict[str, float]:
    """Prometheus text → {'name{labels}': value} (samples only)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        samples[name] = float(value)
    return samples


def metric(samples: dict[str, float], name: str) -> float:
    """Sum of all samples of a metric, whatever their labels."""
    return sum(v for k, v in samples.items() if k == name or k.startswith(name + "{"))
