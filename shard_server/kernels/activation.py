"""act(gate) * up over the fused gate_up projection, in one pass: SiLU (Llama and most
families) or GELU's tanh approximation (Gemma's GeGLU).

Numerics follow torch: the activation in float32 rounded to the model dtype, then the product
rounded.
For an fp8 down projection (`--quantize fp8`, past the skinny kernel's rows) one program per
row also quantizes it, as `quantize_rows` would, handing the product `Fp8Rows`.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .fp8_matmul import FP8, FP8_MAX, TINY_SCALE, Fp8Rows
from .pdl import launch_args, wait_for_previous_kernel

BLOCK = 1024
ROW_IN_REGISTERS = 32768  # the widest row the quantizing kernel keeps whole


# Each gated activation the kernels fuse, and its plain-torch form (the unfused path).
TORCH_ACTIVATIONS = {"silu": F.silu, "gelu_tanh": partial(F.gelu, approximate="tanh")}
ACTIVATIONS = tuple(TORCH_ACTIVATIONS)
SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)  # a kernel reads only constexpr globals


@triton.jit
def _act_mul_row(gate_up_ptr, row, in_stride, cols, WIDTH, GELU: tl.constexpr):
    """act(gate) * up of one row's `cols`, rounded as torch rounds it, in float32."""
    mask = cols < WIDTH
    gate = tl.load(gate_up_ptr + row * in_stride + cols, mask=mask, other=0.0)
    up = tl.load(gate_up_ptr + row * in_stride + WIDTH + cols, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    if GELU:  # tanh(y) as 1 - 2 / (exp(2y) + 1): exact at both saturations in float32
        y = SQRT_2_OVER_PI * (g + 0.044715 * g * g * g)
        act = 0.5 * g * (2.0 - 2.0 / (tl.exp(2.0 * y) + 1.0))
    else:
        act = g / (1.0 + tl.exp(-g))
    act = act.to(gate.dtype).to(tl.float32)
    return (act * up.to(tl.float32)).to(gate.dtype).to(tl.float32)


@triton.jit
def _act_mul_kernel(gate_up_ptr, out_ptr, in_stride, WIDTH, BLOCK: tl.constexpr, GELU: tl.constexpr,
                    PDL: tl.constexpr):  # fmt: skip
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    product = _act_mul_row(gate_up_ptr, row, in_stride, cols, WIDTH, GELU)  # already rounded to the model dtype
    tl.store(out_ptr + row * WIDTH + cols, product.to(out_ptr.dtype.element_ty), mask=cols < WIDTH)


@triton.jit
def _act_mul_quant_kernel(gate_up_ptr, out_ptr, scale_ptr, in_stride, WIDTH, BLOCK: tl.constexpr,
                          WHOLE_ROW: tl.constexpr, FP8_MAX: tl.constexpr, TINY: tl.constexpr, GELU: tl.constexpr,
                          PDL: tl.constexpr):  # fmt: skip
    """One row: WHOLE_ROW (BLOCK >= WIDTH) in one pass from registers, else its products' amax
    in a first pass and the products again, quantized, in a second."""
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0).to(tl.int64)
    if WHOLE_ROW:
        cols = tl.arange(0, BLOCK)
        product = _act_mul_row(gate_up_ptr, row, in_stride, cols, WIDTH, GELU)
        scale = tl.maximum(tl.max(tl.abs(product), axis=0) / FP8_MAX, TINY)
        q = tl.minimum(tl.maximum(product / scale, -FP8_MAX), FP8_MAX)
        tl.store(out_ptr + row * WIDTH + cols, q.to(out_ptr.dtype.element_ty), mask=cols < WIDTH)
    else:
        amax = tl.zeros((BLOCK,), tl.float32)
        for c0 in range(0, WIDTH, BLOCK):
            amax = tl.maximum(amax, tl.abs(_act_mul_row(gate_up_ptr, row, in_stride, c0 + tl.arange(0, BLOCK), WIDTH, GELU)))
        scale = tl.maximum(tl.max(amax, axis=0) / FP8_MAX, TINY)
        for c0 in range(0, WIDTH, BLOCK):
            cols = c0 + tl.arange(0, BLOCK)
            q = tl.minimum(tl.maximum(_act_mul_row(gate_up_ptr, row, in_stride, cols, WIDTH, GELU) / scale, -FP8_MAX),
                           FP8_MAX)  # fmt: skip
            tl.store(out_ptr + row * WIDTH + cols, q.to(out_ptr.dtype.element_ty), mask=cols < WIDTH)
    tl.store(scale_ptr + row, scale)


def fused_act_mul(gate_up: torch.Tensor, activation: str, quantize: bool = False) -> torch.Tensor | Fp8Rows:
    """gate_up: [T, 2 * I] (gate columns first) -> activation(gate) * up, [T, I]; with `quantize`
    as `Fp8Rows`. `activation`: one of ACTIVATIONS."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"no fused kernel for activation {activation!r}; have {', '.join(ACTIVATIONS)}")
    gelu = activation == "gelu_tanh"
    tokens, double = gate_up.shape
    if double % 2 or gate_up.stride(1) != 1:
        raise ValueError("fused_act_mul needs [T, 2 * I] with contiguous columns")
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
            _act_mul_quant_kernel[(tokens,)](gate_up, out, scale, gate_up.stride(0), width, BLOCK=block,
                                             WHOLE_ROW=block >= width, FP8_MAX=FP8_MAX, TINY=TINY_SCALE, GELU=gelu,
                                             num_warps=warps, **launch_args(gate_up))  # fmt: skip
        return Fp8Rows(out, scale, gate_up.dtype)
    if tokens:
        grid = (tokens, triton.cdiv(width, BLOCK))
        _act_mul_kernel[grid](gate_up, out, gate_up.stride(0), width, BLOCK=BLOCK, GELU=gelu, num_warps=4,
                              **launch_args(gate_up))  # fmt: skip
    return out
