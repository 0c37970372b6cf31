"""The `reference` attention backend: plain torch, any device, the correctness oracle.

Sequences with a single query token (decodes) are batched into one SDPA call over their
gathered, padded contexts. Multi-token chunks (prefill) run one SDPA call each; a chunk with
no earlier context attends to its own fresh k/v without touching the cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .base import AttentionBackend, AttentionShape, StepLayout, slot_mapping


@dataclass
class ChunkPlan:
    start: int
    end: int
    context_slots: torch.Tensor | None  # None: no earlier context, use the chunk's own k/v
    mask: torch.Tensor | None  # None: plain causal


@dataclass
class ReferenceMetadata:
    slot_mapping: torch.Tensor  # [T]
    single_rows: torch.Tensor | None  # rows of 1-token queries; None when every row is one
    single_slots: torch.Tensor | None  # [B, L] cache slots of their contexts (padded)
    single_mask: torch.Tensor | None  # [B, 1, 1, L] True where a slot is attended
    chunks: list[ChunkPlan]


class ReferenceAttention(AttentionBackend):
    name = "reference"

    def __init__(self, shape: AttentionShape):
        self.shape = shape

    # -- per-step planning -------------------------------------------------------------
    def build_metadata(self, layout: StepLayout, device: torch.device) -> ReferenceMetadata:
        slots = torch.tensor(slot_mapping(layout), dtype=torch.long, device=device)
        starts = layout.query_starts
        singles = [i for i, n in enumerate(layout.query_lens) if n == 1]
        chunks = [
            self._plan_chunk(starts[i], layout, i, device) for i, n in enumerate(layout.query_lens) if n > 1
        ]
        single_rows = single_slots = single_mask = None
        if singles:
            single_slots, single_mask = self._plan_singles(layout, singles, device)
            if len(singles) != len(layout.query_lens):
                single_rows = torch.tensor([starts[i] for i in singles], device=device)
        return ReferenceMetadata(slots, single_rows, single_slots, single_mask, chunks)

    def _plan_singles(self, layout: StepLayout, which: list[int], device: torch.device):
        bs = layout.block_size
        ctx = torch.tensor([layout.context_lens[i] for i in which], device=device)
        max_ctx = int(max(layout.context_lens[i] for i in which))
        width = (max_ctx + bs - 1) // bs
        tables = torch.zeros((len(which), width), dtype=torch.long)
        for row, i in enumerate(which):
            table = layout.block_tables[i][:width]
            tables[row, : len(table)] = torch.tensor(table, dtype=torch.long)
        tables = tables.to(device)
        offsets = torch.arange(bs, device=device)
        slots = (tables.unsqueeze(-1) * bs + offsets).reshape(len(which), -1)[:, :max_ctx]
        key_pos = torch.arange(max_ctx, device=device).unsqueeze(0)
        mask = key_pos < ctx.unsqueeze(1)
        if self.shape.sliding_window is not None:
            mask &= key_pos >= (ctx - self.shape.sliding_window).unsqueeze(1)
        # Padding rows point at slot 0 and are masked out.
        slots = slots.masked_fill(~mask, 0)
        return slots, mask[:, None, None, :]

    def _plan_chunk(self, start: int, layout: StepLayout, i: int, device: torch.device) -> ChunkPlan:
        n, ctx = layout.query_lens[i], layout.context_lens[i]
        window = self.shape.sliding_window
        fresh = ctx == n
        needs_mask = not fresh or (window is not None and window < n)
        mask = None
        if needs_mask:
            query_pos = torch.arange(ctx - n, ctx, device=device).unsqueeze(1)
            key_pos = torch.arange(ctx, device=device).unsqueeze(0)
            mask = key_pos <= query_pos
            if window is not None:
                mask &= key_pos > query_pos - window
        context_slots = None
        if not fresh:
            bs = layout.block_size
            pos = torch.arange(ctx)
            table = torch.tensor(layout.block_tables[i][: (ctx + bs - 1) // bs], dtype=torch.long)
            context_slots = (table[pos // bs] * bs + pos % bs).to(device)
        return ChunkPlan(start, start + n, context_slots, mask)

    # -- per-layer compute -------------------------------------------------------------
    def forward(self, q, k, v, k_cache, v_cache, metadata: ReferenceMetadata) -> torch.Tensor:
        k_flat = k_cache.view(-1, *k_cache.shape[2:])
        v_flat = v_cache.view(-1, *v_cache.shape[2:])
        k_flat.index_copy_(0, metadata.slot_mapping, k)
        v_flat.index_copy_(0, metadata.slot_mapping, v)
        if metadata.single_slots is not None and not metadata.chunks:
            return self._singles(q, k_flat, v_flat, metadata)
        out = torch.empty_like(q)
        if metadata.single_slots is not None:
            rows = metadata.single_rows
            out.index_copy_(0, rows, self._singles(q.index_select(0, rows), k_flat, v_flat, metadata))
        for chunk in metadata.chunks:
            out[chunk.start : chunk.end] = self._chunk(q, k, v, k_flat, v_flat, chunk)
        return out

    def _singles(self, q, k_flat, v_flat, metadata: ReferenceMetadata) -> torch.Tensor:
        keys = k_flat[metadata.single_slots].transpose(1, 2)  # [B, Hkv, L, D]
        values = v_flat[metadata.single_slots].transpose(1, 2)
        out = F.scaled_dot_product_attention(
            q.unsqueeze(2),  # [B, H, 1, D]
            keys,
            values,
            attn_mask=metadata.single_mask,
            scale=self.shape.scale,
            enable_gqa=True,
        )
        return out.squeeze(2)

    def _chunk(self, q, k, v, k_flat, v_flat, chunk: ChunkPlan) -> torch.Tensor:
        query = q[chunk.start : chunk.end].transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
        if chunk.context_slots is None:
            keys, values = k[chunk.start : chunk.end], v[chunk.start : chunk.end]
        else:
            keys, values = k_flat[chunk.context_slots], v_flat[chunk.context_slots]
        out = F.scaled_dot_product_attention(
            query,
            keys.transpose(0, 1).unsqueeze(0),
            values.transpose(0, 1).unsqueeze(0),
            attn_mask=chunk.mask,
            is_causal=chunk.mask is None,
            scale=self.shape.scale,
            enable_gqa=True,
        )
        return out.squeeze(0).transpose(0, 1)
