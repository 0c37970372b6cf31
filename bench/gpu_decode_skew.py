"""Decode graph replays over skewed context lengths, by split-KV target (issue 23).

Under Poisson arrivals a decode batch holds a few long sequences among many short ones. A
graph of 64 or more sequences ran its attention unsplit (`split_count` aimed at 256
programs), so each long sequence's keys went through one program per KV head, and that
program set the attention's time in every layer. This times the replay of one decode graph
with contexts drawn as the Poisson workloads draw them (`peer_load.sharegpt_like`: prompt,
plus a uniform share of the answer already generated) against the same batch with every
context at the mean, for several values of `triton_paged.SPLIT_TARGET_PROGRAMS`, each with
the decode graphs captured again under it.

    PYTHONPATH=. python3 bench/gpu_decode_skew.py MODEL_DIR OUT_JSON [--targets 256,1024,2048,4096] [--fp8]
        [--min-split-keys 0,256]

`--min-split-keys`: values of `triton_paged.MIN_SPLIT_KEYS` (the fewest keys of a range) tried
under each target; a row's key is the target, then `_min` and the value where it is not 0.

`--fp8`: the fp8 path (weights quantized at load, KV cache in e4m3), whose decode tiles are
chosen by program count.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gpu_parity import parity_runner  # noqa: E402
from bench.peer_load import lognormal  # noqa: E402
from shard_server.attention import triton_paged  # noqa: E402
from shard_server.pb import generate_pb2 as pb  # noqa: E402

PREFILL_TOKENS = 4096  # prompt tokens per setup step


def skewed_contexts(batch: int, seed: int) -> list[int]:
    """Context lengths of a decode batch under the Poisson workloads' request shapes."""
    rng = random.Random(seed)
    contexts = []
    for _ in range(batch):
        prompt, answer = lognormal(rng, 180, 1.0, 8, 2048), lognormal(rng, 150, 0.8, 8, 1024)
        contexts.append(prompt + rng.randint(0, answer))
    return contexts


def _prefill(runner, contexts: list[int], steps: int) -> None:
    """Registers and prefills sequences 0..len-1 of these lengths, with room for `steps` more."""
    next_block, pending, tokens = 0, pb.StepRequest(step_id=1), 0
    for i, n in enumerate(contexts):
        blocks = -(-(n + steps + 2) // runner.block_size)
        pending.new_sequences.add(id=i, input_ids=[100 + (i + j) % 20000 for j in range(n)], prompt_len=n)
        pending.sequences.add(id=i, num_tokens=n, new_block_ids=range(next_block, next_block + blocks), sample=True)
        next_block, tokens = next_block + blocks, tokens + n
        if tokens >= PREFILL_TOKENS:
            runner.step(pending)
            pending, tokens = pb.StepRequest(step_id=1), 0
    if pending.sequences:
        runner.step(pending)


def replay_ms(runner, contexts: list[int], repeats: int) -> tuple[float, int]:
    """(ms of one replay of the decode graph for this batch, its split count)."""
    _prefill(runner, contexts, steps=2)
    decode = pb.StepRequest(step_id=2)
    for i in range(len(contexts)):
        decode.sequences.add(id=i, num_tokens=1, sample=True)
    runner.step(decode)  # the graph's inputs now hold this batch
    step = runner.graphs.steps[runner.graphs.size_for_batch(len(contexts))]
    step.graph.replay()
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(repeats):
        step.graph.replay()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - began) / repeats * 1e3
    runner.step(pb.StepRequest(step_id=3, released_ids=list(range(len(contexts)))))
    return ms, step.metadata.splits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--targets", default="256,1024,2048,4096")
    parser.add_argument("--batches", default="8,16,32,48,64,96,128,256")
    parser.add_argument("--min-split-keys", default="0")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--fp8", action="store_true", help="fp8 weights and KV cache")
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    fp8 = {"quantize": "fp8", "kv_dtype": torch.float8_e4m3fn} if args.fp8 else {}
    runner, _ = parity_runner(args.model_dir, graph_sizes=batches, memory_fraction=0.6, **fp8)
    results: dict = {"model": str(args.model_dir), "precision": "fp8" if args.fp8 else "bf16", "batches": {}}
    for batch in batches:
        skewed = skewed_contexts(batch, seed=batch)
        mean = round(sum(skewed) / batch)
        results["batches"][batch] = {"contexts": {"max": max(skewed), "mean": mean}, "targets": {}}
    variants = [(int(t), int(m)) for t in args.targets.split(",") for m in args.min_split_keys.split(",")]
    for target, min_keys in variants:
        triton_paged.SPLIT_TARGET_PROGRAMS, triton_paged.MIN_SPLIT_KEYS = target, min_keys
        runner.graphs.capture(runner.graphs.sizes, runner.kv_cache)
        key = f"{target}_min{min_keys}" if min_keys else str(target)
        for batch in batches:
            skewed = skewed_contexts(batch, seed=batch)
            uniform = [results["batches"][batch]["contexts"]["mean"]] * batch
            (skew_ms, splits), (uniform_ms, _) = (replay_ms(runner, c, args.repeats) for c in (skewed, uniform))
            row = {"splits": splits, "skewed_ms": round(skew_ms, 3), "uniform_ms": round(uniform_ms, 3)}
            results["batches"][batch]["targets"][key] = row
            print(json.dumps({"target": key, "batch": batch, **row}), flush=True)
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
