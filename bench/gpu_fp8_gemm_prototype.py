"""An fp8 x fp8 Triton product for 17-256 rows, to be measured against cuBLASLt's (`w8a8_product`).

Why: with `--quantize fp8` the decodes of batches 64-256 spend their matmul time in cuBLASLt's
fp8 product, which streams the 8B model's weights at 1-2.6 TB/s at those sizes
(bench/results/fp8_matmul_h200.json); a batch-77 decode's matmuls take 3.6 ms where the 7.5 GB
of fp8 weights need 1.8 ms. This kernel gives each program a slice of output features and every
row (one row tile of up to 256, so the weight streams exactly once), multiplies fp8 by fp8 on the
tensor cores with float32 accumulation, and applies both scales in the epilogue. Its loop is the
skinny kernel's; if it wins on the GPU, that kernel takes an activation-scale epilogue and a
row tile up to 256 and serves `fp8_linear` for 17-256 rows, rather than a second kernel.

    python3 bench/gpu_fp8_gemm_prototype.py OUT_JSON

Each case: µs per call replayed from CUDA graphs over weight copies (no L2 hits), for cuBLASLt's
product and every prototype config, with the prototype's error against cuBLASLt's result.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gpu_skinny_matmul import COPIES, SHAPES, graph_us  # noqa: E402
from shard_server.kernels.fp8_matmul import quantize_rows, quantize_rows_reference, w8a8_product  # noqa: E402

ROWS = (17, 32, 64, 80, 128, 192, 256)


@dataclass(frozen=True)
class GemmConfig:
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


CONFIGS = [GemmConfig(n, k, w, s) for n, k, w, s in [
    (64, 128, 4, 3), (64, 128, 4, 4), (128, 128, 4, 3), (128, 128, 8, 3), (64, 256, 4, 3), (32, 256, 4, 4),
    (128, 64, 8, 4), (64, 64, 4, 5)]]  # fmt: skip


@triton.jit
def fp8_rows_gemm_kernel(x_ptr, x_scale_ptr, w_ptr, w_scale_ptr, out_ptr, M, N, K, x_stride, w_stride, out_stride,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < M
    col_ok = cols < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        x = tl.load(x_ptr + rows[:, None] * x_stride + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptr + cols[:, None] * w_stride + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        acc += tl.dot(x, tl.trans(w))
    x_scale = tl.load(x_scale_ptr + rows, mask=row_ok, other=0.0)
    w_scale = tl.load(w_scale_ptr + cols, mask=col_ok, other=0.0)
    acc = acc * x_scale[:, None] * w_scale[None, :]
    out = out_ptr + rows[:, None] * out_stride + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def fp8_rows_gemm(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, config: GemmConfig) -> torch.Tensor:
    """x [M, K] (bf16, M <= 256) @ (weight [N, K] fp8 * weight_scale [N, 1])^T -> [M, N] bf16."""
    rows, k = x.shape
    n = weight.shape[0]
    xq, x_scale = quantize_rows(x)
    out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    fp8_rows_gemm_kernel[(triton.cdiv(n, config.block_n),)](
        xq, x_scale, weight, weight_scale, out, rows, n, k, xq.stride(0), weight.stride(0), out.stride(0),
        BLOCK_M=max(64, triton.next_power_of_2(rows)), BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
    return out


def main() -> None:
    out_path = Path(sys.argv[1])
    device = torch.device("cuda")
    results = {}
    for name, (n, k) in SHAPES.items():
        quantized = [quantize_rows_reference(torch.randn((n, k), device=device) * 0.02) for _ in range(COPIES)]
        nbytes = n * k  # one byte per fp8 weight
        for rows in ROWS:
            x = torch.randn((rows, k), device=device, dtype=torch.bfloat16)
            cublas_us = graph_us(lambda wq: w8a8_product(x, *wq), quantized)
            want = w8a8_product(x, *quantized[0]).float()
            entries = []
            for config in CONFIGS:
                try:
                    got = fp8_rows_gemm(x, *quantized[0], config).float()
                    us = graph_us(lambda wq: fp8_rows_gemm(x, wq[0], wq[1], config), quantized)
                except Exception as exc:  # a config the compiler or the shared memory refuses
                    entries.append({"config": asdict(config), "error": f"{type(exc).__name__}: {str(exc)[:160]}"})
                    continue
                error = float((got - want).norm() / want.norm())
                entries.append({"config": asdict(config), "us": us, "tb_s": nbytes / us / 1e6, "rel_l2_vs_cublas": error})
            valid = [e for e in entries if "us" in e and e["rel_l2_vs_cublas"] < 1e-2]
            best = min(valid, key=lambda e: e["us"]) if valid else None
            results[f"{name}_m{rows}"] = {"cublaslt_us": cublas_us, "cublaslt_tb_s": nbytes / cublas_us / 1e6,
                                          "best": best, "all": entries}  # fmt: skip
            shown = f"{best['us']:.1f} us ({best['tb_s']:.2f} TB/s) {best['config']}" if best else "none valid"
            print(f"{name}_m{rows}: cuBLASLt {cublas_us:.1f} us ({nbytes / cublas_us / 1e6:.2f} TB/s), prototype {shown}",
                  flush=True)  # fmt: skip
        del quantized
        out_path.write_text(json.dumps(results, indent=1))  # after each shape: a cut-short run keeps its part


if __name__ == "__main__":
    main()
