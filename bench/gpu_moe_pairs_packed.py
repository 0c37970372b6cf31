"""The packed MoE pairs path's tiles against the grouped W4A16 kernel, at decode token counts.

Served at batch 1 with its first tiles, the pair-by-pair path (`kernels/moe_pairs_packed.py`)
was slower than the grouped kernel (`kernels/fused_moe_packed.py`): 165 against 203 tok/s on a
random GPTQ Qwen3-30B-A3B (H100); this sweep picked its tiles and the token counts it takes
(bench/results/moe_pairs_packed_tiles_h100.json). It times one MoE layer's experts both ways, the pairs path
over candidate (gate_up, down) tiles, on random 4-bit experts of the Qwen3-30B-A3B shape (128
experts, hidden 2048, 768 intermediate rows, groups of 128, top 8, bf16), replayed from a CUDA
graph over several copies of the experts so no call finds them in L2. Reported per token count:
µs a call for the grouped kernel and each pairs tile, and the hit experts' bytes over the time.
The fastest pairs tile's output is checked against the reference once.

    python3 bench/gpu_moe_pairs_packed.py OUT_JSON [--tokens 1,2,4]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gpu_skinny_matmul import graph_us  # noqa: E402
from shard_server.kernels import moe_pairs_packed  # noqa: E402
from shard_server.kernels.fused_moe_packed import fused_packed_experts  # noqa: E402
from shard_server.kernels.w4a16_row import W4A16Row  # noqa: E402
from shard_server.layers.packed_experts import PackedExperts  # noqa: E402
from shard_server.models.moe import reference_experts, route  # noqa: E402

EXPERTS, HIDDEN, INTER, TOP_K, GROUP = 128, 2048, 768, 8, 128
COPIES = 4


def _fields(tile: W4A16Row) -> tuple[int, int, int, int]:
    return tile.block_n, tile.words, tile.num_warps, tile.num_stages


# (block_n, words, warps, stages) of gate_up's tile, then down's; the shipped pair first.
SHIPPED = (_fields(moe_pairs_packed.GATE_UP_TILE), _fields(moe_pairs_packed.DOWN_TILE))
OTHERS = [((16, 16, 4, 2), (8, 16, 4, 2)), ((32, 16, 4, 2), (32, 16, 4, 2)), ((64, 16, 4, 2), (64, 16, 4, 2)),
          ((64, 8, 4, 3), (64, 8, 4, 3)), ((128, 8, 4, 3), (128, 8, 4, 3)), ((128, 16, 8, 2), (128, 16, 8, 2)),
          ((32, 32, 4, 2), (32, 16, 2, 2)), ((64, 16, 2, 3), (32, 16, 2, 3))]  # fmt: skip
CANDIDATES = [SHIPPED] + [c for c in OTHERS if c != SHIPPED]


def random_experts(depth: int, width: int, generator: torch.Generator) -> PackedExperts:
    """Random 4-bit words, zero points near 8 and fp16 scales that keep outputs unit-sized."""
    groups = depth // GROUP
    words = torch.randint(-(2**31), 2**31 - 1, (EXPERTS, depth // 8, width), generator=generator, device="cuda",
                          dtype=torch.int32)  # fmt: skip
    zeros = torch.randint(6, 10, (EXPERTS, groups, width), generator=generator, device="cuda").to(torch.int16)
    scales = (torch.rand(EXPERTS, groups, width, generator=generator, device="cuda") * 0.5 / depth**0.5).half()
    g_idx = (torch.arange(depth, device="cuda") // GROUP).int().expand(EXPERTS, depth).contiguous()
    return PackedExperts(4, words, zeros, scales, g_idx, GROUP)


def case(tokens: int, copies: list, generator: torch.Generator) -> dict:
    x = torch.randn(tokens, HIDDEN, generator=generator, device="cuda").bfloat16()
    weights, ids = route(torch.randn(tokens, EXPERTS, generator=generator, device="cuda"), TOP_K, True)
    hit = ids.unique().numel()
    bytes_hit = hit * (HIDDEN * 2 * INTER + INTER * HIDDEN) // 2  # 4-bit words (scales left out)
    grouped = graph_us(lambda w: fused_packed_experts(x, w[0], w[1], weights, ids), copies)
    pairs = {}
    for gate_up, down in CANDIDATES:
        moe_pairs_packed.GATE_UP_TILE = W4A16Row(*gate_up, near_top=True)
        moe_pairs_packed.DOWN_TILE = W4A16Row(*down, near_top=True)
        pairs[f"gate_up {gate_up} down {down}"] = graph_us(
            lambda w: moe_pairs_packed.packed_pair_experts(x, w[0], w[1], weights, ids), copies)
    best = min(pairs, key=pairs.get)
    gate_up, down = CANDIDATES[list(pairs).index(best)]
    moe_pairs_packed.GATE_UP_TILE = W4A16Row(*gate_up, near_top=True)
    moe_pairs_packed.DOWN_TILE = W4A16Row(*down, near_top=True)
    got = moe_pairs_packed.packed_pair_experts(x, copies[0][0], copies[0][1], weights, ids).float()
    want = reference_experts(x, copies[0][0], copies[0][1], weights, ids).float()
    return {"tokens": tokens, "experts_hit": hit, "grouped_us": grouped, "pairs_us": pairs, "best_pairs": best,
            "best_pairs_rel_err": ((got - want).norm() / want.norm()).item(),
            "grouped_gb_s": bytes_hit / grouped / 1e3, "best_pairs_gb_s": bytes_hit / pairs[best] / 1e3}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--tokens", default="1,2,4")
    args = parser.parse_args()
    generator = torch.Generator("cuda").manual_seed(0)
    copies = [(random_experts(HIDDEN, 2 * INTER, generator), random_experts(INTER, HIDDEN, generator))
              for _ in range(COPIES)]  # fmt: skip
    results = {"device": torch.cuda.get_device_name(), "cases": []}
    for tokens in (int(t) for t in args.tokens.split(",")):
        results["cases"].append(case(tokens, copies, generator))
        row = results["cases"][-1]
        best, shipped = row["pairs_us"][row["best_pairs"]], list(row["pairs_us"].values())[0]
        print(f"== {tokens} tokens: grouped {row['grouped_us']:.1f} us, best pairs {best:.1f} us ({row['best_pairs']}),"
              f" shipped pairs {shipped:.1f} us", flush=True)
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
