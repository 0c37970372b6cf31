"""Does the router's memory grow with the requests it serves? (issue 27's soak found +3.4 %.)

Starts the stack a user starts (demo model, shipped defaults) and sends requests back to back,
16 at a time, in segments, sampling the router's and shard's RSS and the KV gauges after each.
A leak grows RSS with every segment once warm; retention by the allocator or a cache filling
up does not. `--mix` sends the soak's mix (bench/soak.py: streamed and cancelled requests,
chat, `n` 2, shared prefixes that fill the prefix cache) with 2-3 new tokens each so that it
runs fast; without it, plain `/generate` with 2 new tokens.

`--pause S` waits S seconds after each segment before sampling. Past tokio's 10 s keep-alive
the blocking threads that tokenized exit, as they do between bursts of real traffic; each
sample then also has the router's anonymous and file-backed RSS and its thread count
(/proc/PID/status), which is how the router's allocator was chosen
(bench/results/router_allocator_cpu.md).

    PYTHONPATH=. .venv/bin/python bench/router_rss_probe.py [--mix] [--segments 600,1200,1200,1200,1200]
    PYTHONPATH=. .venv/bin/python bench/router_rss_probe.py --mix --segments 200x10 --pause 12
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import soak  # noqa: E402
from bench.soak_stack import start_stack  # noqa: E402

CONCURRENCY = 16


class ShortAnswers(random.Random):
    """The soak's mix draws 8-32 new tokens; this probe draws 2-3."""

    def randint(self, a: int, b: int) -> int:
        return super().randint(2, 3) if (a, b) == (8, 32) else super().randint(a, b)


async def segment(url: str, count: int, seed: int, prefixes: list[str] | None) -> dict[str, int]:
    rng, gate, results = ShortAnswers(seed), asyncio.Semaphore(CONCURRENCY), {}
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:

        async def one(i: int) -> None:
            async with gate:
                if prefixes is not None:
                    result = (await soak.send(client, rng, prefixes, 0.0)).result
                else:
                    body = {"inputs": f"tell me {i} things about", "parameters": {"max_new_tokens": 2}}
                    answer = await client.post("/generate", json=body)
                    result = "ok" if answer.status_code == 200 else f"http {answer.status_code}"
                results[result] = results.get(result, 0) + 1

        await asyncio.gather(*(one(i) for i in range(count)))
    return results


def process_status(pid: int) -> dict[str, float]:
    """RssAnon and RssFile in MiB, and Threads, from /proc/PID/status."""
    fields = {"RssAnon": "router_anon_mib", "RssFile": "router_file_mib", "Threads": "router_threads"}
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in fields:
            number = int(value.split()[0])
            out[fields[key]] = number if key == "Threads" else round(number / 1024, 1)
    return out


def segment_sizes(spec: str) -> list[int]:
    """"600,1200" or "200x10" (ten segments of 200), or both mixed."""
    sizes = []
    for part in spec.split(","):
        count, times, repeat = part.partition("x")
        sizes += [int(count)] * (int(repeat) if times else 1)
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mix", action="store_true", help="the soak's mix instead of plain /generate")
    parser.add_argument("--segments", default="600,1200,1200,1200,1200",
                        help="requests per segment; NxK is K segments of N")
    parser.add_argument("--pause", type=float, default=2.0, help="seconds idle after each segment, then a sample")
    parser.add_argument("--out", type=Path, default=None, help="write the samples here as JSON")
    args = parser.parse_args()
    rng = random.Random(1)
    prefixes = [soak._text(rng, 120) for _ in range(6)] if args.mix else None
    stack = start_stack()
    samples, began, done = [], time.perf_counter(), 0
    try:
        for index, count in enumerate(segment_sizes(args.segments)):
            results = asyncio.run(segment(stack.url, count, index, prefixes))
            done += count
            time.sleep(args.pause)
            samples.append({"requests": done, "s": round(time.perf_counter() - began), "results": results,
                            **stack.probe.sample(), **process_status(stack.probe.router.pid)})  # fmt: skip
            print(json.dumps(samples[-1]), flush=True)
    finally:
        stack.stop()
    if args.out:
        report = {"mix": args.mix, "concurrency": CONCURRENCY, "pause_s": args.pause, "samples": samples}
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
