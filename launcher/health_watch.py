"""Steady-state liveness: a background thread probes every shard's gRPC `Health` and the
router's /health, and reports the first child that keeps failing.

A child that exits is caught by polling its status; this catches the ones that stay alive
but stop answering (a stopped or deadlocked shard), and a router whose /health turned 503
because a shard failed a step (the router latches that state; its log names the rank).

A shard that does not answer `Health` in time is not taken for a hung one on that alone. The
shard is one Python process: a native call that holds the GIL (a grammar compile, a tokenizer
build) keeps its event loop from answering for as long as it runs, while the shard is doing
exactly what it was asked. So each round also reads the shard's process state from /proc:
- stopped (SIGSTOP, state T): failed after `stopped_allowed` rounds, without waiting on Health;
- it used at least `busy_share` of a core since the last sample: busy, not hung; a miss does
  not count, up to `busy_limit` seconds without an answer (the router's step deadline
  usually bounds a step sooner). A share, not "any CPU": a hung process's idle threads
  (gRPC's pollers, timed waits) still wake and cost a few ticks a second, and on a loaded
  machine that alone kept a hung shard "busy" until the busy limit;
- otherwise (no answer, next to no CPU): a miss; `failures_allowed` in a row fail it.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence


@dataclass(frozen=True)
class WatchTimings:
    interval: float = 1.0  # seconds between probe rounds
    shard_timeout: float = 5.0  # a shard answers Health from its event loop, even mid-step
    router_timeout: float = 15.0  # the router bounds its own /health to a few seconds
    failures_allowed: int = 3  # consecutive failed probes (of an idle process) before it counts as failed
    # Consecutive rounds seen stopped (SIGSTOP). The router fails its streams first (within
    # its 4 s stopped grace, or a short --step-timeout plus a 2 s diagnosis); the margin
    # lets clients read its 503s before the launcher takes it down.
    stopped_allowed: int = 10
    busy_limit: float = 180.0  # seconds a busy (CPU-consuming) shard may go without answering
    busy_share: float = 0.25  # share of one core a silent shard must use to count as busy


@dataclass(frozen=True)
class ProcessSample:
    state: str  # /proc/<pid>/stat's state letter: R, S, D, T (stopped), t (traced), Z ...
    cpu_seconds: float  # user + system time of every thread

    @property
    def stopped(self) -> bool:
        return self.state in ("T", "t")


def read_process(pid: int) -> ProcessSample | None:
    """The process's state and CPU time from /proc; None where that cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read().decode("ascii", "replace")
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: fields follow the last ')'.
    fields = text[text.rfind(")") + 2:].split()
    try:
        ticks = int(fields[11]) + int(fields[12])
    except (IndexError, ValueError):
        return None
    return ProcessSample(state=fields[0], cpu_seconds=ticks / os.sysconf("SC_CLK_TCK"))


class HealthWatch:
    def __init__(self, shards: Sequence[tuple[str, Path]], router_url: str,
                 shard_probe: Callable[[Path, float], bool],
                 router_probe: Callable[[str, float], bool],
                 timings: WatchTimings = WatchTimings(),
                 pids: Mapping[str, int] | None = None,
                 process_probe: Callable[[int], ProcessSample | None] = read_process,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._shards = list(shards)
        self._router_url = router_url
        self._shard_probe = shard_probe
        self._router_probe = router_probe
        self._timings = timings
        self._pids = dict(pids or {})
        self._process_probe = process_probe
        self._clock = clock
        self._misses: dict[str, int] = {}
        self._stopped: dict[str, int] = {}
        self._cpu: dict[str, tuple[float, float]] = {}  # (when, CPU seconds) of the last sample
        self._answered: dict[str, float] = {}  # when each shard last answered Health
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
            failure = self._probe_shard(name, socket)
            if failure is not None:
                return failure
        router_healthy = self._router_probe(self._router_url, timings.router_timeout)
        if not router_healthy and any(self._stopped.values()):
            return None  # the router's 503 is the stopped shard's, which is named above in time
        if self._record("router", router_healthy):
            return (f"the router's /health has failed {timings.failures_allowed} probes in a row "
                    f"(a shard failed a step; the router's log above names the rank)")
        return None

    def _probe_shard(self, name: str, socket: Path) -> str | None:
        timings = self._timings
        now = self._clock()
        self._answered.setdefault(name, now)
        pid = self._pids.get(name)
        before = self._process_probe(pid) if pid is not None else None
        if before is not None and before.stopped:
            self._stopped[name] = self._stopped.get(name, 0) + 1
            if self._stopped[name] >= timings.stopped_allowed:
                return (f"{name} has not answered Health: it is stopped (pid {pid}, state "
                        f"{before.state}: SIGSTOP or a debugger)")
            return None
        self._stopped[name] = 0
        if self._shard_probe(socket, timings.shard_timeout):
            self._answered[name] = self._clock()
            self._misses[name] = 0
            if before is not None:
                self._cpu[name] = (now, before.cpu_seconds)
            return None
        after = self._process_probe(pid) if pid is not None else None
        if after is not None and after.stopped:
            self._stopped[name] = 1
            return None  # counted from the next round on
        silent_for = self._clock() - self._answered[name]
        busy = after is not None and self._busy(name, after)
        if busy:
            # Working (a long native call holds the GIL): not a miss, within a bound.
            self._misses[name] = 0
            if silent_for >= timings.busy_limit:
                return (f"{name} has not answered Health for {silent_for:.0f} s while using CPU "
                        f"(busy far past any step; hung in a loop?)")
            return None
        if self._record(name, False):
            return (f"{name} has not answered Health for {timings.failures_allowed} probes "
                    f"in a row and uses next to no CPU (hung or stopped)")
        return None

    def _busy(self, name: str, sample: ProcessSample) -> bool:
        """Whether the shard used at least `busy_share` of a core since its last sample."""
        now = self._clock()
        previous = self._cpu.get(name)
        self._cpu[name] = (now, sample.cpu_seconds)
        if previous is None or now <= previous[0]:
            return False
        share = (sample.cpu_seconds - previous[1]) / (now - previous[0])
        return share >= self._timings.busy_share

    def _record(self, name: str, healthy: bool) -> bool:
        """True when `name` has now failed `failures_allowed` probes in a row."""
        self._misses[name] = 0 if healthy else self._misses.get(name, 0) + 1
        return self._misses[name] >= self._timings.failures_allowed
