"""Speculative decoding on one H200 (issue 26): the random 8B (bf16), textgen without and with
`--speculate 4`, on prompts that contain the model's own greedy continuation.

For each seed prompt P (random token ids as text), a server without speculation answers P
greedily with C (token ids); the measured prompt is then P + C + P (ids), so prompt lookup finds P's end followed by C,
and drafts C again. How often the model really continues with C after the second P (its
output depends on everything before) is the acceptance rate, measured and reported. Workloads:
batch 1 (three prompts one at a time), and bursts of 64 and 256 such prompts at once. Both
servers run at their defaults apart from `--speculate`.

    PYTHONPATH=. python3 bench/gpu_speculation.py --tokenizer-dir T --router-binary R --out OUT
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import peer_load  # noqa: E402
from bench.gpu_http_load import clients_for  # noqa: E402
from bench.gpu_vs_transformers import TEXT_VOCAB, phase_model, start_server  # noqa: E402
from bench.gpu_vs_vllm import stop  # noqa: E402

PROMPT_TOKENS = 128
COUNTER_NAMES = ("textgen_speculative_draft_tokens_total", "textgen_speculative_accepted_tokens_total")


def continuation(url: str, prompt: str, tokens: int) -> list[int]:
    """The server's greedy answer to `prompt`, as token ids (TGI's /generate with details)."""
    body = {"inputs": prompt, "parameters": {"max_new_tokens": tokens, "details": True}}
    response = httpx.post(f"{url}/generate", json=body, timeout=600)
    response.raise_for_status()
    return [token["id"] for token in response.json()["details"]["tokens"]]


def self_copy_prompts(url: str, tokenizer, count: int, answer: int, seed: int) -> list[list[int]]:
    """P + C + P for `count` seeded prompts P (random ids as text, encoded as the server encodes
    it), C the server's greedy answer to P as token ids: the model's own continuation of P."""
    rng = random.Random(seed)
    texts = [tokenizer.decode(peer_load.random_ids(rng, PROMPT_TOKENS, TEXT_VOCAB)) for _ in range(count)]
    with ThreadPoolExecutor(min(count, 64)) as pool:
        answers = list(pool.map(lambda t: continuation(url, t, answer), texts))
    prompts = []
    for text, answer_ids in zip(texts, answers):
        p = tokenizer.encode(text, add_special_tokens=False).ids
        prompts.append(p + answer_ids + p)
    return prompts


def counters(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    values = dict.fromkeys(COUNTER_NAMES, 0.0)
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in values:
            values[name] = float(value)
    return values


def measure(url: str, plan: dict[str, list[list[peer_load.Request]]]) -> dict:
    results = {}
    for name, runs in plan.items():
        before = counters(url)
        summaries = []
        for requests in runs:
            outcomes, wall = peer_load.run(url, requests, clients_for(len(requests)), len(requests))
            summaries.append(peer_load.summary(outcomes, wall))
        after = counters(url)
        summaries.sort(key=lambda s: s["output_tok_s"])
        picked = dict(summaries[len(summaries) // 2])  # the median run
        picked["drafted"], picked["kept"] = (after[n] - before[n] for n in COUNTER_NAMES)
        results[name] = picked
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer-dir", type=Path, required=True)
    parser.add_argument("--router-binary", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/textgen-bench"))
    parser.add_argument("--model-dir", type=Path, default=Path("/tmp/llama8b-random"))
    parser.add_argument("--client-cpus", type=int, default=6)
    parser.add_argument("--speculate", type=int, default=4)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(args.tokenizer_dir / "tokenizer.json"))
    results: dict = {"model": phase_model(args), "speculate": args.speculate}
    url = "http://127.0.0.1:3500"
    plan: dict[str, list[list[peer_load.Request]]] = {}
    # The prompts come from a server of their own: the measured servers start with an empty
    # prefix cache (P + C would be cached on the server that answered P).
    for key, flags in (("prompts", []), ("off", []), ("on", ["--speculate", str(args.speculate)])):
        args.server_flag = flags
        process, ready_s = start_server(args, 3500, timeout_s=900, base_flags=[])
        try:
            if key == "prompts":
                started = time.perf_counter()
                single = self_copy_prompts(url, tokenizer, 3, 512, seed=40)
                many = self_copy_prompts(url, tokenizer, 256, 256, seed=41)
                results["prompts_s"] = round(time.perf_counter() - started, 1)
                results["prompt_tokens"] = {"batch1": [len(p) for p in single],
                                            "burst_mean": sum(map(len, many)) / len(many)}  # fmt: skip
                plan = {"batch1": [[peer_load.Request(p, 512)] for p in single],
                        "burst64": [[peer_load.Request(p, 256) for p in many[:64]]],
                        "burst256": [[peer_load.Request(p, 256) for p in many]]}
            else:
                results[key] = {"ready_s": ready_s, **measure(url, plan)}
        finally:
            stop(process)
        (args.out / "gpu_speculation.json").write_text(json.dumps(results, indent=1) + "\n")
    lines = ["| workload | tok/s off | tok/s on | on / off | drafted | kept | acceptance |",
             "|:--|--:|--:|--:|--:|--:|--:|"]
    for name in plan:
        off, on = results["off"][name], results["on"][name]
        acceptance = on["kept"] / on["drafted"] if on["drafted"] else 0.0
        lines.append(f"| {name} | {off['output_tok_s']:.1f} | {on['output_tok_s']:.1f} | "
                     f"{on['output_tok_s'] / off['output_tok_s']:.3f} | {on['drafted']:.0f} | {on['kept']:.0f} | "
                     f"{acceptance:.3f} |")
    text = "\n".join(lines) + "\n"
    (args.out / "gpu_speculation.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
