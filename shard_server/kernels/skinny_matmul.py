"""Matmuls of a few rows against a large weight (decode steps of small batches), in Triton.

At batch 1-16 a projection only streams its weight through the GPU: the work is memory-bound
and the time is the weight's bytes over the bandwidth the kernel reaches. cuBLAS reaches
~3.1 TB/s on the 8B model's qkv projection and 2.5 TB/s on o at batch 1, and adds a split-K
reduction kernel to o and down; this kernel gives each program a slice of output features and
the whole reduction dimension, so one launch streams every weight row exactly once.

Rows are padded to 16 inside the kernel (the smallest tensor-core tile): the padding costs
no memory traffic. Accumulation is float32, rounded once to the output dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .dispatch import use_fused
from .pdl import launch_args, prefetch_rows_to_l2, prefetches_weights, wait_for_previous_kernel

MAX_ROWS = 16  # one tensor-core tile of rows
SUM_BLOCK = 1024


@dataclass(frozen=True)
class SkinnyConfig:
    block_n: int  # output features per program
    block_k: int  # reduction step
    num_warps: int
    num_stages: int
    split_k: int = 1  # reduction ranges, a program each; past 1 their float32 partials are summed after


# Measured on an H200 at 1, 4 and 16 rows (bench/gpu_skinny_matmul.py, results in
# bench/results/skinny_matmul_h200.json): µs per call against cuBLAS's.
WIDE = SkinnyConfig(block_n=64, block_k=256, num_warps=4, num_stages=4)  # qkv 4096 -> 6144: 15.0 vs 16.3
DEEP = SkinnyConfig(block_n=32, block_k=512, num_warps=4, num_stages=3)  # down 14336 -> 4096: 30.4 vs 31.2
SQUARE = SkinnyConfig(block_n=32, block_k=256, num_warps=4, num_stages=4)  # o 4096 -> 4096: 11.5 vs 13.4
# gate_up (4096 -> 28672) stays with cuBLAS up to 8 rows: 55.7 µs against the best config's 57.6.
CUBLAS_FROM_FEATURES = 16384
CUBLAS_UP_TO_ROWS = 8
# fp8 weights (half the bytes) in fp16 dots: the configs above stream too little a program, and
# one config beats them on every projection, each key range a quarter of the depth (µs at 1 / 8
# rows, was): qkv 12.2 / 12.7 (14.8 / 14.7), o 9.4 / 9.6 (12.2 / 12.7), gate_up 37.5 / 40.2
# (40.4 / 40.6), down 19.8 / 20.5 (30.3 / 36.5); bench/gpu_skinny_matmul.py --fp8-weights,
# bench/results/skinny_matmul_fp8_h200.json.
FP8_WEIGHTS = SkinnyConfig(block_n=128, block_k=256, num_warps=4, num_stages=3, split_k=4)


def config_for(rows: int, features: int, depth: int, weights_fp8: bool = False) -> SkinnyConfig | None:
    """The config for an [rows, depth] x [features, depth]^T product; None: cuBLAS is faster.
    cuBLAS has no bf16 x fp8 product, so fp8 weights always get a config."""
    if weights_fp8:
        return FP8_WEIGHTS
    if features >= CUBLAS_FROM_FEATURES and rows <= CUBLAS_UP_TO_ROWS:
        return None
    if depth >= 2 * features:
        return DEEP
    return WIDE if features > depth else SQUARE


@triton.jit
def split_range(K, SPLIT_K: tl.constexpr, BLOCK_K: tl.constexpr, AXIS: tl.constexpr):
    """[lo, hi) of K for this program's split (its index on grid axis AXIS): SPLIT_K ranges of whole
    BLOCK_K steps, so a step never spans two; all of K without a split."""
    if SPLIT_K > 1:
        chunk = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
        lo = tl.program_id(AXIS) * chunk
        return lo, tl.minimum(K, lo + chunk)
    return 0, K


@triton.jit
def _skinny_matmul_kernel(x_ptr, x_scale_ptr, w_ptr, w_scale_ptr, out_ptr, M, N, K, x_stride, w_stride, out_stride,
                          split_stride, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          W_SCALED: tl.constexpr, X_SCALED: tl.constexpr, FP16_DOT: tl.constexpr,
                          SPLIT_K: tl.constexpr, PDL: tl.constexpr, PREFETCH_W: tl.constexpr,
                          W_LINE: tl.constexpr):  # fmt: skip
    # Row tiles are the grid's first axis: the programs that read one weight slice run together
    # and all but the first find it in L2. With SPLIT_K > 1 each program (axis 2) reduces one
    # range of K and writes its float32 partial at split_stride * its range into out_ptr.
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # output features
    row_ok = rows < M
    col_ok = cols < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    k_lo, k_hi = split_range(K, SPLIT_K, BLOCK_K, 2)
    if SPLIT_K > 1:
        out_ptr += tl.program_id(2).to(tl.int64) * split_stride
    if PREFETCH_W:  # the weights do not depend on the previous kernel (`pdl.py`); the first row tile asks
        if tl.program_id(0) == 0:
            prefetch_rows_to_l2(w_ptr, cols, col_ok, w_stride, k_lo, k_hi, W_LINE, 8)
    wait_for_previous_kernel(PDL)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < k_hi
        x = tl.load(x_ptr + rows[:, None] * x_stride + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptr + cols[:, None] * w_stride + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        if X_SCALED:  # fp8 rows against fp8 weights: the tensor cores take both as they are
            acc += tl.dot(x, tl.trans(w))
        elif FP16_DOT:  # fp8 -> fp16 is one instruction per pair on sm_89+, fp8 -> bf16 several
            x = tl.clamp(x.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
            acc += tl.dot(x, tl.trans(w.to(tl.float16)))
        else:
            acc += tl.dot(x, tl.trans(w.to(x.dtype)))  # fp8 weights widen exactly to bf16/fp16
    if W_SCALED:  # one float32 scale per output feature (fp8 weights)
        acc *= tl.load(w_scale_ptr + cols, mask=col_ok, other=0.0)[None, :]
    if X_SCALED:  # ... and per row (fp8 rows)
        acc *= tl.load(x_scale_ptr + rows, mask=row_ok, other=0.0)[:, None]
    out = out_ptr + rows[:, None] * out_stride + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _sum_splits_kernel(partial_ptr, out_ptr, numel, SPLITS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """out = the sum of SPLITS float32 partials of numel elements each, in the output dtype."""
    wait_for_previous_kernel(PDL)
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < numel
    total = tl.zeros((BLOCK,), tl.float32)
    for split in tl.static_range(SPLITS):
        total += tl.load(partial_ptr + split * numel + offsets, mask=mask, other=0.0)
    tl.store(out_ptr + offsets, total.to(out_ptr.dtype.element_ty), mask=mask)


def skinny_rows(x: torch.Tensor) -> bool:
    """Few half-precision rows with contiguous columns (float32 would round to tf32)."""
    return x.dim() == 2 and 0 < x.shape[0] <= MAX_ROWS and x.dtype in (torch.bfloat16, torch.float16) and x.stride(1) == 1


def skinny_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """`skinny_rows` against a weight of their dtype with contiguous columns."""
    return skinny_rows(x) and weight.dtype == x.dtype and weight.stride(1) == 1


def skinny_matmul(x: torch.Tensor, weight: torch.Tensor, config: SkinnyConfig = SQUARE,
                  weight_scale: torch.Tensor | None = None, fp16_dot: bool = False) -> torch.Tensor:  # fmt: skip
    """x [M, K] @ weight[N, K]^T -> [M, N], for M <= 16 (see `skinny_applies`); an fp8 weight
    comes with `weight_scale`, one float32 per output feature. `fp16_dot`: an fp8 weight and
    the rows meet in fp16: exact for the weight; a bf16 row keeps every value in fp16's normal
    range (2^-14 to 65504), rounds smaller ones to fp16's subnormals and clamps larger ones."""
    out = torch.empty((x.shape[0], weight.shape[0]), dtype=x.dtype, device=x.device)
    launch_rows_product(x, None, weight, weight_scale, out, config, MAX_ROWS, fp16_dot)
    return out


def launch_rows_product(x: torch.Tensor, x_scale: torch.Tensor | None, weight: torch.Tensor,
                        weight_scale: torch.Tensor | None, out: torch.Tensor, config: SkinnyConfig, block_m: int,
                        fp16_dot: bool = False) -> None:  # fmt: skip
    """The kernel over `block_m`-row tiles of x into `out` (contiguous); scales given: fp8 operands."""
    rows, k = x.shape
    n = weight.shape[0]
    splits = config.split_k
    target = out if splits == 1 else torch.empty((splits, rows, n), dtype=torch.float32, device=out.device)
    _skinny_matmul_kernel[(triton.cdiv(rows, block_m), triton.cdiv(n, config.block_n), splits)](
        x, x if x_scale is None else x_scale, weight, weight if weight_scale is None else weight_scale, target,
        rows, n, k, x.stride(0), weight.stride(0), n, rows * n,
        BLOCK_M=block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        W_SCALED=weight_scale is not None, X_SCALED=x_scale is not None, FP16_DOT=fp16_dot, SPLIT_K=splits,
        PREFETCH_W=prefetches_weights(x), W_LINE=128 // weight.element_size(),
        num_warps=config.num_warps, num_stages=config.num_stages, **launch_args(x),
    )  # fmt: skip
    if splits > 1:
        numel = rows * n
        _sum_splits_kernel[(triton.cdiv(numel, SUM_BLOCK),)](target, out, numel, SPLITS=splits, BLOCK=SUM_BLOCK,
                                                            **launch_args(out))  # fmt: skip


def project(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear`, through the skinny kernel when it applies (no bias, few half-precision rows)."""
    if bias is None and use_fused(x) and skinny_applies(x, weight):
        config = config_for(x.shape[0], weight.shape[0], weight.shape[1])
        if config is not None:
            return skinny_matmul(x, weight, config)
    return F.linear(x, weight, bias)
