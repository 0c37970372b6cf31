"""RMSNorm, optionally after a residual add, as one pass over each row.

Numerics follow Hugging Face: the residual sum is rounded to the model dtype, the row is
normalised in float32, rounded, then scaled by the weight in the model dtype.

For an fp8 product next (`--quantize fp8`, more rows than the skinny kernel takes) the output
row is quantized in the same pass, exactly as `quantize_rows` would quantize it: its amax is
already in registers, and the product gets `Fp8Rows` without a launch of its own.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .fp8_matmul import FP8, FP8_MAX, TINY_SCALE, Fp8Rows
from .pdl import launch_args, wait_for_previous_kernel


@triton.jit
def _add_rmsnorm_kernel(
    x_ptr,
    residual_ptr,  # unused when HAS_RESIDUAL is false
    weight_ptr,
    out_ptr,  # the model dtype, or fp8 with QUANT
    scale_ptr,  # with QUANT: float32 [T], each row's scale
    residual_out_ptr,
    x_stride,
    residual_stride,
    eps,
    N: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    QUANT: tl.constexpr,
    FP8_MAX: tl.constexpr,
    TINY: tl.constexpr,
    PDL: tl.constexpr,  # programmatic dependent launch (`pdl.py`)
):
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * residual_stride + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(residual_out_ptr + row * N + cols, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, axis=0) / N + eps)
    normed = (xf * rstd).to(x.dtype).to(tl.float32)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0)
    y = (normed * w.to(tl.float32)).to(w.dtype)
    if QUANT:  # quantize_rows' arithmetic on the rounded row
        yf = y.to(tl.float32)
        scale = tl.maximum(tl.max(tl.abs(yf), axis=0) / FP8_MAX, TINY)
        tl.store(scale_ptr + row, scale)
        y = tl.minimum(tl.maximum(yf / scale, -FP8_MAX), FP8_MAX)
    tl.store(out_ptr + row * N + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def _warps(block: int) -> int:
    return max(1, min(16, block // 512))


def fused_rmsnorm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None, quantize: bool = False
) -> tuple[torch.Tensor | Fp8Rows, torch.Tensor]:
    """(rmsnorm(x + residual) * weight, x + residual) for x, residual of shape [T, N]; with
    `quantize` the first value comes as `Fp8Rows`.

    Without a residual the second value is x itself.
    """
    tokens, n = x.shape
    if x.stride(1) != 1 or (residual is not None and residual.stride(1) != 1):
        raise ValueError("fused_rmsnorm needs rows with contiguous columns")
    out = torch.empty((tokens, n), dtype=FP8 if quantize else weight.dtype, device=x.device)
    scale = torch.empty((tokens, 1), dtype=torch.float32, device=x.device) if quantize else out
    summed = torch.empty((tokens, n), dtype=x.dtype, device=x.device) if residual is not None else x
    if tokens:
        block = 1 << (n - 1).bit_length()
        _add_rmsnorm_kernel[(tokens,)](
            x, residual if residual is not None else x, weight, out, scale, summed,
            x.stride(0), residual.stride(0) if residual is not None else 0, eps,
            N=n, BLOCK=block, HAS_RESIDUAL=residual is not None, QUANT=quantize, FP8_MAX=FP8_MAX, TINY=TINY_SCALE,
            num_warps=_warps(block), **launch_args(x),
        )  # fmt: skip
    return (Fp8Rows(out, scale, weight.dtype) if quantize else out), summed
