"""The fp8 products of decode batches (`fp8_linear`) against cuBLASLt's, per 8B projection and row count.

With `--quantize fp8` a decode of 17-256 rows quantizes its rows and multiplies fp8 by fp8. cuBLASLt
(`w8a8_product`) streams the 8B model's weights at only 1-2.7 TB/s at those sizes
(bench/results/fp8_matmul_h200.json); the skinny kernel in 64-row tiles streams each weight slice
once. This sweeps its configs at each row count against cuBLASLt (both with the rows'
quantization), to choose ROWS_GEMM_MAX_ROWS and the configs in `shard_server/kernels/fp8_matmul.py`;
up to 16 rows also the shipped path (the fp8 weight widened to fp16, activations exact) and the
same kernel widening to bf16.

    python3 bench/gpu_fp8_rows_gemm.py OUT_JSON [--rows 80,128,256] [--shapes qkv,o]

Each case: µs per call replayed from CUDA graphs over weight copies (no L2 hits between calls),
and each result's error against cuBLASLt's.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gpu_skinny_matmul import COPIES, SHAPES, graph_us  # noqa: E402
from shard_server.kernels.fp8_matmul import fp8_rows_product, quantize_rows_reference, w8a8_product  # noqa: E402
from shard_server.kernels.skinny_matmul import MAX_ROWS, SkinnyConfig, config_for, skinny_matmul  # noqa: E402

ROWS = (1, 4, 16, 17, 32, 64, 80, 96, 128, 160, 192, 256)
CONFIGS = [SkinnyConfig(n, k, w, s) for n, k, w, s in [
    (32, 256, 4, 4), (64, 128, 4, 3), (64, 128, 4, 4), (128, 128, 4, 3), (128, 128, 8, 3), (64, 256, 4, 3),
    (32, 256, 4, 3), (128, 64, 8, 4), (64, 64, 4, 5), (256, 64, 8, 3), (128, 128, 8, 4)]] + [
    # Split over K (float32 partials, then summed): the weight streams from more programs at once.
    SkinnyConfig(n, k, w, s, split) for n, k, w, s, split in [
        (64, 256, 4, 3, 2), (64, 256, 4, 3, 4), (32, 256, 4, 4, 2), (32, 256, 4, 4, 4), (128, 256, 4, 3, 4),
        (128, 128, 8, 4, 2), (64, 128, 4, 4, 4)]]  # fmt: skip
# Past 64 rows a second 64-row tile is mostly empty (~30 % slower at 80 rows): one 128-row tile
# over two warpgroups instead.
TALL_CONFIGS = [SkinnyConfig(n, k, 8, s, split) for n, k, s, split in [
    (64, 128, 3, 1), (64, 256, 3, 1), (32, 256, 4, 1), (128, 128, 3, 1), (64, 256, 3, 2), (32, 256, 4, 4)]]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--rows", default=",".join(map(str, ROWS)), help="comma-separated row counts")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated projections")
    args = parser.parse_args()
    out_path, row_counts = args.out, [int(r) for r in args.rows.split(",")]
    device = torch.device("cuda")
    results = {}
    for name in args.shapes.split(","):
        n, k = SHAPES[name]
        quantized = [quantize_rows_reference(torch.randn((n, k), device=device) * 0.02) for _ in range(COPIES)]
        nbytes = n * k  # one byte per fp8 weight
        for rows in row_counts:
            x = torch.randn((rows, k), device=device, dtype=torch.bfloat16)
            cublas_us = graph_us(lambda wq: w8a8_product(x, *wq), quantized)
            want = w8a8_product(x, *quantized[0]).float()
            skinny = {}
            if rows <= MAX_ROWS:  # the shipped path at these rows (fp16 widening), and bf16 widening
                config = config_for(rows, n, k, weights_fp8=True)
                for fp16_dot in (True, False):
                    us = graph_us(lambda wq: skinny_matmul(x, wq[0], config, wq[1], fp16_dot=fp16_dot), quantized)
                    skinny["fp16_dot" if fp16_dot else "bf16_dot"] = {"us": us, "tb_s": nbytes / us / 1e6}
            entries = []
            for config, tile in [(c, 64) for c in CONFIGS] + ([(c, 128) for c in TALL_CONFIGS] if rows > 64 else []):
                shown_config = {**asdict(config), "tile": tile}
                try:
                    got = fp8_rows_product(x, *quantized[0], config, tile).float()
                    us = graph_us(lambda wq: fp8_rows_product(x, wq[0], wq[1], config, tile), quantized)
                except Exception as exc:  # a config the compiler or the shared memory refuses
                    entries.append({"config": shown_config, "error": f"{type(exc).__name__}: {str(exc)[:160]}"})
                    continue
                error = float((got - want).norm() / want.norm())
                entries.append({"config": shown_config, "us": us, "tb_s": nbytes / us / 1e6, "rel_l2_vs_cublas": error})
            valid = [e for e in entries if "us" in e and e["rel_l2_vs_cublas"] < 1e-2]
            best = min(valid, key=lambda e: e["us"]) if valid else None
            results[f"{name}_m{rows}"] = {"cublaslt_us": cublas_us, "cublaslt_tb_s": nbytes / cublas_us / 1e6,
                                          "skinny": skinny, "best": best, "all": entries}  # fmt: skip
            shown = f"{best['us']:.1f} us ({best['tb_s']:.2f} TB/s) {best['config']}" if best else "none valid"
            first = next((f"{e['us']:.1f}" for e in entries if "us" in e), "-")
            widened = "".join(f", skinny {kind} {e['us']:.1f} us" for kind, e in skinny.items())
            print(f"{name}_m{rows}: cuBLASLt {cublas_us:.1f} us ({nbytes / cublas_us / 1e6:.2f} TB/s){widened}, "
                  f"rows gemm first {first}, best {shown}", flush=True)  # fmt: skip
        del quantized
        out_path.write_text(json.dumps(results, indent=1))  # after each shape: a cut-short run keeps its part


if __name__ == "__main__":
    main()
