"""Start the shards, then the router; watch them; turn signals into an orderly shutdown.

Order: stale sockets removed → shards spawned → each shard's socket appears and answers
Health → router spawned → router's /health answers 200 → "ready". Any child that dies stops
everything and the launcher exits non-zero naming it, with the end of its stderr. Once ready,
a health watch also probes the children: a shard that stops answering (hung or stopped) or a
router whose /health stays 503 (a shard failed a step) stops everything the same way. SIGTERM or
SIGINT drains: the router finishes in-flight requests (up to the shutdown timeout), then the
shards stop. A second signal skips the waiting.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable, Mapping, Sequence

from .commands import redact_secrets
from .child import ChildProcess, describe_exit
from .health_watch import HealthWatch, WatchTimings
from .probes import router_is_healthy, shard_is_healthy

logger = logging.getLogger("textgen.launcher")


@dataclass(frozen=True)
class ChildSpec:
    name: str
    argv: Sequence[str]
    env: Mapping[str, str]


@dataclass(frozen=True)
class ShardSpec(ChildSpec):
    socket: Path = Path()


@dataclass(frozen=True)
class RouterSpec(ChildSpec):
    health_url: str = ""


@dataclass(frozen=True)
class Timeouts:
    startup: float = 1800.0
    shutdown: float = 90.0  # the router's drain
    shard_grace: float = 10.0  # SIGTERM → SIGKILL for shards
    poll_interval: float = 0.1
    waiting_log_every: float = 10.0
    watch: WatchTimings = WatchTimings()


@dataclass
class StopSignal:
    """Set by SIGTERM/SIGINT. `requested` starts the drain; a second signal sets `forced`."""

    requested: threading.Event = field(default_factory=threading.Event)
    forced: threading.Event = field(default_factory=threading.Event)

    def trigger(self, signum: int = signal.SIGTERM, _frame=None) -> None:
        if self.requested.is_set():
            self.forced.set()
        self.requested.set()

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.trigger)


class ChildDied(Exception):
    def __init__(self, child: ChildProcess, returncode: int) -> None:
        super().__init__(f"{child.name} {describe_exit(returncode)}")
        self.child = child


class StartupTimeout(Exception):
    pass


class ChildUnresponsive(Exception):
    """A child is alive but failed its health probes; the message names it."""


class _StopRequested(Exception):
    pass


@dataclass
class Probes:
    shard: Callable[[Path, float], bool] = shard_is_healthy  # (socket, timeout)
    router: Callable[[str, float], bool] = router_is_healthy  # (url, timeout)


class Supervisor:
    def __init__(self, shards: Sequence[ShardSpec], router: RouterSpec, stop: StopSignal,
                 timeouts: Timeouts = Timeouts(), probes: Probes | None = None,
                 stderr_sink: IO[str] | None = None) -> None:
        self._shard_specs = list(shards)
        self._router_spec = router
        self._stop = stop
        self._timeouts = timeouts
        self._probes = probes or Probes()
        self._sink = stderr_sink or sys.stderr
        self._shards: list[ChildProcess] = []
        self._router: ChildProcess | None = None

    def run(self) -> int:
        """Exit status: 0 after a signal-driven shutdown, 1 when a child failed."""
        try:
            self._remove_sockets()
            self._start_shards()
            self._wait_ready({spec.name for spec in self._shard_specs}, self._shards_ready)
            self._router = self._spawn(self._router_spec)
            self._wait_ready({self._router_spec.name}, self._router_ready)
            logger.info("ready: serving on %s", self._router_spec.health_url.rsplit("/", 1)[0])
            self._watch()
        except ChildDied as death:
            tail = death.child.stderr_tail()
            logger.error("%s; stopping everything. Last stderr lines of %s:\n%s",
                         death, death.child.name, tail or "(none)")
            self._stop_all(router_grace=self._timeouts.shard_grace)
            return 1
        except (StartupTimeout, ChildUnresponsive) as exc:
            logger.error("%s; stopping everything", exc)
            self._stop_all(router_grace=self._timeouts.shard_grace)
            return 1
        except _StopRequested:
            logger.info("shutdown requested; draining")
            self._stop_all(router_grace=self._timeouts.shutdown)
            logger.info("shutdown complete")
            return 0
        except BaseException:
            self._stop_all(router_grace=self._timeouts.shard_grace)
            raise
        finally:
            self._remove_sockets()

    # -- startup ---------------------------------------------------------------------------

    def _remove_sockets(self) -> None:
        for spec in self._shard_specs:
            try:
                spec.socket.unlink()
            except FileNotFoundError:
                pass

    def _spawn(self, spec: ChildSpec) -> ChildProcess:
        logger.info("starting %s: %s", spec.name, " ".join(redact_secrets(spec.argv)))
        return ChildProcess(spec.name, spec.argv, spec.env, self._sink)

    def _start_shards(self) -> None:
        for spec in self._shard_specs:
            self._shards.append(self._spawn(spec))

    def _children(self) -> list[ChildProcess]:
        return [*self._shards, *([self._router] if self._router else [])]

    def _check_alive(self) -> None:
        if self._stop.requested.is_set():
            raise _StopRequested
        for child in self._children():
            returncode = child.poll()
            if returncode is not None:
                raise ChildDied(child, returncode)

    def _shards_ready(self, pending: set[str]) -> set[str]:
        for spec in self._shard_specs:
            if spec.name in pending and spec.socket.exists() and self._probes.shard(spec.socket):
                logger.info("%s is ready", spec.name)
                pending.discard(spec.name)
        return pending

    def _router_ready(self, pending: set[str]) -> set[str]:
        if self._probes.router(self._router_spec.health_url):
            pending.discard(self._router_spec.name)
        return pending

    def _wait_ready(self, pending: set[str], step: Callable[[set[str]], set[str]]) -> None:
        start = last_log = time.monotonic()
        while True:
            self._check_alive()
            pending = step(pending)
            if not pending:
                return
            now = time.monotonic()
            if now - start > self._timeouts.startup:
                raise StartupTimeout(f"{', '.join(sorted(pending))} not ready after "
                                     f"{self._timeouts.startup:g} s")
            if now - last_log >= self._timeouts.waiting_log_every:
                logger.info("waiting for %s to be ready...", ", ".join(sorted(pending)))
                last_log = now
            self._stop.requested.wait(self._timeouts.poll_interval)

    # -- steady state and shutdown ---------------------------------------------------------

    def _watch(self) -> None:
        watch = HealthWatch([(spec.name, spec.socket) for spec in self._shard_specs],
                            self._router_spec.health_url, self._probes.shard,
                            self._probes.router, self._timeouts.watch,
                            pids={spec.name: child.pid for spec, child in
                                  zip(self._shard_specs, self._shards)})
        watch.start()
        try:
            while True:
                self._check_alive()
                if watch.failure is not None:
                    raise ChildUnresponsive(watch.failure)
                self._stop.requested.wait(self._timeouts.poll_interval)
        finally:
            watch.close()

    def _stop_all(self, router_grace: float) -> None:
        if self._router is not None and self._router.poll() is None:
            self._router.send_signal(signal.SIGTERM)
            if not self._router.wait(router_grace, self._stop.forced):
                logger.warning("router still running after %g s; killing it", router_grace)
                self._router.kill()
        for shard in self._shards:
            # A stopped (SIGSTOP) shard resumes first: a SIGTERM it got while stopped would go
            # to whichever thread ran first, not the one that handles it.
            shard.send_signal(signal.SIGCONT)
            shard.send_signal(signal.SIGTERM)
        for shard in self._shards:
            if not shard.wait(self._timeouts.shard_grace, self._stop.forced):
                logger.warning("%s ignored SIGTERM; killing it", shard.name)
                shard.kill()
