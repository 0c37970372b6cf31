"""CPU benchmark: the whole textgen stack over HTTP vs transformers `generate`, same weights.

Measures, in one run on the same machine:
  1. batch-1 per-token decode latency (textgen: gaps between SSE events; transformers:
     (T(n) - T(1)) / (n - 1) for a forced-length greedy generate),
  2. output tokens/s with 16 concurrent streams (textgen) vs one batch of 16 (transformers).
Both sides use fp32 and the demo model. Results go to bench/results/ as JSON + markdown.

    python bench/cpu_vs_transformers.py [--new-tokens 64] [--out bench/results/cpu_demo]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration_tests"))
from server import Server  # noqa: E402

PROMPT = "Write a long story about a dragon who learns to paint. Once upon a time"
BATCH_PROMPTS = [f"Story number {i}: Once upon a time, a traveller" for i in range(16)]


def textgen_stream(url: str, prompt: str, new_tokens: int) -> list[float]:
    """Arrival times of each streamed token."""
    times = []
    body = {"inputs": prompt, "parameters": {"max_new_tokens": new_tokens}}
    with httpx.stream("POST", url + "/generate_stream", json=body, timeout=600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data:"):
                times.append(time.perf_counter())
    return times


def bench_textgen(new_tokens: int) -> dict:
    server = Server()
    try:
        textgen_stream(server.url, PROMPT, 8)  # warm caches
        gaps = []
        for _ in range(3):
            times = textgen_stream(server.url, PROMPT, new_tokens)
            gaps += [b - a for a, b in zip(times, times[1:])]
        start = time.perf_counter()
        with ThreadPoolExecutor(16) as pool:
            streams = list(pool.map(lambda p: textgen_stream(server.url, p, new_tokens), BATCH_PROMPTS))
        elapsed = time.perf_counter() - start
        tokens = sum(len(s) for s in streams)
        return {
            "batch1_per_token_ms": 1000 * statistics.median(gaps),
            "batch16_tokens": tokens,
            "batch16_seconds": elapsed,
            "batch16_tokens_per_s": tokens / elapsed,
        }
    finally:
        server.stop()


def bench_transformers(model_dir: Path, new_tokens: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def run(prompts: list[str], n: int) -> float:
        batch = tokenizer(prompts, return_tensors="pt", padding=True)
        start = time.perf_counter()
        with torch.inference_mode():
            model.generate(**batch, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                           pad_token_id=tokenizer.pad_token_id)
        return time.perf_counter() - start

    run([PROMPT], 8)  # warm up
    per_token = []
    for _ in range(3):
        t1 = run([PROMPT], 1)
        tn = run([PROMPT], new_tokens)
        per_token.append((tn - t1) / (new_tokens - 1))
    elapsed = run(BATCH_PROMPTS, new_tokens)
    tokens = len(BATCH_PROMPTS) * new_tokens
    return {
        "batch1_per_token_ms": 1000 * statistics.median(per_token),
        "batch16_tokens": tokens,
        "batch16_seconds": elapsed,
        "batch16_tokens_per_s": tokens / elapsed,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--out", default="bench/results/cpu_demo")
    args = parser.parse_args()

    from launcher.demo_model import ensure_demo_model

    model_dir = ensure_demo_model()
    textgen = bench_textgen(args.new_tokens)
    reference = bench_transformers(model_dir, args.new_tokens)
    ratios = {
        # > 1 means textgen is faster.
        "batch1_latency_ratio": reference["batch1_per_token_ms"] / textgen["batch1_per_token_ms"],
        "batch16_throughput_ratio": textgen["batch16_tokens_per_s"] / reference["batch16_tokens_per_s"],
    }
    result = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "processor": platform.processor() or platform.machine()},
        "model": "HuggingFaceTB/SmolLM2-135M-Instruct (demo, fp32)",
        "new_tokens": args.new_tokens,
        "textgen": textgen,
        "transformers_generate": reference,
        "ratios": ratios,
        "bar": ">= 1.0 on both ratios",
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    out.with_suffix(".md").write_text(
        f"# CPU: textgen vs transformers `generate` (demo model, fp32)\n\n"
        f"Machine: {result['machine']['cpus']} CPUs, {result['machine']['platform']}. "
        f"Command: `python bench/cpu_vs_transformers.py --new-tokens {args.new_tokens}`.\n\n"
        "| measure | textgen (HTTP, full stack) | transformers | ratio (≥ 1.0 = textgen better) |\n"
        "|---|---|---|---|\n"
        f"| batch-1 per-token latency | {textgen['batch1_per_token_ms']:.1f} ms | "
        f"{reference['batch1_per_token_ms']:.1f} ms | {ratios['batch1_latency_ratio']:.2f} |\n"
        f"| 16 streams vs batch 16, output tokens/s | {textgen['batch16_tokens_per_s']:.1f} | "
        f"{reference['batch16_tokens_per_s']:.1f} | {ratios['batch16_throughput_ratio']:.2f} |\n"
    )
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
