"""Triton kernels of the `triton` attention backend, over the shared paged KV layout.

`store_kv`: copies each new token's k/v row into its cache slot (slot < 0: padding, skipped).

`paged_attention`: one kernel for every kind of query in a step. A program takes one tile
of BLOCK_Q consecutive query tokens of one sequence and one KV head, with all the query
heads that share that KV head (GQA) stacked as rows: BLOCK_M = BLOCK_Q * GROUP_P rows. It
streams the sequence's keys and values through its block table, BLOCK_N tokens at a time,
with an online softmax in float32, masking causally (key position <= query position, and
inside the sliding window if any). Decodes and prefill chunks differ only in BLOCK_Q.

On CPU both kernels run only through Triton's interpreter (slowly), which the tests use.
"""

from __future__ import annotations

import triton
import triton.language as tl


def _store_kv(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slots_ptr,
    k_row_stride,
    v_row_stride,
    WIDTH: tl.constexpr,  # num_kv_heads * head_dim
    WIDTH_P: tl.constexpr,  # next power of two
):
    token = tl.program_id(0)
    slot = tl.load(slots_ptr + token).to(tl.int64)
    if slot >= 0:
        cols = tl.arange(0, WIDTH_P)
        mask = cols < WIDTH
        k = tl.load(k_ptr + token * k_row_stride + cols, mask=mask)
        v = tl.load(v_ptr + token * v_row_stride + cols, mask=mask)
        tl.store(k_cache_ptr + slot * WIDTH + cols, k, mask=mask)
        tl.store(v_cache_ptr + slot * WIDTH + cols, v, mask=mask)


def _paged_attention(
    q_ptr,  # [T, H, D]
    k_cache_ptr,  # [slots, KV_HEADS, D]
    v_cache_ptr,
    out_ptr,  # [T, H, D]
    tile_seq_ptr,  # [tiles] sequence of each tile
    tile_first_ptr,  # [tiles] first query offset of the tile inside its sequence
    query_starts_ptr,  # [B] first step row of each sequence
    query_lens_ptr,  # [B]
    context_lens_ptr,  # [B] KV length after this step
    block_tables_ptr,  # [B, table_stride]
    q_stride_t,
    q_stride_h,
    o_stride_t,
    o_stride_h,
    table_stride,
    scale_log2,  # softmax scale * log2(e)
    KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,  # query heads per KV head
    GROUP_P: tl.constexpr,  # GROUP rounded up to a power of two
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE: tl.constexpr,  # KV block size in tokens
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P: tl.constexpr,
    IEEE: tl.constexpr,  # exact float32 dots (float32 models)
    WINDOW: tl.constexpr,  # sliding window in tokens; 0: none
):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = tl.load(tile_seq_ptr + tile)
    first = tl.load(tile_first_ptr + tile)
    q_len = tl.load(query_lens_ptr + seq)
    ctx = tl.load(context_lens_ptr + seq)
    row0 = tl.load(query_starts_ptr + seq).to(tl.int64)

    rows = tl.arange(0, BLOCK_Q * GROUP_P)
    q_tok = first + rows // GROUP_P
    group_index = rows % GROUP_P
    head = kv_head * GROUP + group_index
    row_ok = (q_tok < q_len) & (group_index < GROUP)
    dims = tl.arange(0, HEAD_DIM_P)
    dim_ok = dims < HEAD_DIM
    q_rows = (row0 + q_tok)[:, None] * q_stride_t + head[:, None] * q_stride_h
    q = tl.load(q_ptr + q_rows + dims[None, :], mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
    q_pos = ctx - q_len + q_tok  # absolute position of each row's query token

    m_i = tl.full([BLOCK_Q * GROUP_P], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_Q * GROUP_P], tl.float32)
    acc = tl.zeros([BLOCK_Q * GROUP_P, HEAD_DIM_P], tl.float32)

    # Keys this tile can see: up to its last query's position, from its first query's window.
    hi = ctx - q_len + tl.minimum(first + BLOCK_Q, q_len)
    if WINDOW > 0:
        lo = tl.maximum(ctx - q_len + first - WINDOW + 1, 0)
        lo = (lo // BLOCK_N) * BLOCK_N
    else:
        lo = 0
    kv_base = kv_head * HEAD_DIM
    for start in range(lo, hi, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        key_ok = keys < hi
        block = tl.load(block_tables_ptr + seq * table_stride + keys // PAGE, mask=key_ok, other=0)
        slot = block.to(tl.int64) * PAGE + keys % PAGE
        kv_offsets = slot[:, None] * (KV_HEADS * HEAD_DIM) + kv_base + dims[None, :]
        kv_mask = key_ok[:, None] & dim_ok[None, :]
        k = tl.load(k_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)
        if IEEE:
            scores = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            scores = tl.dot(q, tl.trans(k))
        allowed = key_ok[None, :] & (keys[None, :] <= q_pos[:, None])
        if WINDOW > 0:
            allowed = allowed & (keys[None, :] > q_pos[:, None] - WINDOW)
        scores = tl.where(allowed, scores * scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
        p = tl.exp2(scores - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_rows = (row0 + q_tok)[:, None] * o_stride_t + head[:, None] * o_stride_h
    tl.store(
        out_ptr + o_rows + dims[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & dim_ok[None, :],
    )


store_kv_kernel = triton.jit(_store_kv)
# The table width changes from step to step: specialising on it would recompile mid-serving.
paged_attention_kernel = triton.jit(_paged_attention, do_not_specialize=["table_stride"])


def kernels_for(device_type: str):
    """(store_kv, paged_attention) for tensors on `device_type`.

    CPU tensors work only under Triton's interpreter, which Triton switches on when
    TRITON_INTERPRET=1 is set before it is first imported (the CPU tests do that).
    """
    if device_type != "cuda" and not triton.knobs.runtime.interpret:
        raise RuntimeError("the triton attention backend needs a CUDA device (or TRITON_INTERPRET=1 on CPU)")
    return store_kv_kernel, paged_attention_kernel
