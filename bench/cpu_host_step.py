"""The shard's host work for one decode step, with the device work stubbed out.

A batch of decodes at one context goes through what the shard does on the host for a
graph-replayed step: parse the request, plan and validate it, prepare the inputs, pack the
triton backend's metadata as a graph refill does (block tables `--width` columns wide, as a
model of `--width x 16` positions captures them), and write and serialise the response. The
forward pass is replaced by zeros. Any machine: no GPU, no model.

With `--speculate k` each decode also verifies up to k prompt-lookup drafts, as a mixed graph
replays them: the prompts repeat a `PERIOD`-token cycle and the stub model continues it, so
every draft is kept (the most host work a verification makes: k + 1 tokens a sequence).

    python3 bench/cpu_host_step.py [--batch 256] [--context 1100] [--width 512] [--steps 200] [--speculate 4]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shard_server.attention.base import AttentionShape, StepLayout  # noqa: E402
from shard_server.attention.triton_paged import TritonPagedAttention  # noqa: E402
from shard_server.cuda_graphs import DEFAULT_SIZES, DecodeOutputs  # noqa: E402
from shard_server.kv_cache import KVSpec  # noqa: E402
from shard_server.mixed_graphs import MIXED_TOKEN_BUCKETS  # noqa: E402
from shard_server.models.config import RopeScaling  # noqa: E402
from shard_server.pb import generate_pb2 as pb  # noqa: E402
from shard_server.runner import ModelRunner  # noqa: E402
from shard_server.step_pipeline import StepPipeline, StreamedStep  # noqa: E402

BLOCK = 16
PERIOD = 37  # the prompts' token cycle: prompt lookup drafts its continuation


class StubGraphs:
    """Stands in for DecodeGraphs (`tokens` None) or one bucket of MixedGraphs: the host side of
    a replay, into metadata captured as the real graphs capture it (padded inputs, refill)."""

    def __init__(self, backend: TritonPagedAttention, width: int, size: int, tokens: int | None = None):
        self.backend, self.size, self.tokens = backend, size, tokens
        empty = StepLayout([], [], [], BLOCK)
        pad_to = size if tokens is None else size + 1  # a mixed graph's padding sequence
        self.metadata = backend.build_metadata(empty, torch.device("cpu"), pad_to=pad_to, width=width, tokens=tokens)
        self.inputs = torch.zeros(2 * (tokens or size) + size, dtype=torch.long)
        self.on_replay = lambda: None

    def size_for(self, layout):
        return self.size

    def bucket_for(self, layout, rows=None):
        return self.tokens

    def run(self, size, input_ids, positions, layout, fill, sample_rows=None):
        rows = size if self.tokens is None else self.tokens
        host = np.zeros(2 * rows + self.size, dtype=np.int64)
        host[: len(input_ids)] = input_ids
        host[rows : rows + len(positions)] = positions
        outputs = range(len(layout.query_lens)) if sample_rows is None else sample_rows
        host[2 * rows : 2 * rows + len(outputs)] = outputs
        self.backend.refill(self.metadata, layout)
        self.inputs.copy_(torch.from_numpy(host))
        if fill is not None:
            fill(self.inputs[:rows])
        self.on_replay()
        # The model continues each prompt's cycle, so every draft is the token it chooses.
        ids = torch.tensor([100 + (positions[row] + 1) % PERIOD for row in outputs], dtype=torch.long)
        return DecodeOutputs(torch.zeros(len(ids), 8), ids, torch.zeros(len(ids)))


def stub_runner(batch: int, context: int, width: int, rows: int) -> ModelRunner:
    backend = TritonPagedAttention(AttentionShape(32, 8, 128, 128**-0.5))  # the 8B's heads
    model = SimpleNamespace(config=SimpleNamespace(vocab_size=128256, max_position_embeddings=width * BLOCK,
                                                  rope_scaling=RopeScaling()),
                            attention_backend=backend)  # fmt: skip
    runner = ModelRunner(model, KVSpec(1, 8, 128, BLOCK, torch.bfloat16), torch.device("cpu"))
    runner.kv_cache = SimpleNamespace(num_blocks=batch * width)
    runner.graphs = StubGraphs(backend, width, batch)
    bucket = next(tokens for tokens in MIXED_TOKEN_BUCKETS if tokens >= rows)
    runner.mixed_graphs = StubGraphs(backend, width, min(bucket, max(DEFAULT_SIZES)), bucket)  # seqs as MixedGraphs
    return runner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--context", type=int, default=1100)
    parser.add_argument("--width", type=int, default=512, help="block-table columns of the captured graph")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--speculate", type=int, default=0, help="drafts a decode verifies (0: none)")
    args = parser.parse_args()
    per_step = 1 + args.speculate
    blocks_each = -(-(args.context + (args.steps + 5) * per_step + 16) // BLOCK)
    if blocks_each > args.width:
        parser.error(f"--context {args.context} needs {blocks_each} blocks, more than --width {args.width}")
    runner = stub_runner(args.batch, args.context, args.width, args.batch * per_step)
    prompt = [100 + p % PERIOD for p in range(args.context)]
    start = pb.StepRequest(step_id=1)
    for i in range(args.batch):
        start.new_sequences.add(id=i, input_ids=prompt, prompt_len=args.context,
                                cached_len=args.context - 1, block_ids=range(i * blocks_each, (i + 1) * blocks_each))  # fmt: skip
        start.sequences.add(id=i, num_tokens=1, sample=True)
    runner.step(start)
    decode = pb.StepRequest(step_id=2)
    for i in range(args.batch):
        decode.sequences.add(id=i, num_tokens=1, sample=True, max_draft_tokens=args.speculate)
    wire = decode.SerializeToString()
    timeline = measure(runner, wire, 5 + args.steps)[5:]
    host_ms = 1e3 * (timeline[-1].answered - timeline[0].launched) / (len(timeline) - 1)
    print(json.dumps({"batch": args.batch, "context": args.context, "width": args.width, "speculate": args.speculate,
                      "host_ms_per_step": host_ms, "idle_ms_per_step": mean_idle_ms(timeline),
                      "tokens_per_step": sum(t.tokens for t in timeline) / len(timeline)}))  # fmt: skip


@dataclass
class StepTimes:
    launched: float = 0.0  # the pipeline took the step
    replayed: float = 0.0  # its "graph" was launched
    completing: float = 0.0  # the pipeline began settling it (on a GPU: waiting for it)
    answered: float = 0.0
    tokens: int = 0


def measure(runner: ModelRunner, wire: bytes, steps: int) -> list[StepTimes]:
    """Runs `steps` copies of a step through the shard's StepPipeline as a GPU shard runs them
    (overlapped: step N+1 launched before N is settled), and times each."""
    times = [StepTimes() for _ in range(steps)]
    launching, settling, answering = iter(times), iter(times), iter(times)
    launch, settle_step = runner.launch, runner.settle
    current: list[StepTimes] = []  # the step being launched

    def timed_launch(request, settle=None):
        current[:] = [next(launching)]
        current[0].launched = time.perf_counter()
        return launch(request, settle)

    def timed_settle(launched):
        next(settling).completing = time.perf_counter()
        return settle_step(launched)

    def replayed():
        current[0].replayed = time.perf_counter()

    runner.launch, runner.settle = timed_launch, timed_settle
    runner.graphs.on_replay = runner.mixed_graphs.on_replay = replayed
    finished = threading.Event()

    def on_done(response, error):
        step = next(answering)
        step.answered = time.perf_counter()
        if error is not None:
            raise error
        response.SerializeToString()
        step.tokens = sum(1 + len(output.next_tokens) for output in response.outputs)
        if step is times[-1]:
            finished.set()

    with ThreadPoolExecutor(1) as worker:
        pipeline = StepPipeline(runner, worker, overlap=True)
        for _ in range(steps):
            pipeline.submit(StreamedStep(pb.StepRequest.FromString(wire), on_done))
        finished.wait()
    return times


def mean_idle_ms(timeline: list[StepTimes]) -> float:
    """The GPU's idle time before each step's replay, with steps that take longer on the GPU
    than on the host: from the moment the host began settling the step before (on a GPU, it
    waits there until that step is done) to this step's replay, when that came first; else
    none (the step was queued while the one before ran)."""
    gaps = [max(0.0, now.replayed - before.completing) for before, now in zip(timeline, timeline[1:])]
    return 1e3 * sum(gaps) / len(gaps)


if __name__ == "__main__":
    main()
