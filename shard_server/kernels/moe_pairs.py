"""The routed experts of a decode batch, pair by pair: no sort, no padding, no per-pair buffer.

At a few tokens each (token, expert) pair is a matrix-vector product against its expert's
weights, and the time is those weights' bytes over the bandwidth. The grouped GEMMs of
`fused_moe.py` first sort the pairs into expert groups padded to a tensor-core tile, and end
with a [T, k, H] sum: three launches beside the two products, which at one token cost more than
the products do. Here two launches do it all:

- gate_up: a program per (pair, slice of intermediate features) streams the slice's gate and
  up rows of the pair's expert against its token's row, and writes silu(gate) * up;
- down: a program per (token, slice of hidden features) runs the token's k experts in turn and
  sums their weighted outputs in float32, in k order (the grouped path's order), rounded once.

A pair whose expert another pair of the batch also hit reads that expert's weights again, so
this path is for batches with few pairs an expert (`pairs_apply`); past that the sorted
grouped GEMMs read each hit expert once.

Numerics are the grouped path's: products in float32, rounded to the model dtype after gate_up,
after SiLU, after the product and after down. fp8 experts with a scale a row (`--quantize fp8`)
are widened in registers and each feature's sum is scaled once; block-scaled ones take the
grouped path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .expert_scales import ExpertScales
from .fused_moe import DTYPES, FP8, silu_times_up
from .pdl import launch_args, wait_for_previous_kernel


@dataclass(frozen=True)
class PairsTile:
    block_n: int  # output features a program
    block_k: int  # reduction step (down: the largest; an expert's row is read in few unrolled tiles)
    num_warps: int


# A decode layer's two products at the Qwen3-30B-A3B shape want many programs (384 for gate_up
# at one token) each streaming a short slice; timed with bench/gpu_fused_moe.py.
GATE_UP_TILE = PairsTile(block_n=16, block_k=256, num_warps=4)
DOWN_TILE = PairsTile(block_n=8, block_k=1024, num_warps=4)
# Pairs a batch may have per expert. At a quarter, uniform routing re-reads about 12 % of the
# hit experts' bytes (pairs that land on an expert already hit); the grouped path reads each once
# but costs three launches more. On an H100 at Qwen3-30B-A3B's shape the pairs took 34.8 / 89.5 us
# a layer at 1 / 4 tokens, the grouped path 44.8 / 104.9 (bench/results/fused_moe_pairs_qwen3_h100.json).
MAX_PAIRS_PER_EXPERT = 0.25


def pairs_apply(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_ids: torch.Tensor,
                scales: ExpertScales | None) -> bool:  # fmt: skip
    """A batch with no more pairs than a quarter of the experts, weights of x's dtype or fp8 with row scales."""
    few = 0 < topk_ids.numel() <= MAX_PAIRS_PER_EXPERT * w13.shape[0]
    weights_ok = w13.dtype in (x.dtype, FP8) and w2.dtype == w13.dtype and (w13.dtype == FP8) == (scales is not None)
    return few and x.dim() == 2 and x.dtype in DTYPES and weights_ok and (scales is None or scales.block is None)


@triton.jit
def _gate_up_kernel(x_ptr, w_ptr, scale_ptr, ids_ptr, act_ptr, INTER, K, TOP_K, x_stride, w_stride_e, scale_stride_e,
                    SCALED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    PDL: tl.constexpr):  # fmt: skip
    # act[pair, n] = silu(gate_e . x_t) * (up_e . x_t) for the pair's token t and expert e, over
    # this program's BLOCK_N intermediate features n; w [E, 2 * INTER, K] (gate rows, then up).
    pair = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < INTER
    wait_for_previous_kernel(PDL)  # the routing wrote the ids, the norm wrote x
    expert = tl.load(ids_ptr + pair).to(tl.int64)
    x_row = x_ptr + (pair // TOP_K).to(tl.int64) * x_stride
    gate_rows = w_ptr + expert * w_stride_e + cols.to(tl.int64)[:, None] * K
    up_rows = gate_rows + INTER * K
    acc_gate = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    acc_up = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        x = tl.load(x_row + ks, mask=k_ok, other=0.0).to(tl.float32)[None, :]
        mask = col_ok[:, None] & k_ok[None, :]
        acc_gate += tl.load(gate_rows + ks[None, :], mask=mask, other=0.0).to(tl.float32) * x
        acc_up += tl.load(up_rows + ks[None, :], mask=mask, other=0.0).to(tl.float32) * x
    gate = tl.sum(acc_gate, axis=1)
    up = tl.sum(acc_up, axis=1)
    if SCALED:  # one float32 scale a weight row, gate rows then up rows
        scales = scale_ptr + expert * scale_stride_e + cols
        gate *= tl.load(scales, mask=col_ok, other=0.0)
        up *= tl.load(scales + INTER, mask=col_ok, other=0.0)
    result = silu_times_up(gate, up, act_ptr)
    tl.store(act_ptr + pair.to(tl.int64) * INTER + cols, result, mask=col_ok)


@triton.jit
def _down_kernel(act_ptr, w_ptr, scale_ptr, ids_ptr, weights_ptr, out_ptr, HIDDEN, INTER, TOP_K, w_stride_e,
                 scale_stride_e, out_stride, SCALED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 K_TILES: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    # out[t, n] = sum_j weight_j * (down_{e_j} . act[t * TOP_K + j]) over this program's BLOCK_N
    # hidden features n; w [E, HIDDEN, INTER]. The K tiles of an expert are unrolled (K_TILES),
    # so the loop over the k experts is the innermost one and the compiler pipelines its loads.
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < HIDDEN
    dtype = out_ptr.dtype.element_ty
    wait_for_previous_kernel(PDL)  # gate_up wrote act
    total = tl.zeros((BLOCK_N,), tl.float32)
    for j in range(0, TOP_K):
        pair = token * TOP_K + j
        expert = tl.load(ids_ptr + pair).to(tl.int64)
        rows = w_ptr + expert * w_stride_e + cols.to(tl.int64)[:, None] * INTER
        acc = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
        for tile in tl.static_range(K_TILES):
            ks = tile * BLOCK_K + tl.arange(0, BLOCK_K)
            k_ok = ks < INTER
            a = tl.load(act_ptr + pair * INTER + ks, mask=k_ok, other=0.0).to(tl.float32)[None, :]
            acc += tl.load(rows + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32) * a
        y = tl.sum(acc, axis=1)
        if SCALED:
            y *= tl.load(scale_ptr + expert * scale_stride_e + cols, mask=col_ok, other=0.0)
        total += y.to(dtype).to(tl.float32) * tl.load(weights_ptr + pair)
    tl.store(out_ptr + token * out_stride + cols, total.to(dtype), mask=col_ok)


def pair_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                 topk_ids: torch.Tensor, scales: ExpertScales | None = None, gate_up_tile: PairsTile = GATE_UP_TILE,
                 down_tile: PairsTile = DOWN_TILE) -> torch.Tensor:  # fmt: skip
    """`reference_experts`' result where `pairs_apply`: x [T, H], w13 [E, 2I, H], w2 [E, H, I],
    topk_weights float [T, k], topk_ids [T, k] -> [T, H] in x's dtype (fp8 experts with row `scales`)."""
    tokens, hidden = x.shape
    inter, top_k = w13.shape[1] // 2, topk_ids.shape[1]
    if scales is not None:
        scales.check(w13, w2)
    x = x.contiguous()
    w13, w2 = w13.contiguous(), w2.contiguous()
    ids = topk_ids.reshape(-1).contiguous()
    weights = topk_weights.reshape(-1).float().contiguous()
    s13, s2 = (scales.w13, scales.w2) if scales is not None else (w13, w2)  # unscaled: never read
    act = torch.empty(tokens * top_k, inter, dtype=x.dtype, device=x.device)
    _gate_up_kernel[(tokens * top_k, triton.cdiv(inter, gate_up_tile.block_n))](
        x, w13, s13, ids, act, inter, hidden, top_k, x.stride(0), w13.stride(0), s13.stride(0),
        SCALED=scales is not None, BLOCK_N=gate_up_tile.block_n, BLOCK_K=gate_up_tile.block_k,
        num_warps=gate_up_tile.num_warps, **launch_args(x),
    )  # fmt: skip
    out = torch.empty(tokens, hidden, dtype=x.dtype, device=x.device)
    block_k = min(triton.next_power_of_2(inter), down_tile.block_k)
    _down_kernel[(tokens, triton.cdiv(hidden, down_tile.block_n))](
        act, w2, s2, ids, weights, out, hidden, inter, top_k, w2.stride(0), s2.stride(0), out.stride(0),
        SCALED=scales is not None, BLOCK_N=down_tile.block_n, BLOCK_K=block_k, K_TILES=triton.cdiv(inter, block_k),
        num_warps=down_tile.num_warps, **launch_args(x),
    )  # fmt: skip
    return out
