"""The fused MoE kernel's row tiles, timed on an H200 at the shapes users serve (issue 24).

For each MoE shape and token count, every candidate `MoeTile` runs `fused_experts` (both grouped
GEMMs, the alignment and the final sum) under uniform random routing, replayed from a CUDA graph
as a step runs it, over several copies of the experts so no call finds them in L2. Reported per
case: µs per call for every tile, the shipped choice (`tile_for`) and the fastest, and what the
call moved or computed: the bytes of the experts it hit over the time (decode is memory-bound)
and its TFLOP/s (prefill is compute-bound). The shipped tile's error against `reference_experts`
is checked once per case. `--fp8`: the experts in e4m3 with a scale a row (`--quantize fp8`),
half the bytes a decode reads; `--block-fp8`: e4m3 with a scale per 128x128 block, as
Qwen3-30B-A3B-FP8 stores them (the kernel dequantizes each tile inside the K loop). The routing
kernel (`moe_routing.py`) is timed beside, as a decode layer runs it. Where a batch has no more
(token, expert) pairs than experts, the pair-by-pair path (`moe_pairs.py`) is timed beside the
tiles, over its own candidate tiles, with whether the shipped dispatch takes it.

    python3 bench/gpu_fused_moe.py OUT_JSON [--shapes qwen3-30b-a3b,mixtral,olmoe] [--tokens 1,4,16]
        [--fp8 | --block-fp8]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gpu_skinny_matmul import graph_us  # noqa: E402
from shard_server.kernels.fp8_matmul import FP8, FP8_MAX, quantize_rows_reference  # noqa: E402
from shard_server.kernels.fused_moe import ExpertScales, MoeTile, fused_experts, tile_for  # noqa: E402
from shard_server.kernels.moe_pairs import GATE_UP_TILE, DOWN_TILE, PairsTile, pair_experts, pairs_apply  # noqa: E402
from shard_server.models.moe import reference_experts, route  # noqa: E402

# (experts, hidden, intermediate, top_k) of one layer, as the Hub configs give them.
SHAPES = {
    "qwen3-30b-a3b": (128, 2048, 768, 8),
    "olmoe": (64, 2048, 1024, 8),
    "mixtral": (8, 4096, 14336, 2),
}
TOKENS = (1, 4, 16, 64, 256, 1024, 4096)
CANDIDATES = [MoeTile(m, n, k, g, w, s) for m, n, k, g, w, s in [
    (16, 32, 128, 1, 4, 4), (16, 64, 128, 1, 4, 4), (16, 64, 256, 1, 4, 3), (16, 128, 128, 1, 4, 3),
    (16, 64, 128, 1, 4, 5), (32, 64, 128, 4, 4, 3), (32, 128, 64, 8, 4, 4), (64, 64, 64, 8, 4, 4),
    (64, 128, 64, 8, 4, 4), (64, 128, 64, 8, 8, 3), (128, 128, 64, 8, 8, 3), (128, 256, 64, 8, 8, 3),
    (64, 256, 64, 8, 8, 3),
    # prefill (64+ rows an expert): one warpgroup, deeper K steps, two stages of wider tiles
    (128, 128, 64, 8, 4, 4), (128, 128, 64, 8, 8, 4), (128, 128, 128, 8, 8, 2), (128, 64, 128, 8, 4, 3),
    (64, 128, 128, 8, 4, 3), (128, 256, 64, 8, 8, 2), (256, 128, 64, 8, 8, 2), (128, 128, 64, 16, 8, 3),
    (128, 128, 64, 1, 8, 3), (64, 128, 64, 8, 4, 3)]]  # fmt: skip
# The pair-by-pair decode path's tiles (gate_up's, down's), where a batch has fewer pairs than experts.
PAIRS_CANDIDATES = [(PairsTile(n, k, w), PairsTile(dn, dk, dw)) for (n, k, w), (dn, dk, dw) in [
    ((16, 256, 4), (16, 256, 4)), ((8, 256, 4), (8, 256, 4)), ((32, 128, 4), (32, 128, 4)),
    ((16, 512, 4), (16, 256, 4)), ((16, 256, 8), (8, 512, 4)), ((4, 512, 4), (4, 512, 4))]]  # fmt: skip
COPIES = 4


def hit_bytes(topk_ids: torch.Tensor, hidden: int, inter: int, element: int) -> int:
    """The expert weights a call must read: each expert hit at least once, gate_up and down."""
    return int(topk_ids.unique().numel()) * 3 * hidden * inter * element


def fp8_copy(w13: torch.Tensor, w2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, ExpertScales]:
    """The experts as --quantize fp8 stores them: e4m3 with a float32 scale a row."""
    (q13, s13), (q2, s2) = (quantize_rows_reference(w.reshape(-1, w.shape[-1])) for w in (w13, w2))
    experts = w13.shape[0]
    return q13.view(w13.shape), q2.view(w2.shape), ExpertScales(s13.view(experts, -1), s2.view(experts, -1))


def block_fp8_copy(w13: torch.Tensor, w2: torch.Tensor, block=(128, 128)) -> tuple[torch.Tensor, torch.Tensor,
                                                                                 ExpertScales]:  # fmt: skip
    """The experts as a block-wise fp8 checkpoint stores them: gate, up and down each in e4m3 with
    a float32 scale per [bn, bk] block (the shapes here are multiples of 128)."""
    bn, bk = block

    def quantize(w):  # [E, out, in] -> e4m3, [E, out / bn, in / bk]
        experts, out, inputs = w.shape
        blocks = w.float().view(experts, out // bn, bn, inputs // bk, bk)
        scales = blocks.abs().amax(dim=(2, 4)).clamp(min=1e-12) / FP8_MAX
        q = (blocks / scales[:, :, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8).view(w.shape)
        return q, scales

    (q_gate, s_gate), (q_up, s_up) = (quantize(half) for half in w13.chunk(2, dim=1))
    q2, s2 = quantize(w2)
    scales = ExpertScales(torch.cat([s_gate, s_up], 1), s2, block)
    return torch.cat([q_gate, q_up], 1), q2, scales


def case(shape: tuple[int, int, int, int], tokens: int, generator: torch.Generator, experts_kind: str) -> dict:
    experts, hidden, inter, top_k = shape
    dtype, device = torch.bfloat16, "cuda"
    copies = []
    for _ in range(COPIES):
        w13 = torch.randn(experts, 2 * inter, hidden, dtype=dtype, device=device, generator=generator) * 0.02
        w2 = torch.randn(experts, hidden, inter, dtype=dtype, device=device, generator=generator) * 0.02
        copy = {"fp8": fp8_copy, "block-fp8": block_fp8_copy}.get(experts_kind, lambda *w: (*w, None))
        copies.append(copy(w13, w2))
    x = torch.randn(tokens, hidden, dtype=dtype, device=device, generator=generator)
    logits = torch.randn(tokens, experts, device=device, generator=generator).to(dtype)
    topk_weights, topk_ids = route(logits, top_k, renormalize=True)
    route_us = graph_us(lambda _: route(logits, top_k, renormalize=True), [None])
    shipped = tile_for(tokens * top_k, experts)
    w13, w2, scales = copies[0]
    got = fused_experts(x, w13, w2, topk_weights, topk_ids, shipped, scales=scales).float()
    want = reference_experts(x, w13, w2, topk_weights, topk_ids, scales).float()
    rel_err = float((got - want).norm() / want.norm().clamp_min(1e-12))
    tiles = {}
    for tile in dict.fromkeys([shipped, *CANDIDATES]):
        try:
            us = graph_us(lambda w, t=tile: fused_experts(x, w[0], w[1], topk_weights, topk_ids, t, scales=w[2]),
                          copies)  # fmt: skip
        except Exception as exc:  # a tile the compiler refuses (shared memory) is reported, not fatal
            tiles[str(tile)] = {"error": f"{type(exc).__name__}: {str(exc)[:120]}"}
            continue
        tiles[str(tile)] = {"us": us}
    pairs = pairs_case(x, copies, topk_weights, topk_ids, want) if tokens * top_k <= experts else None
    timed = {k: v for k, v in tiles.items() if "us" in v}
    best = min(timed, key=lambda k: timed[k]["us"])
    moved = hit_bytes(topk_ids, hidden, inter, 2 if experts_kind == "bf16" else 1)
    flops = 2 * tokens * top_k * 3 * hidden * inter

    def figures(us: float) -> dict:
        return {"us": us, "tb_s": moved / us / 1e6, "tflop_s": flops / us / 1e6}

    del copies
    torch.cuda.empty_cache()
    return {"tokens": tokens, "rel_err_shipped": rel_err, "hit_bytes": moved, "route_us": route_us,
            "shipped": {"tile": str(shipped), **figures(tiles[str(shipped)]["us"])},
            "best": {"tile": best, **figures(timed[best]["us"])},
            "shipped_over_best": tiles[str(shipped)]["us"] / timed[best]["us"], "tiles": tiles,
            "pairs": pairs}  # fmt: skip


def pairs_case(x, copies, topk_weights, topk_ids, want) -> dict:
    """The pair-by-pair path at this batch: µs per call for each tile pair, whether the shipped
    dispatch takes it, and the shipped tiles' error."""
    w13, w2, scales = copies[0]
    got = pair_experts(x, w13, w2, topk_weights, topk_ids, scales).float()
    timed = {}
    for gate_up, down in dict.fromkeys([(GATE_UP_TILE, DOWN_TILE), *PAIRS_CANDIDATES]):
        key = f"{gate_up} / {down}"
        try:
            timed[key] = graph_us(lambda w, g=gate_up, d=down: pair_experts(x, w[0], w[1], topk_weights, topk_ids,
                                                                            w[2], g, d), copies)  # fmt: skip
        except Exception as exc:
            timed[key] = f"{type(exc).__name__}: {str(exc)[:120]}"
    return {"shipped_takes_it": pairs_apply(x, w13, w2, topk_ids, scales),
            "rel_err": float((got - want).norm() / want.norm().clamp_min(1e-12)), "us": timed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    kinds = parser.add_mutually_exclusive_group()
    kinds.add_argument("--fp8", action="store_true", help="e4m3 experts with a scale a row (--quantize fp8)")
    kinds.add_argument("--block-fp8", action="store_true", help="e4m3 experts with a scale per 128x128 block")
    args = parser.parse_args()
    experts_kind = "fp8" if args.fp8 else "block-fp8" if args.block_fp8 else "bf16"
    generator = torch.Generator("cuda").manual_seed(0)
    results: dict = {"device": torch.cuda.get_device_name(), "copies": COPIES, "experts": experts_kind}
    for name in args.shapes.split(","):
        for tokens in map(int, args.tokens.split(",")):
            r = case(SHAPES[name], tokens, generator, experts_kind)
            results.setdefault(name, []).append(r)
            print(f"{name} T={tokens}: shipped {r['shipped']['us']:.1f} us ({r['shipped']['tb_s']:.2f} TB/s, "
                  f"{r['shipped']['tflop_s']:.0f} TFLOP/s), best {r['best']['us']:.1f} us {r['best']['tile']}, "
                  f"err {r['rel_err_shipped']:.1e}, routing {r['route_us']:.1f} us", flush=True)  # fmt: skip
            if r["pairs"]:
                print("   pairs:", r["pairs"], flush=True)
            args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
