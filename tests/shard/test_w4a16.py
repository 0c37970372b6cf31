"""The W4A16 Triton kernel (shard_server/kernels/w4a16.py) against `PackedWeight`'s reference product.

On CPU the kernel runs through Triton's interpreter, forced on with `fused_kernels(True,
on_cpu=True)`; small shapes (K 200 or 256, N 37-72) keep a case under a second. Triton 3.9's
interpreter multiplies bf16 tiles as their raw uint16 bits, so a fixture widens bf16 dot
operands to float32 first (exact, as the tensor cores' products are); the kernel's code is the
one the GPU compiles. On a GPU the same small cases are compiled, and a Llama-8B-shaped case
(4096 x 14336 both ways) runs too.

Tolerances, on the output's largest magnitude: both sides multiply the same weight (the kernel
rounds (q - zero) * scale to the activations' dtype exactly as `dequantize` does) in float32
and round once, so they differ by summation order plus one rounding of the output: float32
1e-5, float16 2e-3 (two of its rounding steps), bfloat16 1.6e-2 (two of its). Greedy tokens of
the tiny int4 models are equal.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

import triton.language as tl  # noqa: E402

from shard_server.distributed import ParallelContext  # noqa: E402
from shard_server.kernels.dispatch import fused_kernels  # noqa: E402
from shard_server.kernels.pair_order import slot_of_row, to_gptq_order, to_pair_order  # noqa: E402
from shard_server.kernels import w4a16 as w4a16_module  # noqa: E402
from shard_server.kernels.w4a16 import (  # noqa: E402
    DEQUANTIZE_FROM_ROWS,
    dequantize_packed,
    FILL_PROGRAMS,
    ROW_TILES,
    TILES,
    W4A16Tile,
    row_tile,
    tile_for,
    w4a16_kernel,
    w4a16_matmul,
)
from shard_server.kernels import w4a16_row as w4a16_row_module  # noqa: E402
from shard_server.kernels.w4a16_row import W4A16Row, row_tile_for  # noqa: E402
from shard_server.layers import int4 as int4_module  # noqa: E402
from shard_server.layers.int4 import PackedWeight, contiguous_group_rows  # noqa: E402
from shard_server.models.quantization import PackedScheme  # noqa: E402
from shard_server.weights import WeightsError  # noqa: E402

from .helpers import StepDriver, generate_greedy  # noqa: E402
from .int4_checkpoints import write_packed_checkpoint  # noqa: E402
from .test_int4_checkpoints import FORMATS, _linears, _tiny  # noqa: E402
from .test_tensor_parallel import PROMPT, load_rank_model, prefill_logits  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
needs_cuda = pytest.mark.skipif(not CUDA, reason="GPU-sized case: the Triton interpreter is too slow on CPU")
# Cases that force the kernel on CPU tensors: only Triton's interpreter runs those, and it is
# off on a GPU host (the same checks run compiled there, on CUDA tensors, in the other cases).
interpreter_only = pytest.mark.skipif(CUDA, reason="CPU tensors through Triton's interpreter, off on a GPU host")
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _interpreter_multiplies_bf16_as_floats(monkeypatch):
    if CUDA:
        return
    from triton.runtime import interpreter

    create_dot = interpreter.InterpreterBuilder.create_dot

    def widened(handle):
        if handle.dtype.scalar != tl.bfloat16:
            return handle
        data = interpreter._convert_float(handle.data, tl.bfloat16, tl.float32, None).view(np.float32)
        return interpreter.TensorHandle(data, tl.float32)

    def dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return create_dot(self, widened(a), widened(b), d, input_precision, max_num_imprecise_acc)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", dot)


def make_weight(bits=4, group_size=128, act_order=False, sym=False, depth=200, features=37, seed=0,
                scale_dtype=torch.float16, device=DEVICE) -> PackedWeight:  # fmt: skip
    """A random packed weight: values, zero points (2^(bits-1) if symmetric) and scales per
    (group, column); act-order rows assigned to groups along a random permutation, as GPTQ does."""
    gen = torch.Generator().manual_seed(seed)
    groups = 1 if group_size == -1 else -(-depth // group_size)
    values = torch.randint(0, 2**bits, (depth, features), generator=gen)
    if sym:
        zeros = torch.full((groups, features), 2 ** (bits - 1))
    else:
        zeros = torch.randint(0, 2**bits, (groups, features), generator=gen)
    # Scales vary 10x between groups, so a row read with another row's group is far off.
    scales = ((torch.rand(groups, features, generator=gen) * 9 + 1) / (2**bits * depth**0.5)).to(scale_dtype)
    g_idx = torch.zeros(depth, dtype=torch.long) if group_size == -1 else torch.arange(depth) // group_size
    if act_order:
        g_idx = g_idx[torch.randperm(depth, generator=gen)]
    scheme = PackedScheme("gptq", bits, group_size, act_order)
    return PackedWeight.from_values(scheme, values, zeros, scales, g_idx, device)


def activations(rows, depth, dtype, seed=1, device=DEVICE) -> torch.Tensor:
    return torch.randn(rows, depth, generator=torch.Generator().manual_seed(seed)).to(dtype=dtype, device=device)


def reference(weight: PackedWeight, x: torch.Tensor) -> torch.Tensor:
    with fused_kernels(False):
        return weight.linear(x, None)


def kernel(weight: PackedWeight, x: torch.Tensor, tile: W4A16Tile | None = None) -> torch.Tensor:
    with fused_kernels(True, on_cpu=True):
        if tile is None:
            return weight.linear(x, None)
        return w4a16_matmul(x, weight.qweight, weight.zeros, weight.scales, weight.g_idx, weight.scheme.bits,
                            weight.group_rows, tile)  # fmt: skip


def assert_matches(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, label="") -> None:
    assert got.dtype == want.dtype == dtype and got.shape == want.shape, label
    scale = want.float().abs().max()
    assert scale > 0.1, "outputs too small to compare"
    error = float((got.float() - want.float()).abs().max() / scale)
    assert error <= TOLERANCE[dtype], (label, error)


# Random weights: every group layout, both widths, decode and prefill rows.

LAYOUTS = {  # (bits, group size, act-order, symmetric)
    "4bit-g32": (4, 32, False, False),
    "4bit-g64": (4, 64, False, False),
    "4bit-g128-sym": (4, 128, False, True),
    "4bit-channel": (4, -1, False, False),
    "4bit-g64-actorder": (4, 64, True, False),
    "4bit-g128-actorder-sym": (4, 128, True, True),
    "8bit-g128": (8, 128, False, False),
    "8bit-g32-actorder": (8, 32, True, False),
}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("rows", [1, 3, 17, 64])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_kernel_matches_the_reference_product(layout, rows, dtype):
    bits, group_size, act_order, sym = LAYOUTS[layout]
    weight = make_weight(bits, group_size, act_order, sym, seed=rows)
    assert (weight.group_rows is None) == act_order  # act-order is read through g_idx
    x = activations(rows, 200, dtype)
    assert_matches(kernel(weight, x), reference(weight, x), dtype, layout)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("layout", ["4bit-g32", "4bit-channel", "4bit-g64-actorder", "8bit-g32-actorder"])
def test_the_dequantize_pass_builds_the_reference_weight(layout, dtype):
    bits, group_size, act_order, sym = LAYOUTS[layout]
    weight = make_weight(bits, group_size, act_order, sym, depth=256, features=150)  # masked tile edges
    with fused_kernels(True, on_cpu=True):
        got = dequantize_packed(weight.qweight, weight.zeros, weight.scales, weight.g_idx, bits, dtype)
    # On the CPU too: the kernels round bf16 by hand where Triton's interpreter would truncate.
    assert got.shape == (256, 150) and torch.equal(got, weight.dequantize(dtype).t())


def test_many_rows_multiply_the_dequantized_weight(monkeypatch):
    """From DEQUANTIZE_FROM_ROWS rows a product dequantizes once and multiplies (cuBLAS on a GPU);
    one row fewer takes the kernel's tiles."""
    weight = make_weight(4, 64, act_order=True)
    passes = []
    real = w4a16_module.dequantize_packed
    monkeypatch.setattr(w4a16_module, "dequantize_packed", lambda *args: passes.append(args) or real(*args))
    x = activations(DEQUANTIZE_FROM_ROWS, 200, torch.float16)
    assert_matches(kernel(weight, x), reference(weight, x), torch.float16)
    assert len(passes) == 1
    fewer = x[: DEQUANTIZE_FROM_ROWS - 1]
    assert_matches(kernel(weight, fewer), reference(weight, fewer), torch.float16)
    assert len(passes) == 1


def test_act_order_groups_matter_to_the_product():
    """The act-order cases would catch a kernel that ignored g_idx: with the rows' groups in
    order instead, the product moves far past the tolerance."""
    weight = make_weight(4, 64, act_order=True)
    x = activations(3, 200, torch.float32)
    shuffled = reference(weight, x)
    weight.g_idx = torch.sort(weight.g_idx).values
    assert float((reference(weight, x) - shuffled).abs().max() / shuffled.abs().max()) > 0.1


@pytest.mark.parametrize("rows", [1, 17])
def test_float32_activations_get_exact_products(rows):
    weight = make_weight(4, 32, depth=256, features=72)
    x = activations(rows, 256, torch.float32)
    assert_matches(kernel(weight, x), reference(weight, x), torch.float32)


SMALL = W4A16Tile(block_m=16, block_n=16, block_k=32, num_warps=4, num_stages=2)


@pytest.mark.parametrize("swap_ab", [False, True], ids=["x@w", "swapped"])
@pytest.mark.parametrize("unpack_by_row", [False, True], ids=["reshape", "by-row"])
@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("layout", ["4bit-g32", "4bit-channel", "4bit-g64-actorder", "8bit-g128"])
def test_small_tiles_cover_masked_edges_many_tiles_and_split_k(layout, split_k, unpack_by_row, swap_ab):
    """16x16x32 tiles over 17 rows x 37 columns x 200 inputs: row, column and K tails masked,
    several programs per axis, K split in 3 ranges (the last one shorter); either unpacking,
    either operand order."""
    bits, group_size, act_order, sym = LAYOUTS[layout]
    weight = make_weight(bits, group_size, act_order, sym)
    x = activations(17, 200, torch.float16)
    tile = W4A16Tile(**{**SMALL.__dict__, "split_k": split_k, "unpack_by_row": unpack_by_row, "swap_ab": swap_ab})
    assert_matches(kernel(weight, x, tile), reference(weight, x), torch.float16, layout)


@pytest.mark.parametrize("rows", [1, 17, 40])
def test_swapped_tiles_match_in_bf16_with_rows_unlike_the_tile(rows):
    """The transposed product (w^T @ x^T) in bf16, with fewer and more rows than its 32-row tile."""
    weight = make_weight(4, 64, depth=256, features=72)
    x = activations(rows, 256, torch.bfloat16)
    tile = W4A16Tile(block_m=32, block_n=32, block_k=64, num_warps=4, num_stages=2, swap_ab=True)
    assert_matches(kernel(weight, x, tile), reference(weight, x), torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("swap_ab", [False, True], ids=["x@w", "swapped"])
def test_two_at_a_time_builds_the_float32_paths_weight(dtype, swap_ab):
    """Pairs (half2 arithmetic on pair-order words; on the CPU its plain-ops twin) and the float32
    path build the same weight, the reference's, bit for bit: one-hot rows read single weights out
    (one nonzero product a sum, exact in any order), over several groups and masked edges."""
    weight = make_weight(4, 32, depth=256, features=150)
    picks = [0, 1, 7, 8, 31, 32, 33, 100, 127, 128, 200, 254, 255]
    x = torch.zeros(len(picks), 256, dtype=dtype, device=DEVICE)
    x[torch.arange(len(picks)), torch.tensor(picks)] = 1
    tile = W4A16Tile(block_m=16, block_n=32, block_k=32, num_warps=4, num_stages=2, swap_ab=swap_ab)
    float32_path = replace(tile, pairs=False)
    assert w4a16_module.pairs_apply(x, 4, True, tile) and not w4a16_module.pairs_apply(x, 4, True, float32_path)
    pairs = kernel(weight, x, tile)
    assert torch.equal(pairs, weight.dequantize(dtype).t()[picks].contiguous())
    assert torch.equal(pairs, kernel(weight, x, float32_path))
    dense = activations(21, 256, dtype)
    assert_matches(kernel(weight, dense, tile), reference(weight, dense), dtype)


def test_pair_order_puts_rows_two_and_two_side_by_side():
    """4-bit words in pair order hold rows 2j and 2j+1 at bits 4j and 16+4j; 8-bit words keep GPTQ's
    order; the inverse restores the checkpoint's words."""
    values = torch.arange(8).repeat(3, 1).t().contiguous()  # rows 0..7 of one word, three columns
    words = int4_module.pack_rows(values, 4)
    paired = to_pair_order(words, 4)
    for row in range(8):
        assert slot_of_row(row, 4) == {0: 0, 1: 4, 2: 1, 3: 5, 4: 2, 5: 6, 6: 3, 7: 7}[row]
        assert bool(((paired >> (4 * slot_of_row(row, 4))) & 15 == row).all())
    random = torch.randint(-(2**31), 2**31, (16, 9), dtype=torch.int32)
    assert torch.equal(to_gptq_order(to_pair_order(random, 4), 4), random)
    assert to_pair_order(random, 8) is random and [slot_of_row(row, 8) for row in range(4)] == [0, 1, 2, 3]


# One row: the CUDA-core kernel (kernels/w4a16_row.py).

ROW_LAYOUTS = ["4bit-g32", "4bit-g128-sym", "4bit-channel", "8bit-g128"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_the_row_kernel_near_the_mantissas_top_matches_its_exact_path(dtype):
    """Half rows may read 4-bit values near the mantissa's top (no subtraction a value); the sums
    differ from the exact float path by the products' rounding, far below the output's."""
    weight = make_weight(4, 128, depth=1024, features=96)
    x = activations(1, 1024, dtype) * 50  # large activations: the offsets it subtracts grow with x
    tile = replace(row_tile(96), split_k=2, near_top=True)
    near, exact = kernel(weight, x, tile), kernel(weight, x, replace(tile, near_top=False))
    assert w4a16_row_module.near_top_applies(x, 4, tile) and not w4a16_row_module.near_top_applies(x.float(), 4, tile)
    error = float((near.float() - exact.float()).abs().max() / exact.float().abs().max())
    assert error <= 2 ** -8, error


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("layout", ROW_LAYOUTS + ["4bit-g64-actorder"])
def test_one_row_with_contiguous_groups_takes_the_row_kernel(layout, dtype, monkeypatch):
    """A batch-1 decode: the row kernel where groups are contiguous, the tensor-core tile otherwise
    (act-order), the same product either way."""
    launched = []
    real = w4a16_module.w4a16_row_matmul
    monkeypatch.setattr(w4a16_module, "w4a16_row_matmul", lambda *args: launched.append(args[-1]) or real(*args))
    bits, group_size, act_order, sym = LAYOUTS[layout]
    weight = make_weight(bits, group_size, act_order, sym, depth=256, features=150)
    x = activations(1, 256, dtype) * 4
    assert_matches(kernel(weight, x), reference(weight, x), dtype, layout)
    assert len(launched) == (0 if act_order else 1)
    two = activations(2, 256, dtype)
    assert_matches(kernel(weight, two), reference(weight, two), dtype, layout)
    assert len(launched) == (0 if act_order else 1), "two rows take the tensor-core tiles"


@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("words", [1, 4])
@pytest.mark.parametrize("layout", ROW_LAYOUTS)
def test_row_tiles_cover_masked_edges_and_split_k(layout, words, split_k):
    """16 features a program over 37 (a masked edge), K 200 in steps of 8 or 32 inputs (4-bit;
    the last step masked), split 3 ways; a group of 32 holds whole steps."""
    bits, group_size, act_order, sym = LAYOUTS[layout]
    weight = make_weight(bits, group_size, act_order, sym, seed=words + split_k)
    x = activations(1, 200, torch.bfloat16)
    tile = W4A16Row(block_n=16, words=words, num_warps=1, num_stages=2, split_k=split_k)
    assert_matches(kernel(weight, x, tile), reference(weight, x), torch.bfloat16, layout)


def test_one_row_takes_the_row_tile_of_its_output_features():
    """ROW_TILES is keyed by the product's output features, its last bound open; the widest
    products (a gate_up) take the wide tile, everything else the narrow one, as the sweep timed."""
    bounds = [most for most, _ in ROW_TILES]
    assert bounds[-1] is None and bounds[:-1] == sorted(bounds[:-1])
    narrow, wide = ROW_TILES[0][1], ROW_TILES[-1][1]
    assert row_tile(1) == row_tile(4096) == row_tile(16383) == narrow
    assert row_tile(16384) == row_tile(57344) == wide and wide.block_n > narrow.block_n
    assert all(tile.near_top for _, tile in ROW_TILES)


def test_row_tiles_are_fitted_to_the_groups_and_the_k_steps():
    tile = W4A16Row(block_n=128, words=16, num_warps=4, num_stages=3, split_k=8)
    assert row_tile_for(tile, 4096, 4096, 4, 32).words == 4  # 4-bit steps of 32 inputs: one group each
    assert row_tile_for(tile, 4096, 4096, 8, 128).words == 16  # 8-bit: 16 words are 64 inputs
    assert row_tile_for(tile, 4096, 4096, 4, 4096).words == 16  # one group
    assert row_tile_for(tile, 4096, 4096, 4, None) is None  # act-order
    assert row_tile_for(tile, 4096, 4096, 4, 96).words == 4  # 96 rows: three steps of 32
    assert row_tile_for(tile, 4096, 4096, 4, 100) is None  # every step (8 inputs or more) straddles groups
    assert row_tile_for(tile, 4096, 14336, 4, 128).split_k == 8
    assert row_tile_for(tile, 4096, 384, 4, 128).split_k == 3  # three K steps: three ranges at most
    assert row_tile_for(tile, 4096, 128, 4, 128).split_k == 1  # one K step: nothing to split
    with pytest.raises(ValueError, match="one row with contiguous groups"):
        weight = make_weight(4, 64, act_order=True, device="cpu")
        w4a16_matmul(activations(1, 200, torch.float16, device="cpu"), weight.qweight, weight.zeros, weight.scales,
                     weight.g_idx, 4, weight.group_rows, tile)  # fmt: skip


@pytest.mark.parametrize("bits, shift, most", [(4, -9, 16), (4, 2, 16), (8, -9, 32767), (8, 2**15, 32767)])
def test_zero_points_outside_the_kernels_range_are_refused_at_load(bits, shift, most):
    """4-bit zero points are 4-bit fields (16 with GPTQ v1's +1); the half2 dequantization needs them
    below 128. 8-bit ones below 2^15 (int16)."""
    weight = make_weight(bits, 64)
    assert int(weight.zeros.max()) + shift > most or int(weight.zeros.min()) + shift < 0
    piece = int4_module._Slice(weight.qweight, weight.zeros.int() + shift, weight.scales, weight.g_idx)
    with pytest.raises(WeightsError, match=rf"zero points outside \[0, {most}\]"):
        weight._set(piece, "model.layers.0.mlp.down_proj")


def test_words_of_the_wrong_shape_are_refused_at_load():
    """A slice is held as GPTQ's words [in/pack, out]: unpacked values, or one word row short, are refused."""
    weight = make_weight(4, 64)
    for qweight in (int4_module.unpack_rows(weight.qweight, 4), weight.qweight[1:]):
        piece = int4_module._Slice(qweight, weight.zeros, weight.scales, weight.g_idx)
        with pytest.raises(WeightsError, match=r"qweight holds \[\d+, 37\] words, expected \[in/8, out\] = \[25, 37\]"):
            weight._set(piece, "model.layers.0.mlp.down_proj")


def test_strided_activations_and_leading_dims_and_bias():
    weight = make_weight(4, 64)
    wide = activations(6, 400, torch.float16)
    x = wide[:, ::2]  # columns two apart: the kernel needs them contiguous and copies
    bias = activations(1, 37, torch.float16, seed=5).view(-1)
    with fused_kernels(True, on_cpu=True):
        got = weight.linear(x.reshape(2, 3, 200), bias)
    with fused_kernels(False):
        want = weight.linear(x.reshape(2, 3, 200), bias)
    assert got.shape == (2, 3, 37)
    assert_matches(got.reshape(6, 37), want.reshape(6, 37), torch.float16)


# Tiles and group modes.


def test_tile_table_is_ordered_and_fits_the_packing():
    bounds = [bound for bound, _ in TILES]
    assert bounds[-1] is None and bounds[:-1] == sorted(bounds[:-1])
    for _, tile in TILES:
        assert tile.block_m >= 16 and tile.block_n >= 16 and tile.block_k % 32 == 0  # MMA tiles, whole words
    assert tile_for(1, 4096, 4096, 128)[0] == tile_for(16, 4096, 4096, 128)[0] != tile_for(17, 4096, 4096, 128)[0]


def test_decode_splits_k_until_the_gpu_is_full_and_prefill_does_not():
    tile, one_group = tile_for(16, 4096, 14336, 128)
    most = TILES[0][1].split_k
    assert one_group and 1 < tile.split_k == min(most, tile.fill // (4096 // tile.block_n))  # few output tiles
    wide = tile_for(16, 28672, 4096, 128)[0]  # 7x the output tiles: split only until the GPU is full
    assert wide.split_k == max(1, wide.fill // (28672 // wide.block_n)) < tile.split_k
    assert tile_for(64, 28672, 4096, 128)[0].split_k == max(1, FILL_PROGRAMS // (28672 // 128 * 1))  # the default fill
    assert tile_for(16, 4096, 128, 128)[0].split_k == 1  # one K tile: nothing to split
    programs = (4096 // 128) * (4096 // 128)  # the prefill tile over 4096 rows
    assert programs > FILL_PROGRAMS and tile_for(4096, 4096, 4096, 128)[0].split_k == 1


@pytest.mark.parametrize("group_rows,block_k,one_group", [
    (128, 128, True), (64, 64, True), (32, 32, True),  # contiguous groups: the tile shrinks to one group
    (4096, 128, True),  # one group
    (96, 128, False),  # groups that tiles straddle: gathered
    (None, 128, False),  # act-order
])  # fmt: skip
def test_contiguous_groups_read_one_zero_and_scale_vector_per_tile(group_rows, block_k, one_group):
    tile, tiled = tile_for(1, 4096, 4096, group_rows)
    assert (tile.block_k, tiled) == (block_k, one_group)


def test_group_rows_are_found_only_for_groups_in_row_order():
    rows = torch.arange(256)
    assert contiguous_group_rows(rows // 64, 64) == 64
    assert contiguous_group_rows(torch.zeros(256, dtype=torch.long), -1) == 256
    assert contiguous_group_rows(torch.zeros(100, dtype=torch.long), 128) == 100  # one partial group
    assert contiguous_group_rows((rows + 64) // 128, 128) is None  # a row-parallel slice from mid-group
    assert contiguous_group_rows((rows // 64)[torch.randperm(256)], 64) is None  # act-order


# Dispatch.


@interpreter_only
def test_the_kernel_runs_where_fused_kernels_do_and_can_be_switched_off_alone(monkeypatch):
    calls = []
    real = int4_module.w4a16_linear
    monkeypatch.setattr(int4_module, "w4a16_linear", lambda *args: calls.append(1) or real(*args))
    weight = make_weight(device="cpu")
    x = activations(2, 200, torch.float16, device="cpu")
    weight.linear(x, None)
    assert calls == []  # CPU: the reference, unless asked
    with fused_kernels(True, on_cpu=True):
        weight.linear(x, None)
        assert calls == [1]
        with w4a16_kernel(False):
            weight.linear(x, None)
        assert calls == [1]
    with fused_kernels(False, on_cpu=True):
        weight.linear(x, None)
    assert calls == [1]
    with w4a16_kernel(True, on_cpu=True):  # this kernel alone, on CPU
        weight.linear(x, None)
    assert calls == [1, 1]
    with fused_kernels(True, on_cpu=True):
        weight.linear(x.to(torch.float64), None)  # no dot for float64: the reference
    assert calls == [1, 1]


# Malformed operands are refused by name before any launch.


def _operands(weight):
    return dict(qweight=weight.qweight, zeros=weight.zeros, scales=weight.scales, g_idx=weight.g_idx)


@pytest.mark.parametrize("change,message", [
    (dict(x=activations(2, 192, torch.float16)),
     "activations have 192 columns; qweight \\[25, 37\\] packs 8 4-bit rows per word: 200 inputs"),
    (dict(bits=3), "4 or 8 bits per value, not 3"),
    (dict(bits=8), "activations have 200 columns; .* packs 4 8-bit rows per word: 100 inputs"),
    (dict(zeros=torch.zeros(2, 36, dtype=torch.int16)),
     "zeros \\[2, 36\\] and scales \\[2, 37\\] must both be \\[groups, 37\\]"),
    (dict(g_idx=torch.zeros(199, dtype=torch.int32)), "g_idx must be int32 \\[200\\]"),
    (dict(g_idx=torch.zeros(200, dtype=torch.int64)), "g_idx must be int32 \\[200\\]"),
    (dict(qweight=torch.zeros(25, 37, dtype=torch.int64)), "qweight must be 2-D int32"),
    (dict(scales=torch.zeros(37, 2, dtype=torch.float16).t()), "scales must be contiguous"),
    (dict(x=activations(2, 200, torch.float16)[None]), "activations must be 2-D"),
])  # fmt: skip
def test_malformed_operands_are_refused_with_a_clear_error(change, message):
    weight = make_weight(device="cpu")
    args = dict(x=activations(2, 200, torch.float16, device="cpu"), **_operands(weight), bits=4)
    args.update(change)
    with pytest.raises(ValueError, match=message):
        w4a16_matmul(args["x"].cpu(), args["qweight"], args["zeros"], args["scales"], args["g_idx"], args["bits"], 128)


# The tiny int4 checkpoints (every format the loader converts) through the kernel.

CHECKPOINTS = ["gptq4-g128-sym-v1", "gptq4-g32-asym-v2", "gptq4-g64-actorder-asym-v1", "gptq4-channel-asym-v1",
               "gptq8-g64-actorder-sym-v2", "awq-g32"]  # fmt: skip


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    sources = {family: _tiny(tmp_path_factory.mktemp(family), family) for family in ("llama", "qwen2")}
    root = tmp_path_factory.mktemp("packed")
    written = {}
    for name in CHECKPOINTS:
        family = "qwen2" if name == "gptq4-g64-actorder-asym-v1" else "llama"  # q/k/v biases
        written[name] = write_packed_checkpoint(sources[family], root / name, FORMATS[name], seed=len(written))[0]
    return written


# The interpreter's time grows with the programs (about 20 ms each per K step on CPU), and the
# table's decode tiles split K to fill an H200: whole models run with one wide tile instead.
# Tiles of the table itself are covered by the random-weight cases above.
FEW_PROGRAMS = W4A16Tile(block_m=16, block_n=256, block_k=128, num_warps=4, num_stages=1)


@pytest.fixture
def few_programs(monkeypatch):
    monkeypatch.setattr(w4a16_module, "TILES", ((None, FEW_PROGRAMS),))


@interpreter_only
@pytest.mark.parametrize("name", CHECKPOINTS)
def test_each_checkpoint_format_multiplies_the_same_through_the_kernel(checkpoints, name, few_programs):
    """GPTQ v1/v2, sym/asym, act-order, one group, 8 bits and AWQ's converted layout: each of the
    first layer's linears (qkv, o, gate_up, down; the second layer's are loaded alike)."""
    model = load_rank_model(checkpoints[name], ParallelContext())
    model.layers = model.layers[:1]
    for label, linear in _linears(model):
        x = activations(5, linear.packed.in_features, torch.float16, device="cpu")
        assert_matches(kernel(linear.packed, x), reference(linear.packed, x), torch.float16, label)


@interpreter_only
def test_a_row_parallel_slice_that_starts_mid_group_is_gathered(checkpoints, few_programs):
    """Rank 1 of 2 reads down_proj's inputs [192, 384): groups of 128 start mid-slice."""
    from shard_server.models.registry import build_model
    from shard_server.models.config import ModelConfig
    from shard_server.weights import WeightStore, read_config

    directory = checkpoints["gptq4-g128-sym-v1"]
    with WeightStore(directory) as store:
        model = build_model(ModelConfig.from_dict(read_config(directory)), store, ParallelContext(1, 2), "reference",
                            torch.float32, torch.device("cpu"))  # fmt: skip
    down = model.layers[0].mlp.down_proj.packed
    assert down.in_features == 192 and down.group_rows is None
    x = activations(3, 192, torch.float16, device="cpu")
    assert_matches(kernel(down, x), reference(down, x), torch.float16)


def _prefill_and_greedy(directory) -> dict:
    """Prefill logits, and 4 greedy tokens after a one-chunk prefill through the runner."""
    from shard_server.kv_cache import KVSpec
    from shard_server.runner import ModelRunner

    model = load_rank_model(directory, ParallelContext())
    cfg = model.config
    runner = ModelRunner(model, KVSpec(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, 4, torch.float32),
                         torch.device("cpu"))  # fmt: skip
    runner.allocate_kv_cache(64)
    greedy = generate_greedy(StepDriver(runner), 1, PROMPT, 4, chunk=len(PROMPT))
    return {"logits": prefill_logits(model, ParallelContext()), "greedy": greedy}


@interpreter_only
def test_a_tiny_int4_model_gives_the_reference_paths_greedy_tokens(checkpoints, few_programs):
    """Act-order GPTQ with q/k/v biases (Qwen2), float32 (IEEE dots), the kernel alone on CPU
    (the other fused kernels stay off, so only the packed product differs)."""
    directory = checkpoints["gptq4-g64-actorder-asym-v1"]
    with w4a16_kernel(True, on_cpu=True):
        got = _prefill_and_greedy(directory)
    want = _prefill_and_greedy(directory)
    assert want["logits"].std(dim=-1).min() > 0.5, "logits too flat to compare"
    torch.testing.assert_close(got["logits"], want["logits"], atol=1e-4, rtol=1e-4)
    assert got["greedy"] == want["greedy"] and len(set(got["greedy"])) > 1


# Compiled for Hopper (no GPU needed): the interpreter accepts code the compiler refuses.

COMPILE_CASES = {  # name: (constexprs, pointer types)
    "w4a16_decode_split_pdl": (dict(BITS=4, BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, SPLIT_K=4, TILE_GROUP=True,
                                    IEEE=False, UNPACK_BY_ROW=False, SWAP_AB=False, PAIRS=False, ASM=True, PDL=True), {"out_ptr": "*fp32"}),  # fmt: skip
    "w4a16_prefill_gathered": (dict(BITS=4, BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, SPLIT_K=1, TILE_GROUP=False,
                                    IEEE=False, UNPACK_BY_ROW=False, SWAP_AB=False, PAIRS=False, ASM=True, PDL=False), {}),  # fmt: skip
    "w4a16_prefill_tile_group": (dict(BITS=4, BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, SPLIT_K=1, TILE_GROUP=True,
                                      IEEE=False, UNPACK_BY_ROW=False, SWAP_AB=False, PAIRS=False, ASM=True, PDL=False), {}),  # fmt: skip
    "w4a16_decode_by_row": (dict(BITS=4, BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, SPLIT_K=4, TILE_GROUP=True,
                                 IEEE=False, UNPACK_BY_ROW=True, SWAP_AB=False, PAIRS=False, ASM=True, PDL=False), {"out_ptr": "*fp32"}),  # fmt: skip
    "w4a16_float32_ieee": (dict(BITS=4, BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, SPLIT_K=1, TILE_GROUP=True,
                                IEEE=True, UNPACK_BY_ROW=False, SWAP_AB=False, PAIRS=False, ASM=True, PDL=False),
                           {"x_ptr": "*fp32", "out_ptr": "*fp32"}),  # fmt: skip
    "w4a16_decode_swapped_split_pdl": (dict(BITS=4, BLOCK_M=16, BLOCK_N=128, BLOCK_K=128, SPLIT_K=4,
                                            TILE_GROUP=True, IEEE=False, UNPACK_BY_ROW=False, SWAP_AB=True,
                                            PAIRS=False, ASM=True, PDL=True), {"out_ptr": "*fp32"}),  # fmt: skip
    "w4a16_swapped_by_row_gathered": (dict(BITS=4, BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, SPLIT_K=1, TILE_GROUP=False,
                                           IEEE=False, UNPACK_BY_ROW=True, SWAP_AB=True, PAIRS=False, ASM=True, PDL=False), {}),  # fmt: skip
    # Two values at a time (4-bit pair order, one group a tile): half2 PTX, swapped or not, bf16 and fp16.
    "w4a16_pairs_decode_swapped_split": (dict(BITS=4, BLOCK_M=16, BLOCK_N=128, BLOCK_K=128, SPLIT_K=4,
                                              TILE_GROUP=True, IEEE=False, UNPACK_BY_ROW=False, SWAP_AB=True,
                                              PAIRS=True, ASM=True, PDL=True), {"out_ptr": "*fp32"}),  # fmt: skip
    "w4a16_pairs_prefill": (dict(BITS=4, BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, SPLIT_K=1, TILE_GROUP=True,
                                 IEEE=False, UNPACK_BY_ROW=False, SWAP_AB=False, PAIRS=True, ASM=True, PDL=False), {}),  # fmt: skip
    "w4a16_pairs_fp16_swapped": (dict(BITS=4, BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, SPLIT_K=1, TILE_GROUP=True,
                                      IEEE=False, UNPACK_BY_ROW=False, SWAP_AB=True, PAIRS=True, ASM=True, PDL=False),
                                 {"x_ptr": "*fp16", "out_ptr": "*fp16"}),  # fmt: skip
    "w8a16_fp16_gathered": (dict(BITS=8, BLOCK_M=32, BLOCK_N=64, BLOCK_K=128, SPLIT_K=1, TILE_GROUP=False,
                                 IEEE=False, UNPACK_BY_ROW=True, SWAP_AB=False, PAIRS=False, ASM=True, PDL=False),
                            {"x_ptr": "*fp16", "out_ptr": "*fp16"}),  # fmt: skip
}


def _compile_all() -> None:
    """In the child: each case through test_kernels_compile's sm_90 compile and PTX checks."""
    path = Path(__file__).with_name("test_kernels_compile.py")
    spec = importlib.util.spec_from_file_location("kernels_compile", path)
    compile_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compile_module)
    common = {"qweight_ptr": "*i32", "zeros_ptr": "*i16", "scales_ptr": "*fp16", "g_idx_ptr": "*i32"}
    for name, (constants, pointers) in COMPILE_CASES.items():
        compile_module.CASES[name] = ("shard_server.kernels.w4a16", "_w4a16_kernel", constants, {**common, **pointers})
        compile_module.compile_case(name)
        compiled, _ = compile_module.compile_for_hopper(name, aligned=True)
        if not constants["IEEE"]:  # exact float32 dots are FMAs; half tiles must reach the tensor cores
            assert "mma" in compiled.asm["ptx"], f"{name}: no tensor-core instruction in the PTX"
        if constants["PAIRS"]:  # two values a half2 FMA, none converted through float32
            half = "f16x2" if pointers.get("x_ptr") == "*fp16" else "bf16x2"
            assert f"fma.rn.{half}" in compiled.asm["ptx"], f"{name}: no {half} FMA in the PTX"
            assert "sub.f32" not in compiled.asm["ptx"], f"{name}: weights still built in float32"
        if constants["SWAP_AB"]:  # the dequantized weight is wgmma's A operand, a register list
            assert re.search(r"wgmma\.mma_async[^;]*\}, \{%r", compiled.asm["ptx"]), f"{name}: A not from registers"
    shipped = [(f"w4a16_row_shipped_n{tile.block_n}_words{tile.words}",
                dict(BITS=4, BLOCK_N=tile.block_n, WORDS=tile.words, SPLIT_K=tile.split_k, NEAR_TOP=tile.near_top,
                     ASM=True, PDL=True)) for _, tile in ROW_TILES]  # fmt: skip
    for name, constants in (
        *shipped,
        ("w4a16_row_split_pdl", dict(BITS=4, BLOCK_N=128, WORDS=16, SPLIT_K=4, NEAR_TOP=True, ASM=True, PDL=True)),
        ("w4a16_row_exact", dict(BITS=4, BLOCK_N=128, WORDS=16, SPLIT_K=1, NEAR_TOP=False, ASM=True, PDL=False)),
        ("w8a16_row", dict(BITS=8, BLOCK_N=64, WORDS=8, SPLIT_K=1, NEAR_TOP=False, ASM=True, PDL=False)),
    ):
        compile_module.CASES[name] = ("shard_server.kernels.w4a16_row", "_w4a16_row_kernel", constants,
                                      {**common, "x_ptr": "*bf16", "out_ptr": "*fp32" if constants["SPLIT_K"] > 1 else "*bf16"})  # fmt: skip
        compile_module.compile_case(name)
        ptx = compile_module.compile_for_hopper(name, aligned=True)[0].asm["ptx"]
        # Near the top: mask and exponent in one lop3 a value (three masks, one per bit position).
        assert (ptx.count("0x3F800000, 0xEA") >= 3) == constants["NEAR_TOP"], name
    compile_module.CASES["w4a16_dequantize"] = ("shard_server.kernels.w4a16", "_dequantize_kernel",
                                                dict(BITS=4, BLOCK_K=64, BLOCK_N=128, ON_GPU=True), {**common, "out_ptr": "*bf16"})
    compile_module.compile_case("w4a16_dequantize")


def test_the_kernel_compiles_for_hopper():
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-m", "tests.shard.test_w4a16"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


# GPU: the Llama-8B MLP shapes, and capture in a CUDA graph.


@needs_cuda
@pytest.mark.parametrize("rows", [1, 16, 32, 256, 2048])
@pytest.mark.parametrize("shape,act_order", [((4096, 14336), False), ((14336, 4096), True)], ids=["gate", "down"])
def test_gpu_llama_8b_mlp_shapes(shape, act_order, rows):
    depth, features = shape
    weight = make_weight(4, 128, act_order, depth=depth, features=features, scale_dtype=torch.bfloat16)
    x = activations(rows, depth, torch.bfloat16)
    assert_matches(kernel(weight, x), reference(weight, x), torch.bfloat16, f"{shape} x {rows}")


@needs_cuda
def test_gpu_kernel_replays_from_a_cuda_graph():
    weight = make_weight(4, 128, depth=4096, features=4096, scale_dtype=torch.bfloat16)
    x = activations(8, 4096, torch.bfloat16)
    eager = kernel(weight, x)
    graph = torch.cuda.CUDAGraph()
    with fused_kernels(True), torch.cuda.graph(graph):
        captured = weight.linear(x, None)
    x.copy_(activations(8, 4096, torch.bfloat16, seed=2))
    graph.replay()
    assert_matches(captured, reference(weight, x), torch.bfloat16)
    assert not torch.equal(captured, eager)


if __name__ == "__main__":
    _compile_all()
