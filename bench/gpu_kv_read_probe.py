"""Why a decode over an fp8 KV pool takes as long as over bf16: the pool's read pattern, probed.

The shipped decode kernel runs one program per (sequence, KV head), so each token of a page
gives it one head's row: 128 bytes in fp8, 256 in bf16, 1 KB apart. Over both pools it takes
~0.11 ms per layer at batch 80 x 1280 keys (bench/results/attention_tiles_fp8_fp16dots_h200.json),
as if the number of rows read, not their bytes, set the time. This reads the same pages with
nothing else to do, `heads` KV heads per program (a row of heads x 128 contiguous elements per
token), and times a decode attention that takes `heads` KV heads per program (batched 3D dots),
against the shipped kernel.

    python3 bench/gpu_kv_read_probe.py OUT_JSON
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gpu_attention_tiles import HEADS, KV_HEADS, DIM, PAGE, build  # noqa: E402
from shard_server.attention.base import AttentionShape  # noqa: E402
from shard_server.attention.triton_paged import LOG2_E, TritonPagedAttention  # noqa: E402

CASES = {"b80_ctx1280": [(1, 1280)] * 80, "b256_ctx512": [(1, 512)] * 256}


@triton.jit
def _read_rows(cache_ptr, out_ptr, tables_ptr, ctx_ptr, table_stride, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
               HEADS: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr,
               HEAD_MAJOR: tl.constexpr):  # fmt: skip
    """Sums a sequence's rows of HEADS heads: the loads of a decode, without its arithmetic."""
    if HEAD_MAJOR:
        group, seq = tl.program_id(0), tl.program_id(1)
    else:
        seq, group = tl.program_id(0), tl.program_id(1)
    ctx = tl.load(ctx_ptr + seq)
    chunk = tl.cdiv(tl.cdiv(ctx, SPLITS), BLOCK_N) * BLOCK_N
    lo = tl.program_id(2) * chunk
    hi = tl.minimum(ctx, lo + chunk)
    cols = tl.arange(0, HEADS * HEAD_DIM)
    acc = tl.zeros([BLOCK_N, HEADS * HEAD_DIM], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        ok = keys < hi
        block = tl.load(tables_ptr + seq * table_stride + keys // PAGE, mask=ok, other=0).to(tl.int64)
        rows = (block * PAGE + keys % PAGE) * (KV_HEADS * HEAD_DIM) + group * (HEADS * HEAD_DIM)
        acc += tl.load(cache_ptr + rows[:, None] + cols[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
    total = tl.sum(tl.sum(acc, 1), 0)
    tl.store(out_ptr + (seq * (KV_HEADS // HEADS) + group) * SPLITS + tl.program_id(2), total)


@triton.jit
def _grouped_decode(q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, tables_ptr, ctx_ptr, table_stride, scale_log2,
                    KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HEADS: tl.constexpr,
                    PAGE: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr):  # fmt: skip
    """One decode token per sequence; a program takes HEADS KV heads (x GROUP query heads each)."""
    seq, group = tl.program_id(0), tl.program_id(1)
    ctx = tl.load(ctx_ptr + seq)
    kv = tl.arange(0, HEADS)
    row = tl.arange(0, ROWS)  # query heads of a KV head, padded to the dot's 16 rows
    dims = tl.arange(0, HEAD_DIM)
    head = (group * HEADS + kv)[:, None] * GROUP + row[None, :]  # [HEADS, ROWS]
    row_ok = (row < GROUP)[None, :]
    q_rows = seq * (KV_HEADS * GROUP * HEAD_DIM) + head[:, :, None] * HEAD_DIM + dims[None, None, :]
    q = tl.load(q_ptr + q_rows, mask=row_ok[:, :, None], other=0.0)
    q = tl.clamp(q.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
    m_i = tl.full([HEADS, ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([HEADS, ROWS], tl.float32)
    acc = tl.zeros([HEADS, ROWS, HEAD_DIM], tl.float32)
    within = (group * HEADS + kv)[None, :, None] * HEAD_DIM + dims[None, None, :]  # [1, HEADS, D]
    for start in range(0, ctx, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        ok = keys < ctx
        block = tl.load(tables_ptr + seq * table_stride + keys // PAGE, mask=ok, other=0).to(tl.int64)
        slots = (block * PAGE + keys % PAGE) * (KV_HEADS * HEAD_DIM)
        at = slots[:, None, None] + within  # [N, HEADS, D]: each token's HEADS rows are contiguous
        k = tl.load(k_cache_ptr + at, mask=ok[:, None, None], other=0.0).to(tl.float16)
        scores = tl.dot(q, tl.permute(k, (1, 2, 0)))  # [HEADS, ROWS, N]
        scores = tl.where(ok[None, None, :], scores * scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 2))
        p = tl.exp2(scores - m_new[:, :, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 2)
        v = tl.load(v_cache_ptr + at, mask=ok[:, None, None], other=0.0).to(tl.float16)
        acc = acc * alpha[:, :, None] + tl.dot(p.to(tl.float16), tl.permute(v, (1, 0, 2)))
        m_i = m_new
    out = acc / l_i[:, :, None]
    tl.store(out_ptr + q_rows, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, :, None])


def _time_reads(specs, k_cache, v_cache, tables, ctx, nbytes) -> list[dict]:
    """`_read_rows` over both pools, per heads per program, tile, grid order and split."""
    device, rows = k_cache.device, []
    for heads, block_n, head_major, splits in itertools.product((1, 2, 4, 8), (32, 64), (False, True), (1, 4)):
        groups = KV_HEADS // heads
        out = torch.empty(len(specs) * groups * splits, device=device)
        grid = (groups, len(specs), splits) if head_major else (len(specs), groups, splits)
        shown = {"heads": heads, "block_n": block_n, "head_major": head_major, "splits": splits}

        def read():
            for cache in (k_cache, v_cache):
                _read_rows[grid](cache.view(-1), out, tables, ctx, tables.stride(0), KV_HEADS, DIM, heads, PAGE,
                                 block_n, splits, head_major, num_warps=4, num_stages=3)  # fmt: skip

        ms = triton.testing.do_bench(read, warmup=10, rep=40, return_mode="median")
        rows.append({**shown, "ms": ms, "tb_s": nbytes / ms / 1e9})
    return sorted(rows, key=lambda r: r["ms"])


def _time_grouped(specs, q, k_cache, v_cache, tables, ctx, nbytes, shipped) -> list[dict]:
    """`_grouped_decode` per heads per program, tile, warps and stages, checked against `shipped`."""
    rows = []
    for heads, block_n, warps, stages in itertools.product((1, 2, 4, 8), (16, 32, 64), (4, 8), (2, 3)):
        out = torch.empty_like(q)
        shown = {"heads": heads, "block_n": block_n, "warps": warps, "stages": stages}

        def attend():
            _grouped_decode[(len(specs), KV_HEADS // heads)](
                q, k_cache, v_cache, out, tables, ctx, tables.stride(0), DIM**-0.5 * LOG2_E, KV_HEADS,
                HEADS // KV_HEADS, DIM, heads, PAGE, block_n, 16, num_warps=warps, num_stages=stages,
            )  # fmt: skip

        try:
            attend()
            ms = triton.testing.do_bench(attend, warmup=10, rep=40, return_mode="median")
        except Exception as exc:  # a config the shared memory refuses
            rows.append({**shown, "error": f"{type(exc).__name__}: {str(exc)[:160]}"})
            continue
        error = float((out.float() - shipped.float()).abs().max())
        rows.append({**shown, "ms": ms, "tb_s": nbytes / ms / 1e9, "max_abs_vs_shipped": error})
    return sorted(rows, key=lambda r: r.get("ms", 1e9))


def main() -> None:
    out_path = Path(sys.argv[1])
    device = torch.device("cuda")
    results = {}
    for (name, specs), kv_dtype in itertools.product(CASES.items(), (torch.float8_e4m3fn, torch.bfloat16)):
        layout, q, k, v, k_cache, v_cache = build(specs, device, kv_dtype=kv_dtype)
        backend = TritonPagedAttention(AttentionShape(HEADS, KV_HEADS, DIM, DIM**-0.5))
        metadata = backend.build_metadata(layout, device)
        tables, ctx = metadata.block_tables, metadata.context_lens
        nbytes = 2 * sum(c for _, c in specs) * KV_HEADS * DIM * k_cache.element_size()
        key = f"{name}_{str(kv_dtype).removeprefix('torch.')}"
        shipped = backend.forward(q, k, v, k_cache, v_cache, metadata)
        ms = triton.testing.do_bench(lambda: backend.forward(q, k, v, k_cache, v_cache, metadata),
                                     warmup=25, rep=100, return_mode="median")  # fmt: skip
        entry = {"kv_bytes": nbytes, "shipped": {"ms": ms, "tb_s": nbytes / ms / 1e9},
                 "reads": _time_reads(specs, k_cache, v_cache, tables, ctx, nbytes),
                 "grouped_decode": _time_grouped(specs, q, k_cache, v_cache, tables, ctx, nbytes, shipped)}  # fmt: skip
        print(f"{key}: shipped {ms:.4f} ms {nbytes / ms / 1e9:.2f} TB/s", flush=True)
        for heads in (1, 2, 4, 8):
            best_read = next(r for r in entry["reads"] if r["heads"] == heads)
            best_grouped = next((r for r in entry["grouped_decode"] if r["heads"] == heads and "ms" in r), None)
            print(f"  {heads} heads/program: read only {best_read}; grouped decode {best_grouped}", flush=True)
        results[key] = entry
        out_path.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
