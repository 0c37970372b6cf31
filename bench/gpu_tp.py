"""Tensor parallelism on the GPU machine, one run: the 8B-shaped random model served at TP=1 and
TP=2 over HTTP, side by side.

    PYTHONPATH=. python3 bench/gpu_tp.py --tokenizer-dir DIR --out OUT [--dtypes bfloat16,float32]

For each dtype and TP degree it starts the full stack (launcher → router → one shard per GPU),
then measures
  - batch-1 decode tokens/s (a 128-token prompt, 256 new tokens),
  - output tokens/s on the 256-request mix of bench/gpu_vs_transformers.py (bfloat16 only),
  - the greedy tokens of 16 prompts × 64 new tokens (for parity between the degrees).
Parity is reported position by position and as tokens before the first divergence. In bfloat16
the random model's near-tied logits make any change of summation order (which TP is) flip some
argmaxes (see bench/results/gpu_precision_check_h200.json); float32 shows whether the sharded
arithmetic itself is right.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gpu_http_load import clients_for, streams  # noqa: E402
from bench.gpu_vs_transformers import MIX, SERVER_FLAGS, Prompts, phase_model, start_server, warm_up  # noqa: E402

PARITY_PROMPTS, PARITY_TOKENS = 16, 64


def greedy_tokens(url: str, prompts: list[str]) -> list[list[int]]:
    out = []
    for prompt in prompts:
        body = {"inputs": prompt, "parameters": {"max_new_tokens": PARITY_TOKENS, "do_sample": False,
                                                 "details": True}}  # fmt: skip
        response = httpx.post(f"{url}/generate", json=body, timeout=600)
        response.raise_for_status()
        out.append([t["id"] for t in response.json()["details"]["tokens"]])
    return out


def serve_and_measure(args, tp: int, dtype: str, throughput: bool) -> dict:
    work = args.work / f"tp{tp}-{dtype}"
    work.mkdir(parents=True, exist_ok=True)
    flags = ["--num-shard", str(tp), "--dtype", dtype, *args.server_flag]
    server_args = SimpleNamespace(out=work, work=work, router_binary=args.router_binary,
                                  model_dir=args.model_dir, server_flag=flags)  # fmt: skip
    process, startup_s = start_server(server_args, 18090 + tp)
    url = f"http://127.0.0.1:{18090 + tp}"
    prompts = Prompts(args.tokenizer_dir, seed=1)
    result: dict = {"tp": tp, "dtype": dtype, "startup_s": startup_s}
    try:
        warm_up(url, prompts)
        rates = [1 / streams(url, [(prompts.text(128), 257)])[0][0].tpot for _ in range(3)]
        result["batch1_decode_tok_s"] = sorted(rates)[1]  # median: one stream varies ~10 % run to run
        result["batch1_runs_tok_s"] = rates
        if throughput:
            requests = [(prompts.text(n_in), n_out) for n_in, n_out in MIX]
            res, wall = streams(url, requests, processes=clients_for(len(requests)))
            tokens = sum(len(r.token_times) for r in res)
            result["mixed_256"] = {"output_tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall,
                                   "errors": sum(1 for r in res if r.error)}  # fmt: skip
        parity_prompts = Prompts(args.tokenizer_dir, seed=7)
        result["greedy"] = greedy_tokens(url, [parity_prompts.text(128) for _ in range(PARITY_PROMPTS)])
    finally:
        process.terminate()
        process.wait(timeout=120)
    return result


def agreement(a: list[list[int]], b: list[list[int]]) -> dict:
    pairs = [(x, y) for seq_a, seq_b in zip(a, b) for x, y in zip(seq_a, seq_b)]
    before = []
    for seq_a, seq_b in zip(a, b):
        n = next((i for i, (x, y) in enumerate(zip(seq_a, seq_b)) if x != y), min(len(seq_a), len(seq_b)))
        before.append(n)
    return {"positionwise": sum(x == y for x, y in pairs) / len(pairs), "tokens_before_first_divergence": before,
            "identical_sequences": sum(n == PARITY_TOKENS for n in before)}  # fmt: skip


def summarize(runs: dict) -> dict:
    summary = {}
    one, two = runs.get("tp1-bfloat16", {}), runs.get("tp2-bfloat16", {})
    if "greedy" in one and "greedy" in two:
        summary["batch1_speedup_tp2_over_tp1"] = two["batch1_decode_tok_s"] / one["batch1_decode_tok_s"]
        if "mixed_256" in one and "mixed_256" in two:
            summary["mixed_256_speedup_tp2_over_tp1"] = (
                two["mixed_256"]["tokens_per_s"] / one["mixed_256"]["tokens_per_s"])
        summary["bfloat16_parity"] = agreement(one["greedy"], two["greedy"])
    if "greedy" in runs.get("tp1-float32", {}) and "greedy" in runs.get("tp2-float32", {}):
        summary["float32_parity"] = agreement(runs["tp1-float32"]["greedy"], runs["tp2-float32"]["greedy"])
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--router-binary", type=Path, default=Path("router/target/release/textgen-router"))
    parser.add_argument("--work", type=Path, default=Path("/tmp/textgen-tp"))
    parser.add_argument("--model-dir", type=Path, default=Path("/tmp/llama8b-random"))
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--server-flag", action="append", default=[], help="extra launcher flag (repeatable)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    print("[model]", phase_model(args), flush=True)
    runs = {}
    for dtype in args.dtypes.split(","):
        for tp in (1, 2):
            key = f"tp{tp}-{dtype}"
            started = time.perf_counter()
            try:
                runs[key] = serve_and_measure(args, tp, dtype, throughput=dtype == "bfloat16")
            except Exception as exc:  # record and go on: the other runs still tell something
                runs[key] = {"error": f"{type(exc).__name__}: {exc}"}
            runs[key]["run_s"] = time.perf_counter() - started
            shown = {k: v for k, v in runs[key].items() if k != "greedy"}
            print(f"[{key}] {json.dumps(shown)}", flush=True)
    report = {"summary": summarize(runs), "runs": runs, "command": "python3 bench/gpu_tp.py " + " ".join(sys.argv[1:])}
    (args.out / "gpu_tp.json").write_text(json.dumps(report, indent=1))
    print("[summary]", json.dumps(report["summary"]), flush=True)


if __name__ == "__main__":
    main()
