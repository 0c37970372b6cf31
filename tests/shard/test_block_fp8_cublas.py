"""Block-wise fp8 past 16 rows through cuBLASLt (`block_fp8_cublas`): the activations quantized a
scale per row and 128 columns (`quantize_groups`), the rank's scales laid out as cuBLASLt reads
them (`cublas_weight_scale`), and the layer's choice between it and the Triton GEMM.

The layout and quantization run on CPU (the kernel through Triton's interpreter); the product
itself needs sm_90 (PyTorch runs the DeepSeek recipe there only), so its cases run on a GPU host.
Tolerances: the quantized rows are exact multiples of their scales, so the product equals the
float64 product of the dequantized operands within cuBLASLt's float32 accumulation and the
output's rounding (1e-2 relative to the largest output, bf16's step being 2^-8), and the dense
product within the rows' e4m3 rounding (5 % relative L2).
"""

from __future__ import annotations

import pytest
import torch

from shard_server.kernels.block_fp8_cublas import (
    CUBLAS_FROM_ROWS,
    GROUP,
    block_fp8_cublas,
    cublas_takes_blocks,
    cublas_weight_scale,
    quantize_groups,
    quantize_groups_reference,
)
from shard_server.kernels.block_fp8_matmul import ColumnBlocks
from shard_server.kernels.dispatch import fused_kernels
from shard_server.kernels.fp8_matmul import FP8, FP8_MAX, TINY_SCALE
from shard_server.layers.quantized import BlockFp8Weight
from shard_server.models.quantization import BlockFp8Scheme

from .test_int4_checkpoints import rel
from .test_quantized_formats import recorded

KERNEL_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the fused case: compiled on a GPU host
SM90 = torch.cuda.is_available() and cublas_takes_blocks(torch.device("cuda"))
needs_sm90 = pytest.mark.skipif(not SM90, reason="cuBLASLt's block-scaled fp8 runs on sm_90 only")


def _rows(rows: int, depth: int, seed: int = 0) -> torch.Tensor:
    x = torch.randn(rows, depth, generator=torch.Generator().manual_seed(seed)) * 3
    x[rows // 2, :GROUP] = 0.0  # an all-zero group: the tiniest scale, and zeros out
    x[0, -1] = 1000.0  # one large value: its group's scale, not its neighbours'
    return x


@pytest.mark.parametrize("depth", [512, 300])  # whole groups; a last group of 44 columns
def test_groups_quantize_to_their_own_scale(depth):
    x = _rows(6, depth)
    xq, scale = quantize_groups_reference(x)
    groups = -(-depth // GROUP)
    assert xq.dtype == FP8 and xq.shape == x.shape and scale.shape == (6, groups)
    for g in range(groups):
        part = x[:, g * GROUP : (g + 1) * GROUP]
        torch.testing.assert_close(scale[:, g], (part.abs().amax(dim=1) / FP8_MAX).clamp(min=TINY_SCALE))
    wide = xq.float() * scale.repeat_interleave(GROUP, dim=1)[:, :depth]
    torch.testing.assert_close(wide, x, rtol=2**-4, atol=0)  # e4m3 keeps 3 mantissa bits
    assert scale[3, 0] == TINY_SCALE and not xq[3, :GROUP].float().any()
    assert xq[0, -1].float() * scale[0, -1] == 1000.0 and scale[0, 0] < scale[0, -1]


def _exact_rows(rows: int, depth: int, seed: int) -> torch.Tensor:
    """Rows whose groups quantize with no rounding: e4m3 values, each group holding +-448 once,
    times a power of two per group (Triton's interpreter rounds some values to fp8 off by a step,
    so its case must not round)."""
    gen = torch.Generator().manual_seed(seed)
    values = (torch.randn(rows, depth, generator=gen) * 100).clamp(-FP8_MAX, FP8_MAX).to(FP8).float()
    values[:, ::GROUP] = FP8_MAX
    powers = 2.0 ** torch.randint(-12, 4, (rows, -(-depth // GROUP)), generator=gen).float()
    return values * powers.repeat_interleave(GROUP, dim=1)[:, :depth]


@pytest.mark.parametrize("fused", [False, True])  # the reference; the kernel (interpreted on CPU)
@pytest.mark.parametrize("rows", [1, 6, 8])
def test_quantized_groups_pad_rows_with_zeros_and_lay_scales_out_group_major(rows, fused):
    pytest.importorskip("triton")
    x = _exact_rows(rows, 300, seed=rows).half()
    with fused_kernels(fused, on_cpu=True):
        xq, scale = quantize_groups(x.to(KERNEL_DEVICE), pad_rows_to=4)
    xq, scale = xq.cpu(), scale.cpu()
    padded = -(-rows // 4) * 4
    assert xq.shape == (padded, 300) and scale.shape == (padded, 3) and scale.stride() == (1, padded)
    assert not xq[rows:].float().any() and (scale[rows:] == TINY_SCALE).all()
    want_q, want_scale = quantize_groups_reference(x)
    assert torch.equal(scale[:rows], want_scale) and torch.equal(xq[:rows].float(), want_q.float())
    assert torch.equal(xq[:rows].float() * scale[:rows].repeat_interleave(GROUP, dim=1)[:, :300], x.float())


def test_the_weight_scales_are_laid_out_k_major_for_whole_blocks():
    scale = torch.arange(24 * 8, dtype=torch.float32).view(24, 8)  # 24 row blocks, 8 column blocks
    row_block = torch.arange(256, 640) // GROUP  # a rank's features [256, 640): blocks 2..4
    got = cublas_weight_scale(scale, row_block, ColumnBlocks(GROUP, GROUP), (384, 1024))
    assert got.shape == (8, 3) and got.stride() == (1, 8)
    assert torch.equal(got, scale[2:5].t())


@pytest.mark.parametrize(
    ("row_block", "blocks", "shape"),
    [
        (torch.arange(40, 424) // GROUP, ColumnBlocks(GROUP, GROUP), (384, 1024)),  # features from mid-block
        (torch.arange(384) // GROUP, ColumnBlocks(58, GROUP), (384, 1024)),  # columns from mid-block
        (torch.arange(384) // GROUP, ColumnBlocks(GROUP, GROUP), (384, 768)),  # 6 column blocks, not a multiple of 4
        (torch.arange(384) // 64, ColumnBlocks(GROUP, GROUP), (384, 1024)),  # 64-row blocks
        (torch.arange(392) // GROUP, ColumnBlocks(GROUP, GROUP), (392, 1024)),  # 392 features: not 16-aligned
    ],
)
def test_slices_cublas_cannot_take_keep_the_triton_gemm(row_block, blocks, shape):
    scale = torch.ones(8, 8)
    assert cublas_weight_scale(scale, row_block, blocks, shape) is None


def test_no_cpu_takes_the_cublas_path():
    assert not cublas_takes_blocks(torch.device("cpu"))
    weight = _aligned_weight("cpu", 256, 512)
    assert weight.cublas_scale is None


def _aligned_weight(device, out: int, depth: int, row_start: int = 0, seed: int = 0) -> BlockFp8Weight:
    """A rank's block-wise fp8 layer of whole 128 x 128 blocks from feature `row_start` on."""
    gen = torch.Generator().manual_seed(seed)
    weight = BlockFp8Weight(BlockFp8Scheme(block=(GROUP, GROUP)), (out, depth), torch.bfloat16, device)
    weight.weight.copy_((torch.randn(out, depth, generator=gen) * 100).clamp(-448, 448).to(FP8))
    blocks = (-(-(row_start + out) // GROUP), depth // GROUP)
    rows = torch.arange(row_start, row_start + out) // GROUP
    weight._set(torch.rand(blocks, generator=gen) / 100 + 1e-4, rows, torch.arange(depth) // GROUP)
    return weight


@needs_sm90
@pytest.mark.parametrize(("rows", "out", "depth", "row_start"), [(17, 256, 512, 0), (130, 384, 1024, 256),
                                                                  (1, 128, 512, 0), (301, 1024, 2048, 0)])  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_cublas_product_is_the_dequantized_operands_product(rows, out, depth, row_start, dtype):
    weight = _aligned_weight("cuda", out, depth, row_start, seed=rows)
    assert weight.cublas_scale is not None
    x = _rows(rows, depth, seed=rows).to(dtype).cuda()
    got = block_fp8_cublas(x, weight.weight, weight.cublas_scale)
    assert got.dtype == dtype and got.shape == (rows, out) and got.is_contiguous()
    xq, scale = quantize_groups_reference(x.cpu())
    operands = xq.double() * scale.double().repeat_interleave(GROUP, dim=1)
    want = operands @ weight.dequantize().cpu().double().t()
    torch.testing.assert_close(got.cpu().double(), want, atol=1e-2 * want.abs().max().item(), rtol=2**-7)
    dense = x.cpu().float() @ weight.dequantize().cpu().t()
    assert rel(got.cpu().float(), dense) < 5e-2


@needs_sm90
def test_gpu_layer_takes_cublas_from_its_rows_and_the_triton_gemm_off_the_blocks(monkeypatch):
    from shard_server.layers import quantized as quantized_module

    aligned = _aligned_weight("cuda", 256, 512)
    calls = recorded(monkeypatch, quantized_module, "block_fp8_cublas")
    x = torch.randn(CUBLAS_FROM_ROWS, 512, device="cuda", dtype=torch.bfloat16)
    got = aligned.linear(x, None)
    assert len(calls) == 1 and got.shape == (CUBLAS_FROM_ROWS, 256)
    assert rel(got.float(), x.float() @ aligned.dequantize().t()) < 5e-2
    off_blocks = BlockFp8Weight(BlockFp8Scheme(block=(GROUP, GROUP)), (256, 512), torch.bfloat16, "cuda")
    off_blocks._set(torch.ones(3, 4), torch.arange(64, 320) // GROUP, torch.arange(512) // GROUP)
    assert off_blocks.cublas_scale is None
    off_blocks.linear(x, None)
    assert len(calls) == 1
