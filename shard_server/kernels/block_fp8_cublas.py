"""Block-wise fp8 products through cuBLASLt, where a rank holds whole 128 x 128 blocks.

cuBLASLt (CUDA 12.9+, sm_90; PyTorch's torch._scaled_mm) multiplies DeepSeek's recipe: e4m3 rows
with a scale per row and 128 columns, times an e4m3 weight with a scale per 128 x 128 block. Past
a few rows it beats the Triton kernel of `block_fp8_matmul.py` (1.6-1.7x at 256 to 2,048 rows on
an H100), which keeps the few-row products (weight streaming), slices that start mid-block, and
other GPUs. A scale per 128 columns (`quantize_groups`) is also closer to the rows than one a row.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .block_fp8_matmul import ColumnBlocks
from .dispatch import use_fused
from .fp8_matmul import FP8, FP8_MAX, TINY_SCALE
from .pdl import launch_args, wait_for_previous_kernel

# From this many rows a rank of whole 128 x 128 blocks multiplies through cuBLASLt's block-scaled
# GEMM (`block_fp8_cublas`) rather than `block_fp8_gemm`. On one H100, total µs over the 8B's
# projections (bench/results/block_fp8_cublas_h100.json; per-channel fp8 in brackets): 32 rows
# 135.5 (115.3), 64 132.5 (115.7), 128 130.9 (127.0), 256 146.4 (144.3), 512 212.2 (195.2), 2048
# 768.0 (715.7); the Triton GEMM took 137.7 at 64 rows, 229.6 at 256 and 1,312.9 at 2048
# (block_fp8_h100.json).
CUBLAS_FROM_ROWS = 17
GROUP = 128  # columns an activation scale covers on the cuBLAS path (and the weight blocks' size)
_GROUPS_A_PROGRAM = 8


def quantize_groups_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[M, K] -> (e4m3 [M, K], float32 scales [M, ceil(K / GROUP)]): x ~= fp8 * scale, a scale per
    row and GROUP columns."""
    rows, k = x.shape
    wide = F.pad(x.float(), (0, -k % GROUP)).view(rows, -1, GROUP)
    scale = (wide.abs().amax(dim=2, keepdim=True) / FP8_MAX).clamp(min=TINY_SCALE)
    return (wide / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8).view(rows, -1)[:, :k], scale[..., 0]


@triton.jit
def _quantize_groups_kernel(x_ptr, out_ptr, scale_ptr, M, K, x_stride, scale_stride, FP8_MAX: tl.constexpr,
                            TINY: tl.constexpr, GROUP: tl.constexpr, GROUPS: tl.constexpr,
                            PDL: tl.constexpr):  # fmt: skip
    # Row program_id(0), groups GROUPS * program_id(1) on: each group's scale at
    # scale_ptr + group * scale_stride + row (the scales stored group-major). Rows past M are zeros.
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0).to(tl.int64)
    groups = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
    ks = groups[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    ok = ks < K
    x = tl.load(x_ptr + row * x_stride + ks, mask=ks < tl.where(row < M, K, 0), other=0.0).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), axis=1) / FP8_MAX, TINY)
    tl.store(scale_ptr + groups * scale_stride + row, scale, mask=groups * GROUP < K)
    q = tl.minimum(tl.maximum(x / scale[:, None], -FP8_MAX), FP8_MAX)
    tl.store(out_ptr + row * K + ks, q.to(out_ptr.dtype.element_ty), mask=ok)


def quantize_groups(x: torch.Tensor, pad_rows_to: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """`quantize_groups_reference` in one launch on CUDA, its rows padded with zero rows to a multiple
    of `pad_rows_to`, and the scales [rows, groups] stored group-major (strides (1, rows)), as
    cuBLASLt's block-scaled GEMM reads them."""
    rows, k = x.shape
    padded, groups = rows + -rows % pad_rows_to, triton.cdiv(k, GROUP)
    if not use_fused(x):
        xq, scale = quantize_groups_reference(F.pad(x, (0, 0, 0, padded - rows)))
        return xq, scale.t().contiguous().t()
    x = x.contiguous()
    out = torch.empty((padded, k), dtype=FP8, device=x.device)
    scale = torch.empty((groups, padded), dtype=torch.float32, device=x.device)
    if padded:
        grid = (padded, triton.cdiv(groups, _GROUPS_A_PROGRAM))
        _quantize_groups_kernel[grid](x, out, scale, rows, k, x.stride(0), padded, FP8_MAX=FP8_MAX, TINY=TINY_SCALE,
                                      GROUP=GROUP, GROUPS=_GROUPS_A_PROGRAM, num_warps=4, **launch_args(x))  # fmt: skip
    return out, scale.t()


def cublas_takes_blocks(device: torch.device) -> bool:
    """Whether torch._scaled_mm multiplies block-scaled fp8 on `device`: cuBLASLt does it on sm_90
    from CUDA 12.9 (PyTorch refuses other GPUs)."""
    if device.type != "cuda" or torch.version.cuda is None:
        return False
    cuda = tuple(int(part) for part in torch.version.cuda.split(".")[:2])
    return torch.cuda.get_device_capability(device) == (9, 0) and cuda >= (12, 9)


def cublas_weight_scale(scale: torch.Tensor, row_block: torch.Tensor, blocks: ColumnBlocks,
                        shape: tuple[int, int]) -> torch.Tensor | None:  # fmt: skip
    """A rank's block scales as cuBLASLt's block-scaled GEMM takes them for weight.t(): [K / 128,
    N / 128], K-major; None where the rank's [N, K] slice is not whole 128 x 128 blocks from its
    first row and column, K / 128 is not a multiple of 4 (cuBLASLt's scale padding) or N is not
    16-aligned. A load-time call (it reads row_block back from the device)."""
    n, k = shape
    if blocks != ColumnBlocks(GROUP, GROUP) or k % (4 * GROUP) or n % 16:
        return None
    row_block = row_block.cpu().long()
    first = int(row_block[0])
    if not torch.equal(row_block, first + torch.arange(n) // GROUP):
        return None
    return scale[first : first + -(-n // GROUP)].float().contiguous().t()


def block_fp8_cublas(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """x [M, K] (half precision), quantized a scale per row and 128 columns, @ (weight [N, K] e4m3
    in whole 128 x 128 blocks)^T -> [M, N] in x's dtype, by cuBLASLt; `weight_scale`:
    `cublas_weight_scale(...)`."""
    rows = x.shape[0]
    xq, x_scale = quantize_groups(x, pad_rows_to=4)  # cuBLASLt takes rows in fours
    return torch._scaled_mm(xq, weight.t(), scale_a=x_scale, scale_b=weight_scale, out_dtype=x.dtype)[:rows]
