"""The real launcher process supervising fake shard and router processes."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from fake_stack import REPO_ROOT, RUN_LAUNCHER, free_port, write_fake_model


@pytest.fixture
def model_dir(tmp_path):
    return write_fake_model(tmp_path / "model")


class Launcher:
    def __init__(self, tmp_path, model_dir, *flags, env=None):
        self.port = free_port()
        self.uds = str(tmp_path / "uds" / "shard")
        (tmp_path / "uds").mkdir(exist_ok=True)
        self.argv_dir = tmp_path / "argv"
        self.argv_dir.mkdir(exist_ok=True)
        self.events = tmp_path / "events.txt"
        environ = {k: v for k, v in os.environ.items() if k not in ("PORT", "HOSTNAME")}
        environ.update({"PYTHONPATH": str(REPO_ROOT), "FAKE_ARGV_DIR": str(self.argv_dir),
                        "FAKE_EVENTS_FILE": str(self.events), **(env or {})})
        self.process = subprocess.Popen(
            [sys.executable, str(RUN_LAUNCHER), "--model-id", str(model_dir),
             "--hostname", "127.0.0.1", "--port", str(self.port),
             "--shard-uds-path", self.uds, *flags],
            env=environ, stderr=subprocess.PIPE, text=True)

    def wait_ready(self, timeout=30.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.finish()[1]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise AssertionError("launcher never became ready")

    def finish(self, timeout=30.0):
        try:
            _, stderr = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            _, stderr = self.process.communicate()
        return self.process.returncode, stderr

    def argv(self, name):
        return json.loads((self.argv_dir / f"{name}.json").read_text())

    def event_names(self):
        return [line.split()[0] for line in self.events.read_text().splitlines()]


def test_shard_failing_to_load_stops_everything_naming_it(tmp_path, model_dir):
    launcher = Launcher(tmp_path, model_dir, "--num-shard", "2",
                        env={"FAKE_SHARD_CRASH_RANK": "1"})
    code, stderr = launcher.finish()
    assert code == 1
    assert "shard 1 exited with code 3" in stderr
    error_line = stderr[stderr.index("shard 1 exited with code 3"):]
    assert "RuntimeError: weights are corrupt" in error_line
    assert not (tmp_path / "argv" / "router.json").exists(), "router started anyway"
    assert "shard-0-stop" in launcher.event_names(), "surviving shard was not stopped"


def test_shard_dying_after_ready_stops_the_router(tmp_path, model_dir):
    launcher = Launcher(tmp_path, model_dir, env={"FAKE_SHARD_CRASH_AFTER_READY_RANK": "0"})
    code, stderr = launcher.finish()
    assert code == 1
    assert "shard 0 exited with code 7" in stderr
    assert "CUDA error: an illegal memory access" in stderr.split("shard 0 exited")[1]
    assert "drain-start" in launcher.event_names()
    assert not Path(f"{launcher.uds}-0").exists(), "socket left behind"


def test_shard_that_stops_answering_stops_everything_naming_it(tmp_path, model_dir):
    launcher = Launcher(tmp_path, model_dir, "--num-shard", "2",
                        env={"FAKE_SHARD_HANG_AFTER_READY_RANK": "1"})
    code, stderr = launcher.finish(timeout=60)
    assert code == 1, stderr
    assert "shard 1 has not answered Health for 3 probes in a row" in stderr
    assert "shard 0 has not" not in stderr
    assert {"shard-0-stop", "shard-1-stop"} <= set(launcher.event_names())


def test_router_reporting_a_failed_shard_stops_everything(tmp_path, model_dir):
    launcher = Launcher(tmp_path, model_dir, "--num-shard", "2",
                        env={"FAKE_ROUTER_UNHEALTHY_AFTER": "3"})
    launcher.wait_ready()
    code, stderr = launcher.finish(timeout=60)
    assert code == 1, stderr
    assert "the router's /health has failed 3 probes in a row" in stderr
    assert "shard-1-stop" in launcher.event_names()


def test_shards_run_with_nvlink_multicast_off(tmp_path, model_dir):
    launcher = Launcher(tmp_path, model_dir, "--num-shard", "2", env={"NCCL_NVLS_ENABLE": "1"})
    launcher.wait_ready()
    launcher.process.send_signal(signal.SIGTERM)
    assert launcher.finish()[0] == 0
    for rank in range(2):
        assert (tmp_path / "argv" / f"shard-{rank}-nvls.txt").read_text() == "0"


def test_sigterm_drains_router_before_stopping_shards(tmp_path, model_dir):
    launcher = Launcher(tmp_path, model_dir, "--num-shard", "2", "--max-batch-size", "8",
                        env={"FAKE_ROUTER_DRAIN_SECONDS": "0.5"})
    launcher.wait_ready()
    launcher.process.send_signal(signal.SIGTERM)
    code, stderr = launcher.finish()
    assert code == 0, stderr
    assert "ready" in stderr
    events = launcher.event_names()
    assert events.index("drain-end") < events.index("shard-0-stop")
    assert events.index("drain-end") < events.index("shard-1-stop")
    assert "router drained" in stderr  # children's stderr is forwarded to ours

    router = launcher.argv("router")
    assert router[router.index("--num-shard") + 1] == "2"
    assert router[router.index("--max-batch-size") + 1] == "8"
    assert "--max-concurrent-requests" not in router
    shard = launcher.argv("shard-1")
    assert shard[:1] == ["serve"]
    assert shard[shard.index("--rank") + 1] == "1"
    assert shard[shard.index("--world-size") + 1] == "2"
    assert shard[shard.index("--model-path") + 1] == str(model_dir)


def test_sigint_also_drains(tmp_path, model_dir):
    launcher = Launcher(tmp_path, model_dir)
    launcher.wait_ready()
    launcher.process.send_signal(signal.SIGINT)
    code, stderr = launcher.finish()
    assert code == 0, stderr
    assert launcher.event_names()[:2] == ["drain-start", "drain-end"]


def test_router_exceeding_shutdown_timeout_is_killed(tmp_path, model_dir):
    launcher = Launcher(tmp_path, model_dir, "--shutdown-timeout", "0.5",
                        env={"FAKE_ROUTER_DRAIN_SECONDS": "30"})
    launcher.wait_ready()
    started = time.monotonic()
    launcher.process.send_signal(signal.SIGTERM)
    code, stderr = launcher.finish()
    assert code == 0
    assert time.monotonic() - started < 10
    assert "killing it" in stderr
    assert "drain-end" not in launcher.event_names()


def test_stale_socket_is_removed_at_start(tmp_path, model_dir):
    (tmp_path / "uds").mkdir()
    stale = tmp_path / "uds" / "shard-0"
    stale.write_text("left over by a crashed run")
    launcher = Launcher(tmp_path, model_dir)
    launcher.wait_ready()
    assert stale.is_socket()
    launcher.process.send_signal(signal.SIGTERM)
    assert launcher.finish()[0] == 0


def test_a_busy_shard_that_misses_health_is_not_stopped(tmp_path, model_dir):
    # Issue 27 defect 2: Health unanswered while the shard works (CPU time growing) is busy,
    # not hung. The watch used to stop everything after 3 missed probes (~3-6 s here).
    launcher = Launcher(tmp_path, model_dir, env={"FAKE_SHARD_BUSY_AFTER_READY_RANK": "0"})
    launcher.wait_ready()
    time.sleep(10)
    assert launcher.process.poll() is None, launcher.finish()[1]
    launcher.process.send_signal(signal.SIGTERM)
    code, stderr = launcher.finish()
    assert code == 0, stderr
    assert "has not answered Health" not in stderr


def test_a_stopped_shard_is_named_within_seconds(tmp_path, model_dir):
    launcher = Launcher(tmp_path, model_dir)
    launcher.wait_ready()
    shard = next(p for p in _children(launcher.process.pid) if b"--rank" in _cmdline(p))
    os.kill(shard, signal.SIGSTOP)
    started = time.monotonic()
    code, stderr = launcher.finish(timeout=60)
    assert code == 1, stderr
    assert "shard 0 has not answered Health: it is stopped" in stderr
    assert time.monotonic() - started < 20, stderr  # 10 rounds stopped, then the stop
    assert "ignored SIGTERM" not in stderr  # it got SIGCONT with its SIGTERM


def _children(pid: int) -> list[int]:
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += (task / "children").read_text().split()
    return [int(c) for c in children]


def _cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()
