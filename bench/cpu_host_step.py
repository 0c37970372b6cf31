"""The shard's host work for one decode step, with the device work stubbed out.

A batch of decodes at one context goes through what the shard does on the host for a
graph-replayed step: parse the request, plan and validate it, prepare the inputs, pack the
triton backend's metadata as a graph refill does (block tables `--width` columns wide, as a
model of `--width x 16` positions captures them), and write and serialise the response. The
forward pass is replaced by zeros. Any machine: no GPU, no model.

    python3 bench/cpu_host_step.py [--batch 256] [--context 1100] [--width 512] [--steps 200]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shard_server.attention.base import AttentionShape  # noqa: E402
from shard_server.attention.triton_paged import TritonPagedAttention  # noqa: E402
from shard_server.cuda_graphs import DecodeOutputs  # noqa: E402
from shard_server.kv_cache import KVSpec  # noqa: E402
from shard_server.models.config import RopeScaling  # noqa: E402
from shard_server.pb import generate_pb2 as pb  # noqa: E402
from shard_server.runner import ModelRunner  # noqa: E402

BLOCK = 16


class StubGraphs:
    """Stands in for DecodeGraphs: the host side of a replay (padded inputs, metadata refill)."""

    def __init__(self, backend: TritonPagedAttention, width: int, size: int):
        self.backend, self.width, self.size = backend, width, size

    def size_for(self, layout):
        return self.size

    def run(self, size, input_ids, positions, layout, fill):
        padding = [0] * (size - len(input_ids))
        torch.tensor([input_ids + padding, positions + padding], dtype=torch.long)
        if fill is not None:
            fill(torch.zeros(size, dtype=torch.long))
        self.backend._pack(layout, size, self.width, only_used_columns=True)
        rows = len(input_ids)
        return DecodeOutputs(torch.zeros(rows, 8), torch.zeros(rows, dtype=torch.long), torch.zeros(rows))


def stub_runner(batch: int, context: int, width: int) -> ModelRunner:
    backend = TritonPagedAttention(AttentionShape(32, 8, 128, 128**-0.5))  # the 8B's heads
    model = SimpleNamespace(config=SimpleNamespace(vocab_size=128256, max_position_embeddings=width * BLOCK,
                                                  rope_scaling=RopeScaling()),
                            attention_backend=backend)  # fmt: skip
    runner = ModelRunner(model, KVSpec(1, 8, 128, BLOCK, torch.bfloat16), torch.device("cpu"))
    runner.kv_cache = SimpleNamespace(num_blocks=batch * width)
    runner.graphs = StubGraphs(backend, width, batch)
    return runner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--context", type=int, default=1100)
    parser.add_argument("--width", type=int, default=512, help="block-table columns of the captured graph")
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    blocks_each = -(-(args.context + args.steps + 16) // BLOCK)
    if blocks_each > args.width:
        parser.error(f"--context {args.context} needs {blocks_each} blocks, more than --width {args.width}")
    runner = stub_runner(args.batch, args.context, args.width)
    start = pb.StepRequest(step_id=1)
    for i in range(args.batch):
        start.new_sequences.add(id=i, input_ids=[100 + i] * args.context, prompt_len=args.context,
                                cached_len=args.context - 1, block_ids=range(i * blocks_each, (i + 1) * blocks_each))  # fmt: skip
        start.sequences.add(id=i, num_tokens=1, sample=True)
    runner.step(start)
    decode = pb.StepRequest(step_id=2)
    for i in range(args.batch):
        decode.sequences.add(id=i, num_tokens=1, sample=True)
    wire = decode.SerializeToString()

    def one_step() -> None:
        runner.step(pb.StepRequest.FromString(wire)).SerializeToString()

    for _ in range(5):
        one_step()
    began = time.perf_counter()
    for _ in range(args.steps):
        one_step()
    ms = 1e3 * (time.perf_counter() - began) / args.steps
    print(json.dumps({"batch": args.batch, "context": args.context, "width": args.width, "host_ms_per_step": ms}))


if __name__ == "__main__":
    main()
