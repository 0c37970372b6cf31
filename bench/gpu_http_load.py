"""Drives a running textgen over HTTP: streamed requests with per-token timestamps."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

import httpx


@dataclass
class StreamResult:
    sent: float
    token_times: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.sent

    @property
    def tpot(self) -> float | None:
        n = len(self.token_times)
        return (self.token_times[-1] - self.token_times[0]) / (n - 1) if n > 1 else None

    @property
    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]


async def sse_data(response: httpx.Response):
    """The `data:` payloads of an SSE response. Lines end at LF (CRLF) only, as the SSE
    spec says: httpx's aiter_lines also splits at U+2028, U+0085 and the like, which JSON
    leaves unescaped inside strings, and a generated token holding one cut its event."""
    pending = b""
    async for chunk in response.aiter_bytes():
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            if line.startswith(b"data:"):
                yield line[5:].rstrip(b"\r").decode()
    if pending.startswith(b"data:"):
        yield pending[5:].rstrip(b"\r").decode()


async def stream_one(client: httpx.AsyncClient, url: str, prompt: str, max_new_tokens: int) -> StreamResult:
    body = {"inputs": prompt, "parameters": {"max_new_tokens": max_new_tokens, "do_sample": False}}
    result = StreamResult(sent=time.perf_counter())
    try:
        async with client.stream("POST", f"{url}/generate_stream", json=body) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread())[:300]!r}"
                return result
            async for data in sse_data(response):
                event = json.loads(data)
                if "error" in event:
                    result.error = str(event["error"])
                    break
                result.token_times.append(time.perf_counter())
    except httpx.HTTPError as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    return result


async def run_streams(url: str, requests: list[tuple[str, int]]) -> tuple[list[StreamResult], float]:
    """Sends every (prompt, max_new_tokens) at once; returns results and the wall time."""
    limits = httpx.Limits(max_connections=len(requests) + 8, max_keepalive_connections=len(requests) + 8)
    async with httpx.AsyncClient(timeout=httpx.Timeout(1800.0), limits=limits) as client:
        start = time.perf_counter()
        results = await asyncio.gather(*(stream_one(client, url, p, n) for p, n in requests))
        return list(results), time.perf_counter() - start


def streams(url: str, requests: list[tuple[str, int]], processes: int = 1) -> tuple[list[StreamResult], float]:
    """Sends every request at once; returns results (in request order) and the wall time.

    With `processes` > 1 the requests are dealt round-robin to that many client processes that
    start together: one Python event loop reading hundreds of streams saturates its core (7 s
    of client CPU in a 10 s run), and then the client, not the server, sets the pace."""
    if processes <= 1:
        return asyncio.run(run_streams(url, requests))
    parts = [requests[i::processes] for i in range(processes)]
    with client_pool(processes) as pool:
        start_at = time.perf_counter() + CLIENT_START_S  # CLOCK_MONOTONIC: one clock for every process
        done = list(pool.map(_client_part, [(url, part, start_at) for part in parts]))
    results: list[StreamResult] = [None] * len(requests)  # type: ignore[list-item]
    for i, (part, _) in enumerate(done):
        results[i::processes] = part
    return results, max(end for _, end in done) - start_at


# From the moment every client process is up (`client_pool`) to the common start: for each to
# open its event loop.
CLIENT_START_S = 0.5
CLIENT_READY_TIMEOUT_S = 300.0
_ready_barrier = None  # a client process's copy of its pool's barrier (`_hold`)


@contextmanager
def client_pool(processes: int) -> Iterator[ProcessPoolExecutor]:
    """A pool of `processes` spawned client processes, every one of them started. A spawned
    process imports the parent's main module (some benchmarks import torch: seconds on a busy
    host), so a start fixed before they are all up would send requests late and count the
    client's own start in their TTFT and the wall time."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(processes)
    with ProcessPoolExecutor(processes, mp_context=context, initializer=_hold, initargs=(barrier,)) as pool:
        list(pool.map(_wait_for_every_client, range(processes)))
        yield pool


def _hold(barrier) -> None:
    global _ready_barrier
    _ready_barrier = barrier


def _wait_for_every_client(_: int) -> None:
    """Holds a process until all have started: each then holds one task, so all were spawned."""
    _ready_barrier.wait(CLIENT_READY_TIMEOUT_S)


STREAMS_PER_CLIENT = 16  # one Python event loop keeps up with about this many busy streams
MAX_CLIENTS = 8


def clients_for(count: int) -> int:
    """Client processes for `count` concurrent streams, so that the client never sets the pace."""
    return max(1, min(MAX_CLIENTS, count // STREAMS_PER_CLIENT))


def _client_part(job) -> tuple[list[StreamResult], float]:
    url, requests, start_at = job
    time.sleep(max(0.0, start_at - time.perf_counter()))
    results, _ = asyncio.run(run_streams(url, requests))
    return results, time.perf_counter()


def timeline(results: list[StreamResult], wall: float) -> dict:
    """Where a run's wall time sits on the clients' clock, from the first request sent: how
    far the sends spread, the first and last token, and the wall time outside first send to
    last token (the client processes' start lag after their common start, plus their tail)."""
    sent = [r.sent for r in results]
    firsts = [r.token_times[0] for r in results if r.token_times]
    lasts = [r.token_times[-1] for r in results if r.token_times]
    if not firsts:
        return {"sends_spread_s": max(sent) - min(sent) if sent else 0.0, "wall_s": wall}
    start = min(sent)
    last = max(lasts) - start
    return {"sends_spread_s": max(sent) - start, "first_token_s": min(firsts) - start, "last_token_s": last,
            "wall_s": wall, "outside_tokens_s": wall - last}  # fmt: skip


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]
