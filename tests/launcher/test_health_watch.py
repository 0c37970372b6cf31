"""The steady-state health watch: which child it names, and only after repeated misses."""

from pathlib import Path

from launcher.commands import Executables, router_command
from launcher.health_watch import HealthWatch, WatchTimings
from launcher.settings import parse_settings

SHARDS = [("shard 0", Path("/s-0")), ("shard 1", Path("/s-1"))]
TIMINGS = WatchTimings(interval=0.01, failures_allowed=3)


def watch(shard_answers, router_answers):
    """Probes answer from the given iterators ({socket: iter of bools}, iter of bools)."""
    return HealthWatch(SHARDS, "http://r/health",
                       lambda socket, timeout: next(shard_answers[socket]),
                       lambda url, timeout: next(router_answers), TIMINGS)


def test_a_shard_is_named_only_after_consecutive_misses():
    flaky = iter([False, False, True, False, False, False])
    w = watch({Path("/s-0"): iter([True] * 9), Path("/s-1"): flaky}, iter([True] * 9))
    assert [w.probe_round() for _ in range(5)] == [None] * 5  # a success resets the count
    assert w.probe_round() == "shard 1 has not answered Health for 3 probes in a row (hung or stopped)"


def test_a_hung_shard_is_named_before_the_router_it_makes_unhealthy():
    w = watch({Path("/s-0"): iter([True] * 9), Path("/s-1"): iter([False] * 9)}, iter([False] * 9))
    assert [w.probe_round() for _ in range(2)] == [None, None]
    assert w.probe_round().startswith("shard 1 ")


def test_the_router_failing_alone_is_reported():
    w = watch({Path("/s-0"): iter([True] * 9), Path("/s-1"): iter([True] * 9)}, iter([False] * 9))
    results = [w.probe_round() for _ in range(3)]
    assert results[:2] == [None, None]
    assert "router's /health has failed 3 probes" in results[2]


def test_the_thread_reports_the_failure():
    w = watch({Path("/s-0"): iter([True] * 99), Path("/s-1"): iter([False] * 99)}, iter([True] * 99))
    w.start()
    w._thread.join(timeout=5)
    assert w.failure is not None and w.failure.startswith("shard 1 ")


def test_step_timeout_is_forwarded_to_the_router_only_when_set():
    exe = Executables(router=("textgen-router",), shard=("textgen-shard",))
    assert "--step-timeout" not in router_command(exe, parse_settings([], {}), Path("/m"), 1)
    argv = router_command(exe, parse_settings([], {"STEP_TIMEOUT": "7"}), Path("/m"), 2)
    assert argv[argv.index("--step-timeout") + 1] == "7"
