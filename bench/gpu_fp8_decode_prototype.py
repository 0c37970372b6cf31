"""A decode-attention kernel without `tl.dot`, for fp8 pools: measured against the shipped one.

The shipped decode tile pads one query token x GROUP heads to `tl.dot`'s 16 rows; over an fp8
pool (half the bytes of bf16) that padded compute and the widening bound it, so fp8 decodes
are slower than bf16 ones (bench/results/attention_tiles_fp8_h200.json). This prototype gives
each program one sequence and one KV head and computes its GROUP real rows on CUDA cores:
scores as a broadcast multiply-and-sum over head_dim, the value product likewise, an online
softmax in float32, split-KV partials in the shipped kernel's format (so `combine_splits`
merges them). If it is faster on the GPU, it moves into shard_server/attention for decode
tiles over fp8 pools.

    python3 bench/gpu_fp8_decode_prototype.py OUT_JSON

Each case: the shipped backend's attention call and the prototype's on the same fp8 (and bf16)
pool, outputs compared (2e-2, bf16 queries), times from do_bench.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gpu_attention_tiles import DIM, HEADS, KV_HEADS, PAGE, build  # noqa: E402
from shard_server.attention.base import AttentionShape  # noqa: E402
from shard_server.attention.triton_kernels import combine_splits_kernel  # noqa: E402
from shard_server.attention.triton_paged import LOG2_E, TritonPagedAttention, split_count  # noqa: E402
from shard_server.kv_cache import to_cache_dtype  # noqa: E402

CASES = {"decode_b1_ctx4096": [(1, 4096)], "decode_b80_ctx1280": [(1, 1280)] * 80,
         "decode_b256_ctx512": [(1, 512)] * 256}  # fmt: skip


@triton.jit
def _decode_rows(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, partial_ml_ptr,
    query_starts_ptr, context_lens_ptr, block_tables_ptr,
    q_stride_t, q_stride_h, o_stride_t, o_stride_h, table_stride, scale_log2,
    split_stride, ml_stride_t, ml_split_stride,
    KV_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_P: tl.constexpr, BLOCK_N: tl.constexpr,
    PAGE: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_P: tl.constexpr, SPLITS: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    row = tl.load(query_starts_ptr + seq).to(tl.int64)
    ctx = tl.load(context_lens_ptr + seq)
    group = tl.arange(0, GROUP_P)
    dims = tl.arange(0, HEAD_DIM_P)
    head = kv_head * GROUP + group
    head_ok = group < GROUP
    dim_ok = dims < HEAD_DIM
    q = tl.load(q_ptr + row * q_stride_t + head[:, None] * q_stride_h + dims[None, :],
                mask=head_ok[:, None] & dim_ok[None, :], other=0.0).to(tl.float32)  # fmt: skip
    m_i = tl.full([GROUP_P], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_P], tl.float32)
    acc = tl.zeros([GROUP_P, HEAD_DIM_P], tl.float32)
    lo, hi = 0, ctx
    if SPLITS > 1:
        chunk = tl.cdiv(tl.cdiv(ctx, SPLITS), BLOCK_N) * BLOCK_N
        lo = tl.program_id(2) * chunk
        hi = tl.minimum(ctx, lo + chunk)
    for start in range(lo, hi, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        key_ok = keys < hi
        block = tl.load(block_tables_ptr + seq * table_stride + keys // PAGE, mask=key_ok, other=0)
        slot = block.to(tl.int64) * PAGE + keys % PAGE
        offsets = slot[:, None] * (KV_HEADS * HEAD_DIM) + kv_head * HEAD_DIM + dims[None, :]
        mask = key_ok[:, None] & dim_ok[None, :]
        k = tl.load(k_cache_ptr + offsets, mask=mask, other=0.0).to(tl.float32)  # [N, D]
        scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale_log2  # [G, N]
        scores = tl.where(key_ok[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(scores - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + offsets, mask=mask, other=0.0).to(tl.float32)  # [N, D]
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m_i = m_new
    o_rows = row * o_stride_t + head[:, None] * o_stride_h + dims[None, :]
    out_mask = head_ok[:, None] & dim_ok[None, :]
    if SPLITS > 1:
        split = tl.program_id(2).to(tl.int64)
        tl.store(out_ptr + split * split_stride + o_rows, acc, mask=out_mask)
        ml = partial_ml_ptr + split * ml_split_stride + row * ml_stride_t + head
        tl.store(ml, m_i, mask=head_ok)
        tl.store(ml + SPLITS * ml_split_stride, l_i, mask=head_ok)
    else:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(out_ptr + o_rows, out.to(out_ptr.dtype.element_ty), mask=out_mask)


def decode_rows(backend: TritonPagedAttention, q, k_cache, v_cache, metadata, splits: int, block_n: int = 16,
                num_warps: int = 4) -> torch.Tensor:  # fmt: skip
    """The prototype's attention of a decode-only step (every sequence one query token)."""
    shape = backend.shape
    tokens, heads, dim = q.shape
    out = torch.empty_like(q)
    target, ml = out, out
    if splits > 1:
        target = torch.empty((splits, tokens, heads, dim), dtype=torch.float32, device=q.device)
        ml = torch.empty((2, splits, tokens, heads), dtype=torch.float32, device=q.device)
    strides = (tokens * heads * dim, heads, tokens * heads)
    _decode_rows[(tokens, shape.num_kv_heads, splits)](
        q, k_cache, v_cache, target, ml, metadata.query_starts, metadata.context_lens, metadata.block_tables,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), metadata.width, shape.scale * LOG2_E, *strides,
        KV_HEADS=shape.num_kv_heads, GROUP=backend.group, GROUP_P=backend.group_p, BLOCK_N=block_n,
        PAGE=k_cache.shape[1], HEAD_DIM=shape.head_dim, HEAD_DIM_P=backend.head_dim_p, SPLITS=splits,
        num_warps=num_warps,
    )  # fmt: skip
    if splits > 1:
        # One tile per sequence at block_q 1: combine_splits walks GROUP_P rows of it.
        seqs = torch.arange(tokens, dtype=torch.int32, device=q.device)
        firsts = torch.zeros_like(seqs)
        combine_splits_kernel[(tokens, shape.num_kv_heads)](
            target, ml, out, seqs, firsts, metadata.query_starts, metadata.query_lens,
            out.stride(0), out.stride(1), *strides,
            SPLITS=splits, GROUP=backend.group, GROUP_P=backend.group_p, BLOCK_Q=1,
            HEAD_DIM=shape.head_dim, HEAD_DIM_P=backend.head_dim_p, num_warps=4,
        )  # fmt: skip
    return out


def main() -> None:
    import triton.testing

    out_path = Path(sys.argv[1])
    device = torch.device("cuda")
    backend = TritonPagedAttention(AttentionShape(HEADS, KV_HEADS, DIM, DIM**-0.5))
    results = {}
    for name, specs in CASES.items():
        for kv_dtype in (torch.float8_e4m3fn, torch.bfloat16):
            layout, q, k, v, k_cache, v_cache = build(specs, device)
            k_cache, v_cache = to_cache_dtype(k_cache, kv_dtype), to_cache_dtype(v_cache, kv_dtype)
            metadata = backend.build_metadata(layout, device)
            shipped = backend.forward(q, k, v, k_cache, v_cache, metadata)  # stores this step's k/v
            splits = split_count(len(specs), KV_HEADS) if len(specs) < 8 else 1
            row = {"shipped_ms": triton.testing.do_bench(
                lambda: backend.forward(q, k, v, k_cache, v_cache, metadata), warmup=25, rep=100, return_mode="median")}  # fmt: skip
            for block_n, warps in ((16, 4), (32, 4), (32, 8), (64, 8)):
                try:
                    got = decode_rows(backend, q, k_cache, v_cache, metadata, splits, block_n, warps)
                    ms = triton.testing.do_bench(lambda: decode_rows(backend, q, k_cache, v_cache, metadata, splits,
                                                                     block_n, warps), warmup=25, rep=100, return_mode="median")  # fmt: skip
                    row[f"prototype_n{block_n}_w{warps}"] = {"ms": ms, "max_abs_diff": float((got.float() - shipped.float()).abs().max())}
                except Exception as exc:  # a config the compiler refuses: say so
                    row[f"prototype_n{block_n}_w{warps}"] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
            results[f"{name}_{str(kv_dtype).split('.')[-1]}"] = row
            print(name, kv_dtype, json.dumps(row), flush=True)
    out_path.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
