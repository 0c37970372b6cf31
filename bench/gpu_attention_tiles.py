"""Tile shapes of the triton attention kernel, swept on the step shapes that matter (8B model).

For each case the backend's launch config (prefill tiles or decode tiles) is replaced by each
candidate; every candidate's output is checked against the shipped config's (bf16, 2e-2) and
timed with CUDA events (median of do_bench). The shipped config is the first of each list.

    python3 bench/gpu_attention_tiles.py OUT_JSON [--kv-dtype fp8_e4m3fn] [--decode-only] [--splits 1,2,4]
        [--cases decode_b80_ctx1280,...]

With `--kv-dtype` the pool is stored in that dtype (`--kv-cache-dtype`): fp8 halves the bytes
a decode reads, and the kernel widens each key and value tile before its dots: to fp16 as
shipped, and each candidate again with the model's bf16 (the widening the kernel had before),
and with fp16 over values read as 32-bit words and widened by hand (`fp8_values_by_words`).
"""

from __future__ import annotations

import json
import random
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shard_server.attention.base import AttentionShape, StepLayout  # noqa: E402
from shard_server.attention.triton_paged import TileConfig, TritonPagedAttention  # noqa: E402
from shard_server.kv_cache import KV_CACHE_DTYPES, is_fp8, to_cache_dtype  # noqa: E402

HEADS, KV_HEADS, DIM, PAGE = 32, 8, 128, 16
CASES = {
    "prefill_2048": ("large", [(2048, 2048)]),
    "mixed_8x1016_plus_64_decodes": ("large", [(1016, 1016)] * 8 + [(1, 512)] * 64),
    "decode_b80_ctx1280": ("small", [(1, 1280)] * 80),
    "decode_b256_ctx512": ("small", [(1, 512)] * 256),
    # Between and around the mix's two decode shapes: where one decode tile stops paying.
    "decode_b24_ctx1536": ("small", [(1, 1536)] * 24),
    "decode_b48_ctx1280": ("small", [(1, 1280)] * 48),
    "decode_b128_ctx768": ("small", [(1, 768)] * 128),
    "decode_b192_ctx640": ("small", [(1, 640)] * 192),
}
LARGE = [TileConfig(32, 64, 8, 2)] + [TileConfig(q, n, w, s) for q, n, w, s in [
    (32, 64, 8, 3), (32, 128, 8, 2), (32, 128, 8, 3), (32, 32, 4, 3), (32, 64, 4, 2), (32, 64, 4, 3),
    (16, 64, 4, 2), (16, 64, 4, 3), (16, 128, 4, 2), (32, 128, 4, 2)]]  # fmt: skip
SMALL = [TileConfig(4, 64, 4, 2)] + [TileConfig(4, n, w, s) for n, w, s in [
    (64, 4, 3), (128, 4, 2), (128, 8, 2), (32, 4, 2), (32, 2, 2), (64, 2, 2), (128, 4, 3),
    (64, 4, 4), (128, 4, 4), (256, 8, 2), (128, 2, 3)]]  # fmt: skip


def build(specs, device, seed=0, kv_dtype=torch.bfloat16):
    gen = torch.Generator(device=device).manual_seed(seed)
    rng = random.Random(seed)
    blocks = [-(-ctx // PAGE) for _, ctx in specs]
    order = list(range(sum(blocks) + 8))
    rng.shuffle(order)
    tables, at = [], 0
    for count in blocks:
        tables.append(order[at : at + count])
        at += count
    k_cache = torch.randn((len(order), PAGE, KV_HEADS, DIM), generator=gen, device=device, dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    tokens = sum(n for n, _ in specs)
    q = torch.randn((tokens, HEADS, DIM), generator=gen, device=device, dtype=torch.bfloat16)
    k = torch.randn((tokens, KV_HEADS, DIM), generator=gen, device=device, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    layout = StepLayout([n for n, _ in specs], [c for _, c in specs], tables, PAGE)
    return layout, q, k, v, to_cache_dtype(k_cache, kv_dtype), to_cache_dtype(v_cache, kv_dtype)


def main() -> None:
    import triton.testing

    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--kv-dtype", choices=sorted(KV_CACHE_DTYPES), default=None)
    parser.add_argument("--decode-only", action="store_true")
    parser.add_argument("--cases", help="comma-separated case names (default: all)")
    # Eager decode steps never split their keys (graph steps of few sequences do): this forces
    # each split count on the decode cases, to see whether more programs per step would pay.
    parser.add_argument("--splits", default="1", help="comma-separated key splits for the decode cases")
    args = parser.parse_args()
    wanted = set(args.cases.split(",")) if args.cases else set(CASES)
    if wanted - set(CASES):
        parser.error(f"unknown cases {sorted(wanted - set(CASES))}; known: {', '.join(CASES)}")
    kv_dtype = KV_CACHE_DTYPES[args.kv_dtype] if args.kv_dtype else torch.bfloat16
    device = torch.device("cuda")
    results = {"kv_dtype": str(kv_dtype)}
    for name, (which, specs) in CASES.items():
        if name not in wanted or (args.decode_only and which != "small"):
            continue
        layout, q, k, v, k_cache, v_cache = build(specs, device, kv_dtype=kv_dtype)
        backend = TritonPagedAttention(AttentionShape(HEADS, KV_HEADS, DIM, DIM**-0.5))
        shipped_switches = backend.fp16_dots_over_fp8, backend.fp8_values_by_words
        fp8_pool = is_fp8(kv_dtype)
        # Over an fp8 pool decode tiles launch with `small_fp8` (values read by words:
        # `small_fp8_words`, or `small_fp8_words_wide` for many programs): the one this case
        # takes is shipped, and all are swept together.
        attributes, shipped = [which], getattr(backend, which)
        if which == "small" and fp8_pool:
            attributes = ["small_fp8_words", "small_fp8_words_wide", "small_fp8"]
            load = "words" if backend.fp8_values_by_words else "plain"
            shipped = backend.fp8_decode_tile(load, len(specs) * KV_HEADS)
        saved = {a: getattr(backend, a) for a in attributes}
        if which == "large":
            candidates = LARGE
        else:
            small = [replace(c, block_q=shipped.block_q) for c in SMALL]
            candidates = [shipped] + [c for c in small if c != shipped]
        # Over an fp8 pool each candidate also runs with the other widenings: fp16 dots over
        # plain or word-read values (`fp8_values_by_words`), and bf16 dots over plain ones.
        variants = [(c, *shipped_switches) for c in candidates]
        if fp8_pool:
            others = [(True, False), (False, False), (True, True)]
            variants += [(c, *s) for s in others if s != shipped_switches for c in candidates]
        split_counts = [int(n) for n in args.splits.split(",")] if which == "small" else [1]
        variants = [(c, dots, words, n) for n in split_counts for c, dots, words in variants]
        baseline, rows = None, []
        for config, fp16_dots, by_words, splits in variants:
            for attribute in attributes:
                setattr(backend, attribute, config)
            backend.fp16_dots_over_fp8, backend.fp8_values_by_words = fp16_dots, by_words
            metadata = backend.build_metadata(layout, device)
            metadata.splits = splits
            try:
                got = backend.forward(q, k, v, k_cache, v_cache, metadata)
                ms = triton.testing.do_bench(lambda: backend.forward(q, k, v, k_cache, v_cache, metadata),
                                             warmup=25, rep=100, return_mode="median")  # fmt: skip
            except Exception as exc:  # a config the compiler refuses (shared memory): say so
                rows.append({"config": config.__dict__, "fp16_dots": fp16_dots, "by_words": by_words, "splits": splits,
                             "error": f"{type(exc).__name__}: {str(exc)[:200]}"})  # fmt: skip
                continue
            if baseline is None:
                baseline = got.float()
            error = float((got.float() - baseline).abs().max())
            rows.append({"config": config.__dict__, "fp16_dots": fp16_dots, "by_words": by_words, "splits": splits,
                         "ms": ms, "max_abs_diff_vs_shipped": error})  # fmt: skip
        for attribute, config in saved.items():
            setattr(backend, attribute, config)
        backend.fp16_dots_over_fp8, backend.fp8_values_by_words = shipped_switches
        results[name] = rows
        for r in rows:
            print(f"  {name} {r['config']} dots16={r['fp16_dots']} words={r['by_words']} splits={r['splits']}: "
                  f"{r.get('ms', r.get('error'))}", flush=True)  # fmt: skip
        best = min((r for r in rows if "ms" in r and r["max_abs_diff_vs_shipped"] < 2e-2), key=lambda r: r["ms"])
        print(f"{name}: shipped {rows[0].get('ms', float('nan')):.3f} ms, best {best['ms']:.3f} ms {best['config']}"
              f" fp16 dots {best['fp16_dots']}, by words {best['by_words']}, splits {best['splits']}",
              flush=True)  # fmt: skip
    args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
