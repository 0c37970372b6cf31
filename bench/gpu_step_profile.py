"""Where a step's time goes, in-process on the 8B model, with the fused kernels off and on.

Decode (context 256): the CUDA graph replay alone (pure GPU: forward, lm_head, greedy
argmax) against the runner's whole step (host planning and copies, replay, sampling,
response). Prefill: one 2048-token prompt (the TTFT case) and 8 prompts of 1024 tokens, each
timed on first use (kernel compilation shows up there) and again.

    python3 bench/gpu_step_profile.py MODEL_DIR [OUT_JSON]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gpu_parity import parity_runner  # noqa: E402
from shard_server.kernels.dispatch import fused_kernels  # noqa: E402
from shard_server.pb import generate_pb2 as pb  # noqa: E402


def _timed_ms(fn, repeats: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats * 1e3


def _prefill(runner, lengths: list[int], first_id: int) -> float:
    """ms of one step prefilling `lengths` new prompts (released afterwards)."""
    request = pb.StepRequest(step_id=1)
    next_block = 0
    for i, n in enumerate(lengths):
        blocks = -(-(n + 1) // runner.block_size)
        request.new_sequences.add(id=first_id + i, input_ids=[(100 + 7 * j) % 30000 for j in range(n)], prompt_len=n)
        request.sequences.add(id=first_id + i, num_tokens=n, new_block_ids=range(next_block, next_block + blocks), sample=True)
        next_block += blocks
    ms = _timed_ms(lambda: runner.step(request), 1)
    runner.step(pb.StepRequest(step_id=2, released_ids=[first_id + i for i in range(len(lengths))]))
    return ms


def _prefill_batch(runner, batch: int, context: int, blocks_each: int, step_tokens: int = 4096) -> None:
    """Prefills sequences 0..batch-1 of `context` tokens, as many per step as fit `step_tokens`."""
    per_step = max(1, step_tokens // context)
    for first in range(0, batch, per_step):
        request = pb.StepRequest(step_id=1)
        for i in range(first, min(batch, first + per_step)):
            request.new_sequences.add(id=i, input_ids=[100 + i] * context, prompt_len=context)
            ids = range(i * blocks_each, (i + 1) * blocks_each)
            request.sequences.add(id=i, num_tokens=context, new_block_ids=ids, sample=True)
        runner.step(request)


def _decode(runner, batch: int, context: int, steps: int) -> dict:
    blocks_each = -(-(context + steps + 2) // runner.block_size)
    _prefill_batch(runner, batch, context, blocks_each)
    decode = pb.StepRequest(step_id=2)
    for i in range(batch):
        decode.sequences.add(id=i, num_tokens=1, sample=True)
    step_ms = _timed_ms(lambda: runner.step(decode), steps)
    graph = runner.graphs.steps[runner.graphs.size_for_batch(batch)]
    replay_ms = _timed_ms(graph.graph.replay, steps)
    runner.step(pb.StepRequest(step_id=3, released_ids=list(range(batch))))
    return {"runner_step_ms": step_ms, "graph_replay_ms": replay_ms, "host_and_idle_ms": step_ms - replay_ms}


def profile(model_dir: Path, batches=(1, 8, 64, 256), context: int = 256, steps: int = 30) -> dict:
    runner, _ = parity_runner(model_dir, graph_sizes=batches)
    results = {}
    for fused in (False, True):
        with fused_kernels(fused):
            runner.graphs.capture(runner.graphs.sizes, runner.kv_cache)
            name = "fused" if fused else "unfused"
            results[name] = {
                "prefill_2048_first_ms": _prefill(runner, [2048], 1000),
                "prefill_2048_ms": sorted(_prefill(runner, [2048], 1000) for _ in range(3))[1],
                "prefill_8x1024_first_ms": _prefill(runner, [1024] * 8, 2000),
                "prefill_8x1024_ms": _prefill(runner, [1024] * 8, 2000),
                "decode": {batch: _decode(runner, batch, context, steps) for batch in batches},
            }
            print(json.dumps({name: results[name]}), flush=True)
    return results


def decode_grid(runner, batches, contexts, steps: int = 20) -> dict:
    """Decode steps by batch and context length: replay (GPU) against the whole runner step."""
    return {f"b{batch}_ctx{context}": _decode(runner, batch, context, steps) for batch in batches for context in contexts}


def mixed_step_ms(runner, decodes: int, context: int, chunk: int) -> float:
    """One eager step: `decodes` decodes at `context` plus one prefill chunk of `chunk` tokens."""
    blocks_each = -(-(context + 4) // runner.block_size)
    _prefill_batch(runner, decodes, context, blocks_each)
    first = decodes * blocks_each
    mixed = pb.StepRequest(step_id=2)
    mixed.new_sequences.add(id=9999, input_ids=[7] * chunk, prompt_len=chunk)
    for i in range(decodes):
        mixed.sequences.add(id=i, num_tokens=1, sample=True)
    mixed.sequences.add(id=9999, num_tokens=chunk, new_block_ids=range(first, first + -(-chunk // runner.block_size)), sample=True)
    ms = _timed_ms(lambda: runner.step(mixed), 1)
    runner.step(pb.StepRequest(step_id=3, released_ids=[*range(decodes), 9999]))
    return ms


def hot_functions(runner, batch: int, context: int, steps: int = 20, top: int = 25) -> str:
    """cProfile of the runner's decode steps: where the host time goes."""
    import cProfile
    import io
    import pstats

    blocks_each = -(-(context + steps + 2) // runner.block_size)
    _prefill_batch(runner, batch, context, blocks_each)
    decode = pb.StepRequest(step_id=2)
    for i in range(batch):
        decode.sequences.add(id=i, num_tokens=1, sample=True)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        runner.step(decode)
    profiler.disable()
    runner.step(pb.StepRequest(step_id=3, released_ids=list(range(batch))))
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("out", type=Path, nargs="?")
    parser.add_argument("--grid", action="store_true", help="decode by batch x context, a mixed step, a host profile")
    parser.add_argument("--batches", default="1,64,256", help="the grid's batch sizes (each captured exactly)")
    parser.add_argument("--contexts", default="256,1024", help="the grid's context lengths")
    args = parser.parse_args()
    if not args.grid:
        data = profile(args.model_dir)
    else:
        batches, contexts = (tuple(int(x) for x in text.split(",")) for text in (args.batches, args.contexts))
        runner, _ = parity_runner(args.model_dir, graph_sizes=batches, memory_fraction=0.85)
        data = {"decode": decode_grid(runner, batches, contexts)}
        print(json.dumps(data), flush=True)
        data["mixed_200x1024_plus_2048_ms"] = [mixed_step_ms(runner, 200, 1024, 2048) for _ in range(2)]
        data["host_profile_b256_ctx1024"] = hot_functions(runner, 256, 1024)
        print(data["host_profile_b256_ctx1024"], flush=True)
    if args.out:
        args.out.write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
