"""Block-wise fp8 products at the Llama-3 8B projections: the shipped path against the old one and
against per-channel fp8 (`--quantize fp8`), the bar a block-fp8 model's serving must reach.

Weights as a DeepSeek / Qwen3-FP8 checkpoint holds them: a random dense weight quantized to e4m3
per [128, 128] block (scale = the block's max / 448); bf16 activations. Each (projection, rows)
case times, replayed from a CUDA graph as a step runs it (`graph_us`) over enough copies of the
weight that none stays in L2:
- shipped: `BlockFp8Weight.linear`: up to 16 rows `block_fp8_rows` (the fp8 weight widened in
  registers, to fp16 with the rows as ROWS_FP16_DOT says) in its ROWS_TILES tile, from CUBLAS_FROM_ROWS `block_fp8_cublas`
  (rows quantized to e4m3 a scale per 128 columns, cuBLASLt's block-scaled GEMM), in between
  `block_fp8_gemm` (rows quantized to e4m3 a scale each, fp8 x fp8) in its GEMM_TILES tile;
- widen+cuBLAS: the path before it past 16 rows: the weight widened to bf16 in one pass
  (`dequantize_8bit`), then cuBLAS;
- cuBLAS block-wise: `block_fp8_cublas` at every row count (placing CUBLAS_FROM_ROWS);
- per-channel fp8: `fp8_linear` against the same dense weight quantized a scale per row;
- unless --no-sweep, candidate tiles by mode (`tiles`, keyed "MODE TILE"): up to 16 rows
  `rows` (`block_fp8_rows(fp16_dot=False)`: the weight widened to the rows' dtype), `rows-fp16`
  (`fp16_dot=True`, shipped: rows and weight meet in fp16, as per-channel fp8's few-row product
  does) in each of ROWS_CANDIDATES, and `gemm`
  (`block_fp8_gemm`: e4m3 rows; 64-row tiles multiply on wgmma, 16-row ones on mma.sync with both
  widened to fp16) in each of FEW_ROWS_GEMM; past 16 rows `gemm` in each of CANDIDATES, and up
  to MID_ROWS `rows-fp16` in each of MID_ROWS_CANDIDATES (placing where weight streaming ends).
Each result's relative L2 error is against the float32 product with its own dequantized weight
(~2.6e-2 for e4m3 rows, ~1e-3 for unrounded ones; a tile above ERR_LIMIT counts as wrong). The
JSON is rewritten after every case and a line printed; at the end, per row count, the total µs over
the projections of each path and of each mode's best tile, and ROWS_TILES and GEMM_TILES tables
(per row count the shipped few-row mode's or `gemm`'s candidate with the least total) to paste into
shard_server/kernels/block_fp8_matmul.py.

    python3 bench/gpu_block_fp8.py OUT_JSON [--shapes qkv,o] [--rows 1,16,2048] [--no-sweep]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gpu_w4a16 import measure  # noqa: E402
from bench.gpu_w4a16 import timed as graph_timer  # noqa: E402
from shard_server.kernels.block_fp8_cublas import CUBLAS_FROM_ROWS, block_fp8_cublas  # noqa: E402
from shard_server.kernels.block_fp8_matmul import (  # noqa: E402
    GEMM_TILES,
    ROWS_FP16_DOT,
    ROWS_TILES,
    GemmTile,
    block_fp8_gemm,
    block_fp8_rows,
    gemm_tile,
    rows_tile,
)
from shard_server.kernels.dequantize import dequantize_8bit  # noqa: E402
from shard_server.kernels.fp8_matmul import FP8, FP8_MAX, fp8_linear, quantize_rows_reference  # noqa: E402
from shard_server.kernels.skinny_matmul import MAX_ROWS  # noqa: E402
from shard_server.layers.quantized import BlockFp8Weight  # noqa: E402
from shard_server.models.quantization import BlockFp8Scheme  # noqa: E402

# (output features N, inputs K); qkv and gate_up fused as the server loads them.
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
ROWS = (1, 16, 32, 64, 128, 256, 512, 2048)
BLOCK = (128, 128)
DTYPE = torch.bfloat16
L2_FLUSH = 256e6  # bytes of weight copies a graph cycles through: five times an H200's 50 MB L2
MAX_COPIES = 32
ERR_LIMIT = 5e-2
PATHS = ("shipped", "widen_cublas", "cublas_blockwise", "per_channel_fp8")
MODES = ("rows", "rows-fp16", "gemm")
CUBLAS_SKIPPED = {"skipped": "cuBLASLt multiplies block-scaled fp8 on sm_90 only, in whole 128 x 128 blocks"}
# The sweep's tiles: 32-row tiles (mma.sync) for the smallest batches, one or two warpgroups of 64
# rows, feature tiles 32-256, 3-5 stages (all within the 227 KB of shared memory a program may have).
CANDIDATES = [GemmTile(*spec) for spec in (
    (32, 32, 128, 4, 4), (32, 64, 128, 4, 4), (64, 32, 128, 4, 4), (64, 32, 128, 4, 5), (64, 64, 128, 4, 3),
    (64, 64, 128, 4, 4), (64, 128, 128, 4, 3), (64, 128, 128, 4, 4), (64, 256, 128, 8, 3), (128, 64, 128, 8, 4),
    (128, 128, 128, 8, 3), (128, 128, 128, 8, 4), (128, 256, 128, 8, 3), (128, 128, 64, 8, 4),
)]  # fmt: skip
# Up to 16 rows the weight is only streamed: 16-row tiles (mma.sync) as wide as keep the 8B's
# 4096-feature projections in programs, K split in ranges to add more (per-channel fp8's few-row
# config: 128 features, four ranges), 3-5 stages.
ROWS_CANDIDATES = [GemmTile(*spec) for spec in (
    (16, 32, 128, 4, 4), (16, 64, 128, 4, 5), (16, 64, 128, 4, 4, 2), (16, 128, 128, 4, 3, 4), (16, 128, 128, 4, 4, 4),
    (16, 128, 128, 8, 4, 4), (16, 256, 128, 8, 3, 4),
)]  # fmt: skip
# fp8 rows at a few: wgmma's 64-row tiles (the weight read from shared memory as it is, no widening)
# narrow or split for programs, and the shipped 16-row rows tile (fp8 widened to fp16 for mma.sync).
FEW_ROWS_GEMM = [GemmTile(*spec) for spec in (
    (64, 32, 128, 4, 4), (64, 64, 128, 4, 4, 2), (64, 128, 128, 4, 4, 4), (16, 128, 128, 4, 4, 4),
)]  # fmt: skip


def copies_for(n: int, k: int) -> int:
    """Weight copies a graph cycles through so that none stays in L2 (a byte per fp8 weight)."""
    return min(MAX_COPIES, max(2, math.ceil(L2_FLUSH / (n * k))))


# 17-64 rows (decode batches under load) also try streaming the weight as few rows do, rows and
# weight in fp16 on mma.sync, in row tiles of 16 to 64 (each a pass over the weight; the others
# mostly from L2): against cuBLASLt's block-scaled GEMM, 1.15x per-channel fp8's µs there.
MID_ROWS = 64
MID_ROWS_CANDIDATES = [GemmTile(*spec) for spec in (
    (16, 128, 128, 4, 3, 4), (32, 128, 128, 4, 3, 4), (32, 64, 128, 4, 3, 2), (32, 128, 128, 8, 3, 4),
    (64, 128, 128, 4, 3, 4), (64, 64, 128, 4, 3, 2), (64, 128, 128, 8, 3, 4),
)]  # fmt: skip


def candidates(rows: int) -> list[GemmTile]:
    """The GEMM sweep's tiles for `rows` (more than 16): none taller than the rows need (64 at least)."""
    return [tile for tile in CANDIDATES if tile.block_m <= max(64, rows)]


def sweep_tiles(rows: int) -> list[tuple[str, GemmTile]]:
    """(mode, tile) of each candidate timed at `rows`."""
    if rows > MAX_ROWS:
        mid = [("rows-fp16", tile) for tile in MID_ROWS_CANDIDATES if tile.block_m <= rows] if rows <= MID_ROWS else []
        return mid + [("gemm", tile) for tile in candidates(rows)]
    few = [(mode, tile) for mode in ("rows", "rows-fp16") for tile in ROWS_CANDIDATES]
    return few + [("gemm", tile) for tile in FEW_ROWS_GEMM]


def label(tile: GemmTile) -> str:
    split = f" split{tile.split_k}" if tile.split_k > 1 else ""
    return f"{tile.block_m}x{tile.block_n}x{tile.block_k} w{tile.num_warps} s{tile.num_stages}{split}"


def shipped_path(rows: int) -> str:
    if rows <= MAX_ROWS:
        return f"block_fp8_rows {label(rows_tile(rows))}"
    if rows >= CUBLAS_FROM_ROWS:  # the 8B's projections are whole 128 x 128 blocks
        return "block_fp8_cublas"
    return f"block_fp8_gemm {label(gemm_tile(rows))}"


def product(mode: str, tile: GemmTile, x: torch.Tensor):
    """One candidate as a call on a BlockFp8Weight."""
    if mode == "gemm":
        return lambda w: block_fp8_gemm(x, w.weight, w.scale, w.row_block, w.col_blocks, tile)
    fp16_dot = mode == "rows-fp16"
    return lambda w: block_fp8_rows(x, w.weight, w.scale, w.row_block, w.col_blocks, tile, fp16_dot)


def weights(n: int, k: int, generator: torch.Generator, device) -> tuple[BlockFp8Weight, tuple[torch.Tensor, ...]]:
    """One random dense [N, K] weight as a block-wise fp8 layer holds it and as per-channel fp8
    (`quantize_rows_reference`: fp8 [N, K], float32 scales [N, 1])."""
    dense = torch.randn(n, k, generator=generator, device=device) * 0.02
    bn, bk = BLOCK
    rows_b, cols_b = -(-n // bn), -(-k // bk)
    padded = F.pad(dense, (0, cols_b * bk - k, 0, rows_b * bn - n)).view(rows_b, bn, cols_b, bk)
    scales = (padded.abs().amax(dim=(1, 3)) / FP8_MAX).clamp(min=1e-12)  # [row blocks, column blocks]
    per_value = scales.repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
    layer = BlockFp8Weight(BlockFp8Scheme(block=BLOCK), (n, k), DTYPE, device)
    layer.weight.copy_((dense / per_value).clamp(-FP8_MAX, FP8_MAX).to(FP8))
    layer._set(scales, torch.arange(n) // bn, torch.arange(k) // bk)
    return layer, quantize_rows_reference(dense)


def case(rows: int, blocks: list, channels: list, sweep: bool, timer) -> dict:
    """One (shape, rows) case over the weight copies `blocks` (BlockFp8Weight) and `channels`."""
    n, k = blocks[0].out_features, blocks[0].in_features
    x = torch.randn(rows, k, device=blocks[0].weight.device, dtype=DTYPE)
    want_block = x.float() @ blocks[0].dequantize().t()
    wq, ws = channels[0]
    want_channel = x.float() @ (wq.float() * ws).t()
    flops = 2 * rows * n * k

    def figures(us: float, weight_bytes: int = n * k) -> dict:
        return {"us": us, "weight_tb_s": weight_bytes / us / 1e6, "tflop_s": flops / us / 1e6}

    def widen(w: BlockFp8Weight) -> torch.Tensor:
        return F.linear(x, dequantize_8bit(w.weight, w.scale, x.dtype, w.row_block, w.col_block))

    result = {
        "rows": rows, "n": n, "k": k, "copies": len(blocks),
        "shipped": {"path": shipped_path(rows), **measure(lambda w: w.linear(x, None), blocks, want_block, figures,
                                                          timer)},
        # reads the fp8 weight, writes and reads it in bf16
        "widen_cublas": measure(widen, blocks, want_block, lambda us: figures(us, 5 * n * k), timer),
        # the rows quantized a scale per 128 columns, cuBLASLt's block-scaled fp8 GEMM
        "cublas_blockwise": measure(lambda w: block_fp8_cublas(x, w.weight, w.cublas_scale), blocks, want_block,
                                    figures, timer) if blocks[0].cublas_scale is not None else CUBLAS_SKIPPED,
        "per_channel_fp8": measure(lambda c: fp8_linear(x, *c), channels, want_channel, figures, timer),
        "tiles": {},
    }  # fmt: skip
    if sweep:
        for mode, tile in sweep_tiles(rows):
            call = product(mode, tile, x)
            result["tiles"][f"{mode} {label(tile)}"] = measure(call, blocks, want_block, figures, timer)
    return result


def totals(results: dict, shapes: list[str]) -> dict[str, dict]:
    """Per row count timed on every shape: each path's µs summed over the shapes, and shipped over
    per-channel fp8 (the bar: at most 1)."""
    out = {}
    for rows in sorted({int(r) for shape in shapes for r in results["cases"].get(shape, {})}):
        cases = [results["cases"].get(shape, {}).get(str(rows)) for shape in shapes]
        if None in cases:
            continue
        sums = {path: sum(c[path].get("us", math.nan) for c in cases) for path in PATHS}
        out[str(rows)] = {**sums, "shipped_over_per_channel": sums["shipped"] / sums["per_channel_fp8"]}
    return out


def best_tiles(results: dict, shapes: list[str], mode: str) -> dict[int, tuple[str, float]]:
    """Per swept row count: `mode`'s tile (its label) with the least total µs over `shapes`, and that
    total (wrong or missing on one shape: out)."""
    best = {}
    for rows in totals(results, shapes):
        cases = [results["cases"][shape][rows]["tiles"] for shape in shapes]
        sums = {}
        for name in cases[0]:
            entries = [c.get(name, {}) for c in cases]
            if name.split(" ")[0] == mode and all(e.get("rel_err", math.inf) < ERR_LIMIT for e in entries):
                sums[name.split(" ", 1)[1]] = sum(e["us"] for e in entries)
        if sums:
            name = min(sums, key=sums.get)
            best[int(rows)] = (name, sums[name])
    return best


def tiles_table(name: str, best: dict[int, tuple[str, float]], tiles: list[GemmTile]) -> str:
    """A table as Python: (most rows, tile), neighbours with one tile merged, the last bound None."""
    by_label = {label(tile): tile for tile in tiles}
    entries: list[tuple[int | None, GemmTile]] = []
    for rows, (tile_label, _) in sorted(best.items()):
        if entries and entries[-1][1] == by_label[tile_label]:
            entries.pop()
        entries.append((rows, by_label[tile_label]))
    if entries:
        entries[-1] = (None, entries[-1][1])
    return f"{name} = (\n" + "".join(f"    ({bound}, {tile!r}),\n" for bound, tile in entries) + ")"


def summary(results: dict, shapes: list[str]) -> str:
    """Per row count the paths' totals, then each mode's best tile; the tables to paste."""
    best = {mode: best_tiles(results, shapes, mode) for mode in MODES}
    lines = [f"{'rows':>5} {'shipped':>9} {'widen+cuBLAS':>13} {'cuBLAS block':>13} {'per-channel':>12} "
             f"{'shipped/per-ch':>15}  (total us over {', '.join(shapes)}; then each mode's best tile)"]  # fmt: skip
    for rows, t in totals(results, shapes).items():
        lines.append(f"{rows:>5} {t['shipped']:>9.1f} {t['widen_cublas']:>13.1f} {t['cublas_blockwise']:>13.1f} "
                     f"{t['per_channel_fp8']:>12.1f} {t['shipped_over_per_channel']:>15.2f}")  # fmt: skip
        for mode in MODES:
            if int(rows) in best[mode]:
                tile, total = best[mode][int(rows)]
                ratio = total / t["per_channel_fp8"]
                lines.append(f"{'':>5} best {mode:<9} {total:>9.1f} ({ratio:.2f} x per-channel)  {tile}")
    shipped_mode = "rows-fp16" if ROWS_FP16_DOT else "rows"  # the few-row table is for the shipped mode
    few = {rows: b for rows, b in best[shipped_mode].items() if rows <= MAX_ROWS}
    many = {rows: b for rows, b in best["gemm"].items() if rows > MAX_ROWS}
    tables = [tiles_table("ROWS_TILES", few, ROWS_CANDIDATES)] if few else []
    tables += [tiles_table("GEMM_TILES", many, CANDIDATES)] if many else []
    return "\n".join(lines + tables)


def case_line(shape: str, r: dict) -> str:
    def timing(entry: dict) -> str:
        if "us" not in entry:
            return entry["error"][:60]
        speed = f"{entry['weight_tb_s']:.2f} TB/s" if r["rows"] <= 64 else f"{entry['tflop_s']:.0f} TFLOP/s"
        return f"{entry['us']:.1f} us ({speed}, err {entry['rel_err']:.1e})"

    swept = ""
    for mode in MODES:
        good = {name: e for name, e in r["tiles"].items()
                if name.split(" ")[0] == mode and e.get("rel_err", math.inf) < ERR_LIMIT}  # fmt: skip
        if good:
            best = min(good, key=lambda name: good[name]["us"])
            swept += f"; best {best} {timing(good[best])}"
    return (f"{shape} M={r['rows']}: shipped {timing(r['shipped'])} {r['shipped']['path']}; widen+cuBLAS "
            f"{timing(r['widen_cublas'])}; per-channel fp8 {timing(r['per_channel_fp8'])}{swept}")  # fmt: skip


def run(out: Path, shapes: list[str], rows_list: list[int], sweep: bool, device="cuda", timer=graph_timer) -> dict:
    """Every case, the JSON rewritten after each; the totals and the suggested tables at the end."""
    results: dict = {"device": torch.cuda.get_device_name() if device == "cuda" else str(device),
                     "torch": torch.__version__, "dtype": str(DTYPE), "block": list(BLOCK), "err_limit": ERR_LIMIT,
                     "rows_tiles": [[bound, label(tile)] for bound, tile in ROWS_TILES],
                     "gemm_tiles": [[bound, label(tile)] for bound, tile in GEMM_TILES], "cases": {}}  # fmt: skip
    generator = torch.Generator(device).manual_seed(0)
    for shape in shapes:
        n, k = SHAPES[shape]
        pairs = [weights(n, k, generator, device) for _ in range(copies_for(n, k))]
        blocks, channels = [p[0] for p in pairs], [p[1] for p in pairs]
        for rows in rows_list:
            r = case(rows, blocks, channels, sweep, timer)
            results["cases"].setdefault(shape, {})[str(rows)] = r
            out.write_text(json.dumps(results, indent=1))
            print(case_line(shape, r), flush=True)
        del pairs, blocks, channels
        if device == "cuda":
            torch.cuda.empty_cache()
    results["totals"] = totals(results, shapes)
    results["summary"] = summary(results, shapes)
    out.write_text(json.dumps(results, indent=1))
    print(results["summary"], flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--rows", default=",".join(map(str, ROWS)))
    parser.add_argument("--no-sweep", action="store_true", help="time only the three paths, no candidate tiles")
    args = parser.parse_args()
    shapes = args.shapes.split(",")
    if unknown := [shape for shape in shapes if shape not in SHAPES]:
        parser.error(f"unknown shapes {unknown}: {', '.join(SHAPES)}")
    run(args.out, shapes, [int(r) for r in args.rows.split(",")], sweep=not args.no_sweep)


if __name__ == "__main__":
    main()
