"""The skinny-matmul kernel against cuBLAS on a model's projections at decode batch sizes.

Every candidate config runs on several copies of the weight in turn, so no run finds the
weight in L2 (o_proj's 33.5 MB would fit), replayed from a CUDA graph as decode steps are. Reported: µs per call, the weight bytes over that
time, and the error against cuBLAS (both round one float32 sum to bf16).

    python3 bench/gpu_skinny_matmul.py OUT_JSON [--fp8-weights] [--shape NAME] [--rows 1,4,16]

`--rows`: the row counts (default 1, 4, 16). Past the kernel's 16 (where the shard takes cuBLAS)
the configs run with a row tile of 32 or 64 (`launch_rows_product`): whether the kernel should
take the Poisson loads' decode batches of 17-64 too.

`--shape`: the projections of one of bench/gpu_model.py's SHAPES (default 8b, Llama-3-8B); each
result also names the config `config_for` ships for it, so a shape it serves badly shows.

`--fp8-weights`: the weights in e4m3 with a scale per output feature (`--quantize fp8`), each
config with the rows and weight meeting in fp16 and in bf16, against the shipped choice
(`config_for(..., weights_fp8=True)`); cuBLAS's column is then the bf16 weight's, for scale.
An fp8 weight is half the bytes: the configs sized for bf16 stream half as much a step.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shard_server.kernels.skinny_matmul import MAX_ROWS, SkinnyConfig, launch_rows_product, skinny_matmul  # noqa: E402

from bench.gpu_model import SHAPES as MODEL_SHAPES, head_dim  # noqa: E402


def projection_shapes(shape: str) -> dict[str, tuple[int, int]]:
    """(out features, depth) of a dense model shape's four projections, as the shard fuses them."""
    cfg = MODEL_SHAPES[shape]
    h, i, d = cfg["hidden_size"], cfg["intermediate_size"], head_dim(cfg)
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    return {"qkv": (q + 2 * kv, h), "o": (h, q), "gate_up": (2 * i, h), "down": (h, i)}


SHAPES = projection_shapes("8b")  # the other kernel benches measure the 8B's projections

ROWS = (1, 4, 16)
CONFIGS = [SkinnyConfig(n, k, w, s) for n, k, w, s in [
    (16, 256, 4, 4), (16, 512, 4, 4), (16, 256, 4, 6), (32, 128, 4, 4), (32, 256, 4, 4), (32, 256, 4, 3),
    (32, 128, 4, 6), (32, 512, 4, 3), (32, 512, 8, 3), (64, 128, 4, 4), (64, 256, 4, 4), (64, 256, 8, 3)]] + [
    # Split over K: more programs for the projections whose outputs alone do not fill the GPU (o, down).
    SkinnyConfig(n, k, w, s, split) for n, k, w, s, split in [
        (32, 256, 4, 4, 2), (64, 256, 4, 4, 2), (64, 256, 4, 4, 4), (128, 256, 4, 3, 4), (64, 512, 4, 3, 4)]]  # fmt: skip
# fp8 weights: the same bytes a step as the bf16 configs (block_k doubled), and more programs.
FP8_CONFIGS = [SkinnyConfig(n, k, w, s, split) for n, k, w, s, split in [
    (16, 512, 4, 4, 1), (32, 512, 4, 4, 1), (32, 512, 4, 3, 1), (64, 512, 4, 3, 1), (64, 512, 4, 4, 1),
    (16, 1024, 4, 3, 1), (32, 1024, 4, 3, 1), (64, 512, 8, 3, 1), (128, 256, 8, 3, 1), (32, 512, 4, 4, 2),
    (64, 512, 4, 3, 2), (32, 512, 4, 4, 4), (16, 512, 4, 4, 2)]]  # fmt: skip
FP8_ROWS = (1, 8)  # batch 1, and the Poisson 8 req/s workload's decode batch
COPIES = 8


def graph_us(call, weights, repeats: int = 10) -> float:
    """µs per call of `call(weight)` over the weight copies in turn, replayed from a CUDA graph
    as a decode step runs it (no launch overhead; a Python launch would dominate otherwise)."""
    current = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    side.wait_stream(current)
    with torch.cuda.stream(side):
        for w in weights:  # compiles outside the capture
            call(w)
    current.wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for w in weights:
            call(w)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        start.record()
        for _ in range(repeats):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / (repeats * len(weights)))
    return sorted(times)[len(times) // 2]


def rows_matmul(x: torch.Tensor, weight: torch.Tensor, config: SkinnyConfig) -> torch.Tensor:
    """The skinny kernel over any rows: its 16-row tile up to 16, else a tile of 32 or 64 rows."""
    if x.shape[0] <= MAX_ROWS:
        return skinny_matmul(x, weight, config)
    out = torch.empty((x.shape[0], weight.shape[0]), dtype=x.dtype, device=x.device)
    launch_rows_product(x, None, weight, None, out, config, 32 if x.shape[0] <= 32 else 64)
    return out


def main() -> None:
    out = Path(sys.argv[1])
    shape = sys.argv[sys.argv.index("--shape") + 1] if "--shape" in sys.argv else "8b"
    rows_list = [int(r) for r in sys.argv[sys.argv.index("--rows") + 1].split(",")] if "--rows" in sys.argv else ROWS
    if "--fp8-weights" in sys.argv[2:]:
        return fp8_main(out, projection_shapes(shape))
    from shard_server.kernels.skinny_matmul import config_for

    device = torch.device("cuda")
    results = {}
    for name, (n, k) in projection_shapes(shape).items():
        weights = [torch.randn((n, k), device=device, dtype=torch.bfloat16) * 0.02 for _ in range(COPIES)]
        nbytes = n * k * 2
        for rows in rows_list:
            x = torch.randn((rows, k), device=device, dtype=torch.bfloat16)
            cublas = graph_us(lambda w: F.linear(x, w), weights)
            want = F.linear(x, weights[0]).float()
            entries = []
            for config in CONFIGS:
                try:
                    got = rows_matmul(x, weights[0], config).float()
                    us = graph_us(lambda w: rows_matmul(x, w, config), weights)
                except Exception as exc:  # a config the compiler refuses
                    entries.append({"config": config.__dict__, "error": f"{type(exc).__name__}: {str(exc)[:160]}"})
                    continue
                error = float((got - want).abs().max() / want.abs().max())
                entries.append({"config": config.__dict__, "us": us, "tb_s": nbytes / us / 1e6, "rel_err": error})
            best = min((e for e in entries if "us" in e and e["rel_err"] < 2e-2), key=lambda e: e["us"])
            key = f"{name}_m{rows}"
            shipped = config_for(rows, n, k) if rows <= MAX_ROWS else None  # None: cuBLAS
            results[key] = {"shape": [n, k], "cublas_us": cublas, "cublas_tb_s": nbytes / cublas / 1e6, "best": best,
                            "shipped": shipped.__dict__ if shipped else "cublas", "all": entries}  # fmt: skip
            print(f"{key} {n}x{k}: cublas {cublas:.1f} us ({nbytes / cublas / 1e6:.2f} TB/s), best {best['us']:.1f} us "
                  f"({best['tb_s']:.2f} TB/s) {best['config']}, shipped {results[key]['shipped']}", flush=True)  # fmt: skip
        del weights
    out.write_text(json.dumps(results, indent=1))


def fp8_main(out: Path, shapes: dict[str, tuple[int, int]]) -> None:
    from shard_server.kernels.fp8_matmul import quantize_rows_reference
    from shard_server.kernels.skinny_matmul import config_for

    device = torch.device("cuda")
    results = {}
    for name, (n, k) in shapes.items():
        dense = [torch.randn((n, k), device=device, dtype=torch.bfloat16) * 0.02 for _ in range(COPIES)]
        cublas_weights = dense
        quantized = [quantize_rows_reference(w) for w in dense]  # (e4m3 [n, k], float32 scale [n, 1])
        scales = {id(q): s.view(-1) for q, s in quantized}
        weights = [q for q, _ in quantized]
        nbytes = n * k  # one byte a weight
        for rows in FP8_ROWS:
            x = torch.randn((rows, k), device=device, dtype=torch.bfloat16)
            cublas = graph_us(lambda w: F.linear(x, w), cublas_weights)
            want = F.linear(x, (weights[0].float() * scales[id(weights[0])][:, None]).to(torch.bfloat16)).float()
            shipped = (config_for(rows, n, k, weights_fp8=True), True)  # fp8_linear's fp16 dots
            entries = []
            for config, fp16 in [shipped, *((c, f) for c in [*CONFIGS, *FP8_CONFIGS] for f in (True, False))]:
                call = lambda w: skinny_matmul(x, w, config, scales[id(w)], fp16_dot=fp16)  # noqa: E731
                try:
                    got = call(weights[0]).float()
                    us = graph_us(call, weights)
                except Exception as exc:  # a config the compiler refuses
                    entries.append({"config": config.__dict__, "fp16_dot": fp16, "error": f"{type(exc).__name__}: {str(exc)[:160]}"})
                    continue
                error = float((got - want).abs().max() / want.abs().max())
                entries.append({"config": config.__dict__, "fp16_dot": fp16, "us": us, "tb_s": nbytes / us / 1e6, "rel_err": error})
            best = min((e for e in entries if "us" in e and e["rel_err"] < 2e-2), key=lambda e: e["us"])
            key = f"{name}_m{rows}"
            results[key] = {"bf16_cublas_us": cublas, "shipped": entries[0], "best": best, "all": entries}
            print(f"{key}: shipped {entries[0].get('us', 0):.1f} us, best {best['us']:.1f} us ({best['tb_s']:.2f} TB/s) "
                  f"{best['config']} fp16_dot={best['fp16_dot']}", flush=True)  # fmt: skip
        del dense, cublas_weights, quantized, weights
    out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
