"""Decode-only steps replayed from CUDA graphs, one per padded batch size.

A decode step of B sequences runs the graph of the smallest captured size >= B: its token
ids, positions and attention metadata are copied into the graph's static inputs (padding
rows write no KV slot and attend to nothing), the graph replays, and the first B rows of its
static outputs are the step's results: float32 logits from lm_head, and the greedy token of
each row with its logprob, so a greedy batch needs no kernel outside the graph. One replay
replaces hundreds of kernel launches, which at small batch is most of a step's time.

Graphs share one memory pool and are captured largest first, so the smaller ones reuse its
buffers; the mixed-step graphs (mixed_graphs.py) share it too. They hold the KV pool's
addresses: capture after the final pool is allocated.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from .attention.base import StepLayout
from .device_copy import copy_into
from .kernels.dispatch import use_fused
from .kernels.greedy import fused_greedy
from .kernels.pdl import programmatic_launch

log = logging.getLogger(__name__)

# Up to 512, the largest batch vLLM captures too: under the default 1,024 concurrent requests a
# burst decodes 300-1,000 sequences at once, and an eager step of that size pays ~8 ms of host
# launches over ~4-6 ms of device time (issue 23). Past 256, steps of 64 cost little padding:
# an 8B model's GEMMs stay bound by reading weights to about 400 rows on an H200. No 448: its
# GEMMs ran slower than 512 rows' (mixed_graphs.MIXED_TOKEN_BUCKETS says by how much).
DEFAULT_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 512)


# With fp8 weights, decode graphs of up to this many sequences launch their Triton kernels
# with programmatic dependent launch (`kernels/pdl.py`): each kernel's programs are placed
# while the one before finishes, which pays where a step is ~325 kernels of a few microseconds.
# H200, 8B, ms a step without -> with (bench/results/kernel_profile_pdl_h200.json): fp8 batch 1
# 3.95 -> 3.70, 4 4.44 -> 4.14, 8 4.59 -> 4.48, 16 4.42 -> 4.44, 64 5.22 -> 5.33; bf16 is
# slower with it at every batch to 16 (batch 1 4.64 -> 4.67, 16 5.10 -> 5.54).
PDL_UP_TO_BATCH = 8


def pdl_up_to(quantize: str | None) -> int:
    """The largest decode graph captured with programmatic dependent launch (0: none)."""
    return PDL_UP_TO_BATCH if quantize == "fp8" else 0


def parse_sizes(text: str, flag: str = "--cuda-graphs") -> tuple[int, ...]:
    """TGI's `--cuda-graphs` (and `--cuda-graph-tokens`): comma-separated sizes; "0" disables."""
    try:
        sizes = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated integers, got {text!r}") from None
    if sizes == [0]:
        return ()
    if not sizes or sizes[0] < 1:
        raise ValueError(f"{flag} sizes must be >= 1 (or just 0 to disable), got {text!r}")
    return tuple(sizes)


@dataclass
class CapturedStep:
    size: int
    graph: torch.cuda.CUDAGraph
    input_ids: torch.Tensor  # [size] static inputs
    positions: torch.Tensor
    metadata: object  # the backend's padded metadata, refilled in place
    outputs: DecodeOutputs  # static outputs, [size, ...]


@dataclass
class DecodeOutputs:
    logits: torch.Tensor  # [B, vocab]: float32, or the model dtype from a graph
    greedy_ids: torch.Tensor  # [B] argmax of each row
    greedy_logprobs: torch.Tensor  # [B] log-softmax at the argmax

    def rows(self, count: int) -> DecodeOutputs:
        return DecodeOutputs(self.logits[:count], self.greedy_ids[:count], self.greedy_logprobs[:count])

    def select(self, index: torch.Tensor) -> DecodeOutputs:
        return DecodeOutputs(*(t.index_select(0, index) for t in (self.logits, self.greedy_ids, self.greedy_logprobs)))


def decode_outputs(model, hidden: torch.Tensor) -> DecodeOutputs:
    """lm_head and the greedy choice, in the form a graph can capture. The logits stay in the
    model dtype: a greedy step never reads them, a sampling step upcasts the rows it needs."""
    logits = model.compute_logits(hidden, float32=False)
    if use_fused(logits):
        return DecodeOutputs(logits, *fused_greedy(logits))
    full = logits.float()
    greedy_ids = full.argmax(dim=1)
    chosen = full.gather(1, greedy_ids.unsqueeze(1)).squeeze(1)
    return DecodeOutputs(logits, greedy_ids, chosen - full.logsumexp(dim=1))


class DecodeGraphs:
    def __init__(self, model, backend, block_size: int, max_positions: int, device: torch.device,
                 pdl_up_to: int = 0):  # fmt: skip
        """`pdl_up_to`: graphs of up to this many sequences launch with PDL (`pdl_up_to()`)."""
        if not backend.cuda_graphs:
            raise ValueError(f"the {backend.name} attention backend cannot run from CUDA graphs")
        self.model = model
        self.backend = backend
        self.block_size = block_size
        self.width = -(-max_positions // block_size)  # block-table columns: the longest sequence
        self.device = device
        self.steps: dict[int, CapturedStep] = {}
        self.pool = None
        self.pdl_up_to = pdl_up_to

    @property
    def sizes(self) -> list[int]:
        return sorted(self.steps)

    def capture(self, sizes, kv_cache, pool=None) -> None:
        """Captures one graph per size against `kv_cache` (largest first, one shared pool:
        `pool`, or a new one)."""
        self.release()
        self.pool = pool if pool is not None else torch.cuda.graph_pool_handle()
        for size in sorted(sizes, reverse=True):
            self.capture_size(size, kv_cache)

    def release(self) -> None:
        self.steps.clear()
        self.pool = None

    def capture_size(self, size: int, kv_cache) -> None:
        """Captures the graph of one size into `self.pool` (set by `capture` or the caller)."""
        empty = StepLayout([], [], [], self.block_size)  # all padding: touches no KV slot
        metadata = self.backend.build_metadata(empty, self.device, pad_to=size, width=self.width)
        input_ids = torch.zeros(size, dtype=torch.long, device=self.device)
        positions = torch.zeros(size, dtype=torch.long, device=self.device)
        run = lambda: decode_outputs(self.model, self.model(input_ids, positions, kv_cache, metadata))  # noqa: E731
        # Above pdl_up_to the ambient setting stands (a benchmark's `programmatic_launch`).
        with programmatic_launch(True) if size <= self.pdl_up_to else nullcontext():
            graph, outputs = record_graph(run, self.pool, self.device)
        self.steps[size] = CapturedStep(size, graph, input_ids, positions, metadata, outputs)

    def size_for(self, layout: StepLayout) -> int | None:
        """The graph size that can run this step, or None (not decode-only, too big, too long)."""
        batch = len(layout.query_lens)
        if not self.steps or batch > self.sizes[-1] or any(n != 1 for n in layout.query_lens):
            return None
        if max(layout.context_lens) > self.width * self.block_size:
            return None
        return self.size_for_batch(batch)

    def size_for_batch(self, batch: int) -> int | None:
        return next((size for size in self.sizes if size >= batch), None)

    def run(
        self,
        size: int,
        input_ids: list[int],
        positions: list[int],
        layout: StepLayout,
        fill: Callable[[torch.Tensor], None] | None = None,
    ) -> DecodeOutputs:
        """Replays the graph of `size` on these inputs; `fill` may then write input ids that are
        still on the device (tokens the previous step sampled) into the static input buffer."""
        step = self.steps[size]
        batch = len(input_ids)
        padding = [0] * (size - batch)
        host = torch.tensor([input_ids + padding, positions + padding], dtype=torch.long)
        copy_into(step.input_ids, host[0])
        copy_into(step.positions, host[1])
        if fill is not None:
            fill(step.input_ids)
        self.backend.refill(step.metadata, layout)
        step.graph.replay()
        return step.outputs.rows(batch)


def record_graph(run: Callable[[], object], pool, device: torch.device):
    """(graph, its static outputs) of `run`, captured into `pool` after one eager run."""
    # The eager run compiles kernels and settles lazy allocations outside the capture.
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    # thread_local: under TP, NCCL's watchdog thread polls events while we capture; the
    # default (global) mode would invalidate the capture on its harmless queries.
    with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
        outputs = run()
    return graph, outputs
