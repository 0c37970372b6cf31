"""Greedy answers of the demo model with fp8 KV caches and fp8 weights against transformers (fp32, CPU).

For each variant (the plain model, each `--kv-cache-dtype`, `--quantize fp8`, and fp8 weights
over an e4m3 pool) the full stack serves the demo model; each prompt's greedy tokens are
compared position by position with transformers' `generate`, and the first position where
they differ is reported.

    python3 bench/cpu_fp8_quality.py [--new-tokens 32] [--out bench/results/cpu_fp8_quality.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import httpx
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "integration_tests")]

from launcher.demo_model import ensure_demo_model  # noqa: E402
from server import Server  # noqa: E402

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at", "Once upon a time",
           "The three primary colours are", "import numpy as np"]  # fmt: skip
VARIANTS = {"model dtype": (), "kv fp8_e4m3fn": ("--kv-cache-dtype", "fp8_e4m3fn"),
            "kv fp8_e5m2": ("--kv-cache-dtype", "fp8_e5m2"), "weights fp8": ("--quantize", "fp8"),
            "weights fp8, kv fp8_e4m3fn": ("--quantize", "fp8", "--kv-cache-dtype", "fp8_e4m3fn")}  # fmt: skip


def main() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, help="write the results here as JSON")
    args = parser.parse_args()
    directory = ensure_demo_model()
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    expected = []
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.inference_mode():
            expected.append(model.generate(ids, max_new_tokens=args.new_tokens, do_sample=False)[0, ids.shape[1]:].tolist())
    results = {}
    for name, flags in VARIANTS.items():
        server = Server(*flags)
        try:
            agree = total = 0
            forks = []
            for prompt, want in zip(PROMPTS, expected):
                body = {"inputs": prompt, "parameters": {"max_new_tokens": args.new_tokens, "details": True, "do_sample": False}}
                got = [t["id"] for t in httpx.post(server.url + "/generate", json=body, timeout=300).json()["details"]["tokens"]]
                pairs = list(zip(got, want))
                agree += sum(a == b for a, b in pairs)
                total += len(pairs)
                forks.append(next((i for i, (a, b) in enumerate(pairs) if a != b), len(pairs)))
        finally:
            server.stop()
        results[name] = {"positionwise": f"{agree}/{total}", "first_fork": forks}
        print(name, json.dumps(results[name]), flush=True)
    if args.out:
        record = {"command": "python3 bench/cpu_fp8_quality.py --new-tokens %d" % args.new_tokens,
                  "prompts": PROMPTS, "variants": {name: list(flags) for name, flags in VARIANTS.items()}, **results}
        args.out.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
