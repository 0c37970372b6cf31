"""The W4A16 kernel's tiles on an H200, at the Llama-3 8B and 70B projections (issue 25).

Weights as a GPTQ checkpoint without act-order gives them: 4-bit, group size 128, symmetric
(zero point 8), fp16 scales; bf16 activations. Each (projection, rows) case times, replayed
from a CUDA graph as a step runs it (`graph_us`) over enough copies of the weight that none
stays in L2:
- shipped: `w4a16_matmul` given no tile (its TILES entry, or from `DEQUANTIZE_FROM_ROWS` rows
  the weight dequantized in one pass, `dequantize_packed`, and cuBLAS);
- every candidate tile of the row class, unpacked both ways (`unpack_by_row`), and what
  `tile_for` would cut its split count to at this shape, so a suggested entry is timed as it ships;
- cuBLAS bf16 `F.linear` on the dequantized weight: the bf16 model's speed, the bar;
- `dequantize_packed` alone, and followed by cuBLAS (to place DEQUANTIZE_FROM_ROWS).
Reported: µs; the bytes of the weight a call reads over its time (packed: words, zeros and
scales; cuBLAS: bf16; the dequantize pass: packed read plus bf16 written); TFLOP/s; each
path's relative L2 error against the bf16 product (~2e-3 is bf16 rounding; above 1e-2 a tile
is out); the best tile, shipped/best, best/cuBLAS. The JSON is rewritten after every case and
a line printed. At the end, per model: the total µs over its projections for each row count
(shipped, suggested tile, cuBLAS, dequantize + cuBLAS), and a `TILES` table to paste into
shard_server/kernels/w4a16.py: each row count's candidate with the least total (the 8B table is
the one asked for; neighbours with one tile merge).

    python3 bench/gpu_w4a16.py OUT_JSON [--shapes 8b,70b.o] [--rows 1,16,4096] [--quick]

Kernels are compiled first, in threads, on a small weight with the same specializations
(Triton's compiler runs mostly outside the GIL): ~200 compiles in seconds, not minutes.
`--compile-threads 1` compiles one at a time, should threads ever misbehave.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gpu_skinny_matmul import graph_us  # noqa: E402
from shard_server.kernels import w4a16  # noqa: E402
from shard_server.kernels.pair_order import to_gptq_order  # noqa: E402
from shard_server.kernels.w4a16 import (  # noqa: E402
    DEQUANTIZE_FROM_ROWS,
    FILL_PROGRAMS,
    ROW_TILES,
    SMS,
    W4A16Tile,
    dequantize_packed,
    row_tile,
    tile_for,
    w4a16_matmul,
)
from shard_server.kernels.w4a16_row import W4A16Row  # noqa: E402

# (output features N, inputs K) of each projection; qkv and gate_up fused as the server loads them.
SHAPES = {
    "8b.qkv": (6144, 4096), "8b.o": (4096, 4096), "8b.gate_up": (28672, 4096), "8b.down": (4096, 14336),
    "70b.qkv": (10240, 8192), "70b.o": (8192, 8192), "70b.gate_up": (57344, 8192), "70b.down": (8192, 28672),
}  # fmt: skip
ROWS = (1, 4, 16, 32, 64, 128, 256, 512, 2048, 4096)
BITS, GROUP, ZERO = 4, 128, 8
L2_FLUSH = 256e6  # bytes of weight copies a graph cycles through: five times the H200's 50 MB L2
MAX_COPIES = 32
ROUND_US = 10_000  # graph_us's repeats are cut so one of its five timed rounds takes about this long
ERR_LIMIT = 1e-2  # relative L2 against the bf16 product above which a tile counts as wrong
COMPILE_THREADS = 12
DEVICE = "cuda"


def _tiles(specs, splits=(1,), by_row=(False, True), swaps=(False, True), fills=(FILL_PROGRAMS,)) -> list[W4A16Tile]:
    """Each (block_m, block_n, block_k, warps, stages) at each split count, unpacked each way,
    in either operand order (`swap_ab`), splitting until each fill."""
    return [W4A16Tile(m, n, k, w, s, split, unpack_by_row=unpack, swap_ab=swap, fill=fill)
            for m, n, k, w, s in specs for split in splits for unpack in by_row for swap in swaps
            for fill in fills]  # fmt: skip


# (most rows, candidates), as TILES is keyed. Decode rows stream the weight (memory-bound: deep
# pipelines, split K so the 132 SMs have work; tile_for's fit adds the smaller split counts); from
# ~64 rows a 4-bit weight is compute-bound on an H200, and taller row tiles spread each tile's
# dequantization over more rows. No block_k of 256: it straddles two 128-row groups, which sends
# the kernel to its per-row g_idx gather, and tile_for cuts such a tile to 128 at this group size.
CANDIDATES = (
    (16, _tiles([(16, 32, 128, 4, 4), (16, 64, 128, 4, 4), (16, 64, 64, 4, 5), (16, 128, 128, 4, 3)], (1, 4, 8))),
    (32, _tiles([(32, 64, 128, 4, 4), (32, 128, 128, 4, 3), (32, 64, 64, 4, 5), (32, 128, 64, 8, 4),
                 (16, 64, 128, 4, 4)], (1, 4))),
    (64, _tiles([(32, 64, 128, 4, 4), (32, 128, 64, 4, 4), (64, 64, 64, 4, 4), (64, 128, 64, 4, 4),
                 (64, 128, 128, 8, 3), (64, 256, 64, 8, 3)], (1, 4))),
    (256, _tiles([(64, 64, 64, 4, 4), (64, 128, 64, 4, 4), (64, 128, 128, 4, 3), (128, 64, 64, 4, 4),
                  (128, 128, 64, 8, 3), (128, 256, 64, 8, 3)], (1, 4))),
    (None, _tiles([(128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 128, 64, 4, 4), (128, 256, 64, 8, 3),
                   (128, 64, 64, 4, 4), (128, 128, 64, 8, 5), (64, 128, 64, 4, 4), (64, 256, 64, 8, 3),
                   (64, 128, 128, 4, 3)]) + _tiles([(128, 128, 64, 8, 3)], (2,))
     # By row these need more than the 227 KB of shared memory a program may have (sm_90 compiles).
     + _tiles([(128, 256, 64, 8, 4), (128, 128, 128, 8, 3), (128, 256, 128, 8, 2)], by_row=(False,))),
)  # fmt: skip
DECODE_FILLS = (FILL_PROGRAMS, 4 * SMS, 8 * SMS, 16 * SMS)  # decode rows stream the weight: more programs may help
# Swapped tiles keep no dequantized weight in shared memory, which leaves room for deeper
# pipelines and wider feature tiles (the wgmma's 64-row side): candidates of their own.
SWAPPED = (
    (16, _tiles([(16, 128, 128, 4, 3), (16, 128, 128, 4, 4), (16, 256, 128, 8, 3), (16, 128, 64, 4, 6)], (4, 8),
                by_row=(False,), swaps=(True,), fills=DECODE_FILLS)),
    (32, _tiles([(32, 64, 128, 4, 4), (32, 128, 128, 4, 4), (32, 256, 128, 8, 3), (32, 128, 64, 4, 6)], (4,),
                by_row=(False,), swaps=(True,), fills=DECODE_FILLS)),
    (64, _tiles([(64, 128, 128, 4, 4), (64, 256, 128, 8, 3), (64, 128, 64, 4, 5), (32, 256, 64, 8, 4)], (1, 4),
                swaps=(True,))),
    (256, _tiles([(128, 128, 128, 8, 3), (128, 256, 64, 8, 4), (64, 256, 128, 8, 3), (256, 128, 64, 8, 3)], (1, 4),
                 swaps=(True,))),
    (None, _tiles([(128, 256, 64, 8, 4), (256, 128, 64, 8, 3), (128, 128, 128, 8, 4), (256, 256, 64, 8, 3)],
                  swaps=(True,))),
)  # fmt: skip
CANDIDATES = tuple((bound, tiles + extra) for (bound, tiles), (_, extra) in zip(CANDIDATES, SWAPPED, strict=True))


# One row: the CUDA-core kernel's tiles (kernels/w4a16_row.py), each split count as given.
# Each tile both ways (values near the mantissa's top or exact floats), and wider column tiles
# than before: fewer word rows a thread, so each activation it loads serves more columns.
ROW_CANDIDATES = [W4A16Row(n, words, warps, 2, split, near_top=near_top) for n in (128, 256, 512, 1024)
                  for words in (4, 8, 16) for warps in (4, 8) for split in (4, 8)
                  for near_top in (False, True)]  # fmt: skip
ROW_CANDIDATES += [tile for _, tile in ROW_TILES if tile not in ROW_CANDIDATES]


def candidates(rows: int) -> list[W4A16Tile]:
    """The row class's candidates, less those whose row tile is taller than the rows (16 is tl.dot's least)."""
    tiles = next(tiles for bound, tiles in CANDIDATES if bound is None or rows <= bound)
    return [tile for tile in tiles if tile.block_m <= max(16, rows)]


def fitted(tile: W4A16Tile, rows: int, n: int, k: int) -> W4A16Tile:
    """What `tile_for` makes of `tile` as a TILES entry at this shape (its split count cut to fill the GPU)."""
    with mock.patch.object(w4a16, "TILES", ((None, tile),)):
        return tile_for(rows, n, k, GROUP)[0]


def case_tiles(rows: int, n: int, k: int, limit: int | None = None) -> tuple[W4A16Tile, list[W4A16Tile]]:
    """The TILES entry (`tile_for`'s) and every tile a case times: it, it on the float32 path (two values
    at a time off), the candidates, their fitted forms."""
    entry = tile_for(rows, n, k, GROUP)[0]
    tiles = candidates(rows)[:limit]
    return entry, list(dict.fromkeys([entry, replace(entry, pairs=False), *tiles,
                                      *(fitted(t, rows, n, k) for t in tiles)]))  # fmt: skip


def label(tile: W4A16Tile | W4A16Row) -> str:
    if isinstance(tile, W4A16Row):
        top = " near-top" if tile.near_top else ""
        return f"row n{tile.block_n} words{tile.words} w{tile.num_warps} s{tile.num_stages} split{tile.split_k}{top}"
    name = f"{tile.block_m}x{tile.block_n}x{tile.block_k} w{tile.num_warps} s{tile.num_stages} split{tile.split_k}"
    fill = f" fill{tile.fill}" if tile.fill != FILL_PROGRAMS else ""
    float32 = " float32" if not tile.pairs else ""
    return name + (" by-row" if tile.unpack_by_row else "") + (" swapped" if tile.swap_ab else "") + fill + float32


def packed_weight(n: int, k: int, generator: torch.Generator, device) -> tuple[torch.Tensor, ...]:
    """Random [K, N] 4-bit weight as `PackedWeight` holds a GPTQ one: (qweight, zeros, scales, g_idx);
    random words are as random in pair order."""
    groups = k // GROUP
    qweight = torch.randint(-(2**31), 2**31, (k // 8, n), dtype=torch.int32, generator=generator, device=device)
    zeros = torch.full((groups, n), ZERO, dtype=torch.int16, device=device)
    scales = ((torch.rand(groups, n, generator=generator, device=device) + 1) * 2e-3).half()
    g_idx = torch.arange(k, dtype=torch.int32, device=device) // GROUP
    return qweight, zeros, scales, g_idx


def packed_bytes(n: int, k: int) -> int:
    return n * k * BITS // 8 + (k // GROUP) * n * 4  # the words, and an int16 zero and fp16 scale per group


def dequantize(qweight, zeros, scales, g_idx, dtype=torch.bfloat16) -> torch.Tensor:
    """The [K, N] weight (`PackedWeight.dequantize`'s, transposed), in plain torch: contiguous groups
    broadcast their zero and scale to their rows instead of gathering them per row."""
    shifts = torch.arange(0, 32, BITS, dtype=torch.int32, device=qweight.device)
    words = to_gptq_order(qweight, BITS)  # the layer keeps pair order
    values = (words.unsqueeze(1) >> shifts.view(1, -1, 1)) & ((1 << BITS) - 1)  # [K/8, 8, N], row 8w+i
    values = values.view(-1, GROUP, qweight.shape[1])  # [groups, GROUP, N]
    weight = (values - zeros.int().unsqueeze(1)).float() * scales.to(dtype).float().unsqueeze(1)
    return weight.view(-1, qweight.shape[1]).to(dtype)


def to_bf16(qweight, zeros, scales, g_idx) -> torch.Tensor:
    """The bf16 [K, N] weight as the server builds it for cuBLAS from DEQUANTIZE_FROM_ROWS rows: one pass."""
    return dequantize_packed(qweight, zeros, scales, g_idx, BITS, torch.bfloat16)


def shipped_path(rows: int, features: int, entry: W4A16Tile) -> str:
    """What `w4a16_matmul` runs given no tile: one row the row kernel in its ROW_TILES tile
    (contiguous groups here), the TILES entry, or from enough rows dequantize + cuBLAS."""
    if rows == 1:
        return f"row kernel, {label(row_tile(features))} fitted"
    return "dequantize_packed + cuBLAS" if rows >= DEQUANTIZE_FROM_ROWS else label(entry)


def timed(call, weights) -> float:
    """graph_us with fewer repeats for slow calls, so a 4096-row 70B case takes seconds, not minutes."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call(weights[0])
    end.record()
    end.synchronize()
    rough_us = start.elapsed_time(end) * 1e3
    return graph_us(call, weights, repeats=max(1, min(10, int(ROUND_US / (rough_us * len(weights))))))


def rel_l2(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want).norm() / want.norm().clamp_min(1e-30))


def precompile(plans: list[tuple[int, list[W4A16Tile]]], threads: int) -> None:
    """Compiles each (rows, tiles) plan's kernels by running them on a small weight. Of the arguments only
    the row count changes a kernel's specialization here (1, a multiple of 16, or neither): N and K are
    multiples of 16 in every shape. A tile that fails is left for its case to record."""
    generator = torch.Generator(DEVICE).manual_seed(1)
    weight = packed_weight(256, 256, generator, DEVICE)
    jobs = [(rows if rows == 1 or rows % 16 else 16, tile) for rows, tiles in plans for tile in tiles]
    jobs += [(1, tile) for tile in ROW_CANDIDATES] if any(rows == 1 for rows, _ in plans) else []
    jobs = list(dict.fromkeys(jobs))
    xs = {rows: torch.randn(rows, 256, device=DEVICE, dtype=torch.bfloat16) for rows, _ in jobs}

    def run(job) -> None:
        try:
            w4a16_matmul(xs[job[0]], *weight, BITS, GROUP, job[1])
        except Exception:  # noqa: BLE001
            pass

    run(jobs[0])  # fills Triton's per-device caches before threads share them
    began = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(run, jobs[1:]))
    torch.cuda.synchronize()
    print(f"compiled {len(jobs)} kernels in {time.perf_counter() - began:.0f} s", flush=True)


def measure(call, weights, want: torch.Tensor, figures, timer=None) -> dict:
    """One way to the product: its figures and error, or why it failed (a tile the compiler refuses
    for shared memory is recorded, not fatal). `timer`: `timed` unless given (tests pass a stand-in)."""
    try:
        error = rel_l2(call(weights[0]), want)
        return {**figures((timer or timed)(call, weights)), "rel_err": error}
    except Exception as exc:  # noqa: BLE001
        return {"error": f"{type(exc).__name__}: {str(exc)[:160]}"}


def case(rows: int, n: int, k: int, packed: list, dense: list, limit: int | None, timings: dict) -> dict:
    """One (shape, rows) case; fills timings[tile] = µs for the suggested table."""
    x = torch.randn(rows, k, device=DEVICE, dtype=torch.bfloat16)
    want = F.linear(x, dense[0]).float()
    flops, nbytes = 2 * rows * n * k, packed_bytes(n, k)

    def figures(us: float, weight_bytes: int = nbytes) -> dict:
        return {"us": us, "weight_tb_s": weight_bytes / us / 1e6, "tflop_s": flops / us / 1e6}

    entry, tiles = case_tiles(rows, n, k, limit)
    entries = {}
    for tile in [*tiles, *(ROW_CANDIDATES if rows == 1 else ())]:
        entries[label(tile)] = {"tile": asdict(tile), **measure(
            lambda w, t=tile: w4a16_matmul(x, *w, BITS, GROUP, t), packed, want, figures)}  # fmt: skip
        if entries[label(tile)].get("rel_err", math.inf) < ERR_LIMIT:
            timings[tile] = entries[label(tile)]["us"]
    good = {name: e for name, e in entries.items() if e.get("rel_err", math.inf) < ERR_LIMIT}
    best = min(good, key=lambda name: good[name]["us"]) if good else None
    shipped = measure(lambda w: w4a16_matmul(x, *w, BITS, GROUP), packed, want, figures)  # the server's path
    cublas = measure(lambda w: F.linear(x, w), dense, want, lambda us: figures(us, n * k * 2))
    us_of = lambda entry: entry.get("us", math.nan)  # noqa: E731
    return {
        "rows": rows, "n": n, "k": k, "copies": len(packed), "packed_bytes": nbytes, "tiles_entry": label(entry),
        "shipped": {"name": shipped_path(rows, n, entry), **shipped},
        "best": {"name": best, **good[best]} if best else None,
        "cublas": cublas,
        "dequantize": measure(lambda w: to_bf16(*w), packed, dense[0].t().float(),
                              lambda us: figures(us, nbytes + n * k * 2)),  # reads the packed, writes bf16
        "dequantize_cublas": measure(lambda w: x @ to_bf16(*w), packed, want, figures),
        "shipped_over_best": us_of(shipped) / good[best]["us"] if best else None,
        "best_over_cublas": good[best]["us"] / us_of(cublas) if best else None,
        "tiles": entries,
    }  # fmt: skip


def best_per_rows(timings: dict, shapes: list[str], limit: int | None = None) -> dict[int, tuple[W4A16Tile, float]]:
    """For each row count timed on all `shapes`: the candidate whose fitted forms have the least total
    µs over them (a candidate missing or wrong on any shape is out), and that total."""
    best = {}
    for rows in sorted(set.intersection(*(set(timings[shape]) for shape in shapes))):

        def total(tile: W4A16Tile) -> float:
            times = [timings[shape][rows].get(fitted(tile, rows, *SHAPES[shape])) for shape in shapes]
            return math.inf if None in times else sum(times)

        tile = min(candidates(rows)[:limit], key=total)
        if total(tile) < math.inf:
            best[rows] = (tile, total(tile))
    return best


def best_row_tiles(timings: dict, shapes: list[str]) -> str:
    """ROW_TILES as the sweep suggests it: for each of its bounds of output features, the row
    candidate with the least total µs at one row over the shapes that bound takes."""
    def total(tile: W4A16Row, among: list[str]) -> float:
        times = [timings[shape].get(1, {}).get(tile) for shape in among]
        return math.inf if None in times else sum(times)

    lines = []
    for bound, shipped in ROW_TILES:
        among = [shape for shape in shapes if row_tile(SHAPES[shape][0]) == shipped]
        if among:
            tile = min(ROW_CANDIDATES, key=lambda t: total(t, among))
            lines.append(f"    ({bound}, {tile!r}),  # {total(tile, among):.1f} us over {', '.join(among)} "
                         f"(shipped {total(shipped, among):.1f})")  # fmt: skip
    return "ROW_TILES = (\n" + "\n".join(lines) + "\n)"


def tiles_table(best: dict[int, tuple[W4A16Tile, float]]) -> str:
    """`TILES` as Python: (most rows, tile), neighbours with one tile merged, the last bound None."""
    entries: list[tuple[int | None, W4A16Tile]] = []
    for rows, (tile, _) in sorted(best.items()):
        if entries and entries[-1][1] == tile:
            entries.pop()
        entries.append((rows, tile))
    if entries:
        entries[-1] = (None, entries[-1][1])
    return "TILES = (\n" + "".join(f"    ({bound}, {tile!r}),\n" for bound, tile in entries) + ")"


def summary(results: dict, timings: dict, shapes: list[str], limit: int | None) -> str:
    best = best_per_rows(timings, shapes, limit)
    head = f"{'rows':>5} {'shipped':>10} {'suggested':>10} {'cuBLAS':>10} {'deq+cuBLAS':>11}"
    lines = [f"{head}  (total us over {', '.join(shapes)})"]
    for rows, (_, total) in best.items():
        cases = [results["cases"][shape][str(rows)] for shape in shapes]
        sums = [sum(c[key].get("us", math.nan) for c in cases) for key in ("shipped", "cublas", "dequantize_cublas")]
        lines.append(f"{rows:>5} {sums[0]:>10.1f} {total:>10.1f} {sums[1]:>10.1f} {sums[2]:>11.1f}")
    row = best_row_tiles(timings, shapes) if all(1 in timings[shape] for shape in shapes) else ""
    return "\n".join(lines) + "\n" + tiles_table(best) + "\n" + row


def case_line(shape: str, r: dict) -> str:
    def timing(entry: dict) -> str:
        if "us" not in entry:
            return entry["error"][:60]
        speed = f"{entry['weight_tb_s']:.2f} TB/s" if r["rows"] <= 64 else f"{entry['tflop_s']:.0f} TFLOP/s"
        named = f", err {entry['rel_err']:.1e}) {entry['name']}" if "name" in entry else ")"
        return f"{entry['us']:.1f} us ({speed}{named}"

    best = timing(r["best"]) if r["best"] else "none within the error"
    return (f"{shape} M={r['rows']}: shipped {timing(r['shipped'])}; best {best}; cuBLAS {timing(r['cublas'])}; "
            f"dequantize+cuBLAS {timing(r['dequantize_cublas'])}; shipped/best {r['shipped_over_best'] or 0:.2f}, "
            f"best/cuBLAS {r['best_over_cublas'] or 0:.2f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--shapes", default="8b,70b", help="names or model prefixes: 8b.qkv,70b")
    parser.add_argument("--rows", default=",".join(map(str, ROWS)))
    parser.add_argument("--quick", action="store_true", help="smoke run: 8b.o, rows 1 and 512, 3 candidates each")
    parser.add_argument("--compile-threads", type=int, default=COMPILE_THREADS)
    args = parser.parse_args()
    wanted = ["8b.o"] if args.quick else args.shapes.split(",")
    shapes = [name for name in SHAPES if any(name == w or name.startswith(w + ".") for w in wanted)]
    rows_list = [1, 512] if args.quick else [int(r) for r in args.rows.split(",")]
    limit = 3 if args.quick else None
    if not shapes:
        parser.error(f"no shape matches {args.shapes}: {', '.join(SHAPES)}")
    plans = [(rows, case_tiles(rows, *SHAPES[shape], limit)[1]) for shape in shapes for rows in rows_list]
    precompile(plans, args.compile_threads)
    results: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "err_limit": ERR_LIMIT,
                     "dequantize_from_rows": DEQUANTIZE_FROM_ROWS, "cases": {}}
    timings: dict = {}
    generator = torch.Generator(DEVICE).manual_seed(0)
    for shape in shapes:
        n, k = SHAPES[shape]
        copies = min(MAX_COPIES, max(2, math.ceil(L2_FLUSH / packed_bytes(n, k))))
        packed = [packed_weight(n, k, generator, DEVICE) for _ in range(copies)]
        dense = [dequantize(*weight).t().contiguous() for weight in packed]  # [N, K] as the bf16 model's
        for rows in rows_list:
            r = case(rows, n, k, packed, dense, limit, timings.setdefault(shape, {}).setdefault(rows, {}))
            results["cases"].setdefault(shape, {})[str(rows)] = r
            args.out.write_text(json.dumps(results, indent=1))
            print(case_line(shape, r), flush=True)
        del packed, dense
        torch.cuda.empty_cache()
    for model in dict.fromkeys(shape.split(".")[0] for shape in shapes):
        text = summary(results, timings, [shape for shape in shapes if shape.startswith(model + ".")], limit)
        results[f"suggested_{model}"] = text
        print(text, flush=True)
    args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
