"""GPTQ / AWQ / pack-quantized experts of a decode batch, pair by pair: `moe_pairs.py`'s scheme
on packed weights (`layers/packed_experts.py`), no sort, no padding, two launches.

- gate_up: a program per (pair, slice of intermediate features) runs its token's row through the
  slice's packed gate and up columns of the pair's expert and writes silu(gate) * up;
- down: a program per (token, slice of hidden features) runs the token's k pairs through their
  experts' packed down columns in turn, each output rounded to the model dtype and weighted in
  float32 in k order (the grouped path's order), rounded once.

Each product is one activation row against packed words on the CUDA cores
(`w4a16_row.row_times_packed`: every value taken where it lies in its word, no tensor-core tile
padded from one row to 16). The grouped kernel (`fused_moe_packed.py`) pads each pair to a
16-row tile: at one token of Qwen3-30B-A3B on an H100 it streamed the packed experts at ~13 % of
the copy bandwidth (bench/results/gpu_moe_qwen3_30b_gptq_h100.md).

Numerics: the row products are the quantized weight's exactly ((q - zero) * scale in float32);
the reference and the grouped kernel round each weight to the activations' dtype first, a
difference within one rounding of the outputs. Each K step must lie in one group: act-order
experts take the grouped kernel.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import triton
import triton.language as tl

from .fused_moe import DTYPES, silu_times_up
from .moe_pairs import MAX_PAIRS_PER_EXPERT
from .pdl import launch_args, wait_for_previous_kernel
from .w4a16_row import W4A16Row, near_top_applies, row_tile_for, row_times_packed

# One MoE layer of random GPTQ Qwen3-30B-A3B experts, replayed from a CUDA graph on an H100
# (bench/results/moe_pairs_packed_tiles_h100.json, bench/gpu_moe_pairs_packed.py): with the
# tiles below, 2 tokens 61.5 us against the grouped kernel's 91.3, 4 tokens 71.7 against 140.1;
# but 1 token 59.6 against 56.9, so a lone token takes the grouped kernel. (With the first,
# untuned tiles, 76.8 us at one token, the served batch 1 fell from 203 to 165 tok/s,
# bench/results/gpu_moe_qwen3_30b_gptq_pairs_h100.md.) At one token both are latency-bound,
# ~6 % of the copy bandwidth. PACKED_PAIRS off: never this path (a profile's A/B).
PACKED_PAIRS = True
MIN_TOKENS = 2
GATE_UP_TILE = W4A16Row(block_n=32, words=16, num_warps=4, num_stages=2, near_top=True)
DOWN_TILE = W4A16Row(block_n=32, words=16, num_warps=4, num_stages=2, near_top=True)


def _tiles(gate_up, down) -> tuple[W4A16Row | None, W4A16Row | None]:
    """The tiles fitted to the experts' groups (None where they are not contiguous)."""
    return (row_tile_for(GATE_UP_TILE, gate_up.out_features, gate_up.in_features, gate_up.bits, gate_up.group_rows),
            row_tile_for(DOWN_TILE, down.out_features, down.in_features, down.bits, down.group_rows))  # fmt: skip


def packed_pairs_apply(x: torch.Tensor, gate_up, down, topk_ids: torch.Tensor) -> bool:
    """With PACKED_PAIRS: a batch of MIN_TOKENS or more with no more pairs than a quarter of the
    experts, float activations, experts whose groups are contiguous."""
    tokens = topk_ids.shape[0] if topk_ids.dim() == 2 else 0
    few = PACKED_PAIRS and tokens >= MIN_TOKENS and topk_ids.numel() <= MAX_PAIRS_PER_EXPERT * gate_up.experts
    return few and x.dim() == 2 and x.dtype in DTYPES and None not in _tiles(gate_up, down)


@triton.jit
def _packed_pairs_kernel(x_ptr, q_ptr, zeros_ptr, scales_ptr, ids_ptr, weights_ptr, out_ptr, N, K, GROUPS,
                         group_rows, TOP_K, x_stride, out_stride, GATE_UP: tl.constexpr, BITS: tl.constexpr,
                         BLOCK_N: tl.constexpr, WORDS: tl.constexpr, NEAR_TOP: tl.constexpr, ASM: tl.constexpr,
                         PDL: tl.constexpr):  # fmt: skip
    # GATE_UP: program (pair, features); x [T, K]; the experts' columns are [gate | up], 2N of
    # them; out [pairs, N]. Else program (token, features); x = that [pairs, K]; out [T, N].
    # q [E, K/pack, WIDTH], zeros/scales [E, GROUPS, WIDTH].
    WIDTH = 2 * N if GATE_UP else N
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    words_each = K // (32 // BITS) * WIDTH
    wait_for_previous_kernel(PDL)  # the routing and gate_up write what comes next
    if GATE_UP:
        x_row = x_ptr + (row // TOP_K) * x_stride
        q, zeros, scales = _expert(q_ptr, zeros_ptr, scales_ptr, ids_ptr + row, words_each, GROUPS * WIDTH)
        gate = row_times_packed(x_row, q, zeros, scales, cols, col_ok, WIDTH, 0, K, group_rows, BITS, BLOCK_N, WORDS,
                                NEAR_TOP, ASM)  # fmt: skip
        up = row_times_packed(x_row, q, zeros, scales, cols + N, col_ok, WIDTH, 0, K, group_rows, BITS, BLOCK_N, WORDS,
                              NEAR_TOP, ASM)  # fmt: skip
        tl.store(out_ptr + row * out_stride + cols, silu_times_up(gate, up, out_ptr), mask=col_ok)
    else:
        dtype = out_ptr.dtype.element_ty
        acc = tl.zeros((BLOCK_N,), tl.float32)
        for j in range(TOP_K):
            pair = row * TOP_K + j
            q, zeros, scales = _expert(q_ptr, zeros_ptr, scales_ptr, ids_ptr + pair, words_each, GROUPS * WIDTH)
            y = row_times_packed(x_ptr + pair * x_stride, q, zeros, scales, cols, col_ok, WIDTH, 0, K, group_rows, BITS,
                                 BLOCK_N, WORDS, NEAR_TOP, ASM)  # fmt: skip
            acc += y.to(dtype).to(tl.float32) * tl.load(weights_ptr + pair)
        tl.store(out_ptr + row * out_stride + cols, acc.to(dtype), mask=col_ok)


@triton.jit
def _expert(q_ptr, zeros_ptr, scales_ptr, id_ptr, words_each, group_cells):
    """The packed words, zero points and scales of the expert at `id_ptr`."""
    e = tl.load(id_ptr).to(tl.int64)
    return q_ptr + e * words_each, zeros_ptr + e * group_cells, scales_ptr + e * group_cells


def _launch(x, experts, ids, weights, out, rows: int, features: int, top_k: int, tile: W4A16Row, gate_up: bool):
    depth = experts.in_features
    group_step = min(experts.group_rows, depth)
    _packed_pairs_kernel[(rows, triton.cdiv(features, tile.block_n))](
        x, experts.qweight, experts.zeros, experts.scales, ids, weights, out, features, depth, experts.zeros.shape[1],
        group_step, top_k, x.stride(0), out.stride(0), GATE_UP=gate_up, BITS=experts.bits, BLOCK_N=tile.block_n,
        WORDS=tile.words, NEAR_TOP=near_top_applies(x, experts.bits, tile), ASM=x.is_cuda, num_warps=tile.num_warps,
        num_stages=tile.num_stages, **launch_args(x),
    )  # fmt: skip


def packed_pair_experts(x: torch.Tensor, gate_up, down, topk_weights: torch.Tensor, topk_ids: torch.Tensor
                        ) -> torch.Tensor:  # fmt: skip
    """`reference_experts`' result for packed experts (see `packed_pairs_apply`): x [T, H],
    topk_weights float [T, k], topk_ids [T, k] -> [T, H] in x's dtype."""
    tokens, hidden = x.shape
    top_k, inter = topk_ids.shape[1], gate_up.out_features // 2
    gate_up_tile, down_tile = _tiles(gate_up, down)
    if x.stride(1) != 1:
        x = x.contiguous()
    ids = topk_ids.reshape(-1).contiguous()
    weights = topk_weights.reshape(-1).float().contiguous()
    act = torch.empty(tokens * top_k, inter, dtype=x.dtype, device=x.device)
    _launch(x, gate_up, ids, weights, act, tokens * top_k, inter, top_k, replace(gate_up_tile, split_k=1), True)
    out = torch.empty(tokens, hidden, dtype=x.dtype, device=x.device)
    _launch(act, down, ids, weights, out, tokens, hidden, top_k, replace(down_tile, split_k=1), False)
    return out
