"""Mixed steps (prefill chunks beside decodes) replayed from CUDA graphs, one per token bucket.

Under continuous arrivals nearly every step that admits a request carries a prompt chunk
beside the running decodes; run eagerly, such a step pays the host launch overhead of hundreds
of kernels (on an H200 with an 8B model: 15.7 ms against 7.8 ms for the graphed decode step
of the same batch, issue 23). A step of up to `tokens` tokens over up to `seqs` sequences
replays the graph of the smallest bucket that holds it: its token rows are padded to the
bucket (padding rows write no KV slot and belong to no sequence), its sequences padded with
zero-length ones, and each attention launch's tile list to a fixed count (the backend's
`build_metadata(..., tokens=...)`), so the grids never change. The graph gathers each real
sequence's last token row (`sample_rows`) before lm_head: its outputs have one row per
sequence, as `DecodeGraphs.run` gives them. A step verifying drafts (speculative decoding)
names its rows instead: every row of a verification, the last of any other sequence.

The graphs share the decode graphs' memory pool; `capture_all` captures every graph largest
first, so the pool is about the largest graph's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from .attention.base import StepLayout
from .cuda_graphs import DecodeGraphs, DecodeOutputs, decode_outputs, record_graph
from .device_copy import copy_into

# Token buckets of the mixed graphs, measured on an H200 with an 8B model
# (bench/results/gpu_mixed_steps_h200.json). A step admitting a request is its running decodes
# (tens to a few hundred) plus a prompt chunk. Past ~256 tokens a step is bound by the GEMMs'
# arithmetic (~20 us per token), so padding to the next bucket costs in proportion: with
# buckets 128/256/512 a 350-token step paid ~3 ms for its padding. No 448: a 448-token step
# took 18.7 ms against 15.6 at 512 (the GEMMs' tiling at that row count). Up to 1,024 too:
# alone an eager step past 512 tokens costs what its graph does, but in a serving shard its
# host launches compete with the gRPC threads: under 32 req/s of Poisson arrivals, eager steps
# of 513-1,024 tokens took 31.9 ms of device time against ~21 ms for their graphs, and they
# were 20 % of what the running streams waited on (router step records, issue 23). Past
# 1,024 the device time hides the launches, and the dense prefill path runs big prompts faster
# than a graph's paged tiles (1,536 tokens: 38.3 ms eager, 42.2 graphed). Below 64: 8 and 16
# keep a speculative verification at a small batch (1 + k rows a sequence) on the skinny
# matmuls, which take up to 16 rows; at 64 rows cuBLAS streams the weights more slowly (on an
# H100 at batch 1 with `--speculate 4`, steps that verified took 8.96 ms against 6.16 for a plain
# decode, bench/results/speculation_h100.json); 32 halves the padding of up to 8 verifications.
MIXED_TOKEN_BUCKETS = (8, 16, 32, 64, 128, 192, 256, 320, 384, 512, 640, 768, 896, 1024)


def buckets_for(max_tokens: int, buckets: tuple[int, ...] = MIXED_TOKEN_BUCKETS) -> list[int]:
    """The buckets a step of at most `max_tokens` tokens can use: those below, and one covering it."""
    chosen = [b for b in sorted(buckets) if b < max_tokens]
    return chosen + [b for b in sorted(buckets) if b >= max_tokens][:1]


@dataclass
class MixedStep:
    tokens: int  # token rows
    seqs: int  # real sequences at most (the metadata holds one more, for padding tiles)
    graph: torch.cuda.CUDAGraph
    inputs: torch.Tensor  # [2 * tokens + seqs]: input ids, positions, sample rows (one copy)
    metadata: object
    outputs: DecodeOutputs  # [seqs, ...]

    @property
    def input_ids(self) -> torch.Tensor:
        return self.inputs[: self.tokens]

    @property
    def positions(self) -> torch.Tensor:
        return self.inputs[self.tokens : 2 * self.tokens]

    @property
    def sample_rows(self) -> torch.Tensor:
        return self.inputs[2 * self.tokens :]


class MixedGraphs:
    def __init__(self, model, backend, block_size: int, max_positions: int, device: torch.device, max_seqs: int):
        """`max_seqs`: the most sequences a mixed graph holds (the largest decode graph's size)."""
        if not backend.cuda_graphs:
            raise ValueError(f"the {backend.name} attention backend cannot run from CUDA graphs")
        self.model = model
        self.backend = backend
        self.block_size = block_size
        self.width = -(-max_positions // block_size)
        self.device = device
        self.max_seqs = max_seqs
        self.steps: dict[int, MixedStep] = {}
        self.pool = None

    @property
    def buckets(self) -> list[int]:
        return sorted(self.steps)

    def seqs_for(self, tokens: int) -> int:
        return min(tokens, self.max_seqs)  # every real sequence has at least one token

    def release(self) -> None:
        self.steps.clear()
        self.pool = None

    def capture_bucket(self, tokens: int, kv_cache) -> None:
        """Captures the graph of one bucket into `self.pool` (set by the caller)."""
        seqs = self.seqs_for(tokens)
        empty = StepLayout([], [], [], self.block_size)  # all padding: touches no KV slot
        metadata = self.backend.build_metadata(empty, self.device, pad_to=seqs + 1, width=self.width, tokens=tokens)
        inputs = torch.zeros(2 * tokens + seqs, dtype=torch.long, device=self.device)
        ids, positions, rows = inputs[:tokens], inputs[tokens : 2 * tokens], inputs[2 * tokens :]

        def run():
            hidden = self.model(ids, positions, kv_cache, metadata)
            return decode_outputs(self.model, hidden.index_select(0, rows))

        graph, outputs = record_graph(run, self.pool, self.device)
        self.steps[tokens] = MixedStep(tokens, seqs, graph, inputs, metadata, outputs)

    def bucket_for(self, layout: StepLayout, rows: int | None = None) -> int | None:
        """The smallest bucket that holds this step and its `rows` output rows (default: one per
        sequence), or None (too many tokens, sequences or rows, or a context past the captured
        width)."""
        batch = len(layout.query_lens)
        if not self.steps or not batch or max(layout.context_lens) > self.width * self.block_size:
            return None
        tokens, rows = layout.num_tokens, max(batch, rows or 0)
        return next((t for t in self.buckets if tokens <= t and rows <= self.steps[t].seqs), None)

    def run(
        self,
        tokens: int,
        input_ids: list[int],
        positions: list[int],
        layout: StepLayout,
        fill: Callable[[torch.Tensor], None] | None = None,
        sample_rows: list[int] | None = None,
    ) -> DecodeOutputs:
        """Replays the graph of bucket `tokens`; one output row per sequence of `layout`, in
        order, or one per token row in `sample_rows` when given. `fill` may write input ids
        still on the device into the static input ids."""
        step = self.steps[tokens]
        rows = np.cumsum(layout.query_lens) - 1 if sample_rows is None else sample_rows  # last rows
        host = np.zeros(2 * step.tokens + step.seqs, dtype=np.int64)
        host[: len(input_ids)] = input_ids
        host[step.tokens : step.tokens + len(positions)] = positions
        host[2 * step.tokens : 2 * step.tokens + len(rows)] = rows
        self.backend.refill(step.metadata, layout)  # first: refuses a layout that does not fit
        copy_into(step.inputs, torch.from_numpy(host))
        if fill is not None:
            fill(step.input_ids)
        step.graph.replay()
        return step.outputs.rows(len(rows))


def capture_all(decode: DecodeGraphs, mixed: MixedGraphs | None, sizes, buckets, kv_cache) -> None:
    """Captures the decode graphs of `sizes` and the mixed ones of `buckets` into one pool,
    largest (in token rows) first, so the smaller ones reuse its buffers."""
    decode.release()
    pool = torch.cuda.graph_pool_handle()
    decode.pool = pool
    plan = [(size, 0, decode.capture_size) for size in sizes]
    if mixed is not None:
        mixed.release()
        mixed.pool = pool
        # A mixed bucket sorts before the decode size of as many rows: same activations, and
        # prefill tiles on top.
        plan += [(tokens, 1, mixed.capture_bucket) for tokens in buckets]
    for rows, _, capture in sorted(plan, key=lambda item: item[:2], reverse=True):
        capture(rows, kv_cache)


def graphs_memory_bytes(decode: DecodeGraphs, mixed: MixedGraphs | None, size: int, buckets, kv_cache) -> int:
    """Device memory of a trial capture of the largest decode graph and every mixed graph: the
    shared pool (about the largest graph's) plus each mixed graph's own static outputs."""
    device = decode.device
    torch.cuda.synchronize(device)
    # Each capture starts by emptying the allocator's cache (torch.cuda.graph.__enter__), so
    # the warmup step's cached activations must be returned before the first reading: else
    # they are given back mid-measurement and the difference is negative (read as 0 MiB).
    torch.cuda.empty_cache()
    free_before, _ = torch.cuda.mem_get_info(device)
    capture_all(decode, mixed, [size], buckets, kv_cache)
    torch.cuda.synchronize(device)
    free_after, _ = torch.cuda.mem_get_info(device)
    decode.release()
    if mixed is not None:
        mixed.release()
    torch.cuda.empty_cache()
    return max(0, free_before - free_after)
