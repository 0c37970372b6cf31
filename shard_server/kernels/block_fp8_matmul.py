"""Products against a block-scaled fp8 weight (DeepSeek-V3 / Qwen3-FP8 checkpoints), in Triton.

A block-wise fp8 weight W [out, in] is e4m3 values times one scale per [bn, bk] block. One kernel
takes the product two ways, both walking the columns one K tile at a time, each tile inside one
scale block: each tile's partial sums, in float32, are multiplied by each output feature's scale
for that block and added up.
- Few rows (decodes, `block_fp8_rows`): the product only streams the weight. The fp8 values
  widen exactly to fp16 with the rows (`fp16_dot`, shipped: as the per-channel fp8 path does,
  one instruction a pair on sm_90, bf16 several; bf16 rows then saturate at fp16's +-65504) or
  to the rows' dtype; the rows stay unrounded otherwise (weight-only, as the fp8 path's few-row
  product).
- More rows (`block_fp8_gemm`): each row is quantized to e4m3 with its own scale (`quantize_rows`,
  as `--quantize fp8` does), the tiles multiply fp8 by fp8 on the tensor cores (64-row tiles on
  wgmma; under 64 rows Triton's mma.sync widens both to fp16 on sm_90), and the sums are
  multiplied by each row's scale at the end and rounded once. The weight is never widened in
  memory.
Both modes share one K loop: a single loop over every K tile whose bounds are arithmetic (the
blocks as `ColumnBlocks`), so Triton pipelines the loads across blocks (cp.async into num_stages
shared-memory buffers for wgmma, num_stages - 1 for mma.sync): a loop nested per block, or
bounds loaded from memory, leave it one tile in flight or none. A tile's `split_k` > 1 cuts that loop into ranges of K tiles, a program each, whose
float32 partials a second kernel sums (as the skinny matmul's fp8 config does): more programs
for the 4096-feature projections at a few rows.
A rank's slice need not fall on block boundaries: `row_block` gives each of its output features
its row of `scale`, and `ColumnBlocks` where the column blocks start in the rank's own columns.

Where a rank holds whole 128 x 128 blocks on sm_90, many rows go to cuBLASLt instead
(`block_fp8_cublas.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .fp8_matmul import _quantized_rows
from .pdl import launch_args, wait_for_previous_kernel
from .skinny_matmul import SUM_BLOCK, _sum_splits_kernel


@dataclass(frozen=True)
class GemmTile:
    """A launch of the kernel, either mode: rows, features and columns a program takes a trip,
    its warps and pipeline stages, and how many programs split the K loop."""

    block_m: int
    block_n: int
    block_k: int  # columns a trip; a block wider than this takes several
    num_warps: int
    num_stages: int
    split_k: int = 1  # ranges of K tiles, a program each; past 1 their float32 partials are summed after


# (most rows, tile) for fp8 rows, from bench/gpu_block_fp8.py's sweep on one H100
# (bench/results/block_fp8_h100.json; total µs over the 8B's qkv, o, gate_up and down): 64 rows
# 137.7 in 64x32x128 w4 s4 (per-channel fp8 116.1); 256 rows 229.6 in 64x128x128 w4 s4 (142.8);
# 2048 rows 1312.9 in 64x128x128 w4 s3 (128x128x128 w8 s3 took 1555.0; per-channel 706.4).
GEMM_TILES = (
    (64, GemmTile(64, 32, 128, 4, 4)),
    (256, GemmTile(64, 128, 128, 4, 4)),
    (None, GemmTile(64, 128, 128, 4, 3)),
)
# (most rows, tile) for half-precision rows (<= 16: `skinny_rows`), from the sweep on one H100
# (bench/results/block_fp8_few_rows_h100.json, total µs over the 8B's projections): widened to
# fp16 with the rows (`ROWS_FP16_DOT`), 104.8 at 1 row and 111.2 at 16 (per-channel fp8: 97.2,
# 105.6); to the rows' bf16, the best tile took 117.7 and 120.8.
ROWS_TILES = ((None, GemmTile(16, 128, 128, 4, 3, split_k=4)),)
# Few rows meet the weight in fp16 (one conversion instruction a pair on sm_90, bf16 several), as
# per-channel fp8's few-row product does: bf16 rows saturate at fp16's +-65504.
ROWS_FP16_DOT = True


@dataclass(frozen=True)
class ColumnBlocks:
    """A rank's column blocks as the kernel walks them: block 0 spans the rank's columns [0, first),
    block b > 0 [first + (b - 1) * width, first + b * width), the last one cut at the rank's width.
    Every slice of a [bn, bk] grid is one (`width` = bk; `first` < bk where it starts mid-block).
    Plain integers: the K loop's bounds need no load (which keeps Triton from pipelining it), and
    are known 16-aligned where these are (Triton specializes such arguments)."""

    first: int
    width: int

    def spans(self, columns: int) -> list[tuple[int, int]]:
        """[low, high) of each block of a rank `columns` wide."""
        lows = [0, *range(self.first, columns, self.width)]
        return [(low, min(high, columns)) for low, high in zip(lows, [*lows[1:], columns])]


@triton.jit
def _block_fp8_kernel(x_ptr, x_scale_ptr, w_ptr, scale_ptr, row_block_ptr, out_ptr, M, N, K, C, first, width,
                      x_stride, w_stride, scale_stride, out_stride, split_stride, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FP8_ROWS: tl.constexpr, FP16_DOT: tl.constexpr,
                      TRIPS: tl.constexpr, SPLIT_K: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    """x [M, K] @ w[N, K]^T over C column blocks (`ColumnBlocks` first, width), TRIPS K tiles a
    block. FP8_ROWS: x is e4m3 with a float32 scale a row (x_scale_ptr), multiplied fp8 by fp8;
    else x is half precision and w is widened to it (FP16_DOT: both to fp16; x_scale_ptr unused).
    SPLIT_K > 1: the program on grid axis 2 takes one range of the K tiles and writes its float32
    partial at split_stride * its range into out_ptr."""
    wait_for_previous_kernel(PDL)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # output features
    row_ok = rows < M
    col_ok = cols < N
    x_rows = x_ptr + rows[:, None] * x_stride
    w_rows = w_ptr + cols[:, None] * w_stride
    scale_rows = scale_ptr + tl.load(row_block_ptr + cols, mask=col_ok, other=0).to(tl.int64) * scale_stride
    trip_lo, trip_hi = 0, C * TRIPS
    if SPLIT_K > 1:
        chunk = tl.cdiv(C * TRIPS, SPLIT_K)
        trip_lo = tl.program_id(2) * chunk
        trip_hi = tl.minimum(C * TRIPS, trip_lo + chunk)
        out_ptr += tl.program_id(2).to(tl.int64) * split_stride
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for trip in range(trip_lo, trip_hi):  # one loop over every K tile: pipelined across blocks
        block = trip // TRIPS
        lo = tl.where(block == 0, 0, first + (block - 1) * width)
        hi = tl.minimum(first + block * width, K)
        ks = lo + (trip % TRIPS) * BLOCK_K + tl.arange(0, BLOCK_K)
        k_ok = ks < hi
        x = tl.load(x_rows + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_rows + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        scale = tl.load(scale_rows + block, mask=col_ok, other=0.0)
        if FP8_ROWS:
            part = tl.dot(x, tl.trans(w))
        elif FP16_DOT:
            x = tl.clamp(x.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
            part = tl.dot(x, tl.trans(w.to(tl.float16)))
        else:
            part = tl.dot(x, tl.trans(w.to(x.dtype)))  # e4m3 widens exactly to bf16 / fp16
        acc += part * scale[None, :]
    if FP8_ROWS:
        acc *= tl.load(x_scale_ptr + rows, mask=row_ok, other=0.0)[:, None]
    out = out_ptr + rows[:, None] * out_stride + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def column_block_starts(col_block: torch.Tensor, blocks: int) -> torch.Tensor:
    """The first column of each of `blocks` column blocks, then the width: int32 [blocks + 1].
    `col_block` (each column's block, 0 first, non-decreasing) must visit every block."""
    starts = torch.searchsorted(col_block.to(torch.int64), torch.arange(blocks + 1, device=col_block.device))
    return starts.to(torch.int32)


def column_blocks(col_starts: torch.Tensor) -> ColumnBlocks:
    """`column_block_starts` as a `ColumnBlocks` (a load-time call: it reads them back from the
    device); ValueError if they are not one."""
    starts = [int(s) for s in col_starts.tolist()]
    spans = list(zip(starts, starts[1:]))
    blocks = ColumnBlocks(first=starts[1], width=max(high - low for low, high in spans))
    if blocks.spans(starts[-1]) != spans or min(high - low for low, high in spans) <= 0:
        raise ValueError(f"column blocks starting at {starts} are not one grid of equal blocks")
    return blocks


def _tile(table, rows: int) -> GemmTile:
    return next(tile for most, tile in table if most is None or rows <= most)


def gemm_tile(rows: int) -> GemmTile:
    return _tile(GEMM_TILES, rows)


def rows_tile(rows: int) -> GemmTile:
    return _tile(ROWS_TILES, rows)


def _launch(x, x_scale, weight, scale, row_block, blocks: ColumnBlocks, out, tile: GemmTile, fp8_rows: bool,
            fp16_dot: bool = False) -> None:  # fmt: skip
    """The kernel over x into `out` (contiguous [M, N]); with split_k > 1 through float32 partials."""
    rows, n = x.shape[0], weight.shape[0]
    scale = scale.float().contiguous()
    splits = tile.split_k
    target = out if splits == 1 else torch.empty((splits, rows, n), dtype=torch.float32, device=out.device)
    grid = (triton.cdiv(rows, tile.block_m), triton.cdiv(n, tile.block_n), splits)
    _block_fp8_kernel[grid](
        x, x if x_scale is None else x_scale, weight, scale, row_block, target, rows, n, x.shape[1], scale.shape[1],
        blocks.first, blocks.width, x.stride(0), weight.stride(0), scale.stride(0), n, rows * n,
        BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, FP8_ROWS=fp8_rows, FP16_DOT=fp16_dot,
        TRIPS=triton.cdiv(blocks.width, tile.block_k), SPLIT_K=splits, num_warps=tile.num_warps,
        num_stages=tile.num_stages, **launch_args(x),
    )  # fmt: skip
    if splits > 1:
        numel = rows * n
        _sum_splits_kernel[(triton.cdiv(numel, SUM_BLOCK),)](target, out, numel, SPLITS=splits, BLOCK=SUM_BLOCK,
                                                            **launch_args(out))  # fmt: skip


def block_fp8_rows(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, row_block: torch.Tensor,
                   blocks: ColumnBlocks, tile: GemmTile | None = None,
                   fp16_dot: bool = ROWS_FP16_DOT) -> torch.Tensor:  # fmt: skip
    """x [M, K] (half precision, unrounded; a few rows) @ (weight [N, K] e4m3 block-scaled)^T ->
    [M, N] in x's dtype, the weight widened to x's dtype (`fp16_dot`: both to fp16). `blocks`:
    `column_blocks(...)`; `tile`: ROWS_TILES' for M unless given."""
    rows, n = x.shape[0], weight.shape[0]
    out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if rows:
        _launch(x, None, weight, scale, row_block, blocks, out, tile or rows_tile(rows), False, fp16_dot)
    return out


def block_fp8_gemm(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, row_block: torch.Tensor,
                   blocks: ColumnBlocks, tile: GemmTile | None = None) -> torch.Tensor:  # fmt: skip
    """x [M, K] (any M, any float dtype), its rows quantized to e4m3 one scale each, @ (weight
    [N, K] e4m3 block-scaled)^T -> [M, N] in x's dtype. `blocks`: `column_blocks(...)`; `tile`:
    GEMM_TILES' for M unless given."""
    rows, n = x.shape[0], weight.shape[0]
    out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if rows:
        xq, x_scale = _quantized_rows(x)
        _launch(xq, x_scale, weight, scale, row_block, blocks, out, tile or gemm_tile(rows), True)
    return out
