"""A soak of the CPU stack (issue 27): an hour of mixed traffic at about 80 % of its measured
capacity, then the figures the issue bars.

The stack is the one a user starts (launcher, router, shard, demo model, shipped defaults).
Capacity is measured first: a closed loop of CALIBRATE_CONCURRENCY clients sending the same mix
for CALIBRATE_S seconds; the soak then sends Poisson arrivals at LOAD_SHARE of the requests per
second it completed. The mix (seeded): non-streamed /generate with and without stop
sequences, streamed /generate_stream, streamed chat, /v1/completions with n=2, and prompts that
share one of a few long prefixes; a tenth of the streamed requests are cancelled after a few
events. Every SAMPLE_S seconds it records router and shard RSS, the KV gauges, requests in
flight and the prefix cache's counters.

Reported against the bars: requests lost (neither answered in full nor cancelled on purpose)
and 5xx answers; RSS growth of router and shard from the end of warm-up (WARMUP_S) to the end;
the KV gauges once the last request is done; p99 end-to-end latency of the first and the last
DRIFT_WINDOW_S, with the prefix cache's hit rate and evictions in each. Writes OUT.json and
OUT.png (RSS, KV and latency over time).

    PYTHONPATH=. .venv/bin/python bench/soak.py --out bench/results/soak_cpu         # an hour
    PYTHONPATH=. .venv/bin/python bench/soak.py --out /tmp/soak --duration 120 --quick  # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.soak_stack import StackProbe, start_stack

CALIBRATE_CONCURRENCY = 8
CALIBRATE_S = 60.0
LOAD_SHARE = 0.8
SAMPLE_S = 15.0
WARMUP_S = 600.0
DRIFT_WINDOW_S = 600.0
CANCEL_SHARE = 0.1
WORDS = ("river stone light market window garden music letter engine winter paper orange "
         "silver doctor animal travel summer bridge forest number island coffee planet").split()


@dataclass
class Outcome:
    kind: str
    started: float  # seconds since the soak began
    seconds: float
    result: str  # "ok", "cancelled", or "http <status>" / the exception's name / "error event" ...
    detail: str = ""  # a stream's offending event, for a lost request


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def make_request(rng: random.Random, prefixes: list[str]) -> tuple[str, str, dict, bool]:
    """(kind, path, body, streamed) of one request of the mix."""
    new = rng.randint(8, 32)
    pick = rng.random()
    if pick < 0.2:
        return "generate", "/generate", {"inputs": _text(rng, 20), "parameters": {"max_new_tokens": new}}, False
    if pick < 0.35:
        stop = [rng.choice(WORDS), "\n\n"]
        sampling = {"max_new_tokens": new, "stop": stop, "do_sample": True, "seed": rng.randrange(1 << 30)}
        body = {"inputs": _text(rng, 20), "parameters": sampling}
        return "generate_stop", "/generate", body, False
    if pick < 0.55:
        return "generate_stream", "/generate_stream", {"inputs": _text(rng, 30), "parameters": {"max_new_tokens": new}}, True
    if pick < 0.7:
        body = {"messages": [{"role": "user", "content": _text(rng, 15)}], "max_tokens": new, "stream": True}
        return "chat_stream", "/v1/chat/completions", body, True
    if pick < 0.8:
        body = {"model": "tgi", "prompt": _text(rng, 20), "max_tokens": new, "n": 2, "temperature": 0.8}
        return "completions_n2", "/v1/completions", body, False
    body = {"inputs": rng.choice(prefixes) + " " + _text(rng, 8), "parameters": {"max_new_tokens": new}}
    return "shared_prefix", "/generate", body, False


async def send(client: httpx.AsyncClient, rng: random.Random, prefixes: list[str], began: float) -> Outcome:
    kind, path, body, streamed = make_request(rng, prefixes)
    cancel_after = rng.randint(1, 4) if streamed and rng.random() < CANCEL_SHARE else None
    started = time.perf_counter()
    detail = ""
    try:
        if not streamed:
            answer = await client.post(path, json=body)
            result = "ok" if answer.status_code == 200 else f"http {answer.status_code}"
        else:
            result, detail = await _stream(client, path, body, cancel_after)
    except Exception as exc:  # anything but a full answer is a lost request, counted by kind
        result = type(exc).__name__
    return Outcome(kind, started - began, time.perf_counter() - started, result, detail)


def stream_event(payload: str) -> str:
    """What one SSE `data:` payload is: "done" ([DONE], an OpenAI chunk naming a finish_reason,
    TGI's last event with its generated text or details), "error" (an object with an `error`
    key, as both APIs send one), "malformed" (not a JSON object), or "token". Parsed, not
    searched: a chunk whose text is the word "error" is a token."""
    if payload == "[DONE]":
        return "done"
    try:
        event = json.loads(payload)
    except ValueError:
        return "malformed"
    if not isinstance(event, dict):
        return "malformed"
    if "error" in event:
        return "error"
    if isinstance(event.get("details"), dict) or event.get("generated_text") is not None:
        return "done"
    choices = event.get("choices") or []
    if any(isinstance(choice, dict) and choice.get("finish_reason") for choice in choices):
        return "done"
    return "token"


async def _stream(client: httpx.AsyncClient, path: str, body: dict, cancel_after: int | None) -> tuple[str, str]:
    """(result, the offending event or ""): "ok" once the stream finished, else what went wrong."""
    async with client.stream("POST", path, json=body) as answer:
        if answer.status_code != 200:
            return f"http {answer.status_code}", ""
        events, finished = 0, False
        async for line in answer.aiter_lines():
            if not line.startswith("data:"):
                continue
            events += 1
            if cancel_after is not None and events >= cancel_after:
                return "cancelled", ""  # leaving the block closes the connection mid-stream
            payload = line[5:].strip()
            what = stream_event(payload)
            finished = finished or what == "done"
            if what in ("error", "malformed") and not finished:
                return f"{what} event", payload[:500]
        return ("ok", "") if finished else ("stream ended early", "")


async def closed_loop(url: str, seconds: float, concurrency: int, prefixes: list[str], seed: int) -> float:
    """Requests per second completed by `concurrency` clients sending back to back."""
    done = 0
    deadline = time.perf_counter() + seconds

    async def client_loop(index: int) -> None:
        nonlocal done
        rng = random.Random(seed + index)
        async with httpx.AsyncClient(base_url=url, timeout=300) as client:
            while time.perf_counter() < deadline:
                if (await send(client, rng, prefixes, 0.0)).result in ("ok", "cancelled"):
                    done += 1

    started = time.perf_counter()
    await asyncio.gather(*(client_loop(i) for i in range(concurrency)))
    return done / (time.perf_counter() - started)


async def open_loop(url: str, rate: float, seconds: float, prefixes: list[str], seed: int, probe: StackProbe) -> tuple[list[Outcome], list[dict]]:
    rng = random.Random(seed)
    outcomes: list[Outcome] = []
    samples: list[dict] = []
    began = time.perf_counter()
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        async def sampler() -> None:
            while True:
                samples.append({"t": time.perf_counter() - began, **probe.sample()})
                await asyncio.sleep(SAMPLE_S)

        sampling = asyncio.create_task(sampler())
        pending: set[asyncio.Task] = set()
        due = 0.0
        while due < seconds:
            due += rng.expovariate(rate)
            await asyncio.sleep(max(0.0, began + due - time.perf_counter()))
            task = asyncio.create_task(send(client, random.Random(rng.randrange(1 << 62)), prefixes, began))
            pending.add(task)
            task.add_done_callback(lambda t: (pending.discard(t), outcomes.append(t.result())))
        while pending:
            await asyncio.sleep(0.5)
        sampling.cancel()
    samples.append({"t": time.perf_counter() - began, **probe.sample()})
    return outcomes, samples


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(outcomes: list[Outcome], samples: list[dict], idle: dict, seconds: float, warmup: float, window: float) -> dict:
    lost = [o for o in outcomes if o.result not in ("ok", "cancelled")]
    served = [o for o in outcomes if o.result == "ok"]
    first = [o.seconds for o in served if o.started < window]
    last = [o.seconds for o in served if o.started >= seconds - window]
    p99_first, p99_last = percentile(first, 0.99), percentile(last, 0.99)
    after_warmup = [s for s in samples if s["t"] >= warmup] or samples
    growth = {name: (after_warmup[-1][name] - after_warmup[0][name]) / after_warmup[0][name]
              for name in ("router_rss_mib", "shard_rss_mib")}  # fmt: skip
    minutes: dict[int, list[float]] = {}
    for o in served:
        minutes.setdefault(int(o.started // 60), []).append(o.seconds)
    kinds: dict[str, dict[str, int]] = {}
    for o in outcomes:
        kinds.setdefault(o.kind, {}).setdefault(o.result, 0)
        kinds[o.kind][o.result] += 1
    return {
        "requests": len(outcomes), "served": len(served),
        "cancelled": sum(o.result == "cancelled" for o in outcomes),
        "lost": len(lost), "http_5xx": sum(o.result.startswith("http 5") for o in outcomes),
        "lost_examples": [o.__dict__ for o in lost[:10]], "by_kind": kinds,
        "rss_growth_after_warmup": growth, "idle_at_end": idle,
        "p99_e2e_s": {"first_window": p99_first, "last_window": p99_last,
                      "drift": (p99_last / p99_first - 1) if p99_first and p99_last else None},
        "per_minute": [{"minute": m, "requests": len(v), "p50_s": percentile(v, 0.5), "p99_s": percentile(v, 0.99)}
                       for m, v in sorted(minutes.items())],
    }  # fmt: skip


def rss_window_growth(samples: list[dict], warmup: float, window: float, seconds: float) -> dict:
    """Mean RSS of the last `window` against the mean of the `window` after warm-up: one sample
    swings by several percent as the allocator takes and returns memory (a router sampled every
    15 s over an hour ranged 83.7-95.2 MiB)."""
    first = [s for s in samples if warmup <= s["t"] < warmup + window]
    last = [s for s in samples if s["t"] >= seconds - window]
    growth = {}
    for name in ("router_rss_mib", "shard_rss_mib"):
        if first and last:
            before = sum(s[name] for s in first) / len(first)
            growth[name] = sum(s[name] for s in last) / len(last) / before - 1
    return growth


def prefix_cache_by_window(samples: list[dict], window: float, seconds: float) -> dict:
    """The prefix cache's hit rate (hit / looked-up prompt tokens) and blocks evicted in the
    first and the last `window`, from the counters' growth between the samples around each."""

    counted = [s for s in samples if "prefix_query_tokens" in s]  # runs before: none

    def between(start: float, end: float) -> dict | None:
        if not counted:
            return None
        before, after = [s for s in counted if s["t"] <= start], [s for s in counted if s["t"] >= end]
        first = before[-1] if before else counted[0]
        last = after[0] if after else counted[-1]
        if first is last:
            return None
        queried = last["prefix_query_tokens"] - first["prefix_query_tokens"]
        return {"hit_rate": (last["prefix_hit_tokens"] - first["prefix_hit_tokens"]) / queried if queried else None,
                "evicted_blocks": last["prefix_evicted_blocks"] - first["prefix_evicted_blocks"]}  # fmt: skip

    return {"first_window": between(0.0, window), "last_window": between(seconds - window, seconds)}


def plot(samples: list[dict], per_minute: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rss, kv, latency) = plt.subplots(3, 1, figsize=(9, 9), sharex=True)
    t = [s["t"] / 60 for s in samples]
    rss.plot(t, [s["router_rss_mib"] for s in samples], label="router")
    rss.plot(t, [s["shard_rss_mib"] for s in samples], label="shard")
    rss.set_ylabel("RSS, MiB")
    rss.legend()
    kv.plot(t, [s["kv_blocks_used"] for s in samples], label="KV blocks used")
    kv.plot(t, [s["prefix_cache_blocks"] for s in samples], label="prefix-cache-only blocks")
    kv.plot(t, [s["running"] for s in samples], label="running sequences")
    kv.legend()
    minutes = [m["minute"] + 0.5 for m in per_minute]
    latency.plot(minutes, [m["p50_s"] for m in per_minute], label="p50")
    latency.plot(minutes, [m["p99_s"] for m in per_minute], label="p99")
    latency.set_ylabel("end-to-end, s")
    latency.set_xlabel("minutes")
    latency.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="writes OUT.json and OUT.png")
    parser.add_argument("--duration", type=float, default=3600.0)
    parser.add_argument("--seed", type=int, default=27)
    parser.add_argument("--quick", action="store_true", help="short calibration, warm-up and windows (smoke run)")
    args = parser.parse_args()
    if importlib.util.find_spec("matplotlib") is None:  # known now, not after the hour
        parser.error("the soak draws its PNG with matplotlib: pip install '.[bench]' first")
    calibrate = 20.0 if args.quick else CALIBRATE_S
    warmup = min(WARMUP_S, args.duration / 6)
    window = min(DRIFT_WINDOW_S, args.duration / 6)
    rng = random.Random(args.seed)
    prefixes = [_text(rng, 150) for _ in range(4)]
    stack = start_stack()
    try:
        asyncio.run(closed_loop(stack.url, 5.0, 2, prefixes, args.seed + 1000))  # first-use costs out of the way
        capacity = asyncio.run(closed_loop(stack.url, calibrate, CALIBRATE_CONCURRENCY, prefixes, args.seed))
        rate = LOAD_SHARE * capacity
        print(f"capacity {capacity:.2f} req/s; soaking at {rate:.2f} req/s for {args.duration:.0f} s", flush=True)
        outcomes, samples = asyncio.run(open_loop(stack.url, rate, args.duration, prefixes, args.seed, stack.probe))
        idle = stack.probe.wait_idle(60.0)
        alive = stack.alive()
    finally:
        stack.stop()
    result = {"duration_s": args.duration, "seed": args.seed, "capacity_req_s": capacity, "rate_req_s": rate,
              "calibration": {"concurrency": CALIBRATE_CONCURRENCY, "seconds": calibrate},
              "warmup_s": warmup, "drift_window_s": window, "stack_alive_at_end": alive,
              **report(outcomes, samples, idle, args.duration, warmup, window),
              "rss_window_growth": rss_window_growth(samples, warmup, window / 2, args.duration),
              "prefix_cache": prefix_cache_by_window(samples, window, args.duration),
              "samples": samples}  # fmt: skip
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    plot(samples, result["per_minute"], args.out.with_suffix(".png"))
    keys = ("requests", "served", "cancelled", "lost", "http_5xx", "rss_growth_after_warmup", "rss_window_growth",
            "idle_at_end", "p99_e2e_s", "prefix_cache")
    print(json.dumps({k: result[k] for k in keys}, indent=1))


if __name__ == "__main__":
    main()
