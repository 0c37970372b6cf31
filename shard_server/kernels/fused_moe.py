"""The routed experts of an MoE block as two grouped GEMMs (gate_up with SiLU·mul, then down).

`reference_experts` (models/moe.py) loops over the experts in Python with data-dependent shapes,
and `dense_experts` runs every expert on every token: one costs a host sync and a launch per
expert, the other experts/top_k times the work. Here every (token, k) pair is sorted by expert,
each expert's group is padded to the GEMM's BLOCK_M rows, and one launch multiplies every row tile
by its expert's weights. All shapes are fixed by (tokens, top_k, experts, BLOCK_M), so a CUDA
graph captures it: no `.item()`, no bincount (CUDA's reads the max to the host). The sort is
`moe_align.py`'s: as torch ops it was about twenty launches, ~60 of the 83 us a Qwen3-30B-A3B
layer took at one token on an H200.

Numerics follow the reference: products in float32 rounded to the model dtype after gate_up,
after SiLU, after the product and after down, as torch rounds them; weighted sums in float32,
rounded once. The top-k contributions are summed by a final launch over [T, k, H], not by atomics
in the down kernel: float32 atomic adds land in whatever order the programs finish, so two runs
(or two tensor-parallel ranks) would differ in the last bits. Down stores each pair's output
already rounded to the model dtype, so that buffer holds it exactly in half the bytes of float32,
and the sum applies the routing weights (`_weighted_sum_kernel`): at 4,096 tokens of
Qwen3-30B-A3B a float32 buffer was 268 MB written and read again every layer.

fp8 experts (`ExpertScales`, `kernels/expert_scales.py`) come with one scale a row, applied to
each output feature's float32 sum, or with a block-wise fp8 checkpoint's [bn, bk] block scales,
applied to each weight tile inside the K loop (W8A16: the tile is dequantized in float32 and
rounded once to the activations' dtype, the reference's dequantized weight exactly).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from .dispatch import next_power_of_two, use_fused
from .expert_scales import ExpertScales, GemmScales
from .moe_align import align_pairs
from .pdl import launch_args, wait_for_previous_kernel

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
FP8 = torch.float8_e4m3fn


@dataclass(frozen=True)
class MoeTile:
    block_m: int  # pairs per row tile: each expert's group is padded to a multiple of it
    block_n: int  # output features per program (per half for gate_up: gate and up tiles alike)
    block_k: int
    group_m: int  # row tiles that walk the feature tiles together (weight tiles reused from L2)
    num_warps: int
    num_stages: int


# Keyed by the rows an expert sees on average, tokens * top_k / experts. Decode (~1 row an expert)
# is memory-bound: the time is the hit experts' weights over the bandwidth, so the row tile is the
# smallest tensor-core tile (16: padding rows cost no memory traffic but waste the MMA) and deep
# K steps keep many loads in flight. With more rows an expert the work turns compute-bound and
# wider tiles reuse each loaded weight tile over more rows. Shapes, not models, pick a tile, so
# any hidden / intermediate size gets one. Timed on an H200 at the Qwen3-30B-A3B shape
# (bench/gpu_fused_moe.py, bench/results/fused_moe_tiles_h200.json, 13 candidates): at 1, 16 and
# 256 tokens the shipped tile was the fastest or within 0.1 %; at 4,096 tokens (256 rows an
# expert) 128-row tiles took 1,040 us against 1,186 for 64-row ones, so they start past 192 rows
# (below that a 128-row tile would mostly pad). Mixtral's 8 experts are not timed yet.
TILES = (
    (4, MoeTile(block_m=16, block_n=64, block_k=128, group_m=1, num_warps=4, num_stages=4)),  # decode
    (24, MoeTile(block_m=32, block_n=64, block_k=128, group_m=4, num_warps=4, num_stages=3)),
    (96, MoeTile(block_m=64, block_n=64, block_k=64, group_m=8, num_warps=4, num_stages=4)),
    (192, MoeTile(block_m=64, block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=3)),
    (None, MoeTile(block_m=128, block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=3)),  # prefill
)


def tile_for(pairs: int, experts: int) -> MoeTile:
    per_expert = pairs / max(1, experts)
    return next(tile for bound, tile in TILES if bound is None or per_expert <= bound)


def fused_moe_applies(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, scales: ExpertScales | None = None
                      ) -> bool:  # fmt: skip
    """Weights of x's dtype, or fp8 (e4m3) weights with row scales (`--quantize fp8`) or block
    scales whose bk the K tile can divide (`ExpertScales.kernel_fits`: every Hub checkpoint's
    128 does). Anything else stays on the torch path."""
    float_or_fp8 = x.dim() == 2 and x.dtype in DTYPES and w13.dtype in (x.dtype, FP8) and w2.dtype == w13.dtype
    return float_or_fp8 and (scales is None or scales.kernel_fits())


# PAIRS and NUM_BLOCKS_M change with every step's token count and routing; specialized (on
# divisibility by 16) they built a new variant mid-serving, a 0.77-1.31 s stall each.
@triton.jit(do_not_specialize=["PAIRS", "NUM_BLOCKS_M"])
def _moe_gemm_kernel(a_ptr, w_ptr, w_scale_ptr, out_ptr, sorted_pairs_ptr, block_expert_ptr,
                     N, K, PAIRS, TOP_K, NUM_BLOCKS_M, a_stride, w_stride_e, w_stride_n, w_stride_k, scale_stride_e,
                     scale_stride_n, scale_stride_k, SCALE_BN, SCALE_BK, SCALE_N_OFFSET, SCALE_UP_ROW, K_OFFSET,
                     out_stride, GATE_UP: tl.constexpr, SCALES: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, PRECISION: tl.constexpr,
                     PDL: tl.constexpr):  # fmt: skip
    # GATE_UP: a = x [T, K] (a pair's row is its token), w = w13 [E, 2N, K]; out [pairs, N] in the
    # model dtype holds silu(gate) * up. Else: a = that [pairs, K], w = w2 [E, N, K]; out [pairs, N]
    # in the model dtype holds the pair's expert output (`_weighted_sum_kernel` weights it).
    # SCALES (None: w is in a's dtype) "row": w is fp8, widened to a's dtype in registers (exact:
    # every e4m3 value is a bf16 / fp16 one), and each output feature's sum is multiplied by its
    # row's scale (w_scale [E, rows of w]) before any rounding. "block": w is fp8 with a scale per [SCALE_BN, SCALE_BK]
    # block (w_scale [E, row blocks, column blocks], `kernels/expert_scales.py`); each tile is
    # dequantized in float32 and rounded to a's dtype before the dot. The rank's slice starts
    # SCALE_N_OFFSET rows / K_OFFSET columns into its first block, so the K loop starts K_OFFSET
    # columns early (masked) and every K tile (BLOCK_K divides SCALE_BK) lies in one block.
    pid = tl.program_id(0)
    blocks_n = tl.cdiv(N, BLOCK_N)
    # Grouped order: GROUP_M row tiles run through the feature tiles side by side, so with several
    # row tiles of one expert (prefill) a weight tile is read from HBM once, then from L2.
    per_group = GROUP_M * blocks_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(NUM_BLOCKS_M - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    wait_for_previous_kernel(PDL)  # the alignment and gate_up write what comes next
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:  # past the last group: the grid is sized for the worst padding
        return
    pair = tl.load(sorted_pairs_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    pair_ok = pair < PAIRS  # padding rows load zeros and store nothing
    rows = pair // TOP_K if GATE_UP else pair
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    a_rows = a_ptr + rows.to(tl.int64)[:, None] * a_stride
    w_cols = w_ptr + expert.to(tl.int64) * w_stride_e + cols.to(tl.int64)[None, :] * w_stride_n
    scales = w_scale_ptr + expert.to(tl.int64) * scale_stride_e
    if SCALES == "block":  # each output feature's row of scale blocks
        scales += ((cols + SCALE_N_OFFSET) // SCALE_BN) * scale_stride_n
    else:
        scales += cols * scale_stride_n
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(-K_OFFSET, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = (ks >= 0) & (ks < K) if SCALES == "block" else ks < K
        k_scales = scales + ((k0 + K_OFFSET) // SCALE_BK) * scale_stride_k  # "block": this tile's column of blocks
        a = tl.load(a_rows + ks[None, :], mask=pair_ok[:, None] & k_ok[None, :], other=0.0)
        w_mask = k_ok[:, None] & col_ok[None, :]
        w = _weight_tile(w_cols + ks[:, None] * w_stride_k, w_mask, k_scales, col_ok, SCALES == "block")
        acc = tl.dot(a, w.to(a.dtype), acc, input_precision=PRECISION)
        if GATE_UP:  # the up rows sit N rows below the gate rows, their scale rows SCALE_UP_ROW below
            w = _weight_tile(w_cols + N * w_stride_n + ks[:, None] * w_stride_k, w_mask,
                             k_scales + SCALE_UP_ROW * scale_stride_n, col_ok, SCALES == "block")  # fmt: skip
            acc_up = tl.dot(a, w.to(a.dtype), acc_up, input_precision=PRECISION)
    if SCALES == "row":
        acc *= tl.load(scales, mask=col_ok, other=0.0)[None, :]
        if GATE_UP:
            acc_up *= tl.load(scales + N * scale_stride_n, mask=col_ok, other=0.0)[None, :]
    dtype = a_ptr.dtype.element_ty
    result = silu_times_up(acc, acc_up, a_ptr) if GATE_UP else acc.to(dtype)
    out = out_ptr + pair.to(tl.int64)[:, None] * out_stride + cols[None, :]
    tl.store(out, result, mask=pair_ok[:, None] & col_ok[None, :])


SUM_BLOCK_H = 1024  # features a program of the weighted sum adds up


@triton.jit
def _weighted_sum_kernel(per_pair_ptr, weights_ptr, out_ptr, H, TOP_K: tl.constexpr, BLOCK_H: tl.constexpr,
                         PDL: tl.constexpr):  # fmt: skip
    # out[t] = sum over j of weights[t, j] * per_pair[t, j] (pair t * TOP_K + j, in the model dtype),
    # in float32 in the order j = 0, 1, ..., rounded once, as the reference's weighted sum.
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    ok = cols < H
    wait_for_previous_kernel(PDL)  # down writes the pairs' outputs
    acc = tl.zeros((BLOCK_H,), tl.float32)
    for j in tl.static_range(TOP_K):
        pair = token * TOP_K + j
        value = tl.load(per_pair_ptr + pair * H + cols, mask=ok, other=0.0).to(tl.float32)
        acc += value * tl.load(weights_ptr + pair)
    tl.store(out_ptr + token * H + cols, acc.to(out_ptr.dtype.element_ty), mask=ok)


def weighted_sum(per_pair: torch.Tensor, weights: torch.Tensor, top_k: int) -> torch.Tensor:
    """[T * k, H] pair outputs and their float32 routing weights [T * k] -> [T, H], one launch."""
    pairs, hidden = per_pair.shape
    out = torch.empty(pairs // top_k, hidden, dtype=per_pair.dtype, device=per_pair.device)
    block_h = min(next_power_of_two(hidden), SUM_BLOCK_H)
    grid = (pairs // top_k, triton.cdiv(hidden, block_h))
    _weighted_sum_kernel[grid](per_pair, weights, out, hidden, TOP_K=top_k, BLOCK_H=block_h, num_warps=4,
                               **launch_args(per_pair))  # fmt: skip
    return out


@triton.jit
def silu_times_up(gate, up, like_ptr):
    """silu(gate) * up from their float32 sums, in like_ptr's element type, rounded where torch
    rounds: F.linear's outputs, F.silu's, the product (shared by `moe_pairs.py`)."""
    dtype = like_ptr.dtype.element_ty
    gate = gate.to(dtype).to(tl.float32)
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    return (silu * up.to(dtype).to(tl.float32)).to(dtype)


@triton.jit
def _weight_tile(ptrs, mask, scales, col_ok, BLOCK_SCALED: tl.constexpr):
    """A [BLOCK_K, BLOCK_N] weight tile as stored, or (BLOCK_SCALED) in float32 times each
    column's block scale (`scales`: one pointer a column, into this K tile's blocks)."""
    w = tl.load(ptrs, mask=mask, other=0.0)
    if BLOCK_SCALED:
        w = w.to(tl.float32) * tl.load(scales, mask=col_ok, other=0.0)[None, :]
    return w


def _launch(a, w, scales: GemmScales | None, out, sorted_pairs, block_expert, n, k, top_k,
            tile: MoeTile, gate_up: bool) -> None:  # fmt: skip
    blocks_m = block_expert.numel()
    grid = (blocks_m * triton.cdiv(n, tile.block_n),)
    s = scales or GemmScales(w, None)  # unscaled: a stand-in pointer the kernel never reads
    strides = (*s.tensor.stride(), 0)[:3] if scales is not None else (0, 0, 0)  # row scales: [E, rows]
    _moe_gemm_kernel[grid](
        a, w, s.tensor, out, sorted_pairs, block_expert, n, k, out.shape[0], top_k,
        blocks_m, a.stride(0), w.stride(0), w.stride(1), w.stride(2), *strides, *s.block, s.n_offset, s.up_row,
        s.k_offset, out.stride(0), GATE_UP=gate_up, SCALES=s.kind, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n,
        BLOCK_K=tile.block_k, GROUP_M=tile.group_m,
        PRECISION="ieee" if a.dtype == torch.float32 else None,  # float32 weights: no tf32 rounding
        num_warps=tile.num_warps, num_stages=tile.num_stages, **launch_args(a),
    )  # fmt: skip


def fused_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor, tile: MoeTile | None = None, scales: ExpertScales | None = None
                  ) -> torch.Tensor:  # fmt: skip
    """`reference_experts`' result (see `fused_moe_applies`): x [T, H], w13 [E, 2I, H] (gate rows,
    then up), w2 [E, H, I], topk_weights float [T, k], topk_ids [T, k] -> [T, H] in x's dtype.
    fp8 weights come with their `scales` (ValueError if they do not fit the experts). With block
    scales the tile's block_k is cut to a power of two dividing bk (`ExpertScales.block_k`)."""
    tokens, hidden = x.shape
    experts, inter = w13.shape[0], w13.shape[1] // 2
    top_k = topk_ids.shape[1]
    pairs = tokens * top_k
    if (w13.dtype == FP8) != (scales is not None):
        raise ValueError("fp8 experts need their scales, and only fp8 experts take them")
    if scales is not None:
        scales.check(w13, w2)
        if not scales.kernel_fits():
            raise ValueError(f"block scales of {scales.block[1]} columns: the fused kernel takes multiples of 16")
    if pairs == 0:
        return torch.zeros(tokens, w2.shape[1], dtype=x.dtype, device=x.device)
    if x.stride(1) != 1:
        x = x.contiguous()
    tile = tile or tile_for(pairs, experts)
    if scales is not None and scales.block_k(tile.block_k) != tile.block_k:
        tile = replace(tile, block_k=scales.block_k(tile.block_k))
    sorted_pairs, block_expert = align_pairs(topk_ids, experts, tile.block_m)
    weights = topk_weights.reshape(-1).float().contiguous()
    act = torch.empty(pairs, inter, dtype=x.dtype, device=x.device)
    w13_scales, w2_scales = (scales.gate_up(), scales.down()) if scales is not None else (None, None)
    _launch(x, w13, w13_scales, act, sorted_pairs, block_expert, inter, hidden, top_k, tile, gate_up=True)
    per_pair = torch.empty(pairs, w2.shape[1], dtype=x.dtype, device=x.device)
    _launch(act, w2, w2_scales, per_pair, sorted_pairs, block_expert, w2.shape[1], inter, top_k, tile,
            gate_up=False)  # fmt: skip
    return weighted_sum(per_pair, weights, top_k)
