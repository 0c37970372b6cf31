"""The `reference` attention backend: plain torch, any device, the correctness oracle.

Sequences are grouped into padded batches, one SDPA call per group, over contexts gathered
from the paged cache: every 1-token query (decodes) in one group, and the multi-token
chunks (prefill) in another when padding them wastes little. Otherwise each chunk runs
alone; a chunk with no earlier context then attends to its own k/v without a gather.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..kv_cache import write_rows
from .base import AttentionBackend, AttentionShape, StepLayout, refuse_graph_shapes, slot_mapping

PADDING_WASTE_LIMIT = 2.0  # pad chunks together while padded work <= this x real work


@dataclass
class PaddedGroup:
    """Sequences computed by one SDPA call over [B, max_query, ...] padded tensors."""

    batch: int
    max_query: int
    query_rows: torch.Tensor | None  # [B * max_query] step rows (padding -> 0); None: all rows in order
    real_rows: torch.Tensor | None  # which padded rows are real; None: all of them
    dest_rows: torch.Tensor | None  # step rows those real rows fill
    key_slots: torch.Tensor  # [B, max_context] cache slots (padding -> 0)
    mask: torch.Tensor  # [B, 1, max_query, max_context]


@dataclass
class ChunkPlan:
    start: int
    end: int
    context_slots: torch.Tensor | None  # None: no earlier context, use the chunk's own k/v
    mask: torch.Tensor | None  # None: plain causal


@dataclass
class ReferenceMetadata:
    slot_mapping: torch.Tensor  # [T]
    groups: list[PaddedGroup]
    chunks: list[ChunkPlan]


class ReferenceAttention(AttentionBackend):
    name = "reference"

    def __init__(self, shape: AttentionShape):
        super().__init__(shape)

    # -- per-step planning -------------------------------------------------------------
    def build_metadata(
        self, layout: StepLayout, device: torch.device, pad_to=None, width=None, tokens=None
    ) -> ReferenceMetadata:
        refuse_graph_shapes(self, pad_to, width, tokens)  # its shapes follow the step: no graphs
        slots = torch.tensor(slot_mapping(layout), dtype=torch.long, device=device)
        singles = [i for i, n in enumerate(layout.query_lens) if n == 1]
        multis = [i for i, n in enumerate(layout.query_lens) if n > 1]
        groups = [self._plan_group(layout, singles, device)] if singles else []
        chunks = []
        if multis and self._worth_padding(layout, multis):
            groups.append(self._plan_group(layout, multis, device))
        else:
            starts = layout.query_starts
            chunks = [self._plan_chunk(starts[i], layout, i, device) for i in multis]
        return ReferenceMetadata(slots, groups, chunks)

    @staticmethod
    def _worth_padding(layout: StepLayout, which: list[int]) -> bool:
        if len(which) < 2:
            return False
        q_max = max(layout.query_lens[i] for i in which)
        k_max = max(layout.context_lens[i] for i in which)
        real = sum(layout.query_lens[i] * layout.context_lens[i] for i in which)
        return len(which) * q_max * k_max <= PADDING_WASTE_LIMIT * real

    def _plan_group(self, layout: StepLayout, which: list[int], device: torch.device) -> PaddedGroup:
        bs, starts = layout.block_size, layout.query_starts
        q_lens = [layout.query_lens[i] for i in which]
        ctx_lens = [layout.context_lens[i] for i in which]
        q_max, k_max = max(q_lens), max(ctx_lens)
        width = -(-k_max // bs)
        tables = torch.zeros((len(which), width), dtype=torch.long)
        for row, i in enumerate(which):
            table = layout.block_tables[i][:width]
            tables[row, : len(table)] = torch.tensor(table, dtype=torch.long)
        tables = tables.to(device)
        key_slots = (tables.unsqueeze(-1) * bs + torch.arange(bs, device=device)).reshape(len(which), -1)
        key_slots = key_slots[:, :k_max]
        q_len_t = torch.tensor(q_lens, device=device)
        ctx_t = torch.tensor(ctx_lens, device=device)
        offset = torch.arange(q_max, device=device).unsqueeze(0)  # [1, Qmax]
        real = offset < q_len_t.unsqueeze(1)  # [B, Qmax]
        query_pos = (ctx_t - q_len_t).unsqueeze(1) + offset  # [B, Qmax]
        key_pos = torch.arange(k_max, device=device)
        mask = key_pos.view(1, 1, -1) <= query_pos.unsqueeze(-1)
        if self.shape.sliding_window is not None:
            mask &= key_pos.view(1, 1, -1) > (query_pos - self.shape.sliding_window).unsqueeze(-1)
        # Padded query rows attend to one key so SDPA stays finite; their output is dropped.
        mask[:, :, 0] |= ~real
        key_slots = key_slots.masked_fill(key_pos.unsqueeze(0) >= ctx_t.unsqueeze(1), 0)
        in_order = q_max == 1 and which == list(range(len(layout.query_lens)))
        query_rows = real_rows = dest_rows = None
        if not in_order:
            first = torch.tensor([starts[i] for i in which], device=device).unsqueeze(1)
            query_rows = (first + offset).masked_fill(~real, 0).reshape(-1)
            real_rows = real.reshape(-1).nonzero().squeeze(1)
            dest_rows = query_rows.index_select(0, real_rows)
        return PaddedGroup(len(which), q_max, query_rows, real_rows, dest_rows, key_slots, mask.unsqueeze(1))

    def _plan_chunk(self, start: int, layout: StepLayout, i: int, device: torch.device) -> ChunkPlan:
        n, ctx = layout.query_lens[i], layout.context_lens[i]
        window = self.shape.sliding_window
        fresh = ctx == n
        mask = None
        if not fresh or (window is not None and window < n):
            query_pos = torch.arange(ctx - n, ctx, device=device).unsqueeze(1)
            key_pos = torch.arange(ctx, device=device).unsqueeze(0)
            mask = key_pos <= query_pos
            if window is not None:
                mask &= key_pos > query_pos - window
        context_slots = None
        if not fresh:
            bs = layout.block_size
            pos = torch.arange(ctx)
            table = torch.tensor(layout.block_tables[i][: -(-ctx // bs)], dtype=torch.long)
            context_slots = (table[pos // bs] * bs + pos % bs).to(device)
        return ChunkPlan(start, start + n, context_slots, mask)

    # -- per-layer compute -------------------------------------------------------------
    def forward(self, q, k, v, k_cache, v_cache, metadata: ReferenceMetadata, rotary=None) -> torch.Tensor:
        if rotary is not None:
            q, k = rotary.apply(q, k)
        k_flat = k_cache.view(-1, *k_cache.shape[2:])
        v_flat = v_cache.view(-1, *v_cache.shape[2:])
        write_rows(k_flat, metadata.slot_mapping, k)
        write_rows(v_flat, metadata.slot_mapping, v)
        if k_flat.dtype != k.dtype:  # a narrower pool (fp8): every chunk reads what it stored
            k, v = (flat.index_select(0, metadata.slot_mapping).to(q.dtype) for flat in (k_flat, v_flat))
        groups = metadata.groups
        if len(groups) == 1 and groups[0].query_rows is None and not metadata.chunks:
            return self._group(q, k_flat, v_flat, groups[0])  # pure decode step
        out = torch.empty_like(q)
        for group in groups:
            result = self._group(q, k_flat, v_flat, group)
            out.index_copy_(0, group.dest_rows, result.index_select(0, group.real_rows))
        for chunk in metadata.chunks:
            out[chunk.start : chunk.end] = self._chunk(q, k, v, k_flat, v_flat, chunk)
        return out

    def _group(self, q, k_flat, v_flat, group: PaddedGroup) -> torch.Tensor:
        """Attention output of the group's padded rows, [B * max_query, H, D]."""
        rows = q if group.query_rows is None else q.index_select(0, group.query_rows)
        query = rows.view(group.batch, group.max_query, *q.shape[1:]).transpose(1, 2)
        out = self._attend(
            query,
            k_flat[group.key_slots].to(q.dtype).transpose(1, 2),
            v_flat[group.key_slots].to(q.dtype).transpose(1, 2),
            group.mask,
        )
        return out.transpose(1, 2).reshape(-1, *q.shape[1:])

    def _chunk(self, q, k, v, k_flat, v_flat, chunk: ChunkPlan) -> torch.Tensor:
        query = q[chunk.start : chunk.end].transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
        if chunk.context_slots is None:
            keys, values = k[chunk.start : chunk.end], v[chunk.start : chunk.end]
        else:
            keys, values = (flat[chunk.context_slots].to(q.dtype) for flat in (k_flat, v_flat))
        out = self._attend(
            query, keys.transpose(0, 1).unsqueeze(0), values.transpose(0, 1).unsqueeze(0), chunk.mask
        )
        return out.squeeze(0).transpose(0, 1)

    def _attend(self, query, keys, values, mask) -> torch.Tensor:
        """[B, H, n, D] queries over [B, KV, m, D] keys; mask None: causal over n == m."""
        cap = self.shape.logit_softcap
        if cap is None:
            return F.scaled_dot_product_attention(
                query, keys, values, attn_mask=mask, is_causal=mask is None, scale=self.shape.scale, enable_gqa=True
            )
        # Soft-capping sits between the product and the softmax, where SDPA has no hook.
        group = query.shape[1] // keys.shape[1]
        keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
        scores = torch.matmul(query, keys.transpose(-1, -2)) * self.shape.scale
        scores = torch.tanh(scores / cap) * cap
        if mask is None:
            n, m = scores.shape[-2:]
            mask = torch.ones(n, m, dtype=torch.bool, device=scores.device).tril(m - n)
        scores = scores.masked_fill(~mask, float("-inf"))
        return torch.matmul(scores.softmax(dim=-1, dtype=torch.float32).to(query.dtype), values)
