"""The fused MoE's alignment (pairs sorted by expert, groups padded to row tiles), timed three
ways at Qwen3-30B-A3B's routing: one program (`_align_sorted_kernel`, up to 256 pairs), in chunks (`_align_in_chunks`) and the torch ops (`align_to_blocks`),
each replayed from a CUDA graph; every result is checked equal to the torch ops'. Sets
`ALIGN_IN_ONE_PROGRAM_UP_TO` (kernels/moe_align.py). (Until stop 59 a counting sort in one
program, `one_program` in bench/results/moe_align*_h100.json, timed beside them; the sort replaced it.)

    python3 bench/gpu_moe_align.py OUT_JSON [--tokens 17,32,...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gpu_skinny_matmul import graph_us  # noqa: E402
from shard_server.kernels import moe_align  # noqa: E402
from shard_server.kernels.fused_moe import tile_for  # noqa: E402
from shard_server.models.moe import route  # noqa: E402

EXPERTS, TOP_K = 128, 8
TOKENS = (5, 17, 32, 64, 128, 256, 512, 1024, 4096, 8192)


def case(tokens: int, generator: torch.Generator) -> dict:
    logits = torch.randn(tokens, EXPERTS, device="cuda", generator=generator).to(torch.bfloat16)
    _, ids = route(logits, TOP_K, renormalize=True)
    flat, pairs = ids.reshape(-1), tokens * TOP_K
    block_m = tile_for(pairs, EXPERTS).block_m
    blocks = moe_align.block_count(pairs, EXPERTS, block_m)
    one_program = moe_align._align_in_one_program
    ways = {"torch": lambda: moe_align.align_to_blocks(ids, EXPERTS, block_m),
            "chunks": lambda: moe_align._align_in_chunks(flat, EXPERTS, block_m, blocks)}  # fmt: skip
    if pairs <= moe_align.ALIGN_IN_ONE_PROGRAM_UP_TO:  # the most the sorting program holds
        ways["sorted"] = lambda: one_program(flat, EXPERTS, block_m, blocks)
    want = ways["torch"]()
    result = {"pairs": pairs, "block_m": block_m}
    for name, way in ways.items():
        got = way()
        result[f"{name}_equal"] = bool(torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]))
        result[f"{name}_us"] = graph_us(lambda _, w=way: w(), [None])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    args = parser.parse_args()
    generator = torch.Generator("cuda").manual_seed(0)
    results: dict = {"device": torch.cuda.get_device_name(), "experts": EXPERTS, "top_k": TOP_K, "cases": []}
    for tokens in map(int, args.tokens.split(",")):
        results["cases"].append(case(tokens, generator))
        print(tokens, json.dumps(results["cases"][-1]), flush=True)
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
