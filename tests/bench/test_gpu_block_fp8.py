"""bench/gpu_block_fp8.py's pure-Python parts on CPU: its shapes and copies, its tiles, its weights,
and a whole run on a tiny shape (Triton's interpreter, a stand-in timer) down to the JSON."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench import gpu_block_fp8 as bench  # noqa: E402
from bench.gpu_w4a16 import rel_l2  # noqa: E402
from shard_server.kernels.block_fp8_matmul import GEMM_TILES, ROWS_TILES, ColumnBlocks, GemmTile  # noqa: E402
from shard_server.kernels.dispatch import fused_kernels  # noqa: E402

SHARED_MEMORY = 227 * 1024  # what an sm_90 program may have


def test_the_8b_projections_rows_and_weight_copies():
    assert bench.SHAPES == {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
    assert bench.ROWS == (1, 16, 32, 64, 128, 256, 512, 2048)
    for n, k in bench.SHAPES.values():
        copies = bench.copies_for(n, k)
        assert 2 <= copies <= bench.MAX_COPIES and copies * n * k >= bench.L2_FLUSH
    assert bench.copies_for(28672, 4096) == 3 and bench.copies_for(4096, 4096) == 16


def shared_bytes(tile: GemmTile, mode: str) -> int:
    """A tile's pipeline buffers: e4m3 rows and weight in num_stages (wgmma); bf16 rows and the
    e4m3 weight in num_stages - 1 (mma.sync, as test_kernels_compile.py checks)."""
    if mode == "gemm":
        return (tile.block_m + tile.block_n) * tile.block_k * tile.num_stages
    return (2 * tile.block_m + tile.block_n) * tile.block_k * (tile.num_stages - 1)


@pytest.mark.parametrize("rows", [1, 16, 17, 32, 64, 100, 2048])
def test_the_sweep_times_the_shipped_tile_and_tiles_that_fit(rows):
    tiles = bench.sweep_tiles(rows)
    assert {tile for _, tile in GEMM_TILES} <= set(bench.CANDIDATES)
    assert {tile for _, tile in ROWS_TILES} <= set(bench.ROWS_CANDIDATES)
    for tiles_of_a_kind in (bench.CANDIDATES, bench.ROWS_CANDIDATES, bench.FEW_ROWS_GEMM, bench.MID_ROWS_CANDIDATES):
        assert len({bench.label(tile) for tile in tiles_of_a_kind}) == len(tiles_of_a_kind)
    assert len({f"{mode} {bench.label(tile)}" for mode, tile in tiles}) == len(tiles)
    for mode, tile in tiles:
        assert mode in bench.MODES and tile.block_k % 32 == 0 and shared_bytes(tile, mode) <= SHARED_MEMORY, tile
        assert tile.block_m <= max(64, rows) and (mode == "gemm" or tile.block_m <= max(16, rows))
    modes = {mode for mode, _ in tiles}
    if rows <= 16:
        assert modes == set(bench.MODES) and bench.shipped_path(rows).startswith("block_fp8_rows 16x")
    else:
        gemm = "block_fp8_cublas" if rows >= bench.CUBLAS_FROM_ROWS else "block_fp8_gemm "
        assert modes == ({"gemm", "rows-fp16"} if rows <= bench.MID_ROWS else {"gemm"})
        assert bench.shipped_path(rows).startswith(gemm)
    assert bench.label(GemmTile(16, 128, 128, 4, 4, 4)) == "16x128x128 w4 s4 split4"


def test_the_bench_weights_are_one_dense_weight_in_both_layouts():
    gen = torch.Generator().manual_seed(0)
    layer, (wq, ws) = bench.weights(200, 300, gen, "cpu")  # ragged: a last block of 72 rows and 44 columns
    assert layer.scale.shape == (2, 3) and layer.col_blocks == ColumnBlocks(first=128, width=128)
    block, channel = layer.dequantize(), wq.float() * ws
    assert block.abs().amax() > 0.05 and rel_l2(block, channel) < 0.1  # the same weight, rounded twice
    values = layer.weight.float().abs()
    for r0 in (0, 128):  # each block's largest value is e4m3's largest
        assert all(values[r0 : r0 + 128, c0 : c0 + 128].amax() == 448 for c0 in (0, 128, 256))


def test_a_tiny_run_writes_every_path_and_the_suggested_table(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "SHAPES", {"a": (96, 256), "b": (64, 384)})
    monkeypatch.setattr(bench, "DTYPE", torch.float16)  # the interpreter's bf16 dots are unreliable
    monkeypatch.setattr(bench, "MAX_COPIES", 2)
    keep = bench.CANDIDATES[2:4]  # two tiles a kind: their interpretation is enough
    rows_keep = [GemmTile(16, 32, 64, 4, 2), GemmTile(16, 32, 128, 4, 3, 2)]
    monkeypatch.setattr(bench, "CANDIDATES", keep)
    monkeypatch.setattr(bench, "ROWS_CANDIDATES", rows_keep)
    monkeypatch.setattr(bench, "FEW_ROWS_GEMM", [keep[0], rows_keep[1]])
    monkeypatch.setattr(bench, "MID_ROWS_CANDIDATES", [rows_keep[0]])  # 17 rows: weight streaming too
    fastest = {("rows", rows_keep[1]), ("rows-fp16", rows_keep[0]), ("gemm", keep[1]), ("gemm", rows_keep[1])}
    real_product = bench.product

    def product(mode, tile, x):
        call = real_product(mode, tile, x)
        timed_call = lambda w: call(w)  # noqa: E731
        timed_call.fast = (mode, tile) in fastest
        return timed_call

    monkeypatch.setattr(bench, "product", product)
    timed = []

    def timer(call, copies):  # a stand-in for graph_us: the `fastest` tiles on both shapes
        call(copies[-1])
        timed.append(len(copies))
        return 1.0 if getattr(call, "fast", False) else 2.0

    out = tmp_path / "block_fp8.json"
    with fused_kernels(True, on_cpu=True):
        bench.run(out, ["a", "b"], [1, 17], sweep=True, device="cpu", timer=timer)
    results = json.loads(out.read_text())
    assert set(results["cases"]) == {"a", "b"} and set(results["cases"]["a"]) == {"1", "17"}
    for shape in ("a", "b"):
        for rows in ("1", "17"):
            r = results["cases"][shape][rows]
            for path in bench.PATHS:
                if path == "cublas_blockwise":  # sm_90 only
                    assert "skipped" in r[path] and "us" not in r[path]
                    continue
                assert r[path]["rel_err"] < bench.ERR_LIMIT, (shape, rows, path, r[path])
            swept = [name.split(" ")[0] for name in r["tiles"]]
            assert swept == (["rows"] * 2 + ["rows-fp16"] * 2 + ["gemm"] * 2 if rows == "1" else ["rows-fp16", "gemm", "gemm"])
            for name, entry in r["tiles"].items():
                assert entry["rel_err"] < (bench.ERR_LIMIT if name.startswith("gemm") else 1e-2), (name, entry)
    assert results["cases"]["a"]["1"]["shipped"]["path"].startswith("block_fp8_rows ")
    assert set(results["totals"]) == {"1", "17"} and results["totals"]["1"]["shipped"] > 0
    summary = results["summary"]
    assert re.search(r"best rows-fp16 +2\.0 \(0\.50 x per-channel\) +16x32x64 w4 s2\n", summary)
    assert re.search(r"best gemm +2\.0 \(0\.50 x per-channel\) +16x32x128 w4 s3 split2\n", summary)
    rows_table, gemm_table = summary.split("ROWS_TILES = ")[1].split("GEMM_TILES = ")
    shipped_fastest = rows_keep[0] if bench.ROWS_FP16_DOT else rows_keep[1]  # rows-fp16's, or rows'
    assert eval(rows_table, {"GemmTile": GemmTile}) == ((None, shipped_fastest),)
    assert eval(gemm_table, {"GemmTile": GemmTile}) == ((None, keep[1]),)
    assert timed and set(timed) == {2}
