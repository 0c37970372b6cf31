"""Every Triton kernel compiles for Hopper (sm_90) at the 8B model's shapes, with no GPU.

The CPU tests run the kernels through Triton's interpreter, which accepts code the compiler
rejects (a branch that reshapes a variable, say). Compiling ahead for an H200 target here
catches that in CI instead of on the GPU machine. Each case compiles in a child process with
the interpreter off: once Triton is imported in interpreter mode its kernels cannot compile.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

REPO = Path(__file__).resolve().parents[2]
FLOATS = {"scale_log2", "eps", "pre_eps"}  # every other scalar argument is an integer
METADATA = {name: "*i32" for name in ("slots_ptr", "tile_seq_ptr", "tile_first_ptr", "query_starts_ptr",
                                      "query_lens_ptr", "context_lens_ptr", "block_tables_ptr")}  # fmt: skip
LLAMA_8B = dict(KV_HEADS=8, GROUP=4, GROUP_P=4, PAGE=16, HEAD_DIM=128, HEAD_DIM_P=128, IEEE=False, WINDOW=0,
                FP16_DOTS=False, V_LOAD="plain", SOFTCAP=0.0)
SPLIT = dict(METADATA, out_ptr="*fp32", partial_ml_ptr="*fp32", arrivals_ptr="*i32")
# The attention kernel's switches a case leaves out: off, as the shipped launches pass them.
ATTENTION_SWITCHES = dict(MIN_SPLIT_KEYS=0, MERGE_IN_KERNEL=False)
FP8_POOL = {"k_cache_ptr": "*fp8e4nv", "v_cache_ptr": "*fp8e4nv"}  # --kv-cache-dtype fp8_e4m3fn
SKINNY = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=256)
FP8_WEIGHT = {"w_ptr": "*fp8e4nv", "w_scale_ptr": "*fp32"}
NORM = dict(N=4096, BLOCK=4096, PRE_NORM=False, HAS_RESIDUAL=True, FP8_MAX=448.0, TINY=1e-12)

BLOCK_FP8 = {"w_ptr": "*fp8e4nv", "scale_ptr": "*fp32", "row_block_ptr": "*i32"}
BLOCK_FP8_ROWS = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=128, FP8_ROWS=False, FP16_DOT=False, TRIPS=1, SPLIT_K=1)

# name: (module, kernel, constexprs, pointer types other than bf16)
MOE_POINTERS = {"w_scale_ptr": "*fp32", "sorted_pairs_ptr": "*i32", "block_expert_ptr": "*i32"}
PACKED_MOE_POINTERS = {"q_ptr": "*i32", "zeros_ptr": "*i16", "scales_ptr": "*fp16", "g_idx_ptr": "*i32",
                       "sorted_pairs_ptr": "*i32", "block_expert_ptr": "*i32"}  # fmt: skip
ALIGN_POINTERS = {"ids_ptr": "*i64", "sorted_ptr": "*i32", "block_expert_ptr": "*i32"}
CASES = {
    "store_kv": ("shard_server.attention.triton_kernels", "store_kv_kernel",
                 dict(WIDTH=1024, WIDTH_P=1024, KV_MAX=0.0), METADATA),  # fmt: skip
    "store_kv_fp8": ("shard_server.attention.triton_kernels", "store_kv_kernel",
                     dict(WIDTH=1024, WIDTH_P=1024, KV_MAX=448.0), dict(METADATA, **FP8_POOL)),  # fmt: skip
    "rotary_store_kv": (
        "shard_server.attention.triton_kernels",
        "rotary_store_kv_kernel",
        dict(Q_HEADS=32, Q_HEADS_P=32, KV_HEADS=8, KV_HEADS_P=8, HALF=64, KV_MAX=0.0),
        dict(METADATA, positions_ptr="*i64"),
    ),
    "rotary_store_kv_fp8_e5m2": (
        "shard_server.attention.triton_kernels",
        "rotary_store_kv_kernel",
        dict(Q_HEADS=32, Q_HEADS_P=32, KV_HEADS=8, KV_HEADS_P=8, HALF=64, KV_MAX=57344.0),
        dict(METADATA, positions_ptr="*i64", k_cache_ptr="*fp8e5", v_cache_ptr="*fp8e5"),
    ),
    "decode_attention_fp8": ("shard_server.attention.triton_kernels", "paged_attention_kernel",
                             dict(LLAMA_8B, BLOCK_Q=4, BLOCK_N=128, SPLITS=16, FP16_DOTS=True), dict(SPLIT, **FP8_POOL)),  # fmt: skip
    "decode_attention_fp8_words": ("shard_server.attention.triton_kernels", "paged_attention_kernel",
                                   dict(LLAMA_8B, BLOCK_Q=4, BLOCK_N=128, SPLITS=1, FP16_DOTS=True, V_LOAD="words_ptx"),
                                   dict(METADATA, **FP8_POOL)),  # fmt: skip
    "decode_attention_fp8_e5m2_words": ("shard_server.attention.triton_kernels", "paged_attention_kernel",
                                        dict(LLAMA_8B, BLOCK_Q=4, BLOCK_N=64, SPLITS=4, FP16_DOTS=True, V_LOAD="words_ptx"),
                                        dict(SPLIT, k_cache_ptr="*fp8e5", v_cache_ptr="*fp8e5")),  # fmt: skip
    "prefill_attention_fp8": ("shard_server.attention.triton_kernels", "paged_attention_kernel",
                              dict(LLAMA_8B, BLOCK_Q=32, BLOCK_N=64, SPLITS=1, FP16_DOTS=True), dict(METADATA, **FP8_POOL)),  # fmt: skip
    "decode_attention": ("shard_server.attention.triton_kernels", "paged_attention_kernel",
                         dict(LLAMA_8B, BLOCK_Q=4, BLOCK_N=64, SPLITS=1), METADATA),  # fmt: skip
    "split_decode_attention": ("shard_server.attention.triton_kernels", "paged_attention_kernel",
                               dict(LLAMA_8B, BLOCK_Q=4, BLOCK_N=64, SPLITS=16), SPLIT),  # fmt: skip
    "prefill_attention": ("shard_server.attention.triton_kernels", "paged_attention_kernel",
                          dict(LLAMA_8B, BLOCK_Q=32, BLOCK_N=64, SPLITS=1), METADATA),  # fmt: skip
    # Gemma 2's attention logit soft-capping (50.0 in its configs), in decode and prefill tiles.
    "split_decode_attention_softcap": ("shard_server.attention.triton_kernels", "paged_attention_kernel",
                                       dict(LLAMA_8B, BLOCK_Q=4, BLOCK_N=64, SPLITS=16, SOFTCAP=50.0), SPLIT),  # fmt: skip
    "prefill_attention_softcap": ("shard_server.attention.triton_kernels", "paged_attention_kernel",
                                  dict(LLAMA_8B, BLOCK_Q=32, BLOCK_N=64, SPLITS=1, SOFTCAP=50.0), METADATA),  # fmt: skip
    "combine_splits": (
        "shard_server.attention.triton_kernels",
        "combine_splits_kernel",
        dict(SPLITS=16, GROUP=4, GROUP_P=4, BLOCK_Q=4, HEAD_DIM=128, HEAD_DIM_P=128),
        dict(METADATA, partial_ptr="*fp32", partial_ml_ptr="*fp32"),
    ),
    "add_rmsnorm": ("shard_server.kernels.norm", "_add_rmsnorm_kernel",
                    dict(NORM, QUANT=False), {"scale_ptr": "*fp32"}),  # fmt: skip
    "add_rmsnorm_fp8_rows": ("shard_server.kernels.norm", "_add_rmsnorm_kernel",
                             dict(NORM, QUANT=True), {"out_ptr": "*fp8e4nv", "scale_ptr": "*fp32"}),  # fmt: skip
    # Gemma 2 9B: a sublayer's post-norm, the residual add and the next pre-norm in one pass.
    "post_norm_add_rmsnorm": ("shard_server.kernels.norm", "_add_rmsnorm_kernel",
                              dict(NORM, N=3584, PRE_NORM=True, QUANT=False), {"scale_ptr": "*fp32"}),  # fmt: skip
    **{name: ("shard_server.kernels.activation", "_act_mul_kernel", dict(BLOCK=1024, GELU=gelu), {})
       for name, gelu in (("silu_mul", False), ("gelu_tanh_mul", True))},  # fmt: skip
    **{f"{name}_fp8_rows_block{block}": ("shard_server.kernels.activation", "_act_mul_quant_kernel",
                                         dict(BLOCK=block, WHOLE_ROW=block > 1024, FP8_MAX=448.0, TINY=1e-12, GELU=gelu),
                                         {"out_ptr": "*fp8e4nv", "scale_ptr": "*fp32"})
       for block in (1024, 16384) for name, gelu in (("silu_mul", False), ("gelu_tanh_mul", True))},  # fmt: skip
    **{f"greedy_chunks{'_masked' if masked else ''}": (
        "shard_server.kernels.greedy", "_chunk_stats_kernel", dict(CHUNK=4096, CHUNKS_P=32, MASKED=masked),
        {"max_ptr": "*fp32", "arg_ptr": "*i32", "sum_ptr": "*fp32", "bits_ptr": "*i32", "slot_ptr": "*i32"})
       for masked in (False, True)},  # fmt: skip
    "greedy_merge": ("shard_server.kernels.greedy", "_merge_kernel", dict(CHUNKS=32, CHUNKS_P=32),
                     {"max_ptr": "*fp32", "arg_ptr": "*i32", "sum_ptr": "*fp32", "ids_ptr": "*i64",
                      "logprobs_ptr": "*fp32"}),  # fmt: skip
    "skinny_matmul": ("shard_server.kernels.skinny_matmul", "_skinny_matmul_kernel",
                      dict(SKINNY, W_SCALED=False, X_SCALED=False, FP16_DOT=False, SPLIT_K=1), {}),  # fmt: skip
    "skinny_matmul_fp8_weights": ("shard_server.kernels.skinny_matmul", "_skinny_matmul_kernel",
                                  dict(SKINNY, W_SCALED=True, X_SCALED=False, FP16_DOT=False, SPLIT_K=1), FP8_WEIGHT),  # fmt: skip
    "skinny_matmul_fp8_weights_fp16_dot": ("shard_server.kernels.skinny_matmul", "_skinny_matmul_kernel",
                                           dict(SKINNY, W_SCALED=True, X_SCALED=False, FP16_DOT=True, SPLIT_K=1), FP8_WEIGHT),
    # W8A16 int8 weights at decode batch sizes, in the fp8 weights' config.
    "skinny_matmul_int8_weights": ("shard_server.kernels.skinny_matmul", "_skinny_matmul_kernel",
                                   dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=256, W_SCALED=True, X_SCALED=False,
                                        FP16_DOT=True, SPLIT_K=4), {"w_ptr": "*i8", "w_scale_ptr": "*fp32"}),  # fmt: skip
    # Block-scaled fp8 weights (DeepSeek / Qwen3-FP8) at decode batch sizes: widened to the rows'
    # dtype, or to fp16 with K split (the shipped tables' tiles: `check_block_fp8_tiles`).
    "block_fp8_rows": ("shard_server.kernels.block_fp8_matmul", "_block_fp8_kernel", BLOCK_FP8_ROWS, BLOCK_FP8),
    "block_fp8_rows_fp16_split_pdl": ("shard_server.kernels.block_fp8_matmul", "_block_fp8_kernel",
                                      dict(BLOCK_FP8_ROWS, FP16_DOT=True, SPLIT_K=4, PDL=True), BLOCK_FP8),  # fmt: skip
    # The shipped fp8-weight config (`FP8_WEIGHTS`): 128 features, four key ranges.
    "skinny_matmul_fp8_weights_split": ("shard_server.kernels.skinny_matmul", "_skinny_matmul_kernel",
                                        dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=256, W_SCALED=True, X_SCALED=False,
                                             FP16_DOT=True, SPLIT_K=4), FP8_WEIGHT),  # fmt: skip
    # fp8 rows x fp8 weights in 64-row tiles (`fp8_rows_product`), every config of its table.
    **{f"fp8_rows_gemm_n{n}_k{k}": ("shard_server.kernels.skinny_matmul", "_skinny_matmul_kernel",
                                    dict(BLOCK_M=64, BLOCK_N=n, BLOCK_K=k, W_SCALED=True, X_SCALED=True, FP16_DOT=False,
                                         SPLIT_K=1),
                                    dict(FP8_WEIGHT, x_ptr="*fp8e4nv", x_scale_ptr="*fp32"))
       for n, k in ((32, 256), (64, 256), (64, 128), (128, 128))},
    # ... split over K (float32 partials, then summed): measured next against the table's.
    "fp8_rows_gemm_split_k4": ("shard_server.kernels.skinny_matmul", "_skinny_matmul_kernel",
                               dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=256, W_SCALED=True, X_SCALED=True,
                                    FP16_DOT=False, SPLIT_K=4),
                               dict(FP8_WEIGHT, x_ptr="*fp8e4nv", x_scale_ptr="*fp32", out_ptr="*fp32")),
    "fp8_rows_gemm_tile128": ("shard_server.kernels.skinny_matmul", "_skinny_matmul_kernel",
                              dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=256, W_SCALED=True, X_SCALED=True,
                                   FP16_DOT=False, SPLIT_K=1),
                              dict(FP8_WEIGHT, x_ptr="*fp8e4nv", x_scale_ptr="*fp32")),
    "sum_splits": ("shard_server.kernels.skinny_matmul", "_sum_splits_kernel", dict(SPLITS=4, BLOCK=1024),
                   {"partial_ptr": "*fp32"}),
    "quantize_groups_fp8": ("shard_server.kernels.block_fp8_cublas", "_quantize_groups_kernel",
                            dict(FP8_MAX=448.0, TINY=1e-12, GROUP=128, GROUPS=8), {"out_ptr": "*fp8e4nv",
                                                                                     "scale_ptr": "*fp32"}),  # fmt: skip
    "quantize_rows_fp8": ("shard_server.kernels.fp8_matmul", "_quantize_rows_kernel",
                          dict(FP8_MAX=448.0, TINY=1e-12, BLOCK=1024), {"out_ptr": "*fp8e4nv", "scale_ptr": "*fp32"}),
    "rotary": ("shard_server.kernels.rotary", "_rotary_kernel",
               dict(Q_HEADS=32, Q_HEADS_P=32, K_HEADS=8, K_HEADS_P=8, HALF=64, HALF_P=64), {"positions_ptr": "*i64"}),  # fmt: skip
    # Phi-4-mini's partial rotary: 96 of 128 dims rotate, a masked half of 48 in 64 lanes.
    "rotary_partial": ("shard_server.kernels.rotary", "_rotary_kernel",
                       dict(Q_HEADS=24, Q_HEADS_P=32, K_HEADS=8, K_HEADS_P=8, HALF=48, HALF_P=64),
                       {"positions_ptr": "*i64"}),  # fmt: skip
    # 8-bit weights widened in one pass for many-row products: block-wise fp8, W8A16 int8.
    "dequantize_block_fp8": ("shard_server.kernels.dequantize", "_dequantize_kernel",
                             dict(BLOCKED=True, BLOCK_N=64, BLOCK_K=128),
                             {"w_ptr": "*fp8e4nv", "scale_ptr": "*fp32", "row_block_ptr": "*i32", "col_block_ptr": "*i32"}),
    "dequantize_int8_rows": ("shard_server.kernels.dequantize", "_dequantize_kernel",
                             dict(BLOCKED=False, BLOCK_N=64, BLOCK_K=128), {"w_ptr": "*i8", "scale_ptr": "*fp32"}),
    # MoE: the grouped GEMMs (bf16 experts, fp8 ones with row or block scales), the one-program
    # alignment and the routing.
    "moe_gate_up": ("shard_server.kernels.fused_moe", "_moe_gemm_kernel",
                    dict(GATE_UP=True, SCALES=None, BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, GROUP_M=1, PRECISION=None),
                    MOE_POINTERS),  # fmt: skip
    "moe_down_fp8_experts": ("shard_server.kernels.fused_moe", "_moe_gemm_kernel",
                             dict(GATE_UP=False, SCALES="row", BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8,
                                  PRECISION=None),
                             dict(MOE_POINTERS, w_ptr="*fp8e4nv")),  # fmt: skip
    "moe_gate_up_block_fp8_experts": ("shard_server.kernels.fused_moe", "_moe_gemm_kernel",
                                      dict(GATE_UP=True, SCALES="block", BLOCK_M=16, BLOCK_N=64, BLOCK_K=128,
                                           GROUP_M=1, PRECISION=None),
                                      dict(MOE_POINTERS, w_ptr="*fp8e4nv")),  # fmt: skip
    "moe_down_block_fp8_experts": ("shard_server.kernels.fused_moe", "_moe_gemm_kernel",
                                   dict(GATE_UP=False, SCALES="block", BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8,
                                        PRECISION=None),
                                   dict(MOE_POINTERS, w_ptr="*fp8e4nv")),  # fmt: skip
    # Packed (GPTQ / AWQ) experts: two values at a time in one group a tile, act-order gathers, 8 bits.
    "moe_packed_gate_up_pairs": ("shard_server.kernels.fused_moe_packed", "_moe_packed_kernel",
                                 dict(GATE_UP=True, BITS=4, BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, GROUP_M=1,
                                      TILE_GROUP=True, PAIRS_DQ=True, IEEE=False, ASM=True), PACKED_MOE_POINTERS),  # fmt: skip
    "moe_packed_down_gathered": ("shard_server.kernels.fused_moe_packed", "_moe_packed_kernel",
                                 dict(GATE_UP=False, BITS=4, BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8,
                                      TILE_GROUP=False, PAIRS_DQ=False, IEEE=False, ASM=True), PACKED_MOE_POINTERS),  # fmt: skip
    "moe_packed_gate_up_8bit_fp16": ("shard_server.kernels.fused_moe_packed", "_moe_packed_kernel",
                                     dict(GATE_UP=True, BITS=8, BLOCK_M=32, BLOCK_N=64, BLOCK_K=128, GROUP_M=4,
                                          TILE_GROUP=True, PAIRS_DQ=False, IEEE=False, ASM=True),
                                     dict(PACKED_MOE_POINTERS, a_ptr="*fp16", out_ptr="*fp16")),  # fmt: skip
    # ... and a decode batch's pairs, one row each on the CUDA cores (4 bits near the top, 8 exact).
    "moe_packed_pairs_gate_up": ("shard_server.kernels.moe_pairs_packed", "_packed_pairs_kernel",
                                 dict(GATE_UP=True, BITS=4, BLOCK_N=32, WORDS=16, NEAR_TOP=True, ASM=True),
                                 dict(PACKED_MOE_POINTERS, ids_ptr="*i64", weights_ptr="*fp32")),  # fmt: skip
    "moe_packed_pairs_down_8bit": ("shard_server.kernels.moe_pairs_packed", "_packed_pairs_kernel",
                                   dict(GATE_UP=False, BITS=8, BLOCK_N=32, WORDS=16, NEAR_TOP=False, ASM=True),
                                   dict(PACKED_MOE_POINTERS, ids_ptr="*i64", weights_ptr="*fp32")),  # fmt: skip
    "moe_align_sorted": ("shard_server.kernels.moe_align", "_align_sorted_kernel",
                         dict(BLOCK_M=16, EXPERTS_POW2=128, PAIRS_POW2=256, CHUNK=128), ALIGN_POINTERS),
    "moe_align_chunk_counts": ("shard_server.kernels.moe_align", "_chunk_counts_kernel",
                               dict(EXPERTS_POW2=128, CHUNK=128), {"ids_ptr": "*i64", "counts_ptr": "*i32"}),
    "moe_align_chunk_layout": ("shard_server.kernels.moe_align", "_chunk_layout_kernel",
                               dict(BLOCK_M=128, EXPERTS_POW2=128, ROWS=32, CHUNK=128),
                               {"counts_ptr": "*i32", "chunk_base_ptr": "*i32", "group_start_ptr": "*i32",
                                "block_expert_ptr": "*i32"}),
    "moe_align_chunk_scatter": ("shard_server.kernels.moe_align", "_chunk_scatter_kernel", dict(CHUNK=128),
                                {"ids_ptr": "*i64", "chunk_base_ptr": "*i32", "group_start_ptr": "*i32",
                                 "sorted_ptr": "*i32"}),
    "moe_weighted_sum": ("shard_server.kernels.fused_moe", "_weighted_sum_kernel", dict(TOP_K=8, BLOCK_H=1024),
                         {"weights_ptr": "*fp32"}),
    "moe_route": ("shard_server.kernels.moe_routing", "_route_kernel",
                  dict(TOP_K=8, EXPERTS_POW2=128, K_POW2=8, RENORMALIZE=True),
                  {"weights_ptr": "*fp32", "ids_ptr": "*i64"}),  # fmt: skip
}
# Every kernel of a decode layer, launched with programmatic dependent launch (`kernels/pdl.py`).
PDL_CASES = ["add_rmsnorm_fp8_rows", "rotary_store_kv", "store_kv", "decode_attention", "split_decode_attention",
             "combine_splits", "silu_mul", "silu_mul_fp8_rows_block16384", "quantize_rows_fp8", "quantize_groups_fp8",
             "fp8_rows_gemm_n64_k256", "sum_splits", "skinny_matmul_fp8_weights_fp16_dot",
             "skinny_matmul_fp8_weights_split"]  # fmt: skip
CASES.update({f"{name}_pdl": (*CASES[name][:2], dict(CASES[name][2], PDL=True), CASES[name][3]) for name in PDL_CASES})
# ... and the matmul asking L2 for its weights first (fp8: 128 per line, bf16: 64).
CASES["fp8_rows_gemm_prefetch_pdl"] = (*CASES["fp8_rows_gemm_n64_k256"][:2],
                                       dict(CASES["fp8_rows_gemm_n64_k256"][2], PDL=True, PREFETCH_W=True, W_LINE=128),
                                       CASES["fp8_rows_gemm_n64_k256"][3])  # fmt: skip
CASES["skinny_matmul_prefetch_pdl"] = (*CASES["skinny_matmul"][:2],
                                       dict(CASES["skinny_matmul"][2], PDL=True, PREFETCH_W=True, W_LINE=64),
                                       CASES["skinny_matmul"][3])  # fmt: skip


def compile_for_hopper(name: str, aligned: bool = False, **options):
    """Compiles one case for an sm_90 target (raises if the compiler refuses). `aligned`: the
    pointers, strides and sizes 16-divisible, as Triton specialises a real launch on them
    (`bench/ptx_census.py` reads the code a launch would run); `options`: num_warps, num_stages."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    module, attribute, constants, pointers = CASES[name]
    kernel = getattr(importlib.import_module(module), attribute)
    if "MERGE_IN_KERNEL" in kernel.arg_names:
        constants = {**ATTENTION_SWITCHES, **constants}
    if "PDL" in kernel.arg_names:  # programmatic dependent launch: off unless the case says
        constants = {"PDL": False, **constants}
    if "PREFETCH_W" in kernel.arg_names:
        constants = {"PREFETCH_W": False, "W_LINE": 128, **constants}
    signature, attrs = {}, {}
    for index, arg in enumerate(kernel.arg_names):
        if arg in constants:
            signature[arg] = "constexpr"
            continue
        if arg.endswith("_ptr"):
            signature[arg] = pointers.get(arg, "*bf16")
        else:
            signature[arg] = "fp32" if arg in FLOATS else "i32"
        sizes = ("M", "N", "K", "first", "width")  # first, width: block fp8's column blocks (128 on an 8B)
        if aligned and (arg.endswith("_ptr") or "stride" in arg or arg in sizes) and arg != "table_stride":
            attrs[(index,)] = [["tt.divisibility", 16]]
    source = ASTSource(fn=kernel, signature=signature, constexprs=constants, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options or None), constants


def compile_case(name: str) -> None:
    """In the child: compiles one case and checks what its PTX must hold."""
    compiled, constants = compile_for_hopper(name)
    assert compiled.asm["ptx"], name
    # With PDL the kernel waits for the previous one before anything else, then releases the next.
    waits = compiled.asm["ptx"].count("griddepcontrol.wait")
    assert waits == (1 if constants.get("PDL") else 0), (name, waits)
    assert ("prefetch.global.L2" in compiled.asm["ptx"]) == constants.get("PREFETCH_W", False), name


def check_block_fp8_tiles() -> None:
    """In the child: each tile of block fp8's tables compiles as launched (its warps and stages;
    the 8B's sizes, 16-aligned), its weight loads pipelined into shared-memory buffers (cp.async)
    across the one K loop: GEMM_TILES' to e4m3 x e4m3 wgmma (num_stages buffers), ROWS_TILES'
    (bf16 rows, the weight widened to bf16 or, `fp16_dot`, both to fp16) to mma.sync (num_stages
    - 1); unaligned, each still compiles."""
    from shard_server.kernels.block_fp8_matmul import GEMM_TILES, ROWS_TILES

    launches = [(tile, True, False) for _, tile in GEMM_TILES]
    launches += [(tile, False, fp16) for _, tile in ROWS_TILES for fp16 in (False, True)]
    for tile, fp8_rows, fp16_dot in launches:
        name = (f"block_fp8_{'gemm' if fp8_rows else 'rows'}{'_fp16' if fp16_dot else ''}_m{tile.block_m}"
                f"_n{tile.block_n}_k{tile.block_k}_split{tile.split_k}")  # fmt: skip
        constants = dict(BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, FP8_ROWS=fp8_rows,
                         FP16_DOT=fp16_dot, TRIPS=1, SPLIT_K=tile.split_k)  # fmt: skip
        pointers = dict(BLOCK_FP8, x_ptr="*fp8e4nv", x_scale_ptr="*fp32") if fp8_rows else BLOCK_FP8
        CASES[name] = ("shard_server.kernels.block_fp8_matmul", "_block_fp8_kernel", constants, pointers)
        compile_case(name)
        compiled, _ = compile_for_hopper(name, aligned=True, num_warps=tile.num_warps, num_stages=tile.num_stages)
        ptx, ttgir = compiled.asm["ptx"], compiled.asm["ttgir"]
        if fp8_rows:
            mma = r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k32\.f32\.e4m3\.e4m3"
        else:
            mma = rf"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.{'f16' if fp16_dot else 'bf16'}"
        assert re.search(mma, ptx), f"{name}: no {mma}"
        assert "cp.async" in ptx, f"{name}: loads not asynchronous"
        # wgmma reads its operands from the num_stages buffers; mma.sync loads each into registers
        # (widened there) a stage ahead, so num_stages - 1 are in flight (as the skinny kernel's).
        stages = tile.num_stages if fp8_rows else tile.num_stages - 1
        buffers = f"!ttg.memdesc<{stages}x{tile.block_n}x{tile.block_k}xf8E4M3FN"
        assert buffers in ttgir, f"{name}: weight tiles not in {stages} buffers"


@pytest.mark.parametrize("name", sorted(CASES))
def test_kernel_compiles_for_hopper(name):
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, __file__, name], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_block_fp8_tiles_multiply_on_tensor_cores_with_pipelined_loads():
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, __file__, "--block-fp8-tiles"], env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


if __name__ == "__main__":
    check_block_fp8_tiles() if sys.argv[1] == "--block-fp8-tiles" else compile_case(sys.argv[1])
