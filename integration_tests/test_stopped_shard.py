"""A shard stopped with SIGSTOP mid-stream (issue 27, defect 5), against the real stack.

What must happen: the stream gets an error event (not a bare EOF) within a few seconds,
not after the 60 s step timeout; /health answers 503 at once; a new request fails fast;
the launcher notices within seconds, naming the stopped shard, and exits 1; the router
exits on the launcher's SIGTERM without being killed.
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import httpx

from server import Server


def shard_pid(launcher_pid: int) -> int:
    children = []
    for task in Path(f"/proc/{launcher_pid}/task").iterdir():
        children += (task / "children").read_text().split()
    for pid in map(int, children):
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if b"serve" in argv and b"--rank" in argv:
            return pid
    raise AssertionError(f"no shard under launcher {launcher_pid}")


def test_a_stopped_shard_fails_streams_turns_health_503_and_stops_the_launcher():
    srv = Server()
    victim = shard_pid(srv.process.pid)
    stopped_at: list[float] = []
    health: dict = {}

    def probe_health() -> None:  # while the stream waits on the stopped shard
        time.sleep(1.0)
        started = time.monotonic()
        try:
            health["status"] = httpx.get(srv.url + "/health", timeout=30).status_code
        except httpx.HTTPError as exc:
            health["status"] = repr(exc)
        health["took"] = time.monotonic() - started

    try:
        body = {"inputs": "1, 2, 3, 4, 5,", "parameters": {"max_new_tokens": 400}}
        error, seen = None, 0
        prober = threading.Thread(target=probe_health)
        with httpx.stream("POST", srv.url + "/generate_stream", json=body, timeout=120) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                if not line.startswith("data:"):
                    continue
                event = json.loads(line[len("data:"):])
                if "error" in event:
                    error = event
                    break
                seen += 1
                if seen == 3:
                    os.kill(victim, signal.SIGSTOP)
                    stopped_at.append(time.monotonic())
                    prober.start()
        failed_after = time.monotonic() - stopped_at[0]
        print(f"stream error {failed_after:.2f} s after the stop: {error}")
        assert error is not None, f"bare EOF after {seen} tokens, no error event"
        assert "stopped" in error["error"], error
        assert error["error_type"] == "generation"
        assert failed_after < 10, f"the stream failed {failed_after:.1f} s after the stop"

        # Known unusable now: a new request fails at once instead of hanging.
        started = time.monotonic()
        late = httpx.post(srv.url + "/generate", json={"inputs": "Hi", "parameters": {"max_new_tokens": 2}},
                          timeout=30)
        print(f"late request: {late.status_code} {late.text} in {time.monotonic() - started:.2f} s")
        assert late.status_code >= 400
        assert time.monotonic() - started < 2

        prober.join(30)
        assert health.get("status") == 503, health
        assert health["took"] < 3, health

        srv.process.wait(40)
        exited_after = time.monotonic() - stopped_at[0]
        print(f"/health {health}; launcher exited {exited_after:.1f} s after the stop")
        assert srv.process.returncode == 1
        log = srv.log()
        assert "shard 0 has not answered Health: it is stopped" in log
        assert "router still running" not in log, "the router ignored SIGTERM"
        assert exited_after < 25, f"the launcher exited {exited_after:.1f} s after the stop"
    except BaseException:
        print(srv.log())
        raise
    finally:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(victim, sig)
            except ProcessLookupError:
                pass
        srv.stop()
