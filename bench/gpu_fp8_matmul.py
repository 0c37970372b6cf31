"""fp8 weights (`--quantize fp8`) against bf16 ones on the 8B model's projections, decode to prefill.

For each projection and row count: the shipped bf16 product (`project`) and the shipped fp8 one
(`fp8_linear`: skinny kernel over fp8 weights up to 16 rows, per-row activation quantization and
cuBLASLt's fp8 product above), both replayed from CUDA graphs over weight copies (no L2 hits);
up to 16 rows also every skinny config over the fp8 weight, to choose the table's entries.
Reported: µs per call, the speedup, and the fp8 result's error against the bf16 product.

    python3 bench/gpu_fp8_matmul.py OUT_JSON [ROWS ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gpu_skinny_matmul import CONFIGS, COPIES, SHAPES, graph_us  # noqa: E402
from shard_server.kernels.fp8_matmul import fp8_linear, quantize_rows_reference  # noqa: E402
from shard_server.kernels.skinny_matmul import MAX_ROWS, SkinnyConfig, project, skinny_matmul  # noqa: E402

ROWS = (1, 4, 16, 64, 80, 128, 256, 1024, 4096)
# Half the bytes per weight element: deeper reduction steps and more stages keep as many bytes
# in flight per program as the bf16 configs do.
FP8_CONFIGS = CONFIGS + [SkinnyConfig(n, k, w, s) for n, k, w, s in [
    (16, 1024, 4, 3), (16, 1024, 4, 4), (32, 1024, 4, 3), (32, 1024, 4, 4), (32, 1024, 8, 3), (64, 512, 4, 4),
    (64, 512, 8, 4), (64, 1024, 8, 3), (16, 512, 4, 6), (32, 512, 4, 5), (32, 512, 8, 4), (128, 256, 8, 4)]]  # fmt: skip


def rel_l2(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


def main() -> None:
    out = Path(sys.argv[1])
    rows_wanted = tuple(int(r) for r in sys.argv[2:]) or ROWS
    device = torch.device("cuda")
    results = {}
    for name, (n, k) in SHAPES.items():
        weights = [torch.randn((n, k), device=device, dtype=torch.bfloat16) * 0.02 for _ in range(COPIES)]
        quantized = [quantize_rows_reference(w) for w in weights]
        for rows in rows_wanted:
            x = torch.randn((rows, k), device=device, dtype=torch.bfloat16)
            bf16_us = graph_us(lambda w: project(x, w), weights)
            fp8_us = graph_us(lambda wq: fp8_linear(x, *wq), quantized)
            entry = {"bf16_us": bf16_us, "fp8_us": fp8_us, "speedup": bf16_us / fp8_us,
                     "rel_l2_vs_bf16": rel_l2(fp8_linear(x, *quantized[0]), project(x, weights[0]))}  # fmt: skip
            if rows <= MAX_ROWS:
                configs = []
                for config in FP8_CONFIGS:
                    try:
                        us = graph_us(lambda wq: skinny_matmul(x, wq[0], config, wq[1]), quantized)
                    except Exception as exc:  # a config the compiler refuses
                        configs.append({"config": config.__dict__, "error": f"{type(exc).__name__}: {str(exc)[:160]}"})
                        continue
                    configs.append({"config": config.__dict__, "us": us})
                entry["best_skinny_fp8"] = min((c for c in configs if "us" in c), key=lambda c: c["us"])
                entry["skinny_fp8_configs"] = configs
            results[f"{name}_m{rows}"] = entry
            print(f"{name}_m{rows}: bf16 {bf16_us:.1f} us, fp8 {fp8_us:.1f} us ({bf16_us / fp8_us:.2f}x), "
                  f"err {entry['rel_l2_vs_bf16']:.3f}"
                  + (f", best skinny {entry['best_skinny_fp8']}" if "best_skinny_fp8" in entry else ""),
                  flush=True)  # fmt: skip
        del weights, quantized
        out.write_text(json.dumps(results, indent=1))  # after each shape: a cut-short run keeps its part


if __name__ == "__main__":
    main()
