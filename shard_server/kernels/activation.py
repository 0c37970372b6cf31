"""SiLU(gate) * up over the fused gate_up projection, in one pass.

Numerics follow torch: SiLU in float32 rounded to the model dtype, then the product rounded.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024


@triton.jit
def _silu_mul_kernel(gate_up_ptr, out_ptr, in_stride, WIDTH, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < WIDTH
    gate = tl.load(gate_up_ptr + row * in_stride + cols, mask=mask, other=0.0)
    up = tl.load(gate_up_ptr + row * in_stride + WIDTH + cols, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    silu = (g / (1.0 + tl.exp(-g))).to(gate.dtype).to(tl.float32)
    tl.store(out_ptr + row * WIDTH + cols, (silu * up.to(tl.float32)).to(gate.dtype), mask=mask)


def fused_silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up: [T, 2 * I] (gate columns first) -> [T, I]."""
    tokens, double = gate_up.shape
    if double % 2 or gate_up.stride(1) != 1:
        raise ValueError("fused_silu_mul needs [T, 2 * I] with contiguous columns")
    width = double // 2
    out = torch.empty((tokens, width), dtype=gate_up.dtype, device=gate_up.device)
    if tokens:
        grid = (tokens, triton.cdiv(width, BLOCK))
        _silu_mul_kernel[grid](gate_up, out, gate_up.stride(0), width, BLOCK=BLOCK, num_warps=4)
    return out
