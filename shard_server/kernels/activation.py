"""SiLU(gate) * up over the fused gate_up projection, in one pass.

Numerics follow torch: SiLU in float32 rounded to the model dtype, then the product rounded.
For an fp8 down projection (`--quantize fp8`, past the skinny kernel's rows) one program per
row also quantizes it, as `quantize_rows` would, handing the product `Fp8Rows`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .fp8_matmul import FP8, FP8_MAX, TINY_SCALE, Fp8Rows
from .pdl import launch_args, wait_for_previous_kernel

BLOCK = 1024
ROW_IN_REGISTERS = 32768  # the widest row the quantizing kernel keeps whole


@triton.jit
def _silu_mul_row(gate_up_ptr, row, in_stride, cols, WIDTH):
    """silu(gate) * up of one row's `cols`, rounded as torch rounds it, in float32."""
    mask = cols < WIDTH
    gate = tl.load(gate_up_ptr + row * in_stride + cols, mask=mask, other=0.0)
    up = tl.load(gate_up_ptr + row * in_stride + WIDTH + cols, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    silu = (g / (1.0 + tl.exp(-g))).to(gate.dtype).to(tl.float32)
    return (silu * up.to(tl.float32)).to(gate.dtype).to(tl.float32)


@triton.jit
def _silu_mul_kernel(gate_up_ptr, out_ptr, in_stride, WIDTH, BLOCK: tl.constexpr, PDL: tl.constexpr):
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    product = _silu_mul_row(gate_up_ptr, row, in_stride, cols, WIDTH)  # already rounded to the model dtype
    tl.store(out_ptr + row * WIDTH + cols, product.to(out_ptr.dtype.element_ty), mask=cols < WIDTH)


@triton.jit
def _silu_mul_quant_kernel(gate_up_ptr, out_ptr, scale_ptr, in_stride, WIDTH, BLOCK: tl.constexpr,
                           WHOLE_ROW: tl.constexpr, FP8_MAX: tl.constexpr, TINY: tl.constexpr,
                           PDL: tl.constexpr):  # fmt: skip
    """One row: WHOLE_ROW (BLOCK >= WIDTH) in one pass from registers, else its products' amax
    in a first pass and the products again, quantized, in a second."""
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0).to(tl.int64)
    if WHOLE_ROW:
        cols = tl.arange(0, BLOCK)
        product = _silu_mul_row(gate_up_ptr, row, in_stride, cols, WIDTH)
        scale = tl.maximum(tl.max(tl.abs(product), axis=0) / FP8_MAX, TINY)
        q = tl.minimum(tl.maximum(product / scale, -FP8_MAX), FP8_MAX)
        tl.store(out_ptr + row * WIDTH + cols, q.to(out_ptr.dtype.element_ty), mask=cols < WIDTH)
    else:
        amax = tl.zeros((BLOCK,), tl.float32)
        for c0 in range(0, WIDTH, BLOCK):
            amax = tl.maximum(amax, tl.abs(_silu_mul_row(gate_up_ptr, row, in_stride, c0 + tl.arange(0, BLOCK), WIDTH)))
        scale = tl.maximum(tl.max(amax, axis=0) / FP8_MAX, TINY)
        for c0 in range(0, WIDTH, BLOCK):
            cols = c0 + tl.arange(0, BLOCK)
            q = tl.minimum(tl.maximum(_silu_mul_row(gate_up_ptr, row, in_stride, cols, WIDTH) / scale, -FP8_MAX), FP8_MAX)
            tl.store(out_ptr + row * WIDTH + cols, q.to(out_ptr.dtype.element_ty), mask=cols < WIDTH)
    tl.store(scale_ptr + row, scale)


def fused_silu_mul(gate_up: torch.Tensor, quantize: bool = False) -> torch.Tensor | Fp8Rows:
    """gate_up: [T, 2 * I] (gate columns first) -> [T, I]; with `quantize` as `Fp8Rows`."""
    tokens, double = gate_up.shape
    if double % 2 or gate_up.stride(1) != 1:
        raise ValueError("fused_silu_mul needs [T, 2 * I] with contiguous columns")
    width = double // 2
    out = torch.empty((tokens, width), dtype=FP8 if quantize else gate_up.dtype, device=gate_up.device)
    if quantize:
        scale = torch.empty((tokens, 1), dtype=torch.float32, device=gate_up.device)
        if tokens:
            # Rows up to 32,768 wide sit in the registers of one program's 16 warps (the 8B's 14,336:
            # 32 products a thread); with two passes of 1,024 the first version took 11.7 µs a
            # decode layer at batch 80 on an H200, where the plain kernel and the quantize took 5.4.
            whole = max(BLOCK, 1 << (width - 1).bit_length())
            block, warps = (whole, 16) if whole <= ROW_IN_REGISTERS else (BLOCK, 4)
            _silu_mul_quant_kernel[(tokens,)](gate_up, out, scale, gate_up.stride(0), width, BLOCK=block,
                                              WHOLE_ROW=block >= width, FP8_MAX=FP8_MAX, TINY=TINY_SCALE,
                                              num_warps=warps, **launch_args(gate_up))  # fmt: skip
        return Fp8Rows(out, scale, gate_up.dtype)
    if tokens:
        grid = (tokens, triton.cdiv(width, BLOCK))
        _silu_mul_kernel[grid](gate_up, out, gate_up.stride(0), width, BLOCK=BLOCK, num_warps=4, **launch_args(gate_up))
    return out
