"""Steady-state liveness: a background thread probes every shard's gRPC `Health` and the
router's /health, and reports the first child that keeps failing.

A child that exits is caught by polling its status; this catches the ones that stay alive
but stop answering (a stopped or deadlocked shard), and a router whose /health turned 503
because a shard failed a step (the router latches that state; its log names the rank).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence


@dataclass(frozen=True)
class WatchTimings:
    interval: float = 2.0  # seconds between probe rounds
    shard_timeout: float = 5.0  # a shard answers Health from its event loop, even mid-step
    router_timeout: float = 15.0  # the router's /health itself waits up to 10 s on the shards
    failures_allowed: int = 3  # consecutive failed probes before a child counts as failed


class HealthWatch:
    def __init__(self, shards: Sequence[tuple[str, Path]], router_url: str,
                 shard_probe: Callable[[Path, float], bool],
                 router_probe: Callable[[str, float], bool],
                 timings: WatchTimings = WatchTimings()) -> None:
        self._shards = list(shards)
        self._router_url = router_url
        self._shard_probe = shard_probe
        self._router_probe = router_probe
        self._timings = timings
        self._misses: dict[str, int] = {}
        self._failure: str | None = None
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="health-watch", daemon=True)

    @property
    def failure(self) -> str | None:
        """Why a child counts as failed; None while all answer."""
        return self._failure

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._closed.set()

    def _run(self) -> None:
        while not self._closed.wait(self._timings.interval):
            self._failure = self.probe_round()
            if self._failure is not None:
                return

    def probe_round(self) -> str | None:
        """Probes every child once; returns a failure once one has missed too many probes.
        Shards go first, so a hung shard is named rather than the router it makes unhealthy."""
        timings = self._timings
        for name, socket in self._shards:
            if self._record(name, self._shard_probe(socket, timings.shard_timeout)):
                return (f"{name} has not answered Health for {timings.failures_allowed} probes "
                        f"in a row (hung or stopped)")
        if self._record("router", self._router_probe(self._router_url, timings.router_timeout)):
            return (f"the router's /health has failed {timings.failures_allowed} probes in a row "
                    f"(a shard failed a step; the router's log above names the rank)")
        return None

    def _record(self, name: str, healthy: bool) -> bool:
        """True when `name` has now failed `failures_allowed` probes in a row."""
        self._misses[name] = 0 if healthy else self._misses.get(name, 0) + 1
        return self._misses[name] >= self._timings.failures_allowed
