"""GPTQ / AWQ / pack-quantized experts (`layers/packed_experts.py`) as two grouped W4A16 GEMMs.

`fused_moe.py`'s structure with packed weights: the (token, k) pairs sorted by expert and padded
to the row tile (`moe_align.py`), one launch for gate_up (SiLU·mul in its epilogue), one for down,
and the weighted sum of the top-k outputs in float32 (`weighted_sum`). Every shape is fixed by
(tokens, top_k, experts, tile), so CUDA graphs capture it.

The weight tiles are `w4a16.py`'s: words loaded once each, unpacked in registers to
(q - zero) * scale with the scale in the activations' dtype, rounded once (4-bit words in one
group: two values at a time), so each expert's weight is exactly the one the reference
dequantizes. Groups as in `w4a16.py`: one zero/scale vector a K tile where every expert's groups
are contiguous and a tile lies in one (`TILE_GROUP`), else each row's group through g_idx.

Numerics follow `fused_moe.py` (and so `reference_experts`): float32 sums rounded to the model
dtype after gate_up, after SiLU, after the product and after down; the weighted sum in float32,
rounded once.

Tiles: `fused_moe.py`'s table by rows an expert, with the K step cut to the group size where
groups are smaller (so a tile stays in one group). Not tuned on a GPU yet: a pair alone in its
16-row tile streamed the experts at ~13 % of the bandwidth (one token, H100). A decode batch of
2+ tokens with few pairs goes pair by pair instead (`moe_pairs_packed.py`); a lone token stays
here, where it measured slightly faster.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import triton
import triton.language as tl

from .fused_moe import DTYPES, MoeTile, silu_times_up, tile_for, weighted_sum
from .moe_align import align_pairs
from .pdl import launch_args, wait_for_previous_kernel
from .w4a16 import PAIR_MAGIC, packed_weight_tile

BITS = (4, 8)


def packed_moe_applies(x: torch.Tensor, gate_up, down) -> bool:
    """2-D activations of a float dtype, 4- or 8-bit experts."""
    return x.dim() == 2 and x.dtype in DTYPES and gate_up.bits in BITS and down.bits == gate_up.bits


@triton.jit(do_not_specialize=["PAIRS", "NUM_BLOCKS_M"])
def _moe_packed_kernel(a_ptr, q_ptr, zeros_ptr, scales_ptr, g_idx_ptr, out_ptr, sorted_pairs_ptr, block_expert_ptr,
                       N, K, GROUPS, PAIRS, TOP_K, NUM_BLOCKS_M, group_rows, a_stride, out_stride,
                       GATE_UP: tl.constexpr, BITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, TILE_GROUP: tl.constexpr,
                       PAIRS_DQ: tl.constexpr, IEEE: tl.constexpr, ASM: tl.constexpr,
                       PDL: tl.constexpr):  # fmt: skip
    # GATE_UP: a = x [T, K] (a pair's row is its token); the experts' packed columns are [gate |
    # up], 2N of them; out [pairs, N] holds silu(gate) * up. Else a = that [pairs, K], N columns,
    # out [pairs, N] the pair's expert output. q [E, K/pack, WIDTH], zeros/scales [E, GROUPS,
    # WIDTH], g_idx [E, K].
    WIDTH = 2 * N if GATE_UP else N
    pid = tl.program_id(0)
    blocks_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * blocks_n  # grouped order, as in fused_moe.py: weight tiles reused from L2
    first_m = (pid // per_group) * GROUP_M
    group_rows_m = tl.minimum(NUM_BLOCKS_M - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows_m
    pid_n = (pid % per_group) // group_rows_m
    wait_for_previous_kernel(PDL)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:
        return
    pair = tl.load(sorted_pairs_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    pair_ok = pair < PAIRS
    rows = pair // TOP_K if GATE_UP else pair
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    e = expert.to(tl.int64)
    q_base = q_ptr + e * (K // (32 // BITS)) * WIDTH
    zeros_base = zeros_ptr + e * GROUPS * WIDTH
    scales_base = scales_ptr + e * GROUPS * WIDTH
    g_base = g_idx_ptr + e * K
    a_rows = a_ptr + rows.to(tl.int64)[:, None] * a_stride
    dtype = a_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        a = tl.load(a_rows + ks[None, :], mask=pair_ok[:, None] & k_ok[None, :], other=0.0)
        w = packed_weight_tile(q_base, zeros_base, scales_base, g_base, k0, ks, k_ok, K, cols, col_ok, WIDTH,
                               group_rows, dtype, BITS, BLOCK_K, TILE_GROUP, PAIRS_DQ, ASM)  # fmt: skip
        acc = _dot(a, w, acc, IEEE)
        if GATE_UP:
            w = packed_weight_tile(q_base, zeros_base, scales_base, g_base, k0, ks, k_ok, K, cols + N, col_ok, WIDTH,
                                   group_rows, dtype, BITS, BLOCK_K, TILE_GROUP, PAIRS_DQ, ASM)  # fmt: skip
            acc_up = _dot(a, w, acc_up, IEEE)
    result = silu_times_up(acc, acc_up, a_ptr) if GATE_UP else acc.to(dtype)
    out = out_ptr + pair.to(tl.int64)[:, None] * out_stride + cols[None, :]
    tl.store(out, result, mask=pair_ok[:, None] & col_ok[None, :])


@triton.jit
def _dot(a, w, acc, IEEE: tl.constexpr):
    if IEEE:  # float32 activations: exact float32 products, not tf32
        return tl.dot(a, w, acc, input_precision="ieee")
    return tl.dot(a, w, acc)


def _fitted(tile: MoeTile, experts, depth: int) -> tuple[MoeTile, bool]:
    """The tile with its K step cut to the group size where groups are smaller (a multiple of 32
    that divides the step), and whether every K tile then lies in one group."""
    rows = experts.group_rows
    if rows is not None and rows < depth and rows % tile.block_k and rows % 32 == 0 and tile.block_k % rows == 0:
        tile = replace(tile, block_k=rows)
    one_group = rows is not None and (rows >= depth or rows % tile.block_k == 0)
    return tile, one_group


def _launch(a, experts, out, sorted_pairs, block_expert, n, top_k, tile: MoeTile, gate_up: bool) -> None:
    depth = experts.in_features
    tile, one_group = _fitted(tile, experts, depth)
    blocks_m = block_expert.numel()
    step = min(experts.group_rows, depth) if one_group else 1
    pairs_dq = experts.bits == 4 and one_group and a.dtype in PAIR_MAGIC
    _moe_packed_kernel[(blocks_m * triton.cdiv(n, tile.block_n),)](
        a, experts.qweight, experts.zeros, experts.scales, experts.g_idx, out, sorted_pairs, block_expert, n, depth,
        experts.zeros.shape[1], out.shape[0], top_k, blocks_m, step, a.stride(0), out.stride(0), GATE_UP=gate_up,
        BITS=experts.bits, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, GROUP_M=tile.group_m,
        TILE_GROUP=one_group, PAIRS_DQ=pairs_dq, IEEE=a.dtype == torch.float32, ASM=a.is_cuda,
        num_warps=tile.num_warps, num_stages=tile.num_stages, **launch_args(a),
    )  # fmt: skip


def fused_packed_experts(x: torch.Tensor, gate_up, down, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                         tile: MoeTile | None = None) -> torch.Tensor:  # fmt: skip
    """`reference_experts`' result for packed experts: x [T, H], gate_up (in H, out 2I) and down
    (in I, out H) `PackedExperts`, topk_weights float [T, k], topk_ids [T, k] -> [T, H] in x's dtype."""
    tokens, hidden = x.shape
    experts, inter = gate_up.experts, gate_up.out_features // 2
    if gate_up.in_features != hidden or down.in_features != inter or down.out_features != hidden:
        raise ValueError(f"packed experts of [{2 * inter}, {gate_up.in_features}] and [{down.out_features}, "
                         f"{down.in_features}] do not fit activations of {hidden} features")  # fmt: skip
    top_k = topk_ids.shape[1]
    pairs = tokens * top_k
    if pairs == 0:
        return torch.zeros(tokens, hidden, dtype=x.dtype, device=x.device)
    if x.stride(1) != 1:
        x = x.contiguous()
    tile = tile or tile_for(pairs, experts)
    sorted_pairs, block_expert = align_pairs(topk_ids, experts, tile.block_m)
    act = torch.empty(pairs, inter, dtype=x.dtype, device=x.device)
    _launch(x, gate_up, act, sorted_pairs, block_expert, inter, top_k, tile, gate_up=True)
    per_pair = torch.empty(pairs, hidden, dtype=x.dtype, device=x.device)
    _launch(act, down, per_pair, sorted_pairs, block_expert, hidden, top_k, tile, gate_up=False)
    return weighted_sum(per_pair, topk_weights.reshape(-1).float().contiguous(), top_k)
