"""CPU benchmark: the whole textgen stack over HTTP vs transformers `generate`, same weights.

Measures, in one run on the same machine:
The two engines alternate round by round, so load changes on a shared machine hit both.
  1. batch-1 per-token decode latency (textgen: gaps between SSE events; transformers:
     (T(n) - T(1)) / (n - 1) for a forced-length greedy generate),
  2. output tokens/s with 16 concurrent streams (textgen) vs one batch of 16 (transformers).
Both sides use fp32 and the demo model. Results go to bench/results/ as JSON + markdown.

    python bench/cpu_vs_transformers.py [--new-tokens 64] [--out bench/results/cpu_demo]
"""
from __future__ import annotations

import argparse
import functools
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


@functools.cache
def client() -> httpx.Client:
    """One pooled client for every stream: building an httpx client per request costs tens of
    milliseconds of CPU (its TLS context), which would be charged to textgen here."""
    limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
    return httpx.Client(limits=limits, timeout=600)


def textgen_stream(url: str, prompt: str, new_tokens: int) -> list[float]:
    """Arrival times of each streamed token."""
    times = []
    body = {"inputs": prompt, "parameters": {"max_new_tokens": new_tokens}}
    with client().stream("POST", url + "/generate_stream", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data:"):
                times.append(time.perf_counter())
    return times


class Textgen:
    """The full stack over HTTP."""

    def __init__(self, server: Server, new_tokens: int):
        self.url, self.new_tokens = server.url, new_tokens
        textgen_stream(self.url, PROMPT, 8)  # warm caches

    def per_token_seconds(self) -> list[float]:
        times = textgen_stream(self.url, PROMPT, self.new_tokens)
        return [b - a for a, b in zip(times, times[1:])]

    def batch16(self) -> tuple[int, float]:
        start = time.perf_counter()
        with ThreadPoolExecutor(16) as pool:
            streams = list(pool.map(lambda p: textgen_stream(self.url, p, self.new_tokens), BATCH_PROMPTS))
        return sum(len(s) for s in streams), time.perf_counter() - start


class Transformers:
    """transformers `generate` on the same weights, fp32, greedy, forced length."""

    def __init__(self, model_dir: Path, new_tokens: int):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch, self.new_tokens = torch, new_tokens
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.tokenizer.padding_side = "left"
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self._run([PROMPT], 8)  # warm up

    def _run(self, prompts: list[str], n: int) -> float:
        batch = self.tokenizer(prompts, return_tensors="pt", padding=True)
        start = time.perf_counter()
        with self.torch.inference_mode():
            self.model.generate(**batch, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                pad_token_id=self.tokenizer.eos_token_id)
        return time.perf_counter() - start

    def per_token_seconds(self) -> list[float]:
        return [(self._run([PROMPT], self.new_tokens) - self._run([PROMPT], 1)) / (self.new_tokens - 1)]

    def batch16(self) -> tuple[int, float]:
        return len(BATCH_PROMPTS) * self.new_tokens, self._run(BATCH_PROMPTS, self.new_tokens)


def measure(engines: dict, rounds: int) -> dict:
    """Alternates the engines round by round, so load changes on a shared machine hit both."""
    per_token = {name: [] for name in engines}
    batch = {name: [0, 0.0] for name in engines}
    for _ in range(rounds):
        for name, engine in engines.items():
            per_token[name] += engine.per_token_seconds()
            tokens, seconds = engine.batch16()
            batch[name][0] += tokens
            batch[name][1] += seconds
    return {
        name: {
            "batch1_per_token_ms": 1000 * statistics.median(per_token[name]),
            "batch16_tokens": batch[name][0],
            "batch16_seconds": batch[name][1],
            "batch16_tokens_per_s": batch[name][0] / batch[name][1],
        }
        for name in engines
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="bench/results/cpu_demo")
    parser.add_argument("--server-flag", action="append", default=[], help="extra launcher flag (repeatable)")
    parser.add_argument("--server-env", action="append", default=[], metavar="KEY=VALUE",
                        help="environment variable for the server only (repeatable)")
    args = parser.parse_args()

    from launcher.demo_model import ensure_demo_model

    model_dir = ensure_demo_model()
    server = Server(*args.server_flag, env=dict(item.split("=", 1) for item in args.server_env))
    try:
        engines = {"textgen": Textgen(server, args.new_tokens),
                   "transformers": Transformers(model_dir, args.new_tokens)}
        results = measure(engines, args.rounds)
    finally:
        server.stop()
    textgen, reference = results["textgen"], results["transformers"]
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
        f"Command: `python bench/cpu_vs_transformers.py --new-tokens {args.new_tokens} "
        f"--rounds {args.rounds}` (engines alternate round by round).\n\n"
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
