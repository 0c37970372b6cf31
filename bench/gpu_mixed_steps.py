"""What a mixed step (one fresh prompt chunk beside running decodes) costs by its token count,
replayed from a CUDA graph of exactly its size and run eagerly, in-process on the 8B model
(issue 23): the data behind the token buckets of shard_server/mixed_graphs.py.

For each case (D decodes at context C) and step sizes T (D decodes + a chunk of T - D tokens):
  graph_ms   the runner's whole step (host planning, copies, replay, sampling) on the graph of
             bucket T, so no padding
  eager_ms   the same step with the mixed graphs off
  replay_ms  the graph's replay alone (device time)
A step of T tokens in a bucket b >= T costs about graph_ms(b): padding's price is read off the
curve, and where eager_ms meets graph_ms a bucket stops paying for its capture.

    python3 bench/gpu_mixed_steps.py MODEL_DIR OUT_JSON
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gpu_parity import parity_runner  # noqa: E402
from bench.gpu_step_profile import _prefill_batch, _timed_ms  # noqa: E402
from shard_server.cuda_graphs import DEFAULT_SIZES  # noqa: E402
from shard_server.pb import generate_pb2 as pb  # noqa: E402

EVERY_64 = tuple(range(64, 2049, 64))
CASES = ((48, 512), (128, 512))  # (decodes, context): a light and a heavy Poisson batch
REPEATS = 3


def _mixed_request(decodes: int, seq_id: int, chunk: int, first_block: int, block_size: int) -> pb.StepRequest:
    request = pb.StepRequest(step_id=2)
    request.new_sequences.add(id=seq_id, input_ids=[(7 + 13 * j) % 30000 for j in range(chunk)], prompt_len=chunk)
    for i in range(decodes):
        request.sequences.add(id=i, num_tokens=1, sample=True)
    blocks = range(first_block, first_block + -(-chunk // block_size))
    request.sequences.add(id=seq_id, num_tokens=chunk, new_block_ids=blocks, sample=True)
    return request


def _step_ms(runner, decodes: int, chunk: int, first_block: int, seq_ids) -> float:
    """Median ms of REPEATS mixed steps, each with a fresh prompt (released after)."""
    times = []
    for _ in range(REPEATS):
        seq_id = next(seq_ids)
        request = _mixed_request(decodes, seq_id, chunk, first_block, runner.block_size)
        times.append(_timed_ms(lambda: runner.step(request), 1))
        runner.step(pb.StepRequest(step_id=3, released_ids=[seq_id]))
    return sorted(times)[len(times) // 2]


def run_case(runner, decodes: int, context: int, totals) -> dict:
    steps = len(totals) * 2 * REPEATS + 16
    blocks_each = -(-(context + steps) // runner.block_size)
    _prefill_batch(runner, decodes, context, blocks_each)
    first_block = decodes * blocks_each
    decode = pb.StepRequest(step_id=2)
    for i in range(decodes):
        decode.sequences.add(id=i, num_tokens=1, sample=True)
    out = {"decode_ms": sorted(_timed_ms(lambda: runner.step(decode), 1) for _ in range(5))[2], "rows": []}
    seq_ids = iter(range(100_000, 10**9))
    graphs = runner.mixed_graphs
    for total in totals:
        chunk = total - decodes
        if chunk < 1:
            continue
        row = {"tokens": total, "chunk": chunk}
        assert graphs.bucket_for(_layout(runner, decodes, context, chunk)) == total, total
        row["graph_ms"] = _step_ms(runner, decodes, chunk, first_block, seq_ids)
        row["replay_ms"] = _timed_ms(graphs.steps[total].graph.replay, 5)
        runner.mixed_graphs = None
        try:
            row["eager_ms"] = _step_ms(runner, decodes, chunk, first_block, seq_ids)
        finally:
            runner.mixed_graphs = graphs
        out["rows"].append(row)
        print(json.dumps({"decodes": decodes, **row}), flush=True)
    runner.step(pb.StepRequest(step_id=3, released_ids=list(range(decodes))))
    return out


def _layout(runner, decodes: int, context: int, chunk: int):
    """The shape bucket_for reads (query and context lengths; tables unused there)."""
    from shard_server.attention.base import StepLayout

    return StepLayout([1] * decodes + [chunk], [context + 1] * decodes + [chunk], [[]] * (decodes + 1),
                      runner.block_size)  # fmt: skip


def main() -> None:
    model_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    runner, _ = parity_runner(model_dir, graph_sizes=DEFAULT_SIZES, memory_fraction=0.85, mixed_buckets=EVERY_64)
    data = {"buckets": list(EVERY_64), "repeats": REPEATS, "cases": {}}
    for decodes, context in CASES:
        data["cases"][f"d{decodes}_ctx{context}"] = run_case(runner, decodes, context, EVERY_64)
        out.write_text(json.dumps(data, indent=1))
    print(f"{'case':>12} {'T':>5} {'graph':>7} {'replay':>7} {'eager':>7}")
    for name, case in data["cases"].items():
        print(f"{name:>12} decode-only {case['decode_ms']:.2f} ms")
        for r in case["rows"]:
            print(f"{name:>12} {r['tokens']:>5} {r['graph_ms']:7.2f} {r['replay_ms']:7.2f} {r['eager_ms']:7.2f}")


if __name__ == "__main__":
    main()
