"""Triton kernels of the `triton` attention backend, over the shared paged KV layout.

`store_kv`: copies each new token's k/v row into its cache slot (slot < 0: padding, skipped).
An fp8 pool (KV_MAX > 0) gets the values saturated at +-KV_MAX, then cast.

`rotary_store_kv`: the same with rotary applied on the way, and each token's q heads rotated
in place: one pass instead of an in-place rotary kernel followed by the store. With HEAD_NORM
(Qwen3's and Gemma 3's q_norm / k_norm) each q and k head is RMS-normed first, rounded as
`kernels/norm.py`'s per-head kernel rounds: that kernel's launch a layer fewer.

`paged_attention`: one kernel for every kind of query in a step. A program takes one tile
of BLOCK_Q consecutive query tokens of one sequence and one KV head, with all the query
heads that share that KV head (GQA) stacked as rows: BLOCK_M = BLOCK_Q * GROUP_P rows. It
streams the sequence's keys and values through its block table, BLOCK_N tokens at a time,
with an online softmax in float32, masking causally (key position <= query position, and
inside the sliding window if any), the scores soft-capped first when SOFTCAP is set (Gemma 2:
cap * tanh(score / cap), after the scale). Decodes and prefill chunks differ only in BLOCK_Q. Keys and
values are read in the pool's dtype and widened to the queries' before the dots; from an fp8
pool under bf16 queries the dots run in fp16 (FP16_DOTS), which both fp8 formats and the
probabilities widen to exactly, and in one instruction per pair rather than several (queries
keep their values in fp16's normal range, 2^-14 to 65504, and are clamped beyond it).

Split-KV: with SPLITS > 1 the keys of each tile are split into SPLITS ranges (program_id 2),
and each program writes its unnormalised partial output with its running max and sum;
`combine_splits` merges them. A small decode batch then occupies SPLITS times more programs:
at batch 1 one program per KV head would leave most of the GPU idle while each walks the
whole context alone. A range is at least MIN_SPLIT_KEYS keys, so a short context takes fewer
ranges than SPLITS; a program whose range is empty writes only its max (-inf) and sum (0),
and `combine_splits` reads no partial output where the max is -inf. With MERGE_IN_KERNEL the
last of a tile's SPLITS programs to finish (counted on an int32 per tile and KV head, which it
sets back to 0 for the next launch) merges the partials itself, and no `combine_splits`
launch follows: one kernel a layer fewer at small batches, but measured slower on an H100
(`MERGE_SPLITS_IN_KERNEL`, off).

On CPU both kernels run only through Triton's interpreter (slowly), which the tests use.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl

from ..kernels.pdl import wait_for_previous_kernel


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
    KV_MAX: tl.constexpr,  # an fp8 pool's largest finite value; 0.0: the pool is not fp8
    PDL: tl.constexpr,  # programmatic dependent launch (`kernels/pdl.py`)
):
    wait_for_previous_kernel(PDL)
    token = tl.program_id(0)
    slot = tl.load(slots_ptr + token).to(tl.int64)
    if slot >= 0:
        cols = tl.arange(0, WIDTH_P)
        mask = cols < WIDTH
        k = tl.load(k_ptr + token * k_row_stride + cols, mask=mask)
        v = tl.load(v_ptr + token * v_row_stride + cols, mask=mask)
        tl.store(k_cache_ptr + slot * WIDTH + cols, _for_pool(k, k_cache_ptr, KV_MAX), mask=mask)
        tl.store(v_cache_ptr + slot * WIDTH + cols, _for_pool(v, v_cache_ptr, KV_MAX), mask=mask)


@triton.jit
def _for_pool(x, cache_ptr, KV_MAX: tl.constexpr):
    """x in the pool's dtype; into an fp8 pool saturated at +-KV_MAX first."""
    if KV_MAX > 0:
        x = tl.clamp(x.to(tl.float32), -KV_MAX, KV_MAX)
    return x.to(cache_ptr.dtype.element_ty)


def _rotary_store_kv(
    q_ptr,  # [T, Q_HEADS, 2 * HALF], rows with densely packed heads
    k_ptr,  # [T, KV_HEADS, 2 * HALF], likewise
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slots_ptr,
    positions_ptr,
    cos_ptr,  # [positions, 2 * HALF] tables
    sin_ptr,
    q_norm_ptr,  # [2 * HALF] per-head norm weights (HEAD_NORM), else unused
    k_norm_ptr,
    q_row_stride,
    k_row_stride,
    v_row_stride,
    table_stride,
    q_eps,
    k_eps,
    Q_HEADS: tl.constexpr,
    Q_HEADS_P: tl.constexpr,
    KV_HEADS: tl.constexpr,
    KV_HEADS_P: tl.constexpr,
    HALF: tl.constexpr,
    KV_MAX: tl.constexpr,  # as in _store_kv
    HEAD_NORM: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_for_previous_kernel(PDL)
    token = tl.program_id(0).to(tl.int64)
    position = tl.load(positions_ptr + token).to(tl.int64)
    dims = tl.arange(0, HALF)
    cos = tl.load(cos_ptr + position * table_stride + dims).to(tl.float32)[None, :]
    sin = tl.load(sin_ptr + position * table_stride + dims).to(tl.float32)[None, :]
    heads = tl.arange(0, Q_HEADS_P)
    q_mask = (heads < Q_HEADS)[:, None]
    q_first = q_ptr + token * q_row_stride + heads[:, None] * (2 * HALF) + dims[None, :]
    q1 = tl.load(q_first, mask=q_mask, other=0.0)
    q2 = tl.load(q_first + HALF, mask=q_mask, other=0.0)
    qa, qb = q1.to(tl.float32), q2.to(tl.float32)
    if HEAD_NORM:
        qa, qb = _normed_halves(qa, qb, q_norm_ptr, dims, q_eps, q1.dtype, HALF)
    tl.store(q_first, (qa * cos - qb * sin).to(q1.dtype), mask=q_mask)
    tl.store(q_first + HALF, (qb * cos + qa * sin).to(q1.dtype), mask=q_mask)
    slot = tl.load(slots_ptr + token).to(tl.int64)
    if slot >= 0:
        kv_heads = tl.arange(0, KV_HEADS_P)
        kv_mask = (kv_heads < KV_HEADS)[:, None]
        within = kv_heads[:, None] * (2 * HALF) + dims[None, :]
        k1 = tl.load(k_ptr + token * k_row_stride + within, mask=kv_mask, other=0.0)
        k2 = tl.load(k_ptr + token * k_row_stride + within + HALF, mask=kv_mask, other=0.0)
        ka, kb = k1.to(tl.float32), k2.to(tl.float32)  # new names: a branch may not reshape qa, qb
        if HEAD_NORM:
            ka, kb = _normed_halves(ka, kb, k_norm_ptr, dims, k_eps, k1.dtype, HALF)
        k_slot = k_cache_ptr + slot * (KV_HEADS * 2 * HALF) + within
        # Rounded to the model dtype first, as the unfused rotary would leave them.
        k_lo, k_hi = (ka * cos - kb * sin).to(k1.dtype), (kb * cos + ka * sin).to(k1.dtype)
        tl.store(k_slot, _for_pool(k_lo, k_cache_ptr, KV_MAX), mask=kv_mask)
        tl.store(k_slot + HALF, _for_pool(k_hi, k_cache_ptr, KV_MAX), mask=kv_mask)
        v_slot = v_cache_ptr + slot * (KV_HEADS * 2 * HALF) + within
        v_row = v_ptr + token * v_row_stride + within
        tl.store(v_slot, _for_pool(tl.load(v_row, mask=kv_mask), v_cache_ptr, KV_MAX), mask=kv_mask)
        tl.store(v_slot + HALF, _for_pool(tl.load(v_row + HALF, mask=kv_mask), v_cache_ptr, KV_MAX), mask=kv_mask)


@triton.jit
def _normed_halves(a, b, weight_ptr, dims, eps, dtype: tl.constexpr, HALF: tl.constexpr):
    """Each head's halves (rows of a and b, float32) RMS-normed over the whole head and scaled by
    the norm's weight, rounded to `dtype` after each as `_norm_heads` rounds, back in float32."""
    rstd = tl.rsqrt((tl.sum(a * a, axis=1) + tl.sum(b * b, axis=1)) / (2 * HALF) + eps)[:, None]
    w1 = tl.load(weight_ptr + dims).to(tl.float32)[None, :]
    w2 = tl.load(weight_ptr + HALF + dims).to(tl.float32)[None, :]
    a = (a * rstd).to(dtype).to(tl.float32) * w1
    b = (b * rstd).to(dtype).to(tl.float32) * w2
    return a.to(dtype).to(tl.float32), b.to(dtype).to(tl.float32)


@triton.jit
def _key_slots(block_tables_ptr, seq, table_stride, keys, key_ok, PAGE: tl.constexpr):
    """The pool slots of a sequence's `keys` (those `key_ok`), by its block table."""
    block = tl.load(block_tables_ptr + seq * table_stride + keys // PAGE, mask=key_ok, other=0)
    return block.to(tl.int64) * PAGE + keys % PAGE


def _widen_word(pair_cvt: str) -> tl.constexpr:
    """PTX: one 32-bit word of 4 fp8 values ($4) -> 4 fp16 ($0-$3), two values per instruction."""
    return tl.constexpr(
        "{ .reg .b32 lo, hi; .reg .b16 wl, wh; mov.b32 {wl, wh}, $4; "
        f"{pair_cvt} lo, wl; {pair_cvt} hi, wh; mov.b32 {{$0, $1}}, lo; mov.b32 {{$2, $3}}, hi; }}"
    )


_WIDEN_E4M3_WORD = _widen_word("cvt.rn.f16x2.e4m3x2")
_WIDEN_E5M2_WORD = _widen_word("cvt.rn.f16x2.e5m2x2")


@triton.jit
def _fp8_words_as_fp16(cache_ptr, slots, key_ok, kv_head, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                       PTX: tl.constexpr):  # fmt: skip
    """One KV head's rows of an fp8 pool at `slots`, in fp16 (zero where not key_ok).

    Read as 32-bit words of 4 values and widened by hand, so the compiler cannot move the
    widening past the tile's trip through shared memory: there, a value tile that `tl.dot`
    takes transposed would be gathered back one byte at a time (sm_90 has no 8-bit
    `ldmatrix.trans`), where fp16 gets `ldmatrix.trans`. PTX: two values an instruction (CUDA);
    else each byte shifted out and cast (the interpreter runs no PTX; on sm_90 this way takes
    ~40 % more instructions than PTX's: `bench/ptx_census.py`).
    """
    words = tl.arange(0, HEAD_DIM // 4)
    word_ptr = cache_ptr.to(tl.pointer_type(tl.uint32), bitcast=True)
    rows = slots[:, None] * (KV_HEADS * HEAD_DIM // 4) + kv_head * (HEAD_DIM // 4)
    packed = tl.load(word_ptr + rows + words[None, :], mask=key_ok[:, None], other=0)
    fp8 = cache_ptr.dtype.element_ty
    if not PTX:
        v0 = (packed & 0xFF).to(tl.uint8).to(fp8, bitcast=True).to(tl.float16)
        v1 = ((packed >> 8) & 0xFF).to(tl.uint8).to(fp8, bitcast=True).to(tl.float16)
        v2 = ((packed >> 16) & 0xFF).to(tl.uint8).to(fp8, bitcast=True).to(tl.float16)
        v3 = (packed >> 24).to(tl.uint8).to(fp8, bitcast=True).to(tl.float16)
    else:
        if fp8 == tl.float8e5:
            widen: tl.constexpr = _WIDEN_E5M2_WORD
        else:
            widen: tl.constexpr = _WIDEN_E4M3_WORD
        v0, v1, v2, v3 = tl.inline_asm_elementwise(widen, "=h,=h,=h,=h,r", [packed], is_pure=True, pack=1,
                                                   dtype=(tl.float16, tl.float16, tl.float16, tl.float16))  # fmt: skip
    # The four values of each word back in place, value 4j + i being v_i[j]: join appends its
    # pair as the last axis, so [j, a, b] holds the outer join's b-th of the inner a-th values.
    return tl.reshape(tl.join(tl.join(v0, v2), tl.join(v1, v3)), [packed.shape[0], HEAD_DIM])


@triton.jit
def _tile_rows(tile, kv_head, tile_seq_ptr, tile_first_ptr, query_starts_ptr, query_lens_ptr,
               GROUP: tl.constexpr, GROUP_P: tl.constexpr, BLOCK_Q: tl.constexpr):  # fmt: skip
    """A tile's rows: BLOCK_Q query tokens of one sequence x the GROUP_P heads of a KV head."""
    seq = tl.load(tile_seq_ptr + tile)
    first = tl.load(tile_first_ptr + tile)
    q_len = tl.load(query_lens_ptr + seq)
    row0 = tl.load(query_starts_ptr + seq).to(tl.int64)
    rows = tl.arange(0, BLOCK_Q * GROUP_P)
    q_tok = first + rows // GROUP_P
    group_index = rows % GROUP_P
    head = kv_head * GROUP + group_index
    row_ok = (q_tok < q_len) & (group_index < GROUP)
    return seq, first, q_len, row0, q_tok, head, row_ok


@triton.jit
def _soft_capped_log2(dots, scale_log2, CAP: tl.constexpr):
    """log2(e) * CAP * tanh(s / CAP) of the scores s = dots * scale, from scale_log2 = scale * log2(e).

    tanh(x) = 1 - 2 / (e^(2x) + 1): finite for every x (e^(2x) overflowing to inf gives 1,
    underflowing to 0 gives -1), where (e^x - e^-x) / (e^x + e^-x) is inf / inf past |x| ~ 88;
    and Triton's interpreter, which the CPU tests use, runs no libdevice tanh. One exp2 and one
    division more per score than without a cap."""
    tanh = 1.0 - 2.0 / (tl.exp2(dots * scale_log2 * (2.0 / CAP)) + 1.0)
    return tanh * (CAP * 1.4426950408889634)


def _paged_attention(
    q_ptr,  # [T, H, D]
    k_cache_ptr,  # [slots, KV_HEADS, D]
    v_cache_ptr,
    out_ptr,  # [T, H, D]; with SPLITS > 1, the float32 partial outputs [SPLITS, T, H, D]
    partial_ml_ptr,  # with SPLITS > 1: float32 [2, SPLITS, T, H], running max then sum
    arrivals_ptr,  # with MERGE_IN_KERNEL: int32 [tiles, KV_HEADS], zeros between launches
    merged_ptr,  # with MERGE_IN_KERNEL: [T, H, D], where the merged output goes
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
    split_stride,  # with SPLITS > 1: elements between two splits' partial outputs (T * H * D)
    ml_stride_t,  # ... between two tokens' rows of the max/sum partials (H)
    ml_split_stride,  # ... between two splits' max/sum partials (T * H)
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
    SPLITS: tl.constexpr,  # key ranges per tile (program_id 2); 1: no split
    MIN_SPLIT_KEYS: tl.constexpr,  # with SPLITS > 1: the fewest keys of a range (0: ~1/SPLITS of them)
    MERGE_IN_KERNEL: tl.constexpr,  # with SPLITS > 1: the tile's last program merges the partials
    FP16_DOTS: tl.constexpr,  # an fp8 pool under bf16 queries: the dots run in fp16
    V_LOAD: tl.constexpr,  # "plain"; fp8 values to fp16 dots: "words" / "words_ptx" (`_fp8_words_as_fp16`)
    PDL: tl.constexpr,
    SOFTCAP: tl.constexpr,  # scores become SOFTCAP * tanh(scores / SOFTCAP) (Gemma 2); 0.0: none
):
    wait_for_previous_kernel(PDL)
    kv_head = tl.program_id(1)
    seq, first, q_len, row0, q_tok, head, row_ok = _tile_rows(
        tl.program_id(0), kv_head, tile_seq_ptr, tile_first_ptr, query_starts_ptr, query_lens_ptr, GROUP, GROUP_P, BLOCK_Q
    )
    ctx = tl.load(context_lens_ptr + seq)
    dims = tl.arange(0, HEAD_DIM_P)
    dim_ok = dims < HEAD_DIM
    q_rows = (row0 + q_tok)[:, None] * q_stride_t + head[:, None] * q_stride_h
    q = tl.load(q_ptr + q_rows + dims[None, :], mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
    if FP16_DOTS:  # keys, values and probabilities then widen to q's fp16, one instruction per pair
        q = tl.clamp(q.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
    q_pos = ctx - q_len + q_tok  # absolute position of each row's query token

    m_i = tl.full([BLOCK_Q * GROUP_P], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_Q * GROUP_P], tl.float32)
    acc = tl.zeros([BLOCK_Q * GROUP_P, HEAD_DIM_P], tl.float32)

    # Keys this tile can see: up to its last query's position, from its first query's window.
    # A tile of a zero-length sequence (a mixed graph's padding: q_len = ctx = first = 0) gets
    # hi = lo = 0 and no row_ok: it reads no key and writes nothing.
    hi = ctx - q_len + tl.minimum(first + BLOCK_Q, q_len)
    if WINDOW > 0:
        lo = tl.maximum(ctx - q_len + first - WINDOW + 1, 0)
        lo = (lo // BLOCK_N) * BLOCK_N
    else:
        lo = 0
    if SPLITS > 1:
        chunk = tl.maximum(tl.cdiv(tl.cdiv(hi - lo, SPLITS), BLOCK_N) * BLOCK_N, MIN_SPLIT_KEYS)
        lo = lo + tl.program_id(2) * chunk
        hi = tl.minimum(hi, lo + chunk)
    kv_base = kv_head * HEAD_DIM
    for start in range(lo, hi, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        key_ok = keys < hi
        slots = _key_slots(block_tables_ptr, seq, table_stride, keys, key_ok, PAGE)
        kv_offsets = slots[:, None] * (KV_HEADS * HEAD_DIM) + kv_base + dims[None, :]
        kv_mask = key_ok[:, None] & dim_ok[None, :]
        k_raw = tl.load(k_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)
        k = k_raw.to(q.dtype)
        if IEEE:
            scores = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            scores = tl.dot(q, tl.trans(k))
        allowed = key_ok[None, :] & (keys[None, :] <= q_pos[:, None])
        if WINDOW > 0:
            allowed = allowed & (keys[None, :] > q_pos[:, None] - WINDOW)
        # A constexpr branch: a kernel without a cap compiles exactly as it did before caps.
        if SOFTCAP > 0:
            scores = tl.where(allowed, _soft_capped_log2(scores, scale_log2, SOFTCAP), float("-inf"))
        else:
            scores = tl.where(allowed, scores * scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
        p = tl.exp2(scores - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        if V_LOAD != "plain":
            v = _fp8_words_as_fp16(v_cache_ptr, slots, key_ok, kv_head, KV_HEADS, HEAD_DIM, V_LOAD == "words_ptx")
        else:
            v = tl.load(v_cache_ptr + kv_offsets, mask=kv_mask, other=0.0).to(q.dtype)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    o_rows = (row0 + q_tok)[:, None] * o_stride_t + head[:, None] * o_stride_h
    if SPLITS > 1:
        split = tl.program_id(2).to(tl.int64)
        # A range past the context's end writes no output, only its max (-inf) and sum (0).
        written = tl.where(lo < hi, row_ok, False)
        tl.store(out_ptr + split * split_stride + o_rows + dims[None, :], acc, mask=written[:, None] & dim_ok[None, :])
        ml = partial_ml_ptr + split * ml_split_stride + (row0 + q_tok) * ml_stride_t + head
        tl.store(ml, m_i, mask=row_ok)
        tl.store(ml + SPLITS * ml_split_stride, l_i, mask=row_ok)
        if MERGE_IN_KERNEL:
            # Every thread's partials are written before the count says so (release); the
            # last to arrive sees all of them (acquire) and reads them from L2 (.cg).
            tl.debug_barrier()
            arrivals = arrivals_ptr + tl.program_id(0) * KV_HEADS + kv_head
            if tl.atomic_add(arrivals, 1, sem="acq_rel", scope="gpu") == SPLITS - 1:
                tl.store(arrivals, 0)
                _merge_partials(
                    out_ptr, partial_ml_ptr, merged_ptr, row0, q_tok, head, row_ok, o_stride_t, o_stride_h,
                    split_stride, ml_stride_t, ml_split_stride, SPLITS, BLOCK_Q * GROUP_P, HEAD_DIM, HEAD_DIM_P, ".cg",
                )  # fmt: skip
    else:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(
            out_ptr + o_rows + dims[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=row_ok[:, None] & dim_ok[None, :],
        )


@triton.jit
def _merge_partials(
    partial_ptr, partial_ml_ptr, out_ptr, row0, q_tok, head, row_ok, o_stride_t, o_stride_h, split_stride,
    ml_stride_t, ml_split_stride, SPLITS: tl.constexpr, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr,
    HEAD_DIM_P: tl.constexpr, CACHE: tl.constexpr,
):  # fmt: skip
    """Merges one tile's split partials into `out`: each split's output weighted by
    exp2(its max - the max). `CACHE`: the loads' cache modifier."""
    dims = tl.arange(0, HEAD_DIM_P)
    mask = row_ok[:, None] & (dims < HEAD_DIM)[None, :]
    ml = partial_ml_ptr + (row0 + q_tok) * ml_stride_t + head
    o_rows = (row0 + q_tok)[:, None] * o_stride_t + head[:, None] * o_stride_h + dims[None, :]
    m = tl.full([ROWS], float("-inf"), tl.float32)
    for split in tl.static_range(SPLITS):
        m = tl.maximum(m, tl.load(ml + split * ml_split_stride, mask=row_ok, other=float("-inf"), cache_modifier=CACHE))
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    total = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, HEAD_DIM_P], tl.float32)
    for split in tl.static_range(SPLITS):
        m_split = tl.load(ml + split * ml_split_stride, mask=row_ok, other=float("-inf"), cache_modifier=CACHE)
        weight = tl.exp2(m_split - m_safe)
        l_split = tl.load(ml + (SPLITS + split) * ml_split_stride, mask=row_ok, other=0.0, cache_modifier=CACHE)
        total += weight * l_split
        # A range that saw no key (m = -inf, weight 0) wrote no output: nothing to read.
        seen = mask & (m_split > float("-inf"))[:, None]
        partial = tl.load(partial_ptr + split * split_stride + o_rows, mask=seen, other=0.0, cache_modifier=CACHE)
        acc += weight[:, None] * partial
    out = acc / tl.where(total > 0, total, 1.0)[:, None]
    tl.store(out_ptr + o_rows, out.to(out_ptr.dtype.element_ty), mask=mask)


def _combine_splits(
    partial_ptr,  # float32 [SPLITS, T, H, D] unnormalised partial outputs
    partial_ml_ptr,  # float32 [2, SPLITS, T, H]: running max, then running sum
    out_ptr,  # [T, H, D]
    tile_seq_ptr,
    tile_first_ptr,
    query_starts_ptr,
    query_lens_ptr,
    o_stride_t,
    o_stride_h,
    split_stride,
    ml_stride_t,
    ml_split_stride,
    SPLITS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_P: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P: tl.constexpr,
    PDL: tl.constexpr,
):
    """Merges each tile's split partials (`_merge_partials`), a launch after the attention's."""
    wait_for_previous_kernel(PDL)
    _, _, _, row0, q_tok, head, row_ok = _tile_rows(
        tl.program_id(0), tl.program_id(1), tile_seq_ptr, tile_first_ptr, query_starts_ptr, query_lens_ptr,
        GROUP, GROUP_P, BLOCK_Q,
    )  # fmt: skip
    _merge_partials(
        partial_ptr, partial_ml_ptr, out_ptr, row0, q_tok, head, row_ok, o_stride_t, o_stride_h, split_stride,
        ml_stride_t, ml_split_stride, SPLITS, BLOCK_Q * GROUP_P, HEAD_DIM, HEAD_DIM_P, "",
    )  # fmt: skip


store_kv_kernel = triton.jit(_store_kv)
rotary_store_kv_kernel = triton.jit(_rotary_store_kv)
combine_splits_kernel = triton.jit(_combine_splits)
# The table width changes from step to step: specialising on it would recompile mid-serving.
paged_attention_kernel = triton.jit(_paged_attention, do_not_specialize=["table_stride"])


@dataclass(frozen=True)
class Kernels:
    store_kv: object
    rotary_store_kv: object
    paged_attention: object
    combine_splits: object


KERNELS = Kernels(store_kv_kernel, rotary_store_kv_kernel, paged_attention_kernel, combine_splits_kernel)


def kernels_for(device_type: str) -> Kernels:
    """The kernels above, for tensors on `device_type`.

    CPU tensors work only under Triton's interpreter, which Triton switches on when
    TRITON_INTERPRET=1 is set before it is first imported (the CPU tests do that).
    """
    if device_type != "cuda" and not triton.knobs.runtime.interpret:
        raise RuntimeError("the triton attention backend needs a CUDA device (or TRITON_INTERPRET=1 on CPU)")
    return KERNELS
