"""cuBLASLt's fp8 product with and without fast accumulation, at prefill and large-decode rows.

`fp8_linear` multiplies quantized rows by the fp8 weight through `torch._scaled_mm` past the
row-tile kernel's range (prefill steps, decodes past 192 rows). By default cuBLASLt promotes its
tensor-core partial sums to float32 every so often (slow accumulation); `use_fast_accum` keeps
them in the tensor cores' narrower accumulator, which row-wise scaled products are reported to
need for full speed (pytorch/pytorch#147971). This times both per 8B projection and row count
(CUDA graphs over weight copies, no L2 hits) and gives each one's error against the float32
product of the same quantized operands, so `FP8_FAST_ACCUM` can be chosen on numbers.

    python3 bench/gpu_fp8_fast_accum.py OUT_JSON [ROWS ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gpu_skinny_matmul import COPIES, SHAPES, graph_us  # noqa: E402
from shard_server.kernels.fp8_matmul import quantize_rows_reference  # noqa: E402

ROWS = (256, 1024, 2048, 4096, 8192)


def product(xq, x_scale, weight, weight_scale, fast: bool) -> torch.Tensor:
    return torch._scaled_mm(xq, weight.t(), scale_a=x_scale, scale_b=weight_scale.view(1, -1),
                            out_dtype=torch.bfloat16, use_fast_accum=fast)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("rows", type=int, nargs="*", default=list(ROWS))
    args = parser.parse_args()
    device, results = torch.device("cuda"), {}
    for name, (n, k) in SHAPES.items():
        weights = [quantize_rows_reference(torch.randn((n, k), device=device) * 0.02) for _ in range(COPIES)]
        for rows in args.rows:
            xq, x_scale = quantize_rows_reference(torch.randn((rows, k), device=device, dtype=torch.bfloat16))
            exact = (xq.float() @ weights[0][0].float().t()) * x_scale * weights[0][1].view(1, -1)
            entry = {}
            for mode, fast in (("slow", False), ("fast", True)):
                try:
                    us = graph_us(lambda w: product(xq, x_scale, *w, fast), weights)
                    got = product(xq, x_scale, *weights[0], fast).float()
                except RuntimeError as exc:  # a mode this torch or cuBLASLt refuses: say so
                    entry[mode] = {"error": str(exc)[:200]}
                    continue
                error = float((got - exact).norm() / exact.norm())
                entry[mode] = {"us": us, "tflops": 2 * rows * n * k / us / 1e6, "rel_l2_vs_float32": error}
            results[f"{name}_m{rows}"] = entry
            shown = ", ".join(
                f"{mode} {e['us']:.1f} us ({e['tflops']:.0f} TFLOP/s, err {e['rel_l2_vs_float32']:.1e})"
                if "us" in e else f"{mode} {e['error']}" for mode, e in entry.items()
            )  # fmt: skip
            print(f"{name}_m{rows}: {shown}", flush=True)
        del weights
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
