"""RMSNorm, optionally after a residual add, as one pass over each row.

Numerics follow Hugging Face: the residual sum is rounded to the model dtype, the row is
normalised in float32, rounded, then scaled by the weight in the model dtype.

Gemma norms a sublayer's output before adding it to the residual stream, then norms the sum
for the next sublayer: with `pre_weight` that first norm runs in the same pass, so the two
norms and the add between them are one launch instead of two.

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
def _rmsnorm_row(x, weight_ptr, cols, mask, eps, N: tl.constexpr):
    """One row (model dtype) normed and scaled, in the weight's dtype."""
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, axis=0) / N + eps)
    normed = (xf * rstd).to(x.dtype).to(tl.float32)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0)
    return (normed * w.to(tl.float32)).to(w.dtype)


@triton.jit
def _add_rmsnorm_kernel(
    x_ptr,
    residual_ptr,  # unused when HAS_RESIDUAL is false
    pre_weight_ptr,  # unused when PRE_NORM is false
    weight_ptr,
    out_ptr,  # the model dtype, or fp8 with QUANT
    scale_ptr,  # with QUANT: float32 [T], each row's scale
    residual_out_ptr,
    x_stride,
    residual_stride,
    pre_eps,
    eps,
    N: tl.constexpr,
    BLOCK: tl.constexpr,
    PRE_NORM: tl.constexpr,
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
    if PRE_NORM:
        x = _rmsnorm_row(x, pre_weight_ptr, cols, mask, pre_eps, N).to(x.dtype)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * residual_stride + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(residual_out_ptr + row * N + cols, x, mask=mask)
    y = _rmsnorm_row(x, weight_ptr, cols, mask, eps, N)
    if QUANT:  # quantize_rows' arithmetic on the rounded row
        yf = y.to(tl.float32)
        scale = tl.maximum(tl.max(tl.abs(yf), axis=0) / FP8_MAX, TINY)
        tl.store(scale_ptr + row, scale)
        y = tl.minimum(tl.maximum(yf / scale, -FP8_MAX), FP8_MAX)
    tl.store(out_ptr + row * N + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def _warps(block: int) -> int:
    return max(1, min(16, block // 512))


def fused_rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    quantize: bool = False,
    pre: tuple[torch.Tensor, float] | None = None,
) -> tuple[torch.Tensor | Fp8Rows, torch.Tensor]:
    """(rmsnorm(x + residual) * weight, x + residual) for x, residual of shape [T, N]; with
    `quantize` the first value comes as `Fp8Rows`. `pre` = (weight, eps) of a norm applied to x
    first: then x stands for rmsnorm(x) * pre_weight throughout.

    Without a residual the second value is x itself (it needs one with `pre`).
    """
    tokens, n = x.shape
    if x.stride(1) != 1 or (residual is not None and residual.stride(1) != 1):
        raise ValueError("fused_rmsnorm needs rows with contiguous columns")
    if pre is not None and residual is None:
        raise ValueError("fused_rmsnorm's pre-norm needs a residual (its normed x is returned as the sum)")
    pre_weight, pre_eps = pre if pre is not None else (weight, eps)
    out = torch.empty((tokens, n), dtype=FP8 if quantize else weight.dtype, device=x.device)
    scale = torch.empty((tokens, 1), dtype=torch.float32, device=x.device) if quantize else out
    summed = torch.empty((tokens, n), dtype=x.dtype, device=x.device) if residual is not None else x
    if tokens:
        block = 1 << (n - 1).bit_length()
        _add_rmsnorm_kernel[(tokens,)](
            x, residual if residual is not None else x, pre_weight, weight, out, scale, summed,
            x.stride(0), residual.stride(0) if residual is not None else 0, pre_eps, eps,
            N=n, BLOCK=block, PRE_NORM=pre is not None, HAS_RESIDUAL=residual is not None, QUANT=quantize,
            FP8_MAX=FP8_MAX, TINY=TINY_SCALE,
            num_warps=_warps(block), **launch_args(x),
        )  # fmt: skip
    return (Fp8Rows(out, scale, weight.dtype) if quantize else out), summed


@triton.jit
def _norm_heads(ptr, weight_ptr, token, row_stride, heads, eps, HEAD_DIM: tl.constexpr, HEADS_P: tl.constexpr,
                DIM_P: tl.constexpr):  # fmt: skip
    """One token's `heads` heads of HEAD_DIM values at ptr + token * row_stride, normed in place."""
    head = tl.arange(0, HEADS_P)[:, None]
    dim = tl.arange(0, DIM_P)[None, :]
    mask = (head < heads) & (dim < HEAD_DIM)
    at = ptr + token * row_stride + head * HEAD_DIM + dim
    xf = tl.load(at, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, axis=1) / HEAD_DIM + eps)[:, None]
    normed = (xf * rstd).to(ptr.dtype.element_ty).to(tl.float32)  # as _rmsnorm_row rounds
    w = tl.load(weight_ptr + dim, mask=dim < HEAD_DIM, other=0.0)
    tl.store(at, (normed * w.to(tl.float32)).to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _heads_rmsnorm_kernel(q_ptr, k_ptr, q_weight_ptr, k_weight_ptr, q_stride, k_stride, q_eps, k_eps, Q_HEADS,
                          KV_HEADS, HEAD_DIM: tl.constexpr, HEADS_P: tl.constexpr, DIM_P: tl.constexpr,
                          PDL: tl.constexpr):  # fmt: skip
    # Program (token, 0) norms the token's query heads, (token, 1) its key heads.
    wait_for_previous_kernel(PDL)
    token = tl.program_id(0).to(tl.int64)
    if tl.program_id(1) == 0:
        _norm_heads(q_ptr, q_weight_ptr, token, q_stride, Q_HEADS, q_eps, HEAD_DIM, HEADS_P, DIM_P)
    else:
        _norm_heads(k_ptr, k_weight_ptr, token, k_stride, KV_HEADS, k_eps, HEAD_DIM, HEADS_P, DIM_P)


def heads_fusable(x: torch.Tensor) -> bool:
    """[T, heads, head_dim] with each token's heads packed (a view into a fused qkv output)."""
    return x.dim() == 3 and x.stride(2) == 1 and x.stride(1) == x.shape[2]


def fused_heads_rmsnorm(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                        q_eps: float, k_eps: float) -> None:  # fmt: skip
    """Per-head RMSNorm of q [T, H, d] and k [T, KV, d] (`heads_fusable`), in place, in one launch:
    each head as `fused_rmsnorm` norms a row (Qwen3's and Gemma 3's q_norm / k_norm)."""
    tokens, heads, dim = q.shape
    if tokens:
        _heads_rmsnorm_kernel[(tokens, 2)](
            q, k, q_weight, k_weight, q.stride(0), k.stride(0), q_eps, k_eps, heads, k.shape[1],
            HEAD_DIM=dim, HEADS_P=triton.next_power_of_2(max(heads, k.shape[1])), DIM_P=triton.next_power_of_2(dim),
            num_warps=4, **launch_args(q),
        )  # fmt: skip
