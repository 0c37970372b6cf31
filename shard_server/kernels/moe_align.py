"""The fused MoE's alignment: every (token, k) pair of a step grouped by its expert, each group
padded to the grouped GEMMs' row tile (`fused_moe.py`).

`align_to_blocks` does it in torch ops (about twenty launches: the oracle, and the path for more
experts than a program's registers hold). On the GPU a decode batch is one program, and more
pairs go in chunks of 128, one program each, so the work spreads over the GPU instead of growing
one program's loop. All three give the same result: groups in expert order, pairs in pair order
within a group (the stable argsort's), and shapes fixed by (pairs, experts, block_m) alone, so a
CUDA graph captures them with no `.item()` and no host sync.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .dispatch import next_power_of_two, use_fused


def block_count(pairs: int, experts: int, block_m: int) -> int:
    """Row tiles of the aligned pairs, from the shapes alone: every hit expert (at most
    min(experts, pairs)) may pad its group by up to block_m - 1 rows."""
    return triton.cdiv(pairs + min(experts, pairs) * (block_m - 1), block_m)


def align_to_blocks(topk_ids: torch.Tensor, experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The (token, k) pairs (flat index t * top_k + k) grouped by expert, each group padded to a
    multiple of block_m: (sorted_pairs int32 [blocks * block_m], block_expert int32 [blocks]).
    Padding entries hold `pairs` (one past the last pair); a block past the last group has
    expert -1. `blocks` is `block_count`'s: the shapes' alone."""
    flat = topk_ids.reshape(-1)
    pairs, device = flat.numel(), flat.device
    blocks = block_count(pairs, experts, block_m)
    counts = torch.zeros(experts, dtype=torch.int64, device=device).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    order = torch.argsort(flat, stable=True)  # by expert, in pair order within one
    expert_of = flat[order]
    rank_in_group = torch.arange(pairs, device=device) - (torch.cumsum(counts, 0) - counts)[expert_of]
    dest = (padded_end - padded)[expert_of] + rank_in_group
    sorted_pairs = torch.full((blocks * block_m,), pairs, dtype=torch.int32, device=device)
    sorted_pairs.scatter_(0, dest, order.to(torch.int32))
    # A block's expert: the group holding its first row (empty groups end where they start).
    starts = torch.arange(blocks, device=device) * block_m
    block_expert = torch.searchsorted(padded_end, starts, right=True).to(torch.int32)
    block_expert = torch.where(block_expert < experts, block_expert, -1)
    return sorted_pairs, block_expert


# One program aligns up to this many pairs (small decode batches): every pair at once, sorted in
# registers (`_align_sorted_kernel`). Past it the pairs are aligned in chunks, one program each
# (`_align_in_chunks`). On an H100 at Qwen3-30B-A3B's routing (bench/results/moe_align_h100.json,
# moe_align_sorted_h100.json): the sorting program 6.2 us at 40 pairs, 8.7-8.8 at 136-256; the
# counting sort one program had before it 8.5 and 14.6-14.8; the chunks 12.6-15.8 us from 40 to
# 4,096 pairs, 28.5 at 32,768; the torch ops 54-140 us.
ALIGN_IN_ONE_PROGRAM_UP_TO = 256
ALIGN_CHUNK = 128  # pairs a step of the chunk programs' loops: [chunk, experts] compares
ALIGN_MAX_EXPERTS = 256  # a [chunk, experts] compare in one program's registers
ALIGN_LAYOUT_CELLS = 4096  # [chunks, experts] counts the layout program scans at a time


def align_pairs(topk_ids: torch.Tensor, experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`align_to_blocks`' result in one launch for a decode batch (`_align_in_one_program`), in
    three and a fill for more pairs (`_align_in_chunks`), instead of about twenty small torch ops,
    whose launches cost a decode step more than its GEMMs."""
    flat = topk_ids.reshape(-1)
    pairs = flat.numel()
    if pairs == 0 or experts > ALIGN_MAX_EXPERTS or not use_fused(flat):
        return align_to_blocks(topk_ids, experts, block_m)
    blocks = block_count(pairs, experts, block_m)
    if pairs > ALIGN_IN_ONE_PROGRAM_UP_TO:
        return _align_in_chunks(flat, experts, block_m, blocks)
    return _align_in_one_program(flat, experts, block_m, blocks)


def _align_in_one_program(flat: torch.Tensor, experts: int, block_m: int, blocks: int
                          ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """One program, up to ALIGN_IN_ONE_PROGRAM_UP_TO pairs: every pair sorted in registers."""
    pairs = flat.numel()
    sorted_pairs = torch.empty(blocks * block_m, dtype=torch.int32, device=flat.device)
    block_expert = torch.empty(blocks, dtype=torch.int32, device=flat.device)
    _align_sorted_kernel[(1,)](flat, sorted_pairs, block_expert, pairs, experts, blocks, BLOCK_M=block_m,
                               EXPERTS_POW2=next_power_of_two(experts),
                               PAIRS_POW2=next_power_of_two(ALIGN_IN_ONE_PROGRAM_UP_TO),
                               CHUNK=ALIGN_CHUNK, num_warps=4)  # fmt: skip
    return sorted_pairs, block_expert


def _align_in_chunks(flat: torch.Tensor, experts: int, block_m: int, blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The counting sort spread over the GPU: every chunk of pairs counts its experts; one program
    turns the counts into each group's start and each chunk's offset inside every group; every
    chunk then places its pairs (in pair order within a group, as the stable argsort does)."""
    pairs, device = flat.numel(), flat.device
    chunks = triton.cdiv(pairs, ALIGN_CHUNK)
    experts_pow2 = next_power_of_two(experts)
    counts = torch.empty(chunks, experts, dtype=torch.int32, device=device)
    chunk_base = torch.empty_like(counts)  # a chunk's first slot in each group, from the group's start
    group_start = torch.empty(experts, dtype=torch.int32, device=device)
    sorted_pairs = torch.full((blocks * block_m,), pairs, dtype=torch.int32, device=device)  # padding: `pairs`
    block_expert = torch.empty(blocks, dtype=torch.int32, device=device)
    _chunk_counts_kernel[(chunks,)](flat, counts, pairs, experts, EXPERTS_POW2=experts_pow2, CHUNK=ALIGN_CHUNK)
    _chunk_layout_kernel[(1,)](counts, chunk_base, group_start, block_expert, chunks, experts, blocks,
                               BLOCK_M=block_m, EXPERTS_POW2=experts_pow2,
                               ROWS=max(1, ALIGN_LAYOUT_CELLS // experts_pow2), CHUNK=ALIGN_CHUNK)  # fmt: skip
    _chunk_scatter_kernel[(chunks,)](flat, chunk_base, group_start, sorted_pairs, pairs, experts, CHUNK=ALIGN_CHUNK)
    return sorted_pairs, block_expert


@triton.jit
def _store_block_experts(block_expert_ptr, ends, EXPERTS, BLOCKS, BLOCK_M: tl.constexpr, EXPERTS_POW2: tl.constexpr,
                         CHUNK: tl.constexpr):  # fmt: skip
    """Each row tile's expert: the group holding its first row (`ends`: the padded groups' ends;
    empty groups end where they start), -1 past the last group."""
    experts = tl.arange(0, EXPERTS_POW2)
    for b0 in range(0, BLOCKS, CHUNK):
        block = b0 + tl.arange(0, CHUNK)
        ended = (ends[None, :] <= (block * BLOCK_M)[:, None]) & (experts < EXPERTS)[None, :]
        owner = tl.sum(ended.to(tl.int32), axis=1)
        tl.store(block_expert_ptr + block, tl.where(owner < EXPERTS, owner, -1), mask=block < BLOCKS)


@triton.jit
def _fill_padding(sorted_ptr, PAIRS, SLOTS, CHUNK: tl.constexpr):
    """Every slot holds PAIRS (one past the last pair: padding) until a pair is placed there."""
    for s0 in range(0, SLOTS, CHUNK):
        slot = s0 + tl.arange(0, CHUNK)
        tl.store(sorted_ptr + slot, tl.zeros((CHUNK,), tl.int32) + PAIRS, mask=slot < SLOTS)


@triton.jit(do_not_specialize=["PAIRS"])
def _chunk_counts_kernel(ids_ptr, counts_ptr, PAIRS, EXPERTS, EXPERTS_POW2: tl.constexpr, CHUNK: tl.constexpr):
    chunk = tl.program_id(0)
    pair = chunk * CHUNK + tl.arange(0, CHUNK)
    ids = tl.load(ids_ptr + pair, mask=pair < PAIRS, other=-1).to(tl.int32)
    experts = tl.arange(0, EXPERTS_POW2)
    counts = tl.sum((ids[:, None] == experts[None, :]).to(tl.int32), axis=0)
    tl.store(counts_ptr + chunk * EXPERTS + experts, counts, mask=experts < EXPERTS)


@triton.jit(do_not_specialize=["CHUNKS", "BLOCKS"])
def _chunk_layout_kernel(counts_ptr, chunk_base_ptr, group_start_ptr, block_expert_ptr, CHUNKS, EXPERTS, BLOCKS,
                         BLOCK_M: tl.constexpr, EXPERTS_POW2: tl.constexpr, ROWS: tl.constexpr,
                         CHUNK: tl.constexpr):  # fmt: skip
    experts = tl.arange(0, EXPERTS_POW2)
    expert_ok = experts < EXPERTS
    before = tl.zeros((EXPERTS_POW2,), tl.int32)  # each expert's pairs in the chunks scanned so far
    for c0 in range(0, CHUNKS, ROWS):
        rows = c0 + tl.arange(0, ROWS)
        cells = rows[:, None] * EXPERTS + experts[None, :]
        ok = (rows < CHUNKS)[:, None] & expert_ok[None, :]
        counts = tl.load(counts_ptr + cells, mask=ok, other=0)
        tl.store(chunk_base_ptr + cells, tl.cumsum(counts, axis=0) - counts + before[None, :], mask=ok)
        before += tl.sum(counts, axis=0)
    padded = (before + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, axis=0)
    tl.store(group_start_ptr + experts, ends - padded, mask=expert_ok)
    _store_block_experts(block_expert_ptr, ends, EXPERTS, BLOCKS, BLOCK_M, EXPERTS_POW2, CHUNK)


@triton.jit(do_not_specialize=["PAIRS"])
def _chunk_scatter_kernel(ids_ptr, chunk_base_ptr, group_start_ptr, sorted_ptr, PAIRS, EXPERTS,
                          CHUNK: tl.constexpr):  # fmt: skip
    chunk = tl.program_id(0)
    pair = chunk * CHUNK + tl.arange(0, CHUNK)
    pair_ok = pair < PAIRS
    ids = tl.load(ids_ptr + pair, mask=pair_ok, other=-1).to(tl.int32)
    base = tl.load(chunk_base_ptr + chunk * EXPERTS + ids, mask=pair_ok, other=0)
    base += tl.load(group_start_ptr + ids, mask=pair_ok, other=0)
    earlier = tl.arange(0, CHUNK)[None, :] < tl.arange(0, CHUNK)[:, None]
    rank = tl.sum(((ids[:, None] == ids[None, :]) & earlier).to(tl.int32), axis=1)  # same expert, earlier
    tl.store(sorted_ptr + base + rank, pair, mask=pair_ok)


@triton.jit(do_not_specialize=["PAIRS", "BLOCKS"])  # counts that vary step to step: one build
def _align_sorted_kernel(ids_ptr, sorted_ptr, block_expert_ptr, PAIRS, EXPERTS, BLOCKS, BLOCK_M: tl.constexpr,
                         EXPERTS_POW2: tl.constexpr, PAIRS_POW2: tl.constexpr, CHUNK: tl.constexpr):  # fmt: skip
    # Every pair at once: its expert's count (a histogram), the groups laid out, the pairs sorted
    # by (expert, pair) in registers; the pair at sorted position p goes to its group's padded
    # start plus p minus the group's unpadded start (so a group keeps pair order).
    pair = tl.arange(0, PAIRS_POW2)
    pair_ok = pair < PAIRS
    ids = tl.load(ids_ptr + pair, mask=pair_ok, other=0).to(tl.int32)
    counts = tl.histogram(ids, EXPERTS_POW2, mask=pair_ok)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, axis=0)
    firsts = tl.cumsum(counts, axis=0) - counts
    order = tl.sort(tl.where(pair_ok, ids, EXPERTS_POW2) * PAIRS_POW2 + pair)  # past the pairs: none
    expert = tl.where(pair_ok, order // PAIRS_POW2, 0)
    slot = tl.gather(ends - padded, expert, 0) + pair - tl.gather(firsts, expert, 0)
    _fill_padding(sorted_ptr, PAIRS, BLOCKS * BLOCK_M, CHUNK)
    tl.debug_barrier()  # the padding is written before the pairs overwrite some of it
    tl.store(sorted_ptr + slot, order % PAIRS_POW2, mask=pair_ok)
    _store_block_experts(block_expert_ptr, ends, EXPERTS, BLOCKS, BLOCK_M, EXPERTS_POW2, CHUNK)
