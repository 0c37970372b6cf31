"""Matmuls against fp8 (e4m3) weights with one float32 scale per output feature (`--quantize fp8`).

A weight row is stored as round(row / scale) in fp8 with scale = max|row| / 448, so every row
uses fp8's whole range. The product picks its path by the number of rows:

- up to 16 rows (decodes of small batches): the skinny kernel streams the fp8 weight, widens
  it to the activation dtype in registers and scales its outputs: half the bytes of bf16, and
  the activations stay exact;
- more rows: each activation row is quantized the same way (its own scale, computed on the
  fly) and cuBLASLt multiplies fp8 by fp8 (`torch._scaled_mm`), at twice bf16's tensor rate;
- on CPU (tests, the demo model), or shapes cuBLASLt refuses: the same w8a8 arithmetic in
  float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .dispatch import use_fused
from .skinny_matmul import config_for, skinny_matmul, skinny_rows

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448
_TINY = 1e-12  # an all-zero row gets this scale instead of a division by zero
_BLOCK = 1024


def require_fp8_support(device: torch.device) -> None:
    """fp8 products need fp8 tensor cores (compute capability 8.9+: Ada, Hopper); CPUs emulate them."""
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        major, minor = torch.cuda.get_device_capability(device)
        raise ValueError(f"--quantize fp8 needs a GPU with fp8 tensor cores (compute capability 8.9+); "
                         f"{torch.cuda.get_device_name(device)} is {major}.{minor}")  # fmt: skip


def quantize_rows_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[M, K] -> (fp8 [M, K], float32 scales [M, 1]) with x ~= fp8 * scale, row by row."""
    wide = x.float()
    scale = (wide.abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp(min=_TINY)
    return (wide / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


@triton.jit
def _quantize_rows_kernel(x_ptr, out_ptr, scale_ptr, K, x_stride, FP8_MAX: tl.constexpr, TINY: tl.constexpr,
                          BLOCK: tl.constexpr):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    amax = tl.zeros((BLOCK,), tl.float32)
    for k0 in range(0, K, BLOCK):
        ks = k0 + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * x_stride + ks, mask=ks < K, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    scale = tl.maximum(tl.max(amax, axis=0) / FP8_MAX, TINY)
    tl.store(scale_ptr + row, scale)
    for k0 in range(0, K, BLOCK):
        ks = k0 + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * x_stride + ks, mask=ks < K, other=0.0).to(tl.float32)
        q = tl.minimum(tl.maximum(x / scale, -FP8_MAX), FP8_MAX)
        tl.store(out_ptr + row * K + ks, q.to(out_ptr.dtype.element_ty), mask=ks < K)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`quantize_rows_reference` in one Triton launch (two passes over each row) on CUDA."""
    if not use_fused(x) or x.stride(1) != 1:
        return quantize_rows_reference(x)
    rows, k = x.shape
    out = torch.empty((rows, k), dtype=FP8, device=x.device)
    scale = torch.empty((rows, 1), dtype=torch.float32, device=x.device)
    if rows:
        _quantize_rows_kernel[(rows,)](x, out, scale, k, x.stride(0), FP8_MAX=FP8_MAX, TINY=_TINY, BLOCK=_BLOCK,
                                       num_warps=4)  # fmt: skip
    return out, scale


def w8a8_product(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """x [M, K] quantized row by row, times the fp8 weight: cuBLASLt on CUDA, float32 elsewhere."""
    if x.is_cuda and weight.shape[0] % 16 == 0 and weight.shape[1] % 16 == 0:  # cuBLASLt's alignment
        xq, x_scale = quantize_rows(x.contiguous())
        return torch._scaled_mm(xq, weight.t(), scale_a=x_scale, scale_b=weight_scale.view(1, -1), out_dtype=x.dtype)
    xq, x_scale = quantize_rows_reference(x)
    return ((xq.float() @ weight.float().t()) * x_scale * weight_scale.view(1, -1)).to(x.dtype)


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
               bias: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """x [..., K] @ (weight [N, K] fp8 * weight_scale [N, 1])^T (+ bias) -> [..., N] in x's dtype."""
    flat = x.reshape(-1, x.shape[-1])
    # Past 16 rows a weight-only tile grown to 128 rows ran 1.4-2.5x slower than cuBLASLt's fp8
    # product (bench/results/fp8_matmul_h200.json, run 5).
    if use_fused(flat) and skinny_rows(flat):
        config = config_for(flat.shape[0], weight.shape[0], weight.shape[1], weights_fp8=True)
        out = skinny_matmul(flat, weight, config, weight_scale)
    else:
        out = w8a8_product(flat, weight, weight_scale)
    if bias is not None:
        out = out + bias
    return out.view(*x.shape[:-1], weight.shape[0])
