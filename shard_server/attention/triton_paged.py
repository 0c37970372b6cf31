"""The `triton` attention backend: Triton kernels over the shared paged KV layout.

Per step, the host packs everything the kernels need into one int32 buffer (one copy to
the device): the slot of each new token, each sequence's query start, query length,
context length and block table, and the list of query tiles. Sequences with few query
tokens (decodes, tiny chunks) go to a launch with small tiles, longer prefill chunks to a
launch with 128-row tiles; both run the same kernel.

A step can be padded to a fixed batch (`pad_to`) and table width so its metadata has fixed
shapes: CUDA graphs capture a decode step once and `refill` rewrites the buffer in place.
A mixed step (prefill chunks beside decodes) is padded too, given a token bucket (`tokens`):
its token rows pad to `tokens` (slot -1, in no tile), its sequences to `pad_to` with
zero-length padding sequences, and each launch's tile list to a count fixed by the bucket
(`mixed_tile_counts`), the padding tiles pointing at the last, zero-length sequence.
A padded (graph) step, decode or mixed, of few sequences splits the keys of each small tile
(decodes, speculative verifications) over several programs (split-KV) so that the whole GPU
works on a small batch. Eager steps never split: their batch shapes vary, and each split
count is a kernel variant compiled on first use.

Rotary, when the step passes it, is fused into the KV store.

A long fresh prompt (no cached prefix, in an eager step) skips the paged kernel for torch's
dense causal SDPA (`dense_prefill.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from ..device_copy import copy_into, host_to_device
from ..kernels.pdl import launch_args
from ..kv_cache import fp8_max, is_fp8
from .base import AttentionBackend, AttentionShape, StepLayout
from .dense_prefill import DENSE_PREFILL_MIN_TOKENS, DenseBatch, DensePrefill
from .triton_packing import PackedStep, TilePlan, aligned, pack_step
from .triton_kernels import kernels_for

LOG2_E = 1.4426950408889634
# Split-KV: a decode graph splits each sequence's keys into ranges (one program each, per KV
# head), each range a share of that sequence's own context. Unsplit, a batch's longest
# sequence ran as one program a head and set the attention's time in every layer: under the
# Poisson workloads' lengths (a few contexts past 2,000 among ~360 on average) batch 64
# replayed in 7.18 ms against 5.69 with every context at the mean. Aiming at 4,096 programs,
# at most 8 ranges: batch 64 6.17 ms, 32 6.93 -> 5.65, 96 7.66 -> 6.70, 128 8.53 -> 7.40,
# 256 12.08 -> 11.28; fp8 batch 64 6.27 -> 5.03 (H200, random 8B,
# bench/results/gpu_decode_skew_h200.json), for +0.1-0.6 ms where every context is equal.
SPLIT_TARGET_PROGRAMS = 4096
MAX_SPLITS = 8
# ... except a launch too small to give every SM a program: batch 1 (8 KV heads) takes 16.
MIN_PROGRAMS = 128
# A mixed graph's small tiles take `split_count` over the bucket's capacity in tiles (up to one
# per token), not over the decodes a step runs: 4 key ranges for the 64-token bucket, 2 for 128
# and 192, 1 from 256, where a decode graph of 8-64 sequences takes 8; so a mixed step's decodes
# attend with fewer ranges than a decode step's (bench/results/pacing_h100_stop59.md). Yet that
# rule wins: 8 ranges for every mixed graph made its steps 0.4-2.4 ms slower (H100, 8B, 32-200
# decodes beside 64-700 prompt tokens, bench/results/kernel_profile_mixed_splits_h100.md), the
# padding tiles' idle programs (~2 ns of the launch each) costing more than the split saves.
# None: that rule; a number: that many ranges for every mixed graph (gpu_kernel_profile --mixed-splits).
MIXED_SPLITS: int | None = None
# The fewest keys of a range: a context shorter than SPLITS of them takes fewer ranges (the
# programs of the others read nothing and write no partial output). 0: every context takes
# SPLITS ranges of its own length / SPLITS.
MIN_SPLIT_KEYS = 0
MAX_SPLITS_SMALL = 16
# The last program of a split tile merges the partials itself (`triton_kernels.py`), instead of
# a `combine_splits` launch after the attention's (2.5 us a layer on an H100). Off: measured
# slower. It passes the CUDA tests, but the attention launch grows by more than the combine
# it saves (batch 1, context 1024, 32 layers: 222 + 81 us -> 336 us; the step 5.979 -> 5.994
# ms, three runs each; batch 8 level; bench/results/kernel_profile_merge_in_kernel_h100.json).
MERGE_SPLITS_IN_KERNEL = False
# Decode launches over an fp8 pool with this many programs (tiles x KV heads x splits) take the
# light word-read tile (`small_fp8_words`): the band where it measured faster on an H200, from
# batch 80 (640 programs) to the batch-96 graph of the mix's batch-77 phase (768), both
# unsplit then. Split as now, those batches launch 2,560-3,072 programs (the wide tile) and
# the band holds batch 8 alone (512); retuning the tiles for split launches is open.
WORDS_LIGHT_PROGRAMS = range(512, 769)
# A sequence of up to this many query tokens runs on small tiles, ceil(q / block_q) of them
# (each reads the context): decodes, and speculative verifications (1 + k tokens), whose keys
# then split like a decode's. On a large tile a verification read its whole context with one
# program per KV head, unsplit (8 programs on the GPU at batch 1 on an 8B).
SMALL_TILE_QUERY_TOKENS = 8


@dataclass(frozen=True)
class TileConfig:
    block_q: int  # query tokens per tile
    block_n: int  # keys per inner iteration
    num_warps: int
    num_stages: int


@dataclass
class TileLaunch:
    config: TileConfig
    tile_seq: torch.Tensor
    tile_first: torch.Tensor

    @property
    def num_tiles(self) -> int:
        return self.tile_seq.shape[0]


@dataclass
class TritonMetadata:
    packed: torch.Tensor  # the one int32 buffer all views below live in
    slot_mapping: torch.Tensor  # [T]; -1 for padding tokens
    query_starts: torch.Tensor  # [B]
    query_lens: torch.Tensor
    context_lens: torch.Tensor
    block_tables: torch.Tensor  # [B, width]
    launches: list[TileLaunch]
    pad_to: int | None
    width: int
    splits: int = 1  # key ranges per small (decode) tile
    arrivals: torch.Tensor | None = None  # merged in the kernel: int32 [small tiles, KV heads], zeros
    tokens: int | None = None  # a mixed graph's token bucket: rows padded to it, fixed tile counts
    dense_rows: tuple[tuple[int, int], ...] = ()  # (first row, length) of each dense-path prompt
    dense_batches: tuple[DenseBatch, ...] = ()  # those prompts as the dense path batches them


def split_count(tiles: int, kv_heads: int) -> int:
    """Key ranges per decode tile: a power of two that brings tiles x heads x splits near the
    target, at most MAX_SPLITS; up to MAX_SPLITS_SMALL while under MIN_PROGRAMS."""
    programs, splits = tiles * kv_heads, 1
    while splits < MAX_SPLITS and programs * splits * 2 <= SPLIT_TARGET_PROGRAMS:
        splits *= 2
    while splits < MAX_SPLITS_SMALL and programs * splits < MIN_PROGRAMS:
        splits *= 2
    return splits


def small_tile_tokens(small: TileConfig) -> int:
    """The most query tokens of a sequence that runs on small tiles."""
    return max(small.block_q, SMALL_TILE_QUERY_TOKENS)


def mixed_tile_counts(small: TileConfig, large: TileConfig, tokens: int, seqs: int) -> tuple[int, int]:
    """Fixed (small, large) tile counts of a mixed step of <= `tokens` tokens over `seqs`
    sequence rows (the last a padding one). Small tiles: each holds a real token, and a
    sequence of S = small_tile_tokens or fewer takes at most ceil(S / block_q); plus a padding
    tile. Large tiles: sum(ceil(q / L)) < tokens / L + n over the n sequences longer than S,
    n <= tokens // (S + 1); none in a bucket of S tokens or fewer, which then launches no
    large tiles at all: that launch of padding tiles alone took ~5.4 us a layer in a batch-1
    verification (H100, 8B, bench/results/kernel_profile_verify_h100.json)."""
    most = small_tile_tokens(small)
    per_sequence = -(-most // small.block_q)
    longer = min(seqs - 1, tokens // (most + 1))
    large_tiles = -(-tokens // large.block_q) + longer if tokens > most else 0
    return min(tokens, (seqs - 1) * per_sequence) + 1, large_tiles


def _next_power_of_two(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, n))))


class TritonPagedAttention(AttentionBackend):
    name = "triton"
    cuda_graphs = True

    def __init__(self, shape: AttentionShape, dense_min_tokens: int | None = DENSE_PREFILL_MIN_TOKENS):
        """`dense_min_tokens`: the shortest fresh prompt that takes the dense path; None: none does."""
        if shape.num_heads % shape.num_kv_heads:
            raise ValueError(f"{shape.num_heads} query heads do not split over {shape.num_kv_heads} KV heads")
        super().__init__(shape)
        # Torch's SDPA has no hook for soft-capping: capped scores stay on the paged kernel.
        self.dense = DensePrefill(shape, None if shape.logit_softcap is not None else dense_min_tokens)
        self.group = shape.num_heads // shape.num_kv_heads
        self.group_p = _next_power_of_two(self.group)
        self.head_dim_p = max(16, _next_power_of_two(shape.head_dim))
        # tl.dot needs >= 16 rows: decode tiles stack GROUP_P heads x block_q tokens.
        self.small = TileConfig(block_q=max(1, 16 // self.group_p), block_n=64, num_warps=4, num_stages=2)
        self.large = TileConfig(block_q=max(1, 128 // self.group_p), block_n=64, num_warps=8, num_stages=2)
        # Over an fp8 pool the decode tiles widen keys before their dots and are no longer
        # bound by memory: 128 keys a step do better (H200, 8B heads, per layer: batch 80 at
        # context 1280 0.134 -> 0.118 ms, batch 256 at 512 0.164 -> 0.146 ms; bf16 pool 0.115
        # and 0.155 ms; bench/gpu_attention_tiles.py --kv-dtype fp8_e4m3fn).
        self.small_fp8 = replace(self.small, block_n=128)
        # ... and with fp16 dots (fp8 widens to fp16 in one instruction per pair): batch 256 at 512
        # 0.145 -> 0.137 ms, batch 80 at 1280 unchanged at 0.118 (attention_tiles_fp8_fp16dots_h200.json).
        self.fp16_dots_over_fp8 = True
        # ... with the decode tiles' values read as 32-bit words and widened by hand
        # (`_fp8_words_as_fp16`): the compiled decode then gathers no value byte by byte from
        # shared memory (128 8-bit loads a warp per 128-key tile in the sm_90 PTX). Prefill tiles
        # (wgmma) have no such loads and keep the plain path. Lighter, the tiles then do best
        # with 64 keys and 2 warps: H200, per layer, batch 80 at context 1280 0.118 -> 0.089 ms,
        # batch 256 at 512 0.136 -> 0.120 ms (attention_tiles_fp8_words_h200.json); in the
        # 256-request mix batch-77 decode steps 6.75 -> 6.35 ms, batch-256 ones 8.93 -> 9.17 ms
        # against 128-key 4-warp tiles (gpu_vs_transformers_h200_fp8.json, run11_series).
        self.fp8_values_by_words = True
        self.small_fp8_words = replace(self.small, block_n=64, num_warps=2, num_stages=2)
        # ... but only for launches of WORDS_LIGHT_PROGRAMS: outside that band 128 keys, 4 warps
        # and 3 stages do better (per layer, batch 24 at context 1536 0.073 -> 0.054 ms, batch 48
        # at 1280 0.074 -> 0.058, batch 256 at 512 0.121 -> 0.116, attention_tiles_fp8_band_h200.json;
        # in the mix, batch-256 steps 9.17 -> 8.91 ms, run12_series).
        self.small_fp8_words_wide = replace(self.small, block_n=128, num_warps=4, num_stages=3)
        self.merge_splits_in_kernel = MERGE_SPLITS_IN_KERNEL  # read when metadata is built

    # -- per-step planning -------------------------------------------------------------
    @property
    def tile_plan(self) -> TilePlan:
        return TilePlan(self.small, self.large, small_tile_tokens(self.small))

    def build_metadata(
        self,
        layout: StepLayout,
        device: torch.device,
        pad_to: int | None = None,
        width: int | None = None,
        tokens: int | None = None,
    ) -> TritonMetadata:
        """`pad_to` alone: a decode graph's shape (one token per sequence). With `tokens` too: a
        mixed graph's, up to `tokens` rows over fewer than `pad_to` sequences. Either splits its
        small tiles' keys by their padded count (`split_count`)."""
        if tokens is not None and pad_to is None:
            raise ValueError("a token bucket needs a sequence bound (pad_to)")
        step = self._pack(layout, pad_to, width, tokens=tokens)
        packed = host_to_device(torch.from_numpy(step.host), device)
        metadata = self._views(packed, step.sections, pad_to, step.width)
        metadata.tokens = tokens
        if step.dense_rows:
            slots = step.host[: step.sections[0][1]]  # the buffer opens with each token's slot
            plans = self.dense.plan(list(step.dense_rows))
            metadata.dense_rows = step.dense_rows
            metadata.dense_batches = tuple(self.dense.to_device(plan, slots, device) for plan in plans)
        small = [launch for launch in metadata.launches if launch.config == self.small]
        if pad_to is not None and small:
            mixed_override = tokens is not None and MIXED_SPLITS is not None
            metadata.splits = MIXED_SPLITS if mixed_override else split_count(small[0].num_tiles, self.shape.num_kv_heads)
            if metadata.splits > 1 and self.merge_splits_in_kernel:
                tiles = small[0].num_tiles * self.shape.num_kv_heads
                metadata.arrivals = torch.zeros(tiles, dtype=torch.int32, device=device)
        return metadata

    def refill(self, metadata: TritonMetadata, layout: StepLayout) -> None:
        """Rewrites a padded metadata buffer in place for a layout of the same shape. Of the
        block tables (last in the buffer) only the columns this step reads are written: the
        captured width covers the model's whole context (8,192 columns for a 131k-token
        Llama 3.1), and the kernel never reads a column past a sequence's own blocks."""
        step = self._pack(layout, metadata.pad_to, metadata.width, only_used_columns=True, tokens=metadata.tokens)
        host = torch.from_numpy(step.host)
        tables = step.sections[-1][1]
        head = host[: host.shape[0] - aligned(tables)]
        if head.shape[0] != metadata.packed.shape[0] - aligned(metadata.block_tables.numel()):
            raise ValueError("refill needs a layout packing to the same shape as the captured one")
        columns = tables // metadata.block_tables.shape[0]
        copy_into(metadata.packed[: head.shape[0]], head)
        copy_into(metadata.block_tables[:, :columns], host[head.shape[0] : head.shape[0] + tables].view(-1, columns))

    def _pack(self, layout: StepLayout, pad_to: int | None, width: int | None, only_used_columns: bool = False,
              tokens: int | None = None) -> PackedStep:  # fmt: skip
        """The step's metadata on the host (triton_packing.py); with a token bucket (`tokens`),
        every section but the tables has the same size for any layout that fits it."""
        fixed = None if tokens is None else mixed_tile_counts(self.small, self.large, tokens, pad_to)
        return pack_step(layout, self.tile_plan, pad_to, width, only_used_columns, tokens, fixed, self.dense.takes)

    @staticmethod
    def _views(packed: torch.Tensor, sections, pad_to, width) -> TritonMetadata:
        offset, named, launches = 0, {}, []
        for name, size in sections:
            if isinstance(name, TileConfig):
                seqs = packed[offset : offset + size]
                offset += aligned(size)
                firsts = packed[offset : offset + size]
                launches.append(TileLaunch(name, seqs, firsts))
            else:
                named[name] = packed[offset : offset + size]
            offset += aligned(size)
        batch = named["starts"].shape[0]
        return TritonMetadata(
            packed=packed,
            slot_mapping=named["slots"],
            query_starts=named["starts"],
            query_lens=named["q_lens"],
            context_lens=named["ctx_lens"],
            block_tables=named["tables"].view(batch, width),
            launches=launches,
            pad_to=pad_to,
            width=width,
        )

    # -- per-layer compute -------------------------------------------------------------
    def forward(self, q, k, v, k_cache, v_cache, metadata: TritonMetadata, rotary=None) -> torch.Tensor:
        kernels = kernels_for(q.device.type)
        if rotary is not None and not rotary.fusable(q):
            q, k = rotary.apply(q, k)
            rotary = None
        q, k, v = _rows_contiguous(q), _rows_contiguous(k), _rows_contiguous(v)
        if q.shape[0]:
            self._store(kernels, q, k, v, k_cache, v_cache, metadata, rotary)
        # A mixed graph's padding rows are in no tile: zeros, not whatever the pool held there.
        alloc = torch.empty if metadata.tokens is None else torch.zeros
        out = alloc(q.shape, dtype=q.dtype, device=q.device)
        for launch in metadata.launches:
            splits = metadata.splits if launch.config == self.small else 1
            self._attend(kernels, q, k_cache, v_cache, out, metadata, launch, splits)
        for batch in metadata.dense_batches:
            self.dense.attend(q, v, k_cache, v_cache, out, batch)
        return out

    def prepare_prefill(self, max_tokens: int, dtype: torch.dtype, device: torch.device) -> int:
        return self.dense.prepare(max_tokens, dtype, device)

    def _store(self, kernels, q, k, v, k_cache, v_cache, metadata: TritonMetadata, rotary) -> None:
        """Writes the step's k/v into their slots; with rotary (fusable), rotates q in place and
        k on its way into the cache, each head RMS-normed first where the rotation has head norms."""
        shape = self.shape
        tokens = q.shape[0]
        if rotary is None:
            width = shape.num_kv_heads * shape.head_dim
            kernels.store_kv[(tokens,)](
                k, v, k_cache, v_cache, metadata.slot_mapping, k.stride(0), v.stride(0),
                WIDTH=width, WIDTH_P=_next_power_of_two(width), KV_MAX=fp8_max(k_cache.dtype), **launch_args(k),
            )  # fmt: skip
            return
        cos, sin = rotary.rotary.cos, rotary.rotary.sin
        norms = rotary.head_norms  # (q_norm, k_norm) or None
        if norms is None:  # HEAD_NORM off: the kernel reads neither
            (q_weight, k_weight), (q_eps, k_eps) = (cos, cos), (0.0, 0.0)
        else:
            (q_weight, k_weight), (q_eps, k_eps) = (n.weight for n in norms), (n.eps for n in norms)
        kernels.rotary_store_kv[(tokens,)](
            q, k, v, k_cache, v_cache, metadata.slot_mapping, rotary.positions, cos, sin, q_weight, k_weight,
            q.stride(0), k.stride(0), v.stride(0), cos.stride(0), q_eps, k_eps,
            Q_HEADS=shape.num_heads, Q_HEADS_P=_next_power_of_two(shape.num_heads),
            KV_HEADS=shape.num_kv_heads, KV_HEADS_P=_next_power_of_two(shape.num_kv_heads),
            HALF=shape.head_dim // 2, KV_MAX=fp8_max(k_cache.dtype), HEAD_NORM=norms is not None,
            num_warps=4, **launch_args(q),
        )  # fmt: skip

    def _value_load(self, device: torch.device) -> str:
        """The kernel's V_LOAD for fp8 values meeting fp16 dots: by words (in PTX on CUDA) when
        switched on and each head row is whole words; else plain."""
        dim = self.shape.head_dim
        if not self.fp8_values_by_words or dim % 4 or dim != self.head_dim_p:
            return "plain"
        return "words_ptx" if device.type == "cuda" else "words"

    def fp8_decode_tile(self, value_load: str, programs: int) -> TileConfig:
        """The decode tile over an fp8 pool for a launch of `programs` (tiles x KV heads x splits)."""
        if value_load == "plain":
            return self.small_fp8
        return self.small_fp8_words if programs in WORDS_LIGHT_PROGRAMS else self.small_fp8_words_wide

    def _attend(self, kernels, q, k_cache, v_cache, out, metadata: TritonMetadata, launch: TileLaunch, splits: int):
        shape, config = self.shape, launch.config
        decode_tiles = config == self.small
        fp16_dots = self.fp16_dots_over_fp8 and is_fp8(k_cache.dtype) and q.dtype == torch.bfloat16
        fp8_into_fp16 = is_fp8(k_cache.dtype) and (fp16_dots or q.dtype == torch.float16)
        value_load = self._value_load(q.device) if fp8_into_fp16 and decode_tiles else "plain"
        if decode_tiles and is_fp8(k_cache.dtype):
            config = self.fp8_decode_tile(value_load, launch.num_tiles * shape.num_kv_heads * splits)
        tokens, heads, dim = q.shape
        target, ml = out, out  # unsplit: the kernel writes the output itself (ml unused)
        merge_in_kernel = splits > 1 and metadata.arrivals is not None
        arrivals = metadata.arrivals if merge_in_kernel else launch.tile_seq  # (unused unless merging)
        if splits > 1:
            target = torch.empty((splits, tokens, heads, dim), dtype=torch.float32, device=q.device)
            ml = torch.empty((2, splits, tokens, heads), dtype=torch.float32, device=q.device)
        strides = (tokens * heads * dim, heads, tokens * heads)  # split, ml token, ml split
        kernels.paged_attention[(launch.num_tiles, shape.num_kv_heads, splits)](
            q, k_cache, v_cache, target, ml, arrivals, out,
            launch.tile_seq, launch.tile_first,
            metadata.query_starts, metadata.query_lens, metadata.context_lens, metadata.block_tables,
            q.stride(0), q.stride(1), out.stride(0), out.stride(1),
            metadata.width, shape.scale * LOG2_E, *strides,
            KV_HEADS=shape.num_kv_heads, GROUP=self.group, GROUP_P=self.group_p,
            BLOCK_Q=config.block_q, BLOCK_N=config.block_n, PAGE=k_cache.shape[1],
            HEAD_DIM=shape.head_dim, HEAD_DIM_P=self.head_dim_p,
            IEEE=q.dtype == torch.float32, WINDOW=shape.sliding_window or 0, SPLITS=splits,
            MIN_SPLIT_KEYS=MIN_SPLIT_KEYS if splits > 1 else 0, MERGE_IN_KERNEL=merge_in_kernel,
            FP16_DOTS=fp16_dots, V_LOAD=value_load, SOFTCAP=shape.logit_softcap or 0.0,
            num_warps=config.num_warps, num_stages=config.num_stages, **launch_args(q),
        )  # fmt: skip
        if splits > 1 and not merge_in_kernel:
            kernels.combine_splits[(launch.num_tiles, shape.num_kv_heads)](
                target, ml, out, launch.tile_seq, launch.tile_first, metadata.query_starts, metadata.query_lens,
                out.stride(0), out.stride(1), *strides,
                SPLITS=splits, GROUP=self.group, GROUP_P=self.group_p, BLOCK_Q=config.block_q,
                HEAD_DIM=shape.head_dim, HEAD_DIM_P=self.head_dim_p, num_warps=4, **launch_args(q),
            )  # fmt: skip


def _rows_contiguous(x: torch.Tensor) -> torch.Tensor:
    """[T, heads, D] with each row's heads and dims densely packed (the row stride is free)."""
    if x.stride(2) == 1 and x.stride(1) == x.shape[2]:
        return x
    return x.contiguous()
