"""Few rows against a block-scaled fp8 weight (DeepSeek-V3 / Qwen3-FP8 checkpoints), in Triton.

A block-wise fp8 weight W [out, in] is e4m3 values times one scale per [bn, bk] block. At decode
batch sizes the product only streams the weight, so each program takes a slice of output
features and walks the columns one scale block at a time: the block's partial sums, in float32,
are multiplied by each feature's scale for that block and added up. The fp8 values widen
exactly to the rows' dtype; the rows stay unrounded (weight-only, as the fp8 path's few-row
product). A rank's slice need not fall on block boundaries: `row_block` gives each of its output
features its row of `scale`, and `col_starts` the first column of each column block in the
rank's own columns (the last entry is the width).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .pdl import launch_args, wait_for_previous_kernel

BLOCK_M = 16  # one tensor-core tile of rows; fewer are masked
BLOCK_N = 32
BLOCK_K = 128  # the checkpoints' usual column block: one trip per block


@triton.jit
def _block_fp8_rows_kernel(x_ptr, w_ptr, scale_ptr, row_block_ptr, col_starts_ptr, out_ptr, M, N, C, x_stride,
                           w_stride, scale_stride, out_stride, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_K: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    wait_for_previous_kernel(PDL)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # output features
    row_ok = rows < M
    col_ok = cols < N
    scale_rows = tl.load(row_block_ptr + cols, mask=col_ok, other=0).to(tl.int64) * scale_stride
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for block in range(0, C):
        lo = tl.load(col_starts_ptr + block)
        hi = tl.load(col_starts_ptr + block + 1)
        part = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for k0 in range(lo, hi, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < hi
            x = tl.load(x_ptr + rows[:, None] * x_stride + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_ptr + cols[:, None] * w_stride + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
            part += tl.dot(x, tl.trans(w.to(x.dtype)))
        scale = tl.load(scale_ptr + scale_rows + block, mask=col_ok, other=0.0)
        acc += part * scale[None, :]
    out = out_ptr + rows[:, None] * out_stride + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def column_block_starts(col_block: torch.Tensor, blocks: int) -> torch.Tensor:
    """The first column of each of `blocks` column blocks, then the width: int32 [blocks + 1].
    `col_block` (each column's block, 0 first, non-decreasing) must visit every block."""
    starts = torch.searchsorted(col_block.to(torch.int64), torch.arange(blocks + 1, device=col_block.device))
    return starts.to(torch.int32)


def block_fp8_rows(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, row_block: torch.Tensor,
                   col_starts: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """x [M, K] (half precision, M <= BLOCK_M) @ (weight [N, K] e4m3 block-scaled)^T -> [M, N] in x's dtype."""
    rows, n = x.shape[0], weight.shape[0]
    out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    scale = scale.float().contiguous()
    grid = (triton.cdiv(rows, BLOCK_M), triton.cdiv(n, BLOCK_N))
    _block_fp8_rows_kernel[grid](
        x, weight, scale, row_block, col_starts, out, rows, n, scale.shape[1], x.stride(0), weight.stride(0),
        scale.stride(0), out.stride(0), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, **launch_args(x),
    )  # fmt: skip
    return out
