"""The stack a soak runs against, and what it samples from it: the processes' RSS (from /proc)
and the KV gauges (from /metrics)."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integration_tests"))

from server import Server, metric, scrape_metrics  # noqa: E402


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:  # the field after the state is the parent's pid
            found.append(int(stat.parent.name))
    return found


def _descendants(pid: int) -> list[int]:
    todo, seen = [pid], []
    while todo:
        for child in _children(todo.pop()):
            seen.append(child)
            todo.append(child)
    return seen


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class StackProbe:
    url: str
    router_pid: int
    shard_pid: int

    def sample(self) -> dict:
        gauges = scrape_metrics(self.url)
        return {"router_rss_mib": _rss_mib(self.router_pid), "shard_rss_mib": _rss_mib(self.shard_pid),
                "kv_blocks_used": metric(gauges, "textgen_kv_blocks_used"),
                "prefix_cache_blocks": metric(gauges, "textgen_prefix_cache_blocks"),
                "running": metric(gauges, "textgen_running_requests")}  # fmt: skip

    def wait_idle(self, timeout_s: float) -> dict:
        """The gauges once no sequence holds a block (or at the timeout), with the wait."""
        started = time.perf_counter()
        while True:
            now = self.sample()
            if (now["kv_blocks_used"] == 0 and now["running"] == 0) or time.perf_counter() - started > timeout_s:
                return {**now, "waited_s": round(time.perf_counter() - started, 1)}
            time.sleep(1.0)


@dataclass
class Stack:
    server: Server
    probe: StackProbe

    @property
    def url(self) -> str:
        return self.server.url

    def alive(self) -> bool:
        return self.server.process.poll() is None

    def stop(self) -> None:
        self.server.stop()


def start_stack(*flags: str) -> Stack:
    server = Server(*flags)
    processes = {pid: _cmdline(pid) for pid in _descendants(server.process.pid)}
    router = next(pid for pid, cmd in processes.items() if "textgen-router" in cmd)
    shard = next(pid for pid, cmd in processes.items() if "shard_server" in cmd or "textgen-shard" in cmd)
    return Stack(server, StackProbe(server.url, router, shard))
