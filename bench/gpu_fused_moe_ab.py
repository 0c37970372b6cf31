"""`fused_experts` of this tree against another revision's (its kernels/fused_moe.py, e.g. from
`git show REV:shard_server/kernels/fused_moe.py > /tmp/other.py`), at Qwen3-30B-A3B's shape and
the shipped tiles, each replayed from a CUDA graph over four copies of the experts; with this
tree's parts (alignment, gate_up, down, weighted sum) and the largest difference between the two.

    python3 bench/gpu_fused_moe_ab.py OUT_JSON OTHER_FUSED_MOE_PY [--tokens 64,256,...]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gpu_skinny_matmul import graph_us  # noqa: E402
from shard_server.kernels import fused_moe  # noqa: E402
from shard_server.kernels.moe_align import align_pairs  # noqa: E402
from shard_server.models.moe import reference_experts, route  # noqa: E402

EXPERTS, HIDDEN, INTER, TOP_K = 128, 2048, 768, 8
TOKENS = (64, 256, 1024, 4096, 8192)
COPIES = 4


def load_other(path: Path):
    """The other revision's module, as a sibling of this tree's (its relative imports resolve here)."""
    spec = importlib.util.spec_from_file_location("shard_server.kernels.fused_moe_other", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def case(other, tokens: int, copies, generator: torch.Generator) -> dict:
    x = torch.randn(tokens, HIDDEN, dtype=torch.bfloat16, device="cuda", generator=generator)
    logits = torch.randn(tokens, EXPERTS, device="cuda", generator=generator).to(torch.bfloat16)
    weights, ids = route(logits, TOP_K, renormalize=True)
    tile = fused_moe.tile_for(tokens * TOP_K, EXPERTS)
    result = {"tokens": tokens, "tile": str(tile)}
    result["other_us"] = graph_us(lambda c: other.fused_experts(x, c[0], c[1], weights, ids, tile), copies)
    result["this_us"] = graph_us(lambda c: fused_moe.fused_experts(x, c[0], c[1], weights, ids, tile), copies)
    got = fused_moe.fused_experts(x, *copies[0], weights, ids, tile).float()
    result["max_abs_diff"] = float((got - other.fused_experts(x, *copies[0], weights, ids, tile).float()).abs().max())
    want = reference_experts(x, *copies[0], weights, ids).float()
    result["rel_err"] = float((got - want).norm() / want.norm())
    pairs = tokens * TOP_K
    sorted_pairs, block_expert = align_pairs(ids, EXPERTS, tile.block_m)
    flat_weights = weights.reshape(-1).float().contiguous()
    act = torch.empty(pairs, INTER, dtype=x.dtype, device="cuda")
    per_pair = torch.empty(pairs, HIDDEN, dtype=x.dtype, device="cuda")
    launch = fused_moe._launch
    result["parts_us"] = {
        "align": graph_us(lambda _: align_pairs(ids, EXPERTS, tile.block_m), [None]),
        "gate_up": graph_us(lambda c: launch(x, c[0], None, act, sorted_pairs, block_expert, INTER, HIDDEN, TOP_K,
                                             tile, gate_up=True), copies),
        "down": graph_us(lambda c: launch(act, c[1], None, per_pair, sorted_pairs, block_expert, HIDDEN, INTER, TOP_K,
                                          tile, gate_up=False), copies),
        "sum": graph_us(lambda _: fused_moe.weighted_sum(per_pair, flat_weights, TOP_K), [None]),
    }  # fmt: skip
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("other", type=Path, help="the other revision's kernels/fused_moe.py")
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    args = parser.parse_args()
    other = load_other(args.other)
    generator = torch.Generator("cuda").manual_seed(0)
    copies = [(torch.randn(EXPERTS, 2 * INTER, HIDDEN, dtype=torch.bfloat16, device="cuda", generator=generator) * 0.02,
               torch.randn(EXPERTS, HIDDEN, INTER, dtype=torch.bfloat16, device="cuda", generator=generator) * 0.02)
              for _ in range(COPIES)]  # fmt: skip
    results: dict = {"device": torch.cuda.get_device_name(), "other": str(args.other), "cases": []}
    for tokens in map(int, args.tokens.split(",")):
        results["cases"].append(case(other, tokens, copies, generator))
        print(json.dumps(results["cases"][-1]), flush=True)
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
