"""One supervised child process: its own process group, stderr forwarded and its tail kept."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import threading
import time
from typing import IO, Mapping, Sequence

STDERR_TAIL_LINES = 50
_sink_lock = threading.Lock()


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with code {returncode}"


class ChildProcess:
    """A started child. Signals go to its whole process group (it may have helpers)."""

    def __init__(self, name: str, argv: Sequence[str], env: Mapping[str, str],
                 stderr_sink: IO[str]) -> None:
        self.name = name
        self.argv = list(argv)
        self._tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        self._sink = stderr_sink
        # A new session makes the child a process-group leader, so a terminal's Ctrl-C
        # reaches only the launcher, which then stops children in order.
        self._process = subprocess.Popen(
            self.argv, env=dict(env), stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
            start_new_session=True)
        self._reader = threading.Thread(target=self._forward_stderr, name=f"{name}-stderr",
                                        daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self._process.pid

    def _forward_stderr(self) -> None:
        assert self._process.stderr is not None
        for raw in self._process.stderr:
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            self._tail.append(line)
            with _sink_lock:
                try:
                    self._sink.write(line + "\n")
                    self._sink.flush()
                except (OSError, ValueError):
                    pass  # our own stderr is gone; keep draining so the child never blocks

    def poll(self) -> int | None:
        return self._process.poll()

    def send_signal(self, sig: int) -> None:
        if self._process.poll() is not None:
            return
        try:
            os.killpg(self._process.pid, sig)
        except ProcessLookupError:
            pass

    def wait(self, timeout: float, interrupted: threading.Event | None = None) -> bool:
        """True when the child has exited within `timeout` (or before `interrupted` is set)."""
        deadline = time.monotonic() + timeout
        while True:
            if self._process.poll() is not None:
                return True
            left = deadline - time.monotonic()
            if left <= 0 or (interrupted is not None and interrupted.is_set()):
                return False
            try:
                self._process.wait(timeout=min(left, 0.1))
                return True
            except subprocess.TimeoutExpired:
                continue

    def stop(self, grace: float, interrupted: threading.Event | None = None) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds; returns once the child is gone."""
        self.send_signal(signal.SIGTERM)
        if not self.wait(grace, interrupted):
            self.kill()

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
        self._process.wait()

    def stderr_tail(self) -> str:
        # Let the reader reach EOF so the last lines a dying child wrote are included.
        self._reader.join(timeout=1.0)
        return "\n".join(self._tail)
