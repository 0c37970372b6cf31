"""8-bit weights widened to the activations' dtype in one pass, for products of many rows.

Past the few rows a skinny kernel streams, a block-wise fp8 or a W8A16 int8 product multiplies
the dequantized weight with cuBLAS (compute-bound there). Dequantizing in torch costs about five
float32 passes over the weight (widen, gather the scales, multiply, round); this kernel reads the
8-bit value and the scale and writes the rounded weight once: W[n, k] = w[n, k] * scale, the
scale one per row (int8) or one per [bn, bk] block, found through each row's and column's block
index (a rank's slice need not start on a block). The same float32 product rounded once to the
dtype, as the reference `dequantize` computes it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

TILE = (64, 128)  # [rows, columns] of the weight a program writes


@triton.jit
def _dequantize_kernel(w_ptr, scale_ptr, row_block_ptr, col_block_ptr, out_ptr, N, K, scale_stride,
                       BLOCKED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    row_ok, col_ok = rows < N, cols < K
    ok = row_ok[:, None] & col_ok[None, :]
    at = rows.to(tl.int64)[:, None] * K + cols[None, :]
    w = tl.load(w_ptr + at, mask=ok).to(tl.float32)  # exact for fp8 and int8; no `other`: fp8 has no literal
    if BLOCKED:
        block_row = tl.load(row_block_ptr + rows, mask=row_ok, other=0).to(tl.int64)
        block_col = tl.load(col_block_ptr + cols, mask=col_ok, other=0)
        scale = tl.load(scale_ptr + block_row[:, None] * scale_stride + block_col[None, :], mask=ok, other=0.0)
    else:
        scale = tl.load(scale_ptr + rows, mask=row_ok, other=0.0)[:, None]
    tl.store(out_ptr + at, (w * scale).to(out_ptr.dtype.element_ty), mask=ok)


def dequantize_8bit(weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype,
                    row_block: torch.Tensor | None = None, col_block: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """weight [N, K] (fp8 or int8, contiguous) in `dtype`: times scale [N, 1] per row, or with
    row_block [N] and col_block [K] (int32) times scale[row_block[n], col_block[k]] (float32)."""
    rows, cols = weight.shape
    out = torch.empty((rows, cols), dtype=dtype, device=weight.device)
    blocked = row_block is not None
    grid = (triton.cdiv(rows, TILE[0]), triton.cdiv(cols, TILE[1]))
    _dequantize_kernel[grid](weight, scale, row_block if blocked else scale, col_block if blocked else scale, out,
                             rows, cols, scale.stride(0), BLOCKED=blocked, BLOCK_N=TILE[0], BLOCK_K=TILE[1],
                             num_warps=4)  # fmt: skip
    return out
