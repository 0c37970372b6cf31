"""GPTQ/AWQ packed integer weights times half-precision activations (W4A16, and W8A16), in Triton.

The weight stays packed in memory as `layers/int4.py`'s `PackedWeight` holds it: `qweight`
int32 [K/pack, N] (pack = 32/bits consecutive input rows per word), `zeros` int16 [groups, N]
(true zero points), `scales` [groups, N], `g_idx` int32 [K]. 8-bit words hold their rows in
GPTQ's order (row i of a word in bits [8i, 8i+8)); 4-bit words in pair order (`slot_of_row`:
rows 2j and 2j+1 at bits 4j and 16+4j), so that one shift and one logic op put two values side
by side in the halves of a register. Each program loads a [BLOCK_K/pack, BLOCK_N] tile of
words and unpacks it in registers to the weight (q - zero) * scale, the scale taken in the
activations' dtype and the product rounded once to it (exactly the weight the reference
`PackedWeight.dequantize` builds), and feeds it to `tl.dot` (tensor-core MMA for bf16/fp16;
float32 activations get exact IEEE dots), accumulating in float32; a swapped tile (`swap_ab`)
multiplies w^T x^T, so the weight is the MMA's register operand. The dequantized weight never
exists in memory. `bits` is a constexpr: 8-bit GPTQ is the same code.

Two at a time (`pairs`, 4-bit half activations with contiguous groups): each value of a pair
is OR-ed under the exponent of a half-precision constant (bf16 128, fp16 1024, whose unit in
the last place is 1), so the pair reads magic + q; one half2 FMA subtracts magic + zero
(exact: small integers) and one multiplies by the scale (rounded once). Four instructions make
two values, where the float32 path took about six a value (sm_90 SASS). On the GPU that is
inline PTX; Triton's interpreter runs the same arithmetic in plain ops.

Groups: where the groups are contiguous (`group_rows` rows each from row 0, which is what a
checkpoint without act-order gives at TP=1 and on column-parallel ranks) and a K tile never
straddles two, the tile reads one zero/scale vector (`TILE_GROUP`). Otherwise (act-order, a
row-parallel rank starting mid-group, groups smaller than the tile) each row reads its group
through `g_idx` inside the K loop: correct for any order, at the cost of gathering a
[BLOCK_K, BLOCK_N] tile of zeros and scales from cache per step. Permuting act-order rows at
load so groups become contiguous would remove that gather (and cost a gather of the
activations' columns instead); it is not done yet.

One row with contiguous groups (a batch-1 decode) goes to `w4a16_row.py`'s CUDA-core kernel
instead. Decode rows (2-64) would leave most SMs idle with one program per output tile, so the
reduction is split over K (`split_k`), float32 partials summed by the skinny matmul's reduction
kernel.

From `DEQUANTIZE_FROM_ROWS` rows (big decode batches, prefill) the product is compute-bound, and
the weight is instead dequantized in one pass to the rows' dtype for cuBLAS to multiply.

Tiles come from `TILES`, keyed by rows, as bench/gpu_w4a16.py suggested them on an H100 over the
8B projections (the table is the only place they live; the sweep prints a new one).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from .dispatch import use_fused
from .pair_order import _slot_of_row
from .pdl import launch_args, wait_for_previous_kernel
from .skinny_matmul import SUM_BLOCK, _sum_splits_kernel, split_range
from .w4a16_row import W4A16Row, row_tile_for, w4a16_row_matmul

BITS = (4, 8)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
SMS = 132  # an H100's or H200's streaming multiprocessors
FILL_PROGRAMS = 2 * SMS  # by default split K until about this many programs run (two per SM)


@dataclass(frozen=True)
class W4A16Tile:
    block_m: int  # activation rows per program (tl.dot needs 16 or more)
    block_n: int  # output features per program
    block_k: int  # reduction step; a multiple of 32 so a tile holds whole words at 4 and 8 bits
    num_warps: int
    num_stages: int
    split_k: int = 1  # at most this many K ranges a program each, only as many as fill the GPU
    # How a tile's words become values: False, load each word once and split it by a reshape of
    # [words, pack, N] (the layout change may go through shared memory); True, each row loads
    # the word holding it (the pack rows sharing a word hit L1, not HBM) and shifts its value
    # out: no reshape. Which is faster is for bench/gpu_w4a16.py to tell.
    unpack_by_row: bool = False
    # Which operand the tensor cores take from registers: False, x @ w; True, the transposed
    # product w^T @ x^T, so the weight's features fill the instruction's 64-row side (sm_90's
    # wgmma) and the few activation rows its narrow side, with the dequantized weight fed from
    # registers instead of staged through shared memory.
    swap_ab: bool = False
    # Programs that fill the GPU: splitting stops at about this many. Decode rows stream the
    # weight, and there more programs in flight (up to 16 a SM) keep more loads going.
    fill: int = FILL_PROGRAMS
    # Dequantize two values at a time in half2 arithmetic where it applies (`pairs_apply`);
    # False keeps the float32 path, so a sweep can time both.
    pairs: bool = True


# (most rows, tile), first match wins: from bench/gpu_w4a16.py's sweep on an H100 with two values
# dequantized at a time (8B projections, bench/results/w4a16_tiles_pairs_h100.json), µs over qkv,
# o, gate_up and down: 16 rows 101.6, 32 103.0, 64 132.0, 128 193.7, 256 327.4; the table before
# (float32 dequantization, w4a16_tiles_swapped_h100.json) 118.4, 151.8, 193.3, 241.2, 398.0;
# cuBLAS on bf16 weights 166.1, 167.0, 168.6, 178.2, 200.1. With the cheaper dequantization the
# decode tiles no longer gain from more than two programs a SM (16 rows: 125.7 µs at 8 a SM).
# Past 128 rows the tiles still lose to bf16 weights: the dequantized weight reaches wgmma
# through shared memory (Triton's layout change) and is made once per row tile.
# One row takes the row kernel below.
TILES = (
    (16, W4A16Tile(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=4, split_k=4, swap_ab=True)),
    (32, W4A16Tile(block_m=32, block_n=64, block_k=128, num_warps=4, num_stages=4, split_k=4, swap_ab=True,
                   fill=4 * SMS)),
    (64, W4A16Tile(block_m=64, block_n=128, block_k=128, num_warps=8, num_stages=3, split_k=4, swap_ab=True)),
    (128, W4A16Tile(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=3, split_k=4, swap_ab=True)),
    (256, W4A16Tile(block_m=256, block_n=128, block_k=64, num_warps=8, num_stages=3, split_k=4, swap_ab=True)),
    (None, W4A16Tile(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=3, split_k=2, swap_ab=True)),
)

# One row (a batch-1 decode) with contiguous groups takes the CUDA-core kernel (`w4a16_row.py`),
# in a tile keyed by the product's output features (most features, tile): 86.6 µs over the 8B's
# four projections on the H100 sweep, against 135.7 for the best 16-row tiles
# (w4a16_row_tiles_h100_prefetch.json). Half rows' values are read near the mantissa's top
# (`near_top`) and the widest products (gate_up) take 512 features in 4-word steps
# (w4a16_row_near_top_h100.json, µs): the 8B's four projections 83.3 against 87.0 for the
# 128-feature tile without `near_top`, the 70B's 243.5 against 263.7 (gate_up 113.1 against 127.1
# with `near_top` in the narrow tile).
ROW_TILES = (
    (16383, W4A16Row(block_n=128, words=16, num_warps=4, num_stages=2, split_k=8, near_top=True)),
    (None, W4A16Row(block_n=512, words=4, num_warps=4, num_stages=2, split_k=8, near_top=True)),
)

# From this many rows a product dequantizes the packed weight to the rows' dtype in one pass
# (`dequantize_packed`) and lets cuBLAS multiply it. On the H100 sweep with pairs, µs over the
# four 8B projections, tiles against the pass plus cuBLAS: 256 rows 327.4 vs 478.9, 512 604.2 vs
# 589.0 (w4a16_tiles_pairs_h100.json); the lines between those two points cross near 490 rows.
# The pass alone costs about 270 µs a layer of the 8B model.
DEQUANTIZE_FROM_ROWS = 480
DEQUANTIZE_TILE = (64, 128)  # [K rows, N columns] of the weight a program writes

_SWITCH = {"enabled": True, "on_cpu": False}


@contextmanager
def w4a16_kernel(enabled: bool, on_cpu: bool = False):
    """Switches this kernel alone for a block of code (`fused_kernels` switches every kernel):
    off, so a benchmark can time the reference product beside it in one process; or on for CPU
    tensors too (Triton's interpreter), so a test runs it without interpreting the other kernels."""
    saved = dict(_SWITCH)
    _SWITCH.update(enabled=enabled, on_cpu=enabled and on_cpu)
    try:
        yield
    finally:
        _SWITCH.update(saved)


def w4a16_applies(x: torch.Tensor, bits: int) -> bool:
    """Whether a packed product over x takes the kernel: CUDA tensors (or CPU ones under
    `fused_kernels(True, on_cpu=True)` or `w4a16_kernel(True, on_cpu=True)`), float
    activations, 4 or 8 bits."""
    if not _SWITCH["enabled"] or x.dtype not in DTYPES or bits not in BITS:
        return False
    return use_fused(x) or (_SWITCH["on_cpu"] and not x.is_cuda)


def tile_for(rows: int, features: int, depth: int, group_rows: int | None) -> tuple[W4A16Tile, bool]:
    """The rows' tile, its split count fitted to the shape, and whether each K tile lies in one group."""
    tile = next(tile for bound, tile in TILES if bound is None or rows <= bound)
    if group_rows is not None and group_rows < depth and group_rows % tile.block_k:
        # Contiguous groups smaller than the tile (32, 64): a tile of one group beats a gather.
        if group_rows % 32 == 0 and tile.block_k % group_rows == 0:
            tile = replace(tile, block_k=group_rows)
    programs = triton.cdiv(rows, tile.block_m) * triton.cdiv(features, tile.block_n)
    splits = min(tile.split_k, max(1, tile.fill // programs), triton.cdiv(depth, tile.block_k))
    tile = replace(tile, split_k=max(1, splits))
    return tile, _tile_in_one_group(tile, depth, group_rows)


def _tile_in_one_group(tile: W4A16Tile, depth: int, group_rows: int | None) -> bool:
    return group_rows is not None and (group_rows >= depth or group_rows % tile.block_k == 0)


def _pair_ptx(half: str, magic: int, one: int) -> str:
    """PTX turning one pair-order word into its 8 weights: $8 the word, $9 the pair -(magic + zero),
    $10 the pair (scale, scale); $0..$7 rows 0..7. fma forms (sm_80+ for bf16x2, sm_53+ for f16x2):
    (magic + q) * 1 - (magic + zero) is exact, then * scale + (-0) rounds once."""
    lines = [f"mov.b32 one, {one:#x};", "mov.b32 nz, 0x80008000;"]
    for j in range(4):
        source = "$8" if j == 0 else f"w{j}"
        if j:
            lines.append(f"shr.u32 w{j}, $8, {4 * j};")
        lines += [f"lop3.b32 t{j}, {source}, 0x000F000F, {magic * 0x10001:#x}, 0xEA;",  # (a & b) | c
                  f"fma.rn.{half} t{j}, t{j}, one, $9;", f"fma.rn.{half} t{j}, t{j}, $10, nz;",
                  f"mov.b32 {{${2 * j}, ${2 * j + 1}}}, t{j};"]  # fmt: skip
    return "{\n.reg .b32 w<4>, t<4>, one, nz;\n" + "\n".join(lines) + "\n}"


# (magic, its bits): a half whose unit in the last place is 1, so magic | q reads magic + q.
PAIR_MAGIC = {torch.bfloat16: 0x4300, torch.float16: 0x6400}  # 128.0, 1024.0
# -(magic + zero) is zero + these bits (the sign bit set), for zeros below the magic.
_MINUS_MAGIC_BF16 = tl.constexpr(0x8000 | PAIR_MAGIC[torch.bfloat16])
_MINUS_MAGIC_F16 = tl.constexpr(0x8000 | PAIR_MAGIC[torch.float16])
_PAIRS_BF16 = tl.constexpr(_pair_ptx("bf16x2", PAIR_MAGIC[torch.bfloat16], 0x3F803F80))
_PAIRS_F16 = tl.constexpr(_pair_ptx("f16x2", PAIR_MAGIC[torch.float16], 0x3C003C00))


def pairs_apply(x: torch.Tensor, bits: int, one_group: bool, tile: W4A16Tile) -> bool:
    """Whether a tile dequantizes two values at a time: 4 bits, half activations, one group per
    K tile (one zero and scale a column), words loaded once each, and the tile allows it."""
    return tile.pairs and not tile.unpack_by_row and bits == 4 and one_group and x.dtype in PAIR_MAGIC


@triton.jit
def _rounded(v, dtype: tl.constexpr, ON_GPU: tl.constexpr):
    """float32 v rounded to nearest even in `dtype`, as a GPU converts. Off the GPU (Triton's
    interpreter, whose bfloat16 conversion truncates) the float32 bits are rounded first, so that
    the conversion after is exact."""
    if not ON_GPU and dtype == tl.bfloat16:
        bits = v.to(tl.int32, bitcast=True)
        v = ((bits + 0x7FFF + ((bits >> 16) & 1)) & -65536).to(tl.float32, bitcast=True)
    return v.to(dtype)


@triton.jit
def _pair_value(packed, row: tl.constexpr, zero, scale):
    """Row `row` of each pair-order word as the pair PTX makes it, in plain ops (the interpreter)."""
    q = (packed >> (_slot_of_row(row, 4) * 4)) & 15
    return _rounded((q - zero).to(tl.float32) * scale.to(tl.float32), scale.dtype, False)


@triton.jit
def _pairs_dequantized(packed, zero, scale, ASM: tl.constexpr):
    """[WORDS, N] pair-order 4-bit words, their group's zero (int32) and scale (in the activations'
    dtype) a column -> the [WORDS * 8, N] weight, row 8w + r from row r of word w."""
    if ASM:
        minus = (zero + (_MINUS_MAGIC_BF16 if scale.dtype == tl.bfloat16 else _MINUS_MAGIC_F16)) & 0xFFFF
        halves = scale.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        if scale.dtype == tl.bfloat16:
            ptx: tl.constexpr = _PAIRS_BF16
        else:
            ptx: tl.constexpr = _PAIRS_F16
        v = tl.inline_asm_elementwise(ptx, "=h,=h,=h,=h,=h,=h,=h,=h,r,r,r",
                                      [packed, minus | (minus << 16), halves | (halves << 16)],
                                      dtype=(scale.dtype,) * 8, is_pure=True, pack=1)  # fmt: skip
        v0, v1, v2, v3, v4, v5, v6, v7 = v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]
    else:
        v0 = _pair_value(packed, 0, zero, scale)
        v1 = _pair_value(packed, 1, zero, scale)
        v2 = _pair_value(packed, 2, zero, scale)
        v3 = _pair_value(packed, 3, zero, scale)
        v4 = _pair_value(packed, 4, zero, scale)
        v5 = _pair_value(packed, 5, zero, scale)
        v6 = _pair_value(packed, 6, zero, scale)
        v7 = _pair_value(packed, 7, zero, scale)
    # Joined as [W, N, h, a, b]: row r = 4b + 2a + h; permuted to [W, b, a, h, N] for row order.
    both = tl.join(tl.join(tl.join(v0, v1), tl.join(v2, v3)), tl.join(tl.join(v4, v5), tl.join(v6, v7)))
    both = tl.permute(both, (0, 4, 3, 2, 1))
    return tl.reshape(both, (packed.shape[0] * 8, packed.shape[1]))


@triton.jit
def _exact_difference(q, zero):
    """q - zero in float32, exact, with no int-to-float conversion: each as the float32 word
    2^23 + v, built by an OR. Both must lie in [0, 2^23): values are unsigned fields, and so are
    zeros plus the format's offset (`PackedWeight` checks at load)."""
    return (q | 0x4B000000).to(tl.float32, bitcast=True) - (zero | 0x4B000000).to(tl.float32, bitcast=True)


@triton.jit
def _group_zeros_scales(zeros_ptr, scales_ptr, g_idx_ptr, k0, ks, k_ok, cols, col_ok, N, group_rows,
                        dtype: tl.constexpr, TILE_GROUP: tl.constexpr, ASM: tl.constexpr):  # fmt: skip
    """The zero points (int32) and scales (in `dtype`) of a K tile's rows `ks` at columns `cols`
    (rows of N): one a column where the whole tile is in one group (TILE_GROUP), else each row's
    own, gathered through g_idx (act-order)."""
    if TILE_GROUP:
        group = k0 // group_rows
        zero = tl.load(zeros_ptr + group * N + cols, mask=col_ok, other=0).to(tl.int32)[None, :]
        scale = _rounded(tl.load(scales_ptr + group * N + cols, mask=col_ok, other=0.0).to(tl.float32), dtype,
                         ASM)[None, :]  # fmt: skip
    else:
        group = tl.load(g_idx_ptr + ks, mask=k_ok, other=0)
        at = group[:, None] * N + cols[None, :]
        both_ok = k_ok[:, None] & col_ok[None, :]
        zero = tl.load(zeros_ptr + at, mask=both_ok, other=0).to(tl.int32)
        scale = _rounded(tl.load(scales_ptr + at, mask=both_ok, other=0.0).to(tl.float32), dtype, ASM)
    return zero, scale


@triton.jit
def packed_weight_tile(qweight_ptr, zeros_ptr, scales_ptr, g_idx_ptr, k0, ks, k_ok, k_hi, cols, col_ok, N, group_rows,
                       dtype: tl.constexpr, BITS: tl.constexpr, BLOCK_K: tl.constexpr, TILE_GROUP: tl.constexpr,
                       PAIRS: tl.constexpr, ASM: tl.constexpr):  # fmt: skip
    """The [BLOCK_K, cols] weight tile of rows ks = k0 + arange(BLOCK_K) (those < k_hi), in
    `dtype`: its words loaded once each ([BLOCK_K/pack, cols], rows of N words) and unpacked in
    registers, (q - zero) * scale with the scale in `dtype`, rounded once: the reference's
    weight. PAIRS: 4-bit words in one group, two values at a time. Shared by the W4A16 kernel
    and the packed MoE experts' (`fused_moe_packed.py`)."""
    PACK: tl.constexpr = 32 // BITS
    words = k0 // PACK + tl.arange(0, BLOCK_K // PACK)  # K is a multiple of PACK, so k_hi // PACK ends the words
    packed = tl.load(qweight_ptr + words[:, None] * N + cols[None, :],
                     mask=(words < k_hi // PACK)[:, None] & col_ok[None, :], other=0)  # fmt: skip
    zero, scale = _group_zeros_scales(zeros_ptr, scales_ptr, g_idx_ptr, k0, ks, k_ok, cols, col_ok, N, group_rows,
                                      dtype, TILE_GROUP, ASM)  # fmt: skip
    if PAIRS:
        return _pairs_dequantized(packed, zero, scale, ASM)
    # Row k is row k % PACK of word k // PACK, at its slot (`slot_of_row`). The arithmetic shift
    # of a negative word smears its sign into the high bits; the mask drops them.
    shifts = _slot_of_row(tl.arange(0, PACK), BITS) * BITS
    q = tl.reshape((packed[:, None, :] >> shifts[None, :, None]) & ((1 << BITS) - 1), (BLOCK_K, packed.shape[1]))
    return _rounded(_exact_difference(q, zero) * scale.to(tl.float32), dtype, ASM)


@triton.jit
def _w4a16_kernel(x_ptr, qweight_ptr, zeros_ptr, scales_ptr, g_idx_ptr, out_ptr, M, N, K, group_rows, x_stride,
                  out_stride, split_stride, BITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, TILE_GROUP: tl.constexpr, IEEE: tl.constexpr,
                  UNPACK_BY_ROW: tl.constexpr, SWAP_AB: tl.constexpr, PAIRS: tl.constexpr, ASM: tl.constexpr,
                  PDL: tl.constexpr):  # fmt: skip
    # Row tiles are the grid's first axis: programs reading one weight slice run together and
    # all but the first find its words in L2. With SPLIT_K > 1 program (.., .., s) reduces the
    # s-th range of K and writes its float32 partial at s * split_stride into out_ptr.
    PACK: tl.constexpr = 32 // BITS
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    k_lo, k_hi = split_range(K, SPLIT_K, BLOCK_K, 2)
    if SPLIT_K > 1:
        out_ptr += tl.program_id(2).to(tl.int64) * split_stride
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * x_stride
    wait_for_previous_kernel(PDL)
    if SWAP_AB:
        acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < k_hi
        x = tl.load(x_rows + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        # Row k is row k % PACK of word k // PACK, at its slot (`slot_of_row`). The arithmetic
        # shift of a negative word smears its sign into the high bits; the mask drops them.
        if UNPACK_BY_ROW:
            packed = tl.load(qweight_ptr + (ks // PACK)[:, None] * N + cols[None, :],
                             mask=k_ok[:, None] & col_ok[None, :], other=0)  # fmt: skip
            q = (packed >> (_slot_of_row(ks % PACK, BITS) * BITS)[:, None]) & ((1 << BITS) - 1)
            zero, scale = _group_zeros_scales(zeros_ptr, scales_ptr, g_idx_ptr, k0, ks, k_ok, cols, col_ok, N,
                                              group_rows, x.dtype, TILE_GROUP, ASM)  # fmt: skip
            # The reference's weight: the scale in x's dtype, the product rounded once.
            w = _rounded(_exact_difference(q, zero) * scale.to(tl.float32), x.dtype, ASM)
        else:
            w = packed_weight_tile(qweight_ptr, zeros_ptr, scales_ptr, g_idx_ptr, k0, ks, k_ok, k_hi, cols, col_ok, N,
                                   group_rows, x.dtype, BITS, BLOCK_K, TILE_GROUP, PAIRS, ASM)  # fmt: skip
        if IEEE:  # float32 activations: exact float32 products, not tf32
            acc += tl.dot(x, w, input_precision="ieee")
        elif SWAP_AB:
            acc += tl.dot(tl.trans(w), tl.trans(x))
        else:
            acc += tl.dot(x, w)
    if SWAP_AB:
        acc = tl.trans(acc)
    out = out_ptr + rows.to(tl.int64)[:, None] * out_stride + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _dequantize_kernel(qweight_ptr, zeros_ptr, scales_ptr, g_idx_ptr, out_ptr, N, K, BITS: tl.constexpr,
                       BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, ON_GPU: tl.constexpr):  # fmt: skip
    # out [K, N] = (q - zero) * scale (in out's dtype) in float32, rounded once to out's dtype: the
    # weight the reference `PackedWeight.dequantize` builds, transposed. Row k is row k % PACK of
    # word k // PACK.
    PACK: tl.constexpr = 32 // BITS
    ks = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = (ks < K)[:, None] & (cols < N)[None, :]
    packed = tl.load(qweight_ptr + (ks // PACK).to(tl.int64)[:, None] * N + cols[None, :], mask=ok, other=0)
    q = (packed >> (_slot_of_row(ks % PACK, BITS) * BITS)[:, None]) & ((1 << BITS) - 1)
    at = tl.load(g_idx_ptr + ks, mask=ks < K, other=0).to(tl.int64)[:, None] * N + cols[None, :]
    zero = tl.load(zeros_ptr + at, mask=ok, other=0).to(tl.int32)
    half = out_ptr.dtype.element_ty
    scale = _rounded(tl.load(scales_ptr + at, mask=ok, other=0.0).to(tl.float32), half, ON_GPU).to(tl.float32)
    w = _rounded(_exact_difference(q, zero) * scale, half, ON_GPU)
    tl.store(out_ptr + ks.to(tl.int64)[:, None] * N + cols[None, :], w, mask=ok)


def dequantize_packed(qweight: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor,
                      bits: int, dtype: torch.dtype) -> torch.Tensor:  # fmt: skip
    """The packed weight as a [K, N] tensor of `dtype` (K = the inputs), in one launch."""
    depth, features = qweight.shape[0] * (32 // bits), qweight.shape[1]
    out = torch.empty((depth, features), dtype=dtype, device=qweight.device)
    block_k, block_n = DEQUANTIZE_TILE
    grid = (triton.cdiv(depth, block_k), triton.cdiv(features, block_n))
    _dequantize_kernel[grid](qweight, zeros, scales, g_idx, out, features, depth, BITS=bits, BLOCK_K=block_k,
                             BLOCK_N=block_n, ON_GPU=qweight.is_cuda, num_warps=4)  # fmt: skip
    return out


def check_operands(x: torch.Tensor, qweight: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor,
                   g_idx: torch.Tensor, bits: int) -> None:  # fmt: skip
    """Raises ValueError naming what does not fit the packed layout; the kernel would read out of bounds."""
    if bits not in BITS:
        raise ValueError(f"the W4A16 kernel packs 4 or 8 bits per value, not {bits}")
    pack = 32 // bits
    if x.dim() != 2 or x.dtype not in DTYPES:
        raise ValueError(f"activations must be 2-D float16/bfloat16/float32, not {x.dtype} {list(x.shape)}")
    if qweight.dtype != torch.int32 or qweight.dim() != 2:
        raise ValueError(f"qweight must be 2-D int32 [in/{pack}, out], not {qweight.dtype} {list(qweight.shape)}")
    depth, features = qweight.shape[0] * pack, qweight.shape[1]
    if x.shape[1] != depth:
        raise ValueError(f"activations have {x.shape[1]} columns; qweight {list(qweight.shape)} packs {pack} "
                         f"{bits}-bit rows per word: {depth} inputs")  # fmt: skip
    if zeros.dim() != 2 or zeros.shape != scales.shape or zeros.shape[1] != features or zeros.shape[0] < 1:
        raise ValueError(f"zeros {list(zeros.shape)} and scales {list(scales.shape)} must both be "
                         f"[groups, {features}]")  # fmt: skip
    if zeros.dtype not in (torch.int16, torch.int32) or scales.dtype not in DTYPES:
        raise ValueError(f"zeros must be int16/int32 and scales float, not {zeros.dtype} and {scales.dtype}")
    if g_idx.shape != (depth,) or g_idx.dtype != torch.int32:
        raise ValueError(f"g_idx must be int32 [{depth}], one group per input row, not {g_idx.dtype} "
                         f"{list(g_idx.shape)}")  # fmt: skip
    for name, tensor in (("qweight", qweight), ("zeros", zeros), ("scales", scales), ("g_idx", g_idx)):
        if not tensor.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
        if tensor.device != x.device:
            raise ValueError(f"{name} is on {tensor.device}, the activations on {x.device}")


def w4a16_matmul(x: torch.Tensor, qweight: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor,
                 g_idx: torch.Tensor, bits: int, group_rows: int | None,
                 tile: W4A16Tile | W4A16Row | None = None) -> torch.Tensor:  # fmt: skip
    """x [M, K] @ the packed weight [K, N] -> [M, N] in x's dtype. `group_rows`: rows per group when
    the groups are contiguous from row 0 (g_idx[k] == k // group_rows), else None. `tile`: a
    fixed tile (tests), else for one row with contiguous groups `ROW_TILES`', from
    `DEQUANTIZE_FROM_ROWS` rows the dequantized weight through cuBLAS, else `TILES`' for M rows;
    a given tile's split_k is used as it is (a row tile is fitted to the groups)."""
    check_operands(x, qweight, zeros, scales, g_idx, bits)
    if tile is None and x.shape[0] >= DEQUANTIZE_FROM_ROWS:
        return x @ dequantize_packed(qweight, zeros, scales, g_idx, bits, x.dtype)
    if x.stride(1) != 1:
        x = x.contiguous()
    rows, depth = x.shape
    features = qweight.shape[1]
    row_tile = _row_tile(tile, rows, features, depth, bits, group_rows)
    if row_tile is not None:
        return w4a16_row_matmul(x, qweight, zeros, scales, bits, min(group_rows, depth), row_tile)
    if tile is None:
        tile, one_group = tile_for(rows, features, depth, group_rows)
    else:
        one_group = _tile_in_one_group(tile, depth, group_rows)
    out = torch.empty((rows, features), dtype=x.dtype, device=x.device)
    if rows == 0:
        return out
    splits = tile.split_k
    target = out if splits == 1 else torch.empty((splits, rows, features), dtype=torch.float32, device=x.device)
    # One group over all rows: any step >= K keeps every tile's k0 // step at group 0.
    step = (depth if group_rows >= depth else group_rows) if one_group else 1
    grid = (triton.cdiv(rows, tile.block_m), triton.cdiv(features, tile.block_n), splits)
    _w4a16_kernel[grid](
        x, qweight, zeros, scales, g_idx, target, rows, features, depth, max(step, 1), x.stride(0), features,
        rows * features, BITS=bits, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k,
        SPLIT_K=splits, TILE_GROUP=one_group, IEEE=x.dtype == torch.float32, UNPACK_BY_ROW=tile.unpack_by_row,
        SWAP_AB=tile.swap_ab and x.dtype != torch.float32, PAIRS=pairs_apply(x, bits, one_group, tile), ASM=x.is_cuda,
        num_warps=tile.num_warps, num_stages=tile.num_stages, **launch_args(x),
    )  # fmt: skip
    if splits > 1:
        numel = rows * features
        _sum_splits_kernel[(triton.cdiv(numel, SUM_BLOCK),)](target, out, numel, SPLITS=splits, BLOCK=SUM_BLOCK,
                                                            **launch_args(out))  # fmt: skip
    return out


def row_tile(features: int) -> W4A16Row:
    """ROW_TILES' tile for a one-row product of `features` outputs (before `row_tile_for` fits it)."""
    return next(tile for most, tile in ROW_TILES if most is None or features <= most)


def _row_tile(tile: W4A16Tile | W4A16Row | None, rows: int, features: int, depth: int, bits: int,
              group_rows: int | None) -> W4A16Row | None:  # fmt: skip
    """The row kernel's tile for this product, or None for the tensor-core tiles."""
    if isinstance(tile, W4A16Row):
        fitted = row_tile_for(tile, features, depth, bits, group_rows)
        if rows != 1 or fitted is None:
            raise ValueError(f"a W4A16Row tile takes one row with contiguous groups, not {rows} rows, "
                             f"group_rows {group_rows}")  # fmt: skip
        return replace(fitted, split_k=tile.split_k)
    if tile is None and rows == 1:
        return row_tile_for(row_tile(features), features, depth, bits, group_rows)
    return None


def w4a16_linear(x: torch.Tensor, qweight: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor,
                 g_idx: torch.Tensor, bits: int, group_rows: int | None,
                 bias: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """x [..., K] @ the packed weight (+ bias) -> [..., N], as `F.linear` with the dequantized weight."""
    flat = x.reshape(-1, x.shape[-1])
    out = w4a16_matmul(flat, qweight, zeros, scales, g_idx, bits, group_rows)
    if bias is not None:
        out = out + bias
    return out.view(*x.shape[:-1], qweight.shape[1])
