"""Warmup: run the worst-case step, then size the KV pool.

The worst case is `max_batch_prefill_tokens` tokens spread over up to `max_batch_size`
sequences, all sampling with every processor active, against a temporary pool just big
enough for it. It runs twice; the second run's time per token is reported, and the router
lets each step take a multiple of it on top of the step timeout. Afterwards the real pool is
sized: on CPU from `--kv-cache-tokens`, on CUDA from the memory left after the step's peak
and the CUDA graphs (measured by one trial capture of the largest decode size and every
mixed-step bucket, in their shared pool), times `--cuda-memory-fraction`. The graphs are then
captured against the real pool, and the objects alive by then are frozen out of the garbage
collector's full passes. In between, the attention backend prepares what a prefill of up to
`max_batch_prefill_tokens` would otherwise build on first use (the triton backend's dense
prefill plans, one per length bucket), and on CUDA a few smaller eager steps follow the worst
case (`eager_step_sizes`), so that the Triton kernel variants a serving step can need are
built before the first request.

With a draft model (`--speculative-model`), one drafting decode follows the worst case (the
draft's kernels, and its catch-up's peak inside the measured one); its KV takes its share of
each block (`ModelRunner.bytes_per_block`), and its graphs are measured and captured beside
the model's, in a pool of their own.
"""

from __future__ import annotations

import atexit
import gc
import time
from dataclasses import dataclass

import logging

import torch

from .cuda_graphs import DecodeGraphs, pdl_up_to
from .draft_model import CATCH_UP_TOKENS, DraftModel
from .mixed_graphs import MIXED_TOKEN_BUCKETS, MixedGraphs, buckets_for, capture_all, graphs_memory_bytes
from .pb import generate_pb2 as pb
from .runner import ModelRunner

CUDA_WIGGLE_ROOM = 0.95  # share of the measured budget handed to the KV pool
# The CPU's warmup step measures nothing (the pool is --kv-cache-tokens), so it is kept to a
# size that runs every code path: prompts of several tokens, sampling with every processor.
# At the default budget (4,096 tokens over 256 sequences) it took 40-100 s on one AVX2 core
# with the demo model, for every start.
CPU_WARMUP_SEQUENCES = 16
CPU_WARMUP_TOKENS = 128
WARMUP_SEED = 1234
DRAFT_WARMUP_TOKENS = 4  # drafts of the warmup's one drafting decode


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PoolSizing:
    kv_cache_tokens: int  # CPU
    cuda_memory_fraction: float  # CUDA
    cuda_graph_sizes: tuple[int, ...] = ()  # decode batch sizes to capture; empty: no graphs
    mixed_token_buckets: tuple[int, ...] = MIXED_TOKEN_BUCKETS  # mixed-step graphs, by token rows


def worst_case_step(
    max_tokens: int, max_batch_size: int, block_size: int, vocab_size: int, max_positions: int
):
    """A StepRequest with `max_tokens` prompt tokens over up to `max_batch_size` sequences,
    plus the number of blocks it needs."""
    tokens = max(1, max_tokens)
    count = max(1, min(max_batch_size, tokens))
    generator = torch.Generator().manual_seed(WARMUP_SEED)
    request = pb.StepRequest(step_id=0)
    next_block = 0
    for index in range(count):
        length = min(tokens // count + (1 if index < tokens % count else 0), max_positions - 1)
        blocks = -(-length // block_size)
        ids = torch.randint(0, vocab_size, (length,), generator=generator).tolist()
        request.new_sequences.add(
            id=index,
            input_ids=ids,
            prompt_len=length,
            sampling=pb.SamplingParameters(
                do_sample=True,
                temperature=0.7,
                top_k=50,
                top_p=0.9,
                typical_p=0.95,
                repetition_penalty=1.1,
                frequency_penalty=0.1,
                presence_penalty=0.1,
                seed=index,
            ),
            top_n_tokens=5,
        )
        request.sequences.add(
            id=index, num_tokens=length, new_block_ids=range(next_block, next_block + blocks), sample=True
        )
        next_block += blocks
    return request, next_block


@dataclass(frozen=True)
class WarmupReport:
    num_blocks: int
    warmup_ms: int  # all of warmup
    step_us: int  # the worst-case step alone, run a second time (kernels built)
    step_tokens: int  # the tokens that step ran


def warmup(runner: ModelRunner, max_tokens: int, max_batch_size: int, sizing: PoolSizing) -> WarmupReport:
    started = time.perf_counter()
    cfg = runner.config
    shape = (runner.block_size, cfg.vocab_size, cfg.max_position_embeddings)
    request, blocks_needed = worst_case_step(max_tokens, max_batch_size, *shape)
    if runner.device.type != "cuda":
        # The pool must still hold the worst case (checked below); the step itself is smaller.
        request, _ = worst_case_step(min(max_tokens, CPU_WARMUP_TOKENS),
                                     min(max_batch_size, CPU_WARMUP_SEQUENCES), *shape)
    runner.clear()
    if runner.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(runner.device)
    warm_drafter = isinstance(runner.drafter, DraftModel)
    draft_prompt, draft_blocks = 0, []
    if warm_drafter:
        draft_prompt = min(max_tokens, CATCH_UP_TOKENS, cfg.max_position_embeddings - DRAFT_WARMUP_TOKENS - 2)
        draft_blocks = list(range(-(-(draft_prompt + 1 + DRAFT_WARMUP_TOKENS) // runner.block_size)))
    runner.allocate_kv_cache(max(blocks_needed, len(draft_blocks)))
    runner.step(request)
    # Again, timed: the router's step deadlines scale with this rate, and the first run's
    # kernel builds (Triton, cuBLAS heuristics) would inflate it many times on a GPU.
    runner.clear()
    step_started = time.perf_counter()
    runner.step(request)  # returns the sampled tokens on the host: the device is done
    step_us = int((time.perf_counter() - step_started) * 1e6)
    if warm_drafter:
        runner.clear()
        _warm_draft_model(runner, draft_prompt, draft_blocks)
    prepared = runner.backend.prepare_prefill(max_tokens, runner.dtype, runner.device)
    if warm_drafter:
        prepared += runner.drafter.model.attention_backend.prepare_prefill(draft_prompt, runner.dtype, runner.device)
    if prepared:
        log.info("prepared %d dense prefill shapes", prepared)
    graphs, sizes = _decode_graphs(runner, sizing.cuda_graph_sizes, max_batch_size)
    mixed, buckets = _mixed_graphs(runner, sizes, max_tokens, sizing.mixed_token_buckets)
    if runner.device.type == "cuda":
        for tokens in eager_step_sizes(max_tokens, max(buckets, default=0)):
            runner.clear()
            runner.step(worst_case_step(tokens, max_batch_size, *shape)[0])
    graph_reserve = graphs_memory_bytes(graphs, mixed, max(sizes), buckets, runner.kv_cache) if graphs else 0
    draft_graphs = graphs is not None and warm_drafter and runner.drafter.model.attention_backend.cuda_graphs
    if draft_graphs:
        graph_reserve += runner.drafter.graphs_memory_bytes()
    runner.clear()
    runner.kv_cache = None
    num_blocks = _pool_blocks(runner, sizing, graph_reserve)
    if num_blocks < blocks_needed:
        sequences = max(1, min(max_batch_size, max_tokens))  # worst_case_step's count
        raise RuntimeError(
            f"the KV pool holds {num_blocks} blocks but one worst-case step ({max_tokens} tokens over "
            f"{sequences} sequences) needs {blocks_needed}; lower --max-batch-prefill-tokens, or "
            "--max-batch-size (default: max_concurrent_requests x max_best_of), or give the KV pool more "
            "memory (--kv-cache-tokens on CPU; on CUDA a larger GPU or a smaller model)"
        )
    runner.allocate_kv_cache(num_blocks)
    if graphs is not None:
        capture_all(graphs, mixed, sizes, buckets, runner.kv_cache)
        runner.graphs, runner.mixed_graphs = graphs, mixed
        if draft_graphs:
            runner.drafter.capture_graphs()
        log.info(
            "captured CUDA graphs for decode batch sizes %s and mixed steps of up to %s tokens "
            "(at most %d sequences) (%d MiB)",
            sizes, buckets, mixed.max_seqs if mixed else 0, graph_reserve >> 20,
        )  # fmt: skip
    _freeze_long_lived_objects()
    step_tokens = sum(sequence.num_tokens for sequence in request.sequences)
    return WarmupReport(num_blocks, int((time.perf_counter() - started) * 1000), step_us, step_tokens)


def eager_step_sizes(max_tokens: int, graphed_up_to: int) -> list[int]:
    """Token counts of the steps warmup also runs eagerly on CUDA, beside the worst case: the
    halvings of `max_tokens` above the largest mixed-graph bucket, each also one token short.
    Triton builds a kernel variant per constexpr set and per specialized integer argument (== 1,
    divisible by 16); the MoE kernels pick their tiles by tokens per expert. Built here, the
    variants an eager step can need no longer stall the first serving step of a new size
    (0.77-1.31 s each on Qwen3-30B-A3B, six times in a two-minute benchmark)."""
    floor = max(graphed_up_to, 1)
    sizes, tokens = [], max_tokens
    while tokens > floor:
        sizes += [size for size in (tokens, tokens - 1) if size > floor and size != max_tokens]
        tokens //= 2
    return sizes


def _warm_draft_model(runner: ModelRunner, prompt_len: int, blocks: list[int]) -> None:
    """A greedy prefill of `prompt_len` tokens, then one decode with drafts (in `blocks`): the
    draft model catches up over the whole prompt in one chunk (its activation peak, measured
    with the rest) and proposes, so its kernels are built before the first request needs them."""
    generator = torch.Generator().manual_seed(WARMUP_SEED)
    ids = torch.randint(0, runner.config.vocab_size, (prompt_len,), generator=generator).tolist()
    prefill = pb.StepRequest(step_id=1)
    prefill.new_sequences.add(id=0, input_ids=ids, prompt_len=prompt_len)
    prefill.sequences.add(id=0, num_tokens=prompt_len, new_block_ids=blocks, sample=True)
    runner.step(prefill)
    decode = pb.StepRequest(step_id=2)
    decode.sequences.add(id=0, num_tokens=1, sample=True, max_draft_tokens=DRAFT_WARMUP_TOKENS)
    runner.step(decode)


def _freeze_long_lived_objects() -> None:
    """Moves every object alive now (modules, tensors' wrappers, imported code: ~200k of them)
    out of the garbage collector's reach. They live as long as the process, and each full
    collection would otherwise walk them all while serving, stalling the step loop (90-180 ms
    for the demo model's shard on a 2-core machine). They are unfrozen at exit, so that the
    interpreter's last collection frees them (else Triton's bindings report them leaked)."""
    gc.collect()
    gc.freeze()
    atexit.unregister(gc.unfreeze)  # registered once however often warmup runs
    atexit.register(gc.unfreeze)


def _decode_graphs(runner: ModelRunner, wanted: tuple[int, ...], max_batch_size: int):
    """(DecodeGraphs, sizes) to capture, or (None, []) when graphs do not apply."""
    runner.graphs = runner.mixed_graphs = None
    if not wanted or runner.device.type != "cuda":
        return None, []
    if not runner.backend.cuda_graphs:
        log.info("CUDA graphs off: the %s attention backend cannot be captured", runner.backend.name)
        return None, []
    # Every size up to the largest batch a step can hold, plus one that covers that batch.
    sizes = [s for s in wanted if s < max_batch_size]
    sizes += [s for s in wanted if s >= max_batch_size][:1]
    cfg = runner.config
    graphs = DecodeGraphs(runner.model, runner.backend, runner.block_size, cfg.max_position_embeddings, runner.device,
                          pdl_up_to(cfg.quantize))  # fmt: skip
    return graphs, sizes


def _mixed_graphs(runner: ModelRunner, sizes: list[int], max_tokens: int, wanted: tuple[int, ...]):
    """(MixedGraphs, token buckets) beside the decode graphs of `sizes`, or (None, []) without
    them. A mixed graph holds as many sequences as the largest decode graph, and the buckets
    stop at the first that covers a step of `max_tokens` (no step is longer)."""
    if not sizes or not wanted:
        return None, []
    cfg = runner.config
    mixed = MixedGraphs(runner.model, runner.backend, runner.block_size, cfg.max_position_embeddings,
                        runner.device, max_seqs=max(sizes))  # fmt: skip
    return mixed, buckets_for(max_tokens, wanted)


def _pool_blocks(runner: ModelRunner, sizing: PoolSizing, reserve: int) -> int:
    per_block = runner.bytes_per_block
    if runner.device.type != "cuda":
        return runner.kv_spec.blocks_for_tokens(sizing.kv_cache_tokens)
    device = runner.device
    torch.cuda.synchronize(device)
    resident = torch.cuda.memory_allocated(device)
    workspace = torch.cuda.max_memory_allocated(device) - resident  # the step's activation peak
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    budget = min(free, total * sizing.cuda_memory_fraction - resident) - workspace - reserve
    log.info("KV pool from device memory (GiB): %.2f total, %.2f free, %.2f resident, %.2f worst-step peak, "
             "%.2f graphs; %.2f to the pool", total / 2**30, free / 2**30, resident / 2**30, workspace / 2**30,
             reserve / 2**30, max(0, budget) * CUDA_WIGGLE_ROOM / 2**30)  # fmt: skip
    return max(0, int(budget * CUDA_WIGGLE_ROOM) // per_block)
