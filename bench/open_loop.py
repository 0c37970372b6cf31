"""Open-loop load: requests leave at scheduled times, whether or not earlier ones finished.

A closed loop (send the next request when one returns) slows its own arrivals down when the
server is slow, which hides queueing from the latency it measures. Here the schedule is
fixed before the run, and each request's latency counts from its scheduled time, so a late
send (a busy client) shows up as latency rather than silently thinning the load.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

import httpx

from bench.gpu_http_load import StreamResult, stream_one


def arrival_times(count: int, rate_per_s: float, poisson: bool = False, seed: int = 0) -> list[float]:
    """Seconds after the start at which each of `count` requests leaves.

    Evenly spaced at 1/rate by default; with `poisson`, exponential gaps of the same mean
    (seeded, so two runs send the same schedule). The first request leaves at 0."""
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    if not rate_per_s > 0:
        raise ValueError(f"rate must be positive, got {rate_per_s}")
    if not poisson:
        return [i / rate_per_s for i in range(count)]
    rng = random.Random(seed)
    times, t = [], 0.0
    for _ in range(count):
        times.append(t)
        t += rng.expovariate(rate_per_s)
    return times


@dataclass
class ScheduledResult:
    scheduled: float  # seconds after the start
    lateness: float  # how much later than scheduled the request actually left
    stream: StreamResult

    @property
    def ttft(self) -> float:
        """From the scheduled send time to the first token."""
        return self.stream.ttft + self.lateness


async def run_open_loop(url: str, requests: list[tuple[str, int]], schedule: list[float]) -> list[ScheduledResult]:
    if len(requests) != len(schedule):
        raise ValueError(f"{len(requests)} requests but {len(schedule)} send times")
    limits = httpx.Limits(max_connections=len(requests) + 8, max_keepalive_connections=len(requests) + 8)
    async with httpx.AsyncClient(timeout=httpx.Timeout(1800.0), limits=limits) as client:
        start = time.perf_counter()

        async def send(request: tuple[str, int], at: float) -> ScheduledResult:
            await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
            lateness = time.perf_counter() - (start + at)
            return ScheduledResult(at, lateness, await stream_one(client, url, *request))

        return list(await asyncio.gather(*(send(r, t) for r, t in zip(requests, schedule))))


def open_loop(url: str, requests: list[tuple[str, int]], schedule: list[float]) -> list[ScheduledResult]:
    return asyncio.run(run_open_loop(url, requests, schedule))
