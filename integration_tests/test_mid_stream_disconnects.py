"""1,000 streamed requests, each closed by its client right after the first event, in
parallel batches (issue 27): afterwards no KV block, running or waiting sequence is left,
the router's memory has not grown past a stated bound, and the server still answers."""
from __future__ import annotations

import asyncio
import time

import httpx
import psutil
import pytest

from server import Server, metric, scrape_metrics

DISCONNECTS = 1000
PARALLEL = 64  # streams open at once; under --max-concurrent-requests below
WARMUP = 2 * PARALLEL  # two full waves before the memory baseline: the allocator has grown to its peak
# Router RSS growth allowed over the 1,000 (after warm-up): 16 KiB a stream. A leak of the
# stream's state (its channel, detokenizer, event buffers) is larger than that.
RSS_GROWTH_BOUND = 16 * 1024 * 1024
LONG = 1000  # tokens asked for: a stream not cancelled would hold its blocks for minutes

STREAMS = [
    ("/generate_stream", {"inputs": "Count to one thousand:", "parameters": {"max_new_tokens": LONG}}),
    ("/", {"inputs": "Count to one thousand:", "stream": True, "parameters": {"max_new_tokens": LONG}}),
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "Count to a thousand."}],
                              "max_tokens": LONG, "stream": True}),
    ("/v1/completions", {"model": "m", "prompt": "Count to one thousand:", "max_tokens": LONG, "stream": True}),
]


@pytest.fixture(scope="module")
def busy_server():
    srv = Server("--max-concurrent-requests", str(PARALLEL * 2))
    yield srv
    srv.stop()


def router_process(server: Server) -> psutil.Process:
    routers = [p for p in psutil.Process(server.process.pid).children(recursive=True) if p.name() == "textgen-router"]
    assert len(routers) == 1, routers
    return routers[0]


async def open_and_drop(client: httpx.AsyncClient, url: str, index: int) -> str:
    """One stream, closed as soon as its first event arrives; returns that event."""
    path, body = STREAMS[index % len(STREAMS)]
    async with client.stream("POST", url + path, json=body) as response:
        assert response.status_code == 200, (path, response.status_code, await response.aread())
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                return line  # leaving the block closes the connection mid-stream
    raise AssertionError(f"{path}: the stream ended before its first event")


async def disconnect_many(url: str, count: int) -> list[str]:
    gate = asyncio.Semaphore(PARALLEL)
    # No keep-alive: closing the response must close the connection, as a client that goes
    # away does.
    limits = httpx.Limits(max_connections=PARALLEL, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        async def one(i: int) -> str:
            async with gate:
                return await open_and_drop(client, url, i)
        return await asyncio.gather(*(one(i) for i in range(count)))


def gauges(url: str) -> dict[str, float]:
    samples = scrape_metrics(url)
    return {name: metric(samples, name)
            for name in ("textgen_kv_blocks_used", "textgen_running_requests", "textgen_waiting_requests")}


def wait_idle(url: str, within: float = 60.0) -> dict[str, float]:
    deadline = time.monotonic() + within
    while any((now := gauges(url)).values()) and time.monotonic() < deadline:
        time.sleep(0.25)
    return now


def test_a_thousand_mid_stream_disconnects_leave_kv_idle_and_memory_flat(busy_server):
    url = busy_server.url
    router = router_process(busy_server)
    asyncio.run(disconnect_many(url, WARMUP))
    assert not any(wait_idle(url).values())
    before = router.memory_info().rss

    started = time.monotonic()
    first_events = asyncio.run(disconnect_many(url, DISCONNECTS))
    elapsed = time.monotonic() - started
    assert len(first_events) == DISCONNECTS
    assert not any('"error"' in event for event in first_events), [e for e in first_events if '"error"' in e][:3]

    left = wait_idle(url)
    assert not any(left.values()), f"after {DISCONNECTS} disconnects: {left}"
    growth = router.memory_info().rss - before
    assert growth <= RSS_GROWTH_BOUND, f"router RSS grew {growth / 2**20:.1f} MiB over {DISCONNECTS} disconnects"
    # Still serving, and the disconnects took no more than they should (on 2 shared cores).
    answer = httpx.post(url + "/generate", json={"inputs": "Hello", "parameters": {"max_new_tokens": 2}}, timeout=120)
    assert answer.status_code == 200, answer.text
    assert httpx.get(url + "/health", timeout=30).status_code == 200
    print(f"{DISCONNECTS} disconnects in {elapsed:.0f} s; router RSS {before / 2**20:.0f} MiB "
          f"{'+' if growth >= 0 else ''}{growth / 2**20:.1f} MiB")
