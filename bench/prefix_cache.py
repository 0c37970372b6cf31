"""Prefix-cache benchmark: the same workloads against textgen with the cache on and off.

In one run, two servers (demo model, greedy) are started one after the other, with
`--prefix-caching true` and `false`, and each runs:
  1. shared system prompt: N requests sharing a ~1,500-token system prompt, each with a
     ~100-token question and 64 new tokens, all submitted at once;
  2. multi-turn chats: C chats of T turns running side by side, each turn resending the
     whole history (earlier answers included) plus a new user message;
  3. no reuse: N random prompts.
It reports wall time, throughput, TTFT p50, whether the greedy outputs are identical,
and the prefix-cache metrics (token hits, hits on generated tokens, evictions).

    python bench/prefix_cache.py [--out bench/results/prefix_cache_cpu] [--scale 1.0]
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration_tests"))
from server import Server, metric, scrape_metrics  # noqa: E402

WORDS = ("river stone lantern market silver garden window engine harbor letter winter "
         "orchard violin copper meadow thunder library candle forest bridge pepper mirror "
         "falcon canvas island ribbon marble compass saddle tunnel").split()
CACHE_METRICS = ("textgen_prefix_cache_queries_tokens_total", "textgen_prefix_cache_hits_tokens_total",
                 "textgen_prefix_cache_hits_generated_tokens_total",
                 "textgen_prefix_cache_evicted_blocks_total")


def words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


@functools.cache
def client() -> httpx.Client:
    """One pooled client for every thread: a fresh httpx client per request costs tens of
    milliseconds of GIL-bound setup (its TLS context), which on a fast GPU would dominate
    the latencies being measured."""
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    return httpx.Client(limits=limits, timeout=3600)


def token_count(url: str, text: str) -> int:
    response = client().post(url + "/tokenize", json={"inputs": text}, timeout=60)
    response.raise_for_status()
    return len(response.json())


def text_of_tokens(url: str, rng: random.Random, tokens: int) -> str:
    """Random words, about `tokens` tokens long (calibrated with /tokenize)."""
    count = max(1, tokens // 2)
    text = words(rng, count)
    for _ in range(4):
        actual = token_count(url, text)
        if abs(actual - tokens) <= max(2, tokens // 50):
            break
        count = max(1, round(count * tokens / actual))
        text = words(rng, count)
    return text


def stream(url: str, prompt: str, new_tokens: int) -> dict:
    """One greedy streamed request: its text, token count, TTFT and end time."""
    body = {"inputs": prompt, "parameters": {"max_new_tokens": new_tokens, "do_sample": False}}
    start = time.perf_counter()
    first = None
    tokens, text = 0, ""
    with client().stream("POST", url + "/generate_stream", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue
            event = json.loads(line[5:])
            if "error" in event:
                raise RuntimeError(event["error"])
            first = first or time.perf_counter()
            tokens += 1
            text = event.get("generated_text") or text
    return {"text": text, "tokens": tokens, "ttft": first - start}


def run_parallel(url: str, jobs: list[tuple[str, int]], threads: int) -> list[dict]:
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda job: stream(url, *job), jobs))


def shared_system_prompt(url: str, rng: random.Random, requests: int) -> tuple[list[dict], float]:
    system = "System: " + text_of_tokens(url, rng, 1500) + "\n"
    jobs = [(system + "Question: " + text_of_tokens(url, rng, 100) + "\nAnswer:", 64)
            for _ in range(requests)]
    start = time.perf_counter()
    results = run_parallel(url, jobs, requests)
    return results, time.perf_counter() - start


def multi_turn_chats(url: str, rng: random.Random, chats: int, turns: int) -> tuple[list[dict], float]:
    openings = ["User: Read this and remember it. " + text_of_tokens(url, rng, 300) for _ in range(chats)]
    follow_ups = [[text_of_tokens(url, rng, 60) for _ in range(turns - 1)] for _ in range(chats)]

    def chat(index: int) -> list[dict]:
        history = openings[index] + "\nAssistant:"
        results = []
        for turn in range(turns):
            result = stream(url, history, 48)
            results.append(result)
            if turn + 1 < turns:
                history += result["text"] + "\nUser: " + follow_ups[index][turn] + "\nAssistant:"
        return results

    start = time.perf_counter()
    with ThreadPoolExecutor(chats) as pool:
        per_chat = list(pool.map(chat, range(chats)))
    return [r for results in per_chat for r in results], time.perf_counter() - start


def no_reuse(url: str, rng: random.Random, requests: int) -> tuple[list[dict], float]:
    # Each prompt opens with a distinct number so no two share even a first block.
    jobs = [(f"{rng.randrange(10**9)} " + text_of_tokens(url, rng, 200), 32) for _ in range(requests)]
    start = time.perf_counter()
    results = run_parallel(url, jobs, requests)
    return results, time.perf_counter() - start


def summarize(results: list[dict], seconds: float, before: dict, after: dict) -> dict:
    tokens = sum(r["tokens"] for r in results)
    return {
        "requests": len(results),
        "seconds": round(seconds, 2),
        "output_tokens": tokens,
        "output_tokens_per_s": round(tokens / seconds, 2),
        "requests_per_s": round(len(results) / seconds, 3),
        "ttft_p50_s": round(statistics.median(r["ttft"] for r in results), 3),
        "metrics": {name: metric(after, name) - metric(before, name) for name in CACHE_METRICS},
        "outputs": [r["text"] for r in results],
    }


def run_mode(cache: bool, scale: float, seed: int, server_flags: list[str]) -> dict:
    server = Server("--prefix-caching", "true" if cache else "false", *server_flags)
    try:
        stream(server.url, "Warm up the shard.", 4)
        workloads = {
            "shared_system_prompt": lambda rng: shared_system_prompt(server.url, rng, max(2, round(64 * scale))),
            "multi_turn_chats": lambda rng: multi_turn_chats(server.url, rng, max(2, round(16 * scale)), 8),
            "no_reuse": lambda rng: no_reuse(server.url, rng, max(2, round(64 * scale))),
        }
        out = {}
        for name, run in workloads.items():
            rng = random.Random(f"{seed}-{name}")  # same prompts in both modes
            before = scrape_metrics(server.url)
            results, seconds = run(rng)
            out[name] = summarize(results, seconds, before, scrape_metrics(server.url))
            print(f"cache={'on' if cache else 'off'} {name}: {seconds:.1f} s, "
                  f"{out[name]['metrics']}", flush=True)
        return out
    finally:
        server.stop()


def compare(on: dict, off: dict) -> dict:
    table = {}
    for name in on:
        a, b = on[name], off[name]
        table[name] = {
            "throughput_ratio_on_over_off": round(b["seconds"] / a["seconds"], 3),
            "ttft_p50_ratio_off_over_on": round(b["ttft_p50_s"] / a["ttft_p50_s"], 3),
            "greedy_outputs_identical": a["outputs"] == b["outputs"],
            "differing_outputs": sum(x != y for x, y in zip(a["outputs"], b["outputs"])),
        }
    return table


def markdown(report: dict) -> str:
    lines = [f"# Prefix cache on vs off ({report['machine']})", "",
             f"Model: {report['model']}, greedy. Scale {report['scale']}. "
             f"Command: `{report['command']}`", "",
             "| Workload | off s | on s | throughput × | TTFT p50 off/on | identical | "
             "hit tokens / queried | hits on generated tokens | evicted blocks |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, row in report["comparison"].items():
        on, off = report["cache_on"][name], report["cache_off"][name]
        m = on["metrics"]
        lines.append(
            f"| {name} | {off['seconds']} | {on['seconds']} | {row['throughput_ratio_on_over_off']} | "
            f"{row['ttft_p50_ratio_off_over_on']} | {row['greedy_outputs_identical']} "
            f"({row['differing_outputs']} differ) | "
            f"{m['textgen_prefix_cache_hits_tokens_total']:.0f} / "
            f"{m['textgen_prefix_cache_queries_tokens_total']:.0f} | "
            f"{m['textgen_prefix_cache_hits_generated_tokens_total']:.0f} | "
            f"{m['textgen_prefix_cache_evicted_blocks_total']:.0f} |")
    if "control_off_vs_off_differing_outputs" in report:
        lines += ["", "Control (cache off, run twice), outputs that differ: "
                  + json.dumps(report["control_off_vs_off_differing_outputs"])]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/prefix_cache_cpu")
    parser.add_argument("--scale", type=float, default=1.0, help="request counts × this")
    parser.add_argument("--seed", type=int, default=6)
    parser.add_argument("--machine", default=f"{platform.machine()}, {os.cpu_count()} CPU cores")
    parser.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct (offline demo model)",
                        help="what the report calls the model")
    parser.add_argument("--server-flag", action="append", default=[],
                        help="extra launcher flag, repeatable (e.g. --server-flag=--model-id=/tmp/llama8b)")
    parser.add_argument("--control", action="store_true",
                        help="run cache-off twice: outputs that differ between two identical runs "
                             "are batching noise (bf16 on GPU), not the cache")
    args = parser.parse_args()
    on = run_mode(True, args.scale, args.seed, args.server_flag)
    off = run_mode(False, args.scale, args.seed, args.server_flag)
    control = run_mode(False, args.scale, args.seed, args.server_flag) if args.control else None
    report = {
        "machine": args.machine,
        "model": args.model,
        "scale": args.scale,
        "command": "python bench/prefix_cache.py " + " ".join(sys.argv[1:]),
        "comparison": compare(on, off),
        "cache_on": on,
        "cache_off": off,
    }
    if control is not None:
        report["control_off_vs_off_differing_outputs"] = {
            name: sum(x != y for x, y in zip(off[name]["outputs"], control[name]["outputs"])) for name in off}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
