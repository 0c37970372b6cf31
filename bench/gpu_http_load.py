"""Drives a running textgen over HTTP: streamed requests with per-token timestamps."""

from __future__ import annotations

import asyncio
import json
import time
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


async def stream_one(client: httpx.AsyncClient, url: str, prompt: str, max_new_tokens: int) -> StreamResult:
    body = {"inputs": prompt, "parameters": {"max_new_tokens": max_new_tokens, "do_sample": False}}
    result = StreamResult(sent=time.perf_counter())
    try:
        async with client.stream("POST", f"{url}/generate_stream", json=body) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread())[:300]!r}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                event = json.loads(line[5:])
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


def streams(url: str, requests: list[tuple[str, int]]) -> tuple[list[StreamResult], float]:
    return asyncio.run(run_streams(url, requests))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]
