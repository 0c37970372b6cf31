"""One load generator for any OpenAI-compatible engine: `/v1/completions` with token-id
prompts, streamed with `stream_options.include_usage`, so textgen and a peer get byte-for-byte
the same work and are timed by the same client.

A workload is a list of `Request`s, each with the second (after the common start) at which it
leaves: all at 0 for a burst, a seeded Poisson schedule for arrivals. Requests are dealt
round-robin to several client processes (one event loop cannot read hundreds of streams and
keep pace), each holding at most its share of `max_in_flight` open at once: an engine that
answers 429 above an admission limit (textgen's --max-concurrent-requests) has its excess wait
in the client, as a retrying client would, and the wait counts in its TTFT.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field

import httpx

from bench.gpu_http_load import CLIENT_START_S, client_pool, percentile, sse_data


@dataclass(frozen=True)
class Request:
    prompt: list[int]
    max_tokens: int
    at: float = 0.0  # seconds after the start


@dataclass
class Outcome:
    scheduled: float  # the clock (perf_counter) time it was due to leave
    chunk_times: list[float] = field(default_factory=list)  # chunks that carried a choice
    completion_tokens: int = 0
    error: str | None = None

    @property
    def ttft(self) -> float:
        return self.chunk_times[0] - self.scheduled

    @property
    def e2e(self) -> float:
        return self.chunk_times[-1] - self.scheduled

    @property
    def tpot(self) -> float | None:
        """Seconds per token after the first, from the usage count (a chunk may carry several)."""
        if self.completion_tokens < 2 or len(self.chunk_times) < 2:
            return None
        return (self.chunk_times[-1] - self.chunk_times[0]) / (self.completion_tokens - 1)


def body(request: Request) -> dict:
    """Greedy, no `ignore_eos` (textgen refuses it): the random model's EOS row is zero, so
    neither engine stops before max_tokens, and `summary` counts the tokens each produced."""
    return {"model": "m", "prompt": request.prompt, "max_tokens": request.max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip


async def _send(client: httpx.AsyncClient, url: str, request: Request, due: float, gate: asyncio.Semaphore) -> Outcome:
    await asyncio.sleep(max(0.0, due - time.perf_counter()))
    outcome = Outcome(scheduled=due)
    async with gate:
        try:
            async with client.stream("POST", f"{url}/v1/completions", json=body(request)) as response:
                if response.status_code != 200:
                    outcome.error = f"HTTP {response.status_code}: {(await response.aread())[:300]!r}"
                    return outcome
                async for data in sse_data(response):
                    if data.strip() == "[DONE]":
                        break
                    event = json.loads(data)
                    if "error" in event:
                        outcome.error = str(event["error"])[:300]
                        break
                    if event.get("choices"):
                        outcome.chunk_times.append(time.perf_counter())
                    if event.get("usage"):
                        outcome.completion_tokens = event["usage"]["completion_tokens"]
        except httpx.HTTPError as exc:
            outcome.error = f"{type(exc).__name__}: {exc}"
    if outcome.error is None and not outcome.chunk_times:
        outcome.error = "no tokens"
    return outcome


async def _run_part(url: str, requests: list[Request], start: float, in_flight: int) -> list[Outcome]:
    limits = httpx.Limits(max_connections=in_flight + 8, max_keepalive_connections=in_flight + 8)
    gate = asyncio.Semaphore(in_flight)
    async with httpx.AsyncClient(timeout=httpx.Timeout(1800.0), limits=limits) as client:
        await _warm(client, url)
        return list(await asyncio.gather(*(_send(client, url, r, start + r.at, gate) for r in requests)))


async def _warm(client: httpx.AsyncClient, url: str) -> None:
    """One request before the clock starts: a fresh client process's first request pays httpx's
    and anyio's first use (about 20 ms on a 2-core host, measured against an instant server),
    which would count in the TTFT of a lone request (batch 1, the long prompt) on both engines.
    It also leaves a kept-alive connection for the first request, as a long-lived client has."""
    try:
        await client.get(f"{url}/health", timeout=10.0)
    except httpx.HTTPError:
        pass  # the measured requests will report what is wrong


def _part(job) -> list[Outcome]:
    url, requests, start, in_flight = job
    return asyncio.run(_run_part(url, requests, start, in_flight))


def run(url: str, requests: list[Request], processes: int, max_in_flight: int) -> tuple[list[Outcome], float]:
    """Outcomes in request order, and the wall time from the common start to the last token."""
    processes = max(1, min(processes, len(requests)))
    parts = [requests[i::processes] for i in range(processes)]
    share = max(1, max_in_flight // processes)
    with client_pool(processes) as pool:
        start = time.perf_counter() + CLIENT_START_S  # CLOCK_MONOTONIC: one clock for every process
        done = list(pool.map(_part, [(url, part, start, share) for part in parts]))
    outcomes: list[Outcome] = [None] * len(requests)  # type: ignore[list-item]
    for i, part in enumerate(done):
        outcomes[i::processes] = part
    last = max((o.chunk_times[-1] for o in outcomes if o.chunk_times), default=start)
    return outcomes, last - start


def summary(outcomes: list[Outcome], wall: float) -> dict:
    """Output tok/s over the wall time, and TTFT, TPOT, ITL and end-to-end at p50 / p99 (ms)."""
    ok = [o for o in outcomes if o.error is None]
    tokens = sum(o.completion_tokens for o in ok)
    gaps = [b - a for o in ok for a, b in zip(o.chunk_times, o.chunk_times[1:])]
    tpots = [t for o in ok if (t := o.tpot) is not None]

    def ms(values: list[float]) -> dict:
        return {"p50": 1000 * percentile(values, 0.5), "p99": 1000 * percentile(values, 0.99)} if values else {}

    errors = [o.error for o in outcomes if o.error is not None]
    return {"requests": len(outcomes), "errors": len(errors), "first_errors": errors[:3], "output_tokens": tokens,
            "wall_s": wall, "output_tok_s": tokens / wall if wall > 0 else 0.0,
            "ttft_ms": ms([o.ttft for o in ok]), "tpot_ms": ms(tpots), "itl_ms": ms(gaps),
            "e2e_ms": ms([o.e2e for o in ok])}  # fmt: skip


# -- workloads --------------------------------------------------------------------------------------
def random_ids(rng: random.Random, count: int, vocab: int) -> list[int]:
    """Ids of ordinary tokens (the first 256 hold the specials of most vocabularies)."""
    return [rng.randrange(256, vocab) for _ in range(count)]


def lognormal(rng: random.Random, median: float, sigma: float, low: int, high: int) -> int:
    return max(low, min(high, round(rng.lognormvariate(0.0, sigma) * median)))


def sharegpt_like(count: int, vocab: int, seed: int, schedule: list[float] | None = None) -> list[Request]:
    """Lognormal prompt and answer lengths of ShareGPT's shape (prompt median ~180 tokens,
    answer median ~150, long tails), clipped to [8, 2048] and [8, 1024]."""
    rng = random.Random(seed)
    at = schedule or [0.0] * count
    return [Request(random_ids(rng, lognormal(rng, 180, 1.0, 8, 2048), vocab),
                    lognormal(rng, 150, 0.8, 8, 1024), at[i]) for i in range(count)]  # fmt: skip


def poisson_schedule(rate_per_s: float, duration_s: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    times, t = [], 0.0
    while t < duration_s:
        times.append(t)
        t += rng.expovariate(rate_per_s)
    return times


def shared_prefix(count: int, prefix: int, suffix: int, max_tokens: int, vocab: int, seed: int) -> list[Request]:
    rng = random.Random(seed)
    common = random_ids(rng, prefix, vocab)
    return [Request(common + random_ids(rng, suffix, vocab), max_tokens) for _ in range(count)]


def fixed(shapes: list[tuple[int, int]], vocab: int, seed: int) -> list[Request]:
    """Requests of exact (prompt, answer) lengths, all at once, in a seeded shuffled order."""
    rng = random.Random(seed)
    shapes = list(shapes)
    rng.shuffle(shapes)
    return [Request(random_ids(rng, n, vocab), m) for n, m in shapes]
