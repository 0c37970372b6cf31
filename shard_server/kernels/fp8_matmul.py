"""Matmuls against fp8 (e4m3) weights with one float32 scale per output feature (`--quantize fp8`).

A weight row is stored as round(row / scale) in fp8 with scale = max|row| / 448, so every row
uses fp8's whole range. The product picks its path by the number of rows:

- up to 16 rows (decodes of small batches): the skinny kernel streams the fp8 weight, widens
  it in registers (to fp16 where that pays: one instruction per pair, bf16 takes several) and
  scales its outputs: half the bytes of bf16, and the activations stay exact;
- more rows: each activation row is quantized the same way (its own scale, computed on the
  fly) and multiplied fp8 by fp8 on the tensor cores: by the skinny kernel in 64-row tiles
  where it measured faster (`rows_gemm_config`: most shapes up to 192 rows), else by cuBLASLt
  (`torch._scaled_mm`), which streams a decode batch's weights at only 1-2.9 TB/s but wins
  once the rows make the product compute-bound;
- on CPU (tests, the demo model), or shapes cuBLASLt refuses: the same w8a8 arithmetic in
  float32.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from .dispatch import use_fused
from .pdl import launch_args, wait_for_previous_kernel
from .skinny_matmul import MAX_ROWS, SkinnyConfig, config_for, launch_rows_product, skinny_matmul, skinny_rows

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448
TINY_SCALE = 1e-12  # an all-zero row gets this scale instead of a division by zero
_BLOCK = 1024
# cuBLASLt's fast accumulation (the tensor cores' own accumulator over the whole depth, with no
# periodic promotion of partial sums to float32 registers): 5-12 % faster at 1024-8192 rows on
# an H200 (2048-row gate_up 425 -> 375 us, 8192-row o 298 -> 223 us); rel L2 error against the
# float32 product 1.7e-3 -> 2.1e-3 (down, 14336 deep: 3.3e-3), well under fp8's own rounding
# (bench/gpu_fp8_fast_accum.py, fp8_fast_accum_h200.json).
FP8_FAST_ACCUM = True
ROWS_GEMM_TILE = 64  # rows per program: Hopper's smallest warpgroup product
ROWS_GEMM_MAX_ROWS = 192
# Measured on an H200 over the 8B projections with their rows' quantization, µs per call
# (bench/gpu_fp8_rows_gemm.py, bench/results/fp8_rows_gemm_h200.json), against cuBLASLt's:
# at 32 rows qkv 15.4 vs 19.3, o 11.3 vs 16.1, gate_up 36.2 vs 47.4, down 31.2 vs 47.3; at 80
# qkv 16.4 vs 16.5, o 13.9 vs 16.2, down 40.7 vs 44.4, but gate_up 45.6 vs 45.5 (128: 47.7 vs
# 39.8); at 192 qkv 20.6 vs 21.9, o 16.4 vs 16.7, gate_up 66.5 vs 72.7, down 46.6 vs 46.7; at
# 256 cuBLASLt wins every one.
ROWS_GEMM_NARROW = SkinnyConfig(block_n=32, block_k=256, num_warps=4, num_stages=4)  # up to 64 rows
ROWS_GEMM_SQUARE = SkinnyConfig(block_n=64, block_k=256, num_warps=4, num_stages=3)  # more rows
ROWS_GEMM_WIDE = SkinnyConfig(block_n=64, block_k=128, num_warps=4, num_stages=4)  # qkv past 128 rows
ROWS_GEMM_WIDEST = SkinnyConfig(block_n=128, block_k=128, num_warps=8, num_stages=4)  # gate_up
# down (14336 deep) past 64 rows in two K ranges: 80 rows 33.6 vs 41.2 µs unsplit (cuBLASLt
# 44.8), 128 rows 34.7 vs 42.1 (45.1) (fp8_rows_gemm_split_h200.json).
ROWS_GEMM_DEEP = replace(ROWS_GEMM_SQUARE, split_k=2)
WIDEST_FROM_FEATURES = 16384


@dataclass(frozen=True)
class Fp8Rows:
    """Activation rows already quantized for an fp8 product, by the kernel that produced them
    (the norm before qkv and gate_up, the SiLU before down): `quantize_rows` of what it would
    have returned, so the product is the same and one launch and one pass over the rows fewer."""

    values: torch.Tensor  # fp8 [T, K]
    scale: torch.Tensor  # float32 [T, 1]
    dtype: torch.dtype  # the rows' own dtype: the product's

    @property
    def shape(self) -> torch.Size:
        return self.values.shape


def quantizes_rows(x: torch.Tensor) -> bool:
    """Whether `fp8_linear` quantizes rows like these itself on a fused path (past the skinny
    kernel's 16), so the kernel producing them may hand over `Fp8Rows` instead."""
    return use_fused(x) and x.dim() == 2 and x.shape[0] > MAX_ROWS


def require_fp8_support(device: torch.device) -> None:
    """fp8 products need fp8 tensor cores (compute capability 8.9+: Ada, Hopper); CPUs emulate them."""
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        major, minor = torch.cuda.get_device_capability(device)
        raise ValueError(f"--quantize fp8 needs a GPU with fp8 tensor cores (compute capability 8.9+); "
                         f"{torch.cuda.get_device_name(device)} is {major}.{minor}")  # fmt: skip


def quantize_rows_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[M, K] -> (fp8 [M, K], float32 scales [M, 1]) with x ~= fp8 * scale, row by row."""
    wide = x.float()
    scale = (wide.abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp(min=TINY_SCALE)
    return (wide / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


@triton.jit
def _quantize_rows_kernel(x_ptr, out_ptr, scale_ptr, K, x_stride, FP8_MAX: tl.constexpr, TINY: tl.constexpr,
                          BLOCK: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    wait_for_previous_kernel(PDL)
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
        _quantize_rows_kernel[(rows,)](x, out, scale, k, x.stride(0), FP8_MAX=FP8_MAX, TINY=TINY_SCALE, BLOCK=_BLOCK,
                                       num_warps=4, **launch_args(x))  # fmt: skip
    return out, scale


def _quantized_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows' quantization for a product: the kernel on CUDA, torch elsewhere (Triton's
    interpreter rounds some values to fp8 wrongly)."""
    return quantize_rows(x.contiguous()) if x.is_cuda else quantize_rows_reference(x)


def w8a8_product(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """x [M, K] quantized row by row, times the fp8 weight: cuBLASLt on CUDA, float32 elsewhere."""
    return _scaled_product(*_quantized_rows(x), weight, weight_scale, x.dtype)


def _scaled_product(xq, x_scale, weight, weight_scale, dtype: torch.dtype) -> torch.Tensor:
    """fp8 rows [M, K] x fp8 weight [N, K]^T with both scales, by cuBLASLt where it takes the shapes."""
    if xq.is_cuda and weight.shape[0] % 16 == 0 and weight.shape[1] % 16 == 0:  # cuBLASLt's alignment
        return torch._scaled_mm(xq, weight.t(), scale_a=x_scale, scale_b=weight_scale.view(1, -1), out_dtype=dtype,
                                use_fast_accum=FP8_FAST_ACCUM)  # fmt: skip
    return ((xq.float() @ weight.float().t()) * x_scale * weight_scale.view(1, -1)).to(dtype)


def rows_gemm_config(rows: int, features: int, depth: int) -> SkinnyConfig | None:
    """The row-tile kernel's config for an fp8 product of `rows` rows; None: cuBLASLt is faster."""
    if rows > ROWS_GEMM_MAX_ROWS:
        return None
    if features >= WIDEST_FROM_FEATURES:
        return None if 64 < rows <= 128 else ROWS_GEMM_WIDEST
    if rows <= 64:
        return ROWS_GEMM_NARROW
    if depth > features and rows <= 128:
        return ROWS_GEMM_DEEP
    return ROWS_GEMM_WIDE if features > depth and rows > 128 else ROWS_GEMM_SQUARE


def fp8_rows_product(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                     config: SkinnyConfig, tile: int = ROWS_GEMM_TILE) -> torch.Tensor:  # fmt: skip
    """`w8a8_product` by the skinny kernel in `tile`-row tiles (CUDA, or Triton's interpreter)."""
    return _rows_product(*quantize_rows(x), weight, weight_scale, config, x.dtype, tile)


def _rows_product(xq, x_scale, weight, weight_scale, config: SkinnyConfig, dtype: torch.dtype,
                  tile: int = ROWS_GEMM_TILE) -> torch.Tensor:  # fmt: skip
    out = torch.empty((xq.shape[0], weight.shape[0]), dtype=dtype, device=xq.device)
    launch_rows_product(xq, x_scale, weight, weight_scale.view(-1), out, config, tile)
    return out


def fp8_linear(x: torch.Tensor | Fp8Rows, weight: torch.Tensor, weight_scale: torch.Tensor,
               bias: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """x [..., K] (or `Fp8Rows` [T, K]) @ (weight [N, K] fp8 * weight_scale [N, 1])^T (+ bias) -> [..., N]."""
    if isinstance(x, Fp8Rows):
        out = _quantized_product(x.values, x.scale, weight, weight_scale, x.dtype)
        return out if bias is None else out + bias
    flat = x.reshape(-1, x.shape[-1])
    rows, (features, depth) = flat.shape[0], weight.shape
    # Past 16 rows a weight-only tile grown to 128 rows ran 1.4-2.5x slower than cuBLASLt's fp8
    # product (bench/results/fp8_matmul_h200.json, run 5): there the rows are quantized too.
    if use_fused(flat) and skinny_rows(flat):
        # Widened to fp16, not bf16 (several instructions a value on sm_90): with the fp8 config,
        # H200, 1 row, qkv 12.2 vs 17.9 µs, o 9.4 vs 13.4, gate_up 37.5 vs 51.5, down 19.8 vs
        # 32.5. The rows then saturate at fp16's +-65504 (`skinny_matmul`).
        config = config_for(rows, features, depth, weights_fp8=True)
        out = skinny_matmul(flat, weight, config, weight_scale, fp16_dot=True)
    else:
        out = _quantized_product(*_quantized_rows(flat), weight, weight_scale, x.dtype)
    if bias is not None:
        out = out + bias
    return out.view(*x.shape[:-1], features)


def _quantized_product(xq, x_scale, weight, weight_scale, dtype: torch.dtype) -> torch.Tensor:
    """Quantized rows times the fp8 weight: the row-tile kernel where the table says, else cuBLASLt."""
    tiled = rows_gemm_config(xq.shape[0], *weight.shape) if use_fused(xq) and xq.stride(1) == 1 else None
    if tiled is not None:
        return _rows_product(xq, x_scale, weight, weight_scale, tiled, dtype)
    return _scaled_product(xq, x_scale, weight, weight_scale, dtype)
