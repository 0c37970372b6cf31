"""Rotary embedding applied in place to q and k (non-interleaved halves, as in HF Llama).

One program per token rotates all of its q heads and k heads, reading cos/sin straight from
the position tables: no gathered [T, 1, D] tables, no rotate-half copies. The rotation is
computed in float32 and rounded once.

Partial rotary (Phi-4-mini's partial_rotary_factor): the tables are narrower than a head, and
only each head's first `width` dims (the tables' width) rotate, in halves of width / 2; the
others are not touched. A half that is not a power of two is masked (HALF_P).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate_heads(x_ptr, token, row_stride, head_stride, cos, sin, HEADS: tl.constexpr,
                  HEADS_P: tl.constexpr, HALF: tl.constexpr, HALF_P: tl.constexpr):  # fmt: skip
    heads = tl.arange(0, HEADS_P)
    dims = tl.arange(0, HALF_P)
    if HALF_P == HALF:
        mask = (heads < HEADS)[:, None]
    else:
        mask = (heads < HEADS)[:, None] & (dims < HALF)[None, :]
    first = x_ptr + token * row_stride + heads[:, None] * head_stride + dims[None, :]
    x1 = tl.load(first, mask=mask, other=0.0)
    x2 = tl.load(first + HALF, mask=mask, other=0.0)
    a, b = x1.to(tl.float32), x2.to(tl.float32)
    tl.store(first, (a * cos - b * sin).to(x1.dtype), mask=mask)
    tl.store(first + HALF, (b * cos + a * sin).to(x1.dtype), mask=mask)


@triton.jit
def _rotary_kernel(
    q_ptr, k_ptr, positions_ptr, cos_ptr, sin_ptr,
    q_row_stride, q_head_stride, k_row_stride, k_head_stride, table_stride,
    Q_HEADS: tl.constexpr, Q_HEADS_P: tl.constexpr, K_HEADS: tl.constexpr, K_HEADS_P: tl.constexpr,
    HALF: tl.constexpr, HALF_P: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    position = tl.load(positions_ptr + token).to(tl.int64)
    dims = tl.arange(0, HALF_P)
    if HALF_P == HALF:
        cos = tl.load(cos_ptr + position * table_stride + dims).to(tl.float32)[None, :]
        sin = tl.load(sin_ptr + position * table_stride + dims).to(tl.float32)[None, :]
    else:
        cos = tl.load(cos_ptr + position * table_stride + dims, mask=dims < HALF, other=0.0).to(tl.float32)[None, :]
        sin = tl.load(sin_ptr + position * table_stride + dims, mask=dims < HALF, other=0.0).to(tl.float32)[None, :]
    _rotate_heads(q_ptr, token, q_row_stride, q_head_stride, cos, sin, Q_HEADS, Q_HEADS_P, HALF, HALF_P)
    _rotate_heads(k_ptr, token, k_row_stride, k_head_stride, cos, sin, K_HEADS, K_HEADS_P, HALF, HALF_P)


def _power_of_two(n: int) -> int:
    return 1 << (n - 1).bit_length()


def fused_rotary_(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> None:
    """Rotates q [T, H, D] and k [T, KV, D] in place; cos/sin are the [positions, width] tables
    (width D, or fewer under partial rotary: the first `width` dims of each head rotate)."""
    tokens, q_heads, dim = q.shape
    k_heads = k.shape[1]
    width = cos.shape[-1]
    if width % 2 or width > dim or k.shape[2] != dim or q.stride(2) != 1 or k.stride(2) != 1:
        raise ValueError("fused_rotary_ needs an even rotary width within head_dim and contiguous dims")
    if cos.stride(1) != 1 or cos.stride() != sin.stride():
        raise ValueError("cos and sin tables must share one row-major layout")
    if tokens:
        _rotary_kernel[(tokens,)](
            q, k, positions, cos, sin,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos.stride(0),
            Q_HEADS=q_heads, Q_HEADS_P=_power_of_two(q_heads), K_HEADS=k_heads,
            K_HEADS_P=_power_of_two(k_heads), HALF=width // 2, HALF_P=_power_of_two(width // 2), num_warps=4,
        )  # fmt: skip
