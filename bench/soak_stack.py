"""The stack a soak runs against, and what it samples from it: the processes' RSS, the KV
gauges and the prefix cache's counters (from /metrics)."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integration_tests"))

from server import Server, metric, scrape_metrics  # noqa: E402


def _rss_mib(process: psutil.Process) -> float:
    return process.memory_info().rss / (1 << 20)


@dataclass
class StackProbe:
    url: str
    router: psutil.Process
    shard: psutil.Process

    def sample(self) -> dict:
        gauges = scrape_metrics(self.url)
        return {"router_rss_mib": _rss_mib(self.router), "shard_rss_mib": _rss_mib(self.shard),
                "kv_blocks_used": metric(gauges, "textgen_kv_blocks_used"),
                "prefix_cache_blocks": metric(gauges, "textgen_prefix_cache_blocks"),
                "running": metric(gauges, "textgen_running_requests"),
                # counters, for the prefix cache's hit rate and evictions per window
                "prefix_query_tokens": metric(gauges, "textgen_prefix_cache_queries_tokens_total"),
                "prefix_hit_tokens": metric(gauges, "textgen_prefix_cache_hits_tokens_total"),
                "prefix_evicted_blocks": metric(gauges, "textgen_prefix_cache_evicted_blocks_total")}  # fmt: skip

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
    children = psutil.Process(server.process.pid).children(recursive=True)
    router = next(p for p in children if p.name() == "textgen-router")
    shard = next(p for p in children if any(arg.endswith(("textgen-shard", "shard_server")) for arg in p.cmdline()))
    return Stack(server, StackProbe(server.url, router, shard))
