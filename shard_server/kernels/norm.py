"""RMSNorm, optionally after a residual add, as one pass over each row.

Numerics follow Hugging Face: the residual sum is rounded to the model dtype, the row is
normalised in float32, rounded, then scaled by the weight in the model dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _add_rmsnorm_kernel(
    x_ptr,
    residual_ptr,  # unused when HAS_RESIDUAL is false
    weight_ptr,
    out_ptr,
    residual_out_ptr,
    x_stride,
    residual_stride,
    eps,
    N: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):
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
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * N + cols, (normed * w).to(out_ptr.dtype.element_ty), mask=mask)


def _warps(block: int) -> int:
    return max(1, min(16, block // 512))


def fused_rmsnorm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rmsnorm(x + residual) * weight, x + residual) for x, residual of shape [T, N].

    Without a residual the second value is x itself.
    """
    tokens, n = x.shape
    if x.stride(1) != 1 or (residual is not None and residual.stride(1) != 1):
        raise ValueError("fused_rmsnorm needs rows with contiguous columns")
    out = torch.empty((tokens, n), dtype=weight.dtype, device=x.device)
    summed = torch.empty_like(out, dtype=x.dtype) if residual is not None else x
    if tokens:
        block = 1 << (n - 1).bit_length()
        _add_rmsnorm_kernel[(tokens,)](
            x, residual if residual is not None else x, weight, out, summed,
            x.stride(0), residual.stride(0) if residual is not None else 0, eps,
            N=n, BLOCK=block, HAS_RESIDUAL=residual is not None, num_warps=_warps(block),
        )  # fmt: skip
    return out, summed
