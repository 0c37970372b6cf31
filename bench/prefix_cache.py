"""Prefix-cache benchmark: the same workloads against textgen with the cache on and off.

In one run, two servers (demo model by default, greedy) run side by side, with
`--prefix-caching true` and `false` (on GPUs, optionally one GPU each: `--gpus 0,1`). After a
warm-up pass on both, every workload runs on each server in alternating order for `--rounds`
rounds (fresh prompts per round, the same prompts on both servers), and the medians are
compared, so the machine's drift (first-use compilation, memory growth) hits both alike:
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
# Steps taken and their time: tells "more steps" apart from "slower steps".
STEP_METRICS = ("textgen_step_duration_seconds_sum", "textgen_step_duration_seconds_count",
                "textgen_step_tokens_sum")


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
        "steps": {name: round(metric(after, name) - metric(before, name), 4) for name in STEP_METRICS},
        "outputs": [r["text"] for r in results],
    }


WORKLOADS = {
    "shared_system_prompt": lambda url, rng, scale: shared_system_prompt(url, rng, max(2, round(64 * scale))),
    "multi_turn_chats": lambda url, rng, scale: multi_turn_chats(url, rng, max(2, round(16 * scale)), 8),
    "no_reuse": lambda url, rng, scale: no_reuse(url, rng, max(2, round(64 * scale))),
}


def measure(server: Server, name: str, key: str, scale: float) -> dict:
    """One workload on one server; `key` seeds its prompts (same key, same prompts)."""
    before = scrape_metrics(server.url)
    results, seconds = WORKLOADS[name](server.url, random.Random(key), scale)
    return summarize(results, seconds, before, scrape_metrics(server.url))


def start(cache: bool, flags: list[str], gpu: str | None) -> Server:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu) if gpu is not None else None
    server = Server("--prefix-caching", "true" if cache else "false", *flags, env=env)
    stream(server.url, "Warm up the shard.", 4)
    return server


def combine(runs: list[dict]) -> dict:
    """Rounds of one workload on one server: medians of time and TTFT, summed metrics,
    round 0's outputs (the rounds use different prompts)."""
    combined = dict(runs[0])
    combined["seconds"] = round(statistics.median(r["seconds"] for r in runs), 3)
    combined["ttft_p50_s"] = round(statistics.median(r["ttft_p50_s"] for r in runs), 4)
    combined["output_tokens_per_s"] = round(combined["output_tokens"] / combined["seconds"], 2)
    combined["requests_per_s"] = round(combined["requests"] / combined["seconds"], 3)
    combined["round_seconds"] = [r["seconds"] for r in runs]
    for key in ("metrics", "steps"):
        combined[key] = {name: sum(r[key][name] for r in runs) for name in runs[0][key]}
    return combined


def side_by_side(args) -> tuple[dict, dict]:
    """Both servers up at once; every workload runs on each in alternating order, round
    after round, after a warm-up pass, so drift of the machine hits both alike."""
    gpus = args.gpus.split(",") if args.gpus else [None, None]
    servers = {"on": start(True, args.server_flag, gpus[0]), "off": start(False, args.server_flag, gpus[-1])}
    try:
        for label, server in servers.items():
            for name in args.workloads:
                measure(server, name, f"warm-{args.seed}-{name}", min(args.scale, 0.25))
        runs = {"on": {}, "off": {}}
        for name in args.workloads:
            for round_ in range(args.rounds):
                for label in ("on", "off") if round_ % 2 == 0 else ("off", "on"):
                    run = measure(servers[label], name, f"{args.seed}-{name}-{round_}", args.scale)
                    runs[label].setdefault(name, []).append(run)
                    print(f"cache={label} {name} round {round_}: {run['seconds']:.2f} s, "
                          f"{run['metrics']} {run['steps']}", flush=True)
    finally:
        for server in servers.values():
            server.stop()
    on = {name: combine(r) for name, r in runs["on"].items()}
    off = {name: combine(r) for name, r in runs["off"].items()}
    return on, off


def control_run(args) -> dict:
    """Round 0 of every workload on a fresh cache-off server."""
    server = start(False, args.server_flag, args.gpus.split(",")[-1] if args.gpus else None)
    try:
        return {name: measure(server, name, f"{args.seed}-{name}-0", args.scale) for name in args.workloads}
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
             f"Model: {report['model']}, greedy; seconds and TTFT are medians of "
             f"{len(next(iter(report['cache_on'].values()))['round_seconds'])} alternating rounds. Scale {report['scale']}. "
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
    parser.add_argument("--rounds", type=int, default=2, help="measured rounds per workload and server")
    parser.add_argument("--gpus", default=None,
                        help="CUDA_VISIBLE_DEVICES of the cache-on and cache-off servers, e.g. 0,1")
    parser.add_argument("--control", action="store_true",
                        help="also run round 0 on a fresh cache-off server: outputs that differ between "
                             "two cache-off runs are batching noise (bf16 on GPU), not the cache")
    parser.add_argument("--workloads", type=lambda text: text.split(","), default=list(WORKLOADS),
                        help="comma-separated subset of: " + ", ".join(WORKLOADS))
    args = parser.parse_args()
    unknown = set(args.workloads) - set(WORKLOADS)
    if unknown:
        parser.error(f"unknown workloads: {', '.join(sorted(unknown))}")
    on, off = side_by_side(args)
    control = control_run(args) if args.control else None
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
        report["control_run"] = control
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
