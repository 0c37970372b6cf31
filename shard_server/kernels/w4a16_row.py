"""One activation row times a GPTQ/AWQ packed weight on the CUDA cores: the batch-1 decode of W4A16.

A tensor-core tile pads one row to 16 and must unpack every value into the MMA operand's
layout, through shared memory on Hopper; on an H100 the best such tile streamed the 8B
model's packed projections at 0.6-1.1 TB/s against cuBLAS's 2.0-2.9 TB/s for their bf16
weights (bench/results/w4a16_tiles_h100_untuned.json), so a 4-bit model decoded barely faster
than bf16. Here each program holds [WORDS, BLOCK_N] packed words as they lie in memory (N
contiguous, one coalesced load, the next step's asked for before this one is worked on) and
takes each of the PACK values a word holds where it lies (times its row's activation, the row
`pair_order.py` puts in that value): masked under the exponent of 2^23,
the float32 is 2^23 + q * 2^at exactly (at: the value's lowest bit; the values past the
mantissa come from the word shifted by 16 once), and its activation is scaled by 2^-at. A value
costs one logic op, one subtraction and one multiply-add; nothing changes layout and nothing
goes through shared memory. Over the four projections: 86.6 µs, against 135 for the best
tiles, 103.6 for this kernel shifting each value out with no prefetch, and 157 for cuBLAS on
bf16 weights (w4a16_row_tiles_h100_prefetch.json). At 0.9-1.7 TB/s of packed weight it is
still short of the copy bandwidth (~3 TB/s); why is not yet profiled.

Zero points and scales apply per group to the step's sums, s * (sum x q - zero * sum x), so a K
step must lie in one group: contiguous groups only (act-order takes the tensor-core tiles).
The result is the exact quantized weight's product in float32, rounded once; the reference
rounds each weight to the activations' dtype first, a difference within its tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from .pair_order import _row_of_slot
from .pdl import launch_args, wait_for_previous_kernel
from .skinny_matmul import SUM_BLOCK, _sum_splits_kernel, split_range


@dataclass(frozen=True)
class W4A16Row:
    block_n: int  # output features per program
    words: int  # packed words (rows of qweight) per K step: words * (32 / bits) inputs
    num_warps: int
    num_stages: int
    split_k: int = 1  # K ranges, a program each (their float32 partials summed after)
    # 4-bit values of half rows read near the mantissa's top (`_value_near_top`): no subtraction
    # a value, one lop3. In the sm_90 SASS (Triton 3.6) the loop of the shipped tile takes 667
    # instructions a step against the exact path's 847 (ROW_TILES turn it on, as measured).
    near_top: bool = False


def row_tile_for(tile: W4A16Row, features: int, depth: int, bits: int, group_rows: int | None) -> W4A16Row | None:
    """`tile` fitted to the shape: K steps inside one group, no more splits than K steps; None where
    the groups are not contiguous (act-order, a slice from mid-group)."""
    if group_rows is None:
        return None
    pack = 32 // bits
    words = tile.words
    while words > 1 and group_rows < depth and group_rows % (words * pack):
        words //= 2
    if group_rows < depth and group_rows % (words * pack):
        return None
    return replace(tile, words=words, split_k=max(1, min(tile.split_k, triton.cdiv(depth, words * pack))))


@triton.jit
def _load_words(qweight_ptr, words, word_end, cols, col_ok, N):
    """The [words, cols] tile of packed words, 0 past `word_end` and the last column."""
    return tl.load(qweight_ptr + words.to(tl.int64)[:, None] * N + cols[None, :],
                   mask=(words < word_end)[:, None] & col_ok[None, :], other=0)  # fmt: skip


@triton.jit
def _value_times_row(packed, high, x, I: tl.constexpr, BITS: tl.constexpr):
    """[WORDS, BLOCK_N] of value I of each word times its activation x [WORDS]. AT is the value's
    lowest bit in `packed` (or in `high`, the word shifted by 16, once it passes a float32's 23-bit
    mantissa): masked where it lies under the exponent of 2^23, the float is 2^23 + q * 2^AT
    exactly, and x is scaled by 2^-AT (a float32 built from its exponent) to match."""
    AT: tl.constexpr = I * BITS - 16 * (I * BITS + BITS > 23)
    if I * BITS + BITS <= 23:
        bits = (packed & (((1 << BITS) - 1) << AT)) | 0x4B000000
    else:
        bits = (high & (((1 << BITS) - 1) << AT)) | 0x4B000000
    inverse_unit = tl.full((1,), (127 - AT) << 23, tl.int32).to(tl.float32, bitcast=True)
    return (bits.to(tl.float32, bitcast=True) - 8388608.0) * (x * inverse_unit)[:, None]


# `(source & (15 << AT)) | exponent of 1.0` as one lop3: Triton's and + or compile to two logic
# ops a value (sm_90, Triton 3.6), as only one of the two constants fits an instruction.
_NEAR_TOP_11, _NEAR_TOP_15, _NEAR_TOP_19 = (tl.constexpr(f"lop3.b32 $0, $1, {15 << at:#x}, 0x3F800000, 0xEA;")
                                            for at in (11, 15, 19))  # fmt: skip


@triton.jit
def _near_top_bits(source, AT: tl.constexpr, ASM: tl.constexpr):
    """The float32 bits of 1 + q * 2^(AT-23) for the 4-bit q at bits [AT, AT+4) of `source`."""
    if ASM:
        if AT == 11:
            ptx: tl.constexpr = _NEAR_TOP_11
        elif AT == 15:
            ptx: tl.constexpr = _NEAR_TOP_15
        else:
            ptx: tl.constexpr = _NEAR_TOP_19
        return tl.inline_asm_elementwise(ptx, "=r,r", [source], dtype=tl.int32, is_pure=True, pack=1)
    return (source & (15 << AT)) | 0x3F800000


@triton.jit
def _value_near_top(source, x, AT: tl.constexpr, ASM: tl.constexpr):
    """[WORDS, BLOCK_N] of the 4-bit value at bits [AT, AT+4) of `source` (a word shifted so it
    lies there) times x [WORDS] * 2^(23-AT), plus that scaled x: masked under the exponent of 1.0,
    the float is 1 + q * 2^(AT-23) exactly, one logic op, and one multiply-add takes it. The caller
    subtracts the scaled x's sum once a word row. AT >= 11 keeps the products' rounding within
    2^-12 of |x| (the offset is x * 2^(23-AT), at most 2^12 times x)."""
    bits = _near_top_bits(source, AT, ASM)
    scaled = x * tl.full((1,), (127 + 23 - AT) << 23, tl.int32).to(tl.float32, bitcast=True)
    return bits.to(tl.float32, bitcast=True) * scaled[:, None], scaled


@triton.jit
def _w4a16_row_kernel(x_ptr, qweight_ptr, zeros_ptr, scales_ptr, out_ptr, N, K, group_rows, split_stride,
                      BITS: tl.constexpr, BLOCK_N: tl.constexpr, WORDS: tl.constexpr, SPLIT_K: tl.constexpr,
                      NEAR_TOP: tl.constexpr, ASM: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    # With SPLIT_K > 1 program (.., s) reduces the s-th range of K and writes its float32 partial
    # at s * split_stride into out_ptr.
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    k_lo, k_hi = split_range(K, SPLIT_K, WORDS * (32 // BITS), 1)
    if SPLIT_K > 1:
        out_ptr += tl.program_id(1).to(tl.int64) * split_stride
    wait_for_previous_kernel(PDL)
    sums = row_times_packed(x_ptr, qweight_ptr, zeros_ptr, scales_ptr, cols, col_ok, N, k_lo, k_hi, group_rows, BITS,
                            BLOCK_N, WORDS, NEAR_TOP, ASM)  # fmt: skip
    tl.store(out_ptr + cols, sums.to(out_ptr.dtype.element_ty), mask=col_ok)


@triton.jit
def row_times_packed(x_ptr, qweight_ptr, zeros_ptr, scales_ptr, cols, col_ok, N, k_lo, k_hi, group_rows,
                     BITS: tl.constexpr, BLOCK_N: tl.constexpr, WORDS: tl.constexpr, NEAR_TOP: tl.constexpr,
                     ASM: tl.constexpr):  # fmt: skip
    """Rows [k_lo, k_hi) of one activation row (x_ptr) times the packed weight's columns `cols`:
    [BLOCK_N] float32 sums. Shared by the row kernel and the packed MoE pairs (`moe_pairs_packed.py`)."""
    PACK: tl.constexpr = 32 // BITS
    BLOCK_K: tl.constexpr = WORDS * PACK
    acc = tl.zeros((WORDS, BLOCK_N), tl.float32)
    word_end = k_hi // PACK  # K is a multiple of PACK
    # Each step asks for the next step's words before it works on its own: two loads in flight.
    upcoming = _load_words(qweight_ptr, k_lo // PACK + tl.arange(0, WORDS), word_end, cols, col_ok, N)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        words = k0 // PACK + tl.arange(0, WORDS)
        word_ok = words < word_end
        packed = upcoming
        upcoming = _load_words(qweight_ptr, words + WORDS, word_end, cols, col_ok, N)
        part = tl.zeros((WORDS, BLOCK_N), tl.float32)
        x_sum = tl.zeros((WORDS,), tl.float32)
        if NEAR_TOP:  # 4 bits: three shifted copies put every value at bit 11, 15 or 19
            offset = tl.zeros((WORDS,), tl.float32)
            copies = (packed << 11, packed >> 1, packed >> 13)  # values 0-2, 3-5, 6-7
        else:
            high = packed >> 16  # the values whose bits pass a float32's 23-bit mantissa, moved down once
        for i in tl.static_range(PACK):  # value i of a word holds its row _row_of_slot(i)
            x = tl.load(x_ptr + words * PACK + _row_of_slot(i, BITS), mask=word_ok, other=0.0).to(tl.float32)
            x_sum += x
            if NEAR_TOP:
                product, scaled = _value_near_top(copies[i // 3], x, 11 + 4 * (i % 3), ASM)
                part += product
                offset += scaled
            else:
                part += _value_times_row(packed, high, x, i, BITS)
        if NEAR_TOP:
            part -= offset[:, None]
        group = k0 // group_rows
        zero = tl.load(zeros_ptr + group * N + cols, mask=col_ok, other=0).to(tl.float32)
        scale = tl.load(scales_ptr + group * N + cols, mask=col_ok, other=0.0).to(tl.float32)
        acc += (part - x_sum[:, None] * zero[None, :]) * scale[None, :]
    return tl.sum(acc, axis=0)


def near_top_applies(x: torch.Tensor, bits: int, tile: W4A16Row) -> bool:
    """Whether the row kernel reads values near the mantissa's top: 4 bits and half activations,
    whose outputs round far coarser than its 2^-12 (float32 rows keep the exact path)."""
    return tile.near_top and bits == 4 and x.dtype in (torch.float16, torch.bfloat16)


def w4a16_row_matmul(x: torch.Tensor, qweight: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, bits: int,
                     group_step: int, tile: W4A16Row) -> torch.Tensor:  # fmt: skip
    """x [1, K] (contiguous columns) @ the packed weight [K, N] -> [1, N] in x's dtype. `group_step`:
    rows per group, or K for one group; `tile` already fitted (`row_tile_for`)."""
    depth, features = x.shape[1], qweight.shape[1]
    out = torch.empty((1, features), dtype=x.dtype, device=x.device)
    splits = tile.split_k
    target = out if splits == 1 else torch.empty((splits, 1, features), dtype=torch.float32, device=x.device)
    _w4a16_row_kernel[(triton.cdiv(features, tile.block_n), splits)](
        x, qweight, zeros, scales, target, features, depth, group_step, features,
        BITS=bits, BLOCK_N=tile.block_n, WORDS=tile.words, SPLIT_K=splits, NEAR_TOP=near_top_applies(x, bits, tile),
        ASM=x.is_cuda, num_warps=tile.num_warps, num_stages=tile.num_stages, **launch_args(x),
    )  # fmt: skip
    if splits > 1:
        _sum_splits_kernel[(triton.cdiv(features, SUM_BLOCK),)](target, out, features, SPLITS=splits, BLOCK=SUM_BLOCK,
                                                               **launch_args(out))  # fmt: skip
    return out
