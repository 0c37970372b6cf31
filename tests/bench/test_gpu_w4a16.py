"""bench/gpu_w4a16.py's pure-Python parts on CPU: its candidates, its packed weight, its TILES table."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench import gpu_w4a16 as bench  # noqa: E402
from shard_server.kernels.w4a16 import W4A16Tile, _tile_in_one_group  # noqa: E402
from shard_server.kernels.pair_order import to_gptq_order  # noqa: E402
from shard_server.layers.int4 import PackedWeight, unpack_rows  # noqa: E402
from shard_server.models.quantization import PackedScheme  # noqa: E402

EIGHT_B = ["8b.qkv", "8b.o", "8b.gate_up", "8b.down"]


@pytest.mark.parametrize("rows", [*bench.ROWS, 2, 8, 100, 300, 8192])
def test_every_row_count_has_candidates_the_kernel_runs_in_one_group(rows):
    tiles = bench.candidates(rows)
    # The default run's budget: with 50-80 a row count, the 8B's six row counts took 70 s on an H100.
    assert 15 <= len(tiles) <= 100 if rows in bench.ROWS else tiles
    assert {tile.unpack_by_row for tile in tiles} == {False, True}
    for tile in tiles:
        assert tile.block_k % 32 == 0 and tile.block_m <= max(16, rows), tile
        assert _tile_in_one_group(tile, 4096, bench.GROUP), tile  # no g_idx gather at group size 128
    for shape in bench.SHAPES:
        entry, timed = bench.case_tiles(rows, *bench.SHAPES[shape])
        assert timed[0] == entry and len(set(timed)) == len(timed)
        assert timed[1] == replace(entry, pairs=False)  # the float32 path, timed beside it
        assert {bench.fitted(tile, rows, *bench.SHAPES[shape]) for tile in tiles} <= set(timed)


def test_fitting_cuts_the_split_count_to_fill_the_gpu():
    tile = W4A16Tile(16, 64, 128, 4, 4, split_k=8)
    assert bench.fitted(tile, 1, *bench.SHAPES["8b.gate_up"]).split_k == 1  # 448 column tiles already
    assert bench.fitted(tile, 1, *bench.SHAPES["8b.o"]).split_k == 4  # 64 column tiles: 4 splits fill 264
    assert bench.fitted(tile, 1, *bench.SHAPES["8b.o"]).block_n == 64


def test_the_bench_weight_is_what_a_gptq_layer_holds():
    n, k = 64, 512
    qweight, zeros, scales, g_idx = bench.packed_weight(n, k, torch.Generator().manual_seed(0), "cpu")
    values = unpack_rows(to_gptq_order(qweight, bench.BITS), bench.BITS)  # the words as a layer keeps them
    assert sorted(values.unique().tolist()) == list(range(16))
    layer = PackedWeight.from_values(PackedScheme("gptq", 4, bench.GROUP), values, zeros, scales, g_idx)
    assert torch.equal(layer.qweight, qweight) and layer.group_rows == bench.GROUP
    for dtype in (torch.float32, torch.bfloat16):
        got = bench.dequantize(qweight, zeros, scales, g_idx, dtype)
        assert got.shape == (k, n) and torch.equal(got.t(), layer.dequantize(dtype))
    assert bench.packed_bytes(n, k) == qweight.numel() * 4 + zeros.numel() * 2 + scales.numel() * 2


def test_the_table_takes_each_row_counts_fastest_fit_and_merges_neighbours():
    first, second = bench.candidates(1)[0], bench.candidates(16)[1]  # split 1: no other tile fits to them
    fast = {1: first, 4: first, 16: second}
    fits = {(shape, rows, tile): bench.fitted(tile, rows, *bench.SHAPES[shape])
            for shape in EIGHT_B for rows in fast for tile in bench.candidates(rows)}  # fmt: skip
    timings = {shape: {rows: {} for rows in fast} for shape in EIGHT_B}
    for (shape, rows, _), fit in fits.items():
        timings[shape][rows][fit] = 10.0
    for shape in EIGHT_B:
        for rows, tile in fast.items():
            timings[shape][rows][fits[shape, rows, tile]] = 1.0
    best = bench.best_per_rows(timings, EIGHT_B)
    assert {rows: tile for rows, (tile, _) in best.items()} == fast and best[16][1] == 4.0
    table = bench.tiles_table(best)
    assert eval(table.removeprefix("TILES = "), {"W4A16Tile": W4A16Tile}) == ((4, first), (None, second))

    del timings["8b.down"][16][fits["8b.down", 16, second]]  # not timed on one shape: out of the running
    tile, total = bench.best_per_rows(timings, EIGHT_B)[16]
    assert tile != second and 4.0 < total < 40.0


def test_the_row_table_takes_each_feature_bounds_fastest_candidate():
    """The suggested ROW_TILES: per bound of output features, the candidate with the least total
    over the shapes that bound takes (the 8B's gate_up alone past 16,383), the shipped total beside."""
    fast_narrow = bench.ROW_CANDIDATES[3]
    fast_wide = bench.ROW_CANDIDATES[7]
    timings = {shape: {1: {tile: 5.0 for tile in bench.ROW_CANDIDATES}} for shape in EIGHT_B}
    for shape in EIGHT_B:
        wide = bench.SHAPES[shape][0] > bench.ROW_TILES[0][0]
        timings[shape][1][fast_wide if wide else fast_narrow] = 1.0
    table = bench.best_row_tiles(timings, EIGHT_B)
    narrow_line, wide_line = table.splitlines()[1:3]
    assert f"({bench.ROW_TILES[0][0]}, {fast_narrow!r})" in narrow_line and "3.0 us over 8b.qkv, 8b.o, 8b.down" in narrow_line
    assert f"(None, {fast_wide!r})" in wide_line and "1.0 us over 8b.gate_up (shipped 5.0)" in wide_line
