"""The steady-state health watch: which child it names, and only after repeated misses."""

from pathlib import Path

from launcher.commands import Executables, router_command
from launcher.health_watch import HealthWatch, ProcessSample, WatchTimings, read_process
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
    assert w.probe_round() == ("shard 1 has not answered Health for 3 probes in a row and uses "
                               "next to no CPU (hung or stopped)")


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


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def watched(shard_answers, samples, clock, timings=TIMINGS):
    """One shard (pid 42) whose Health answers and /proc samples come from the iterators."""
    return HealthWatch([("shard 0", Path("/s-0"))], "http://r/health",
                       lambda socket, timeout: next(shard_answers), lambda url, timeout: True,
                       timings, pids={"shard 0": 42}, process_probe=lambda pid: next(samples),
                       clock=clock)


def test_a_busy_shard_that_holds_the_gil_is_not_taken_for_a_hung_one():
    # A grammar compile holds the GIL for seconds: Health times out, the CPU time keeps growing.
    clock = Clock()
    cpu = iter(range(0, 10_000, 6))  # 6 CPU seconds per sample, 2 samples per 6 s round: 2 cores
    samples = (ProcessSample("R", next(cpu)) for _ in iter(int, 1))
    w = watched(iter([True] + [False] * 20 + [True]), samples, clock)
    for _ in range(22):
        clock.now += 6.0
        assert w.probe_round() is None


def test_a_busy_shard_silent_past_the_busy_limit_is_named():
    clock = Clock()
    cpu = iter(range(0, 10_000, 6))
    samples = (ProcessSample("R", next(cpu)) for _ in iter(int, 1))
    w = watched(iter([True] + [False] * 99), samples, clock, WatchTimings(interval=0.01, busy_limit=30))
    results = []
    for _ in range(8):
        clock.now += 6.0
        results.append(w.probe_round())
    assert results[:4] == [None] * 4
    assert "while using CPU" in next(r for r in results if r)


def test_a_silent_shard_that_uses_no_cpu_is_hung():
    clock = Clock()
    samples = (ProcessSample("S", 100) for _ in iter(int, 1))
    w = watched(iter([True] + [False] * 9), samples, clock)
    assert [w.probe_round() for _ in range(3)] == [None] * 3
    assert "uses next to no CPU (hung or stopped)" in w.probe_round()


def test_a_silent_shard_whose_idle_threads_still_wake_is_hung():
    # gRPC's pollers and timed waits cost a few ticks a second in a hung process; on a loaded
    # machine (CI) that is more, but far from the core a GIL-holding native call burns.
    clock = Clock()
    cpu = (0.2 * i for i in range(1_000))  # 0.4 s of CPU per 6 s round: 7 % of a core
    samples = (ProcessSample("S", next(cpu)) for _ in iter(int, 1))
    w = watched(iter([True] + [False] * 9), samples, clock)
    results = []
    for _ in range(4):
        clock.now += 6.0
        results.append(w.probe_round())
    assert results[:3] == [None] * 3
    assert "uses next to no CPU (hung or stopped)" in results[3]


def test_a_stopped_shard_is_named_without_waiting_on_health():
    clock = Clock()
    samples = iter([ProcessSample("S", 1)] + [ProcessSample("T", 1)] * 9)

    def never_probed(socket, timeout):
        raise AssertionError("Health probed while the shard is stopped")

    w = watched(iter([True]), samples, clock, WatchTimings(interval=0.01, stopped_allowed=2))
    assert w.probe_round() is None
    w._shard_probe = never_probed
    assert w.probe_round() is None
    failure = w.probe_round()
    assert failure.startswith("shard 0 has not answered Health: it is stopped (pid 42, state T")


def test_read_process_parses_proc_stat(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        # Running, sleeping, or (just started, reading its files under load) in disk sleep.
        live = read_process(child.pid)
        assert live.state in ("R", "S", "D") and not live.stopped
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while not read_process(child.pid).stopped and time.monotonic() < deadline:
            time.sleep(0.01)
        assert read_process(child.pid).stopped
        me = read_process(os.getpid())
        sum(range(3_000_000))
        assert read_process(os.getpid()).cpu_seconds > me.cpu_seconds
    finally:
        child.kill()
        child.wait()
    assert read_process(child.pid) is None


def test_step_timeout_is_forwarded_to_the_router_only_when_set():
    exe = Executables(router=("textgen-router",), shard=("textgen-shard",))
    assert "--step-timeout" not in router_command(exe, parse_settings([], {}), Path("/m"), 1)
    argv = router_command(exe, parse_settings([], {"STEP_TIMEOUT": "7"}), Path("/m"), 2)
    assert argv[argv.index("--step-timeout") + 1] == "7"


def test_a_stopped_shard_is_named_rather_than_the_router_it_makes_unhealthy():
    clock = Clock()
    samples = iter([ProcessSample("T", 1)] * 9)
    w = HealthWatch([("shard 0", Path("/s-0"))], "http://r/health", lambda socket, timeout: False,
                    lambda url, timeout: False, WatchTimings(interval=0.01, stopped_allowed=4),
                    pids={"shard 0": 42}, process_probe=lambda pid: next(samples), clock=clock)
    assert [w.probe_round() for _ in range(3)] == [None] * 3
    assert w.probe_round().startswith("shard 0 has not answered Health: it is stopped")


def test_the_limits_docs_processes_states_are_the_defaults():
    text = " ".join((Path(__file__).parents[2] / "docs" / "processes.md").read_text().split())
    default = WatchTimings()
    assert f"misses {default.failures_allowed} `Health` probes in a row" in text
    assert f"given up to {default.busy_limit:.0f} s" in text
    assert f"stays stopped (SIGSTOP) for {default.stopped_allowed * default.interval:.0f} s" in text
    assert f"`/health` fails {default.failures_allowed} probes in a row" in text
