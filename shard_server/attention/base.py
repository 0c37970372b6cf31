"""The attention backend interface and the step layout every backend consumes.

KV layout, shared by all backends: per layer one key and one value tensor of shape
[num_blocks, block_size, num_kv_heads, head_dim]. Token position p of a sequence lives in
slot block_table[p // block_size] * block_size + p % block_size of the flattened
[num_blocks * block_size, num_kv_heads, head_dim] view.

A step's tokens are flattened into one [T, ...] batch: sequence i owns rows
[query_starts[i], query_starts[i] + query_lens[i]) and, after this step, has KV for
positions [0, context_lens[i]); its queries are the last query_lens[i] of those positions.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch


@dataclass
class StepLayout:
    """Backend-independent description of a step's sequences (host-side lists)."""

    query_lens: list[int]
    context_lens: list[int]
    block_tables: list[list[int]]
    block_size: int

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)

    @property
    def query_starts(self) -> list[int]:
        starts, offset = [], 0
        for n in self.query_lens:
            starts.append(offset)
            offset += n
        return starts


@dataclass(frozen=True)
class AttentionShape:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float
    sliding_window: int | None = None
    logit_softcap: float | None = None  # scores become cap * tanh(scores / cap) (Gemma 2)


class AttentionBackend(ABC):
    """Computes causal attention for a flattened step against the paged KV cache."""

    name: str

    @abstractmethod
    def build_metadata(self, layout: StepLayout, device: torch.device):
        """Per-step tensors shared by every layer (slot mapping, gather indices, masks)."""

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,  # [T, num_heads, head_dim]
        k: torch.Tensor,  # [T, num_kv_heads, head_dim]
        v: torch.Tensor,
        k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        v_cache: torch.Tensor,
        metadata,
        rotary=None,  # a RotaryStep: rotate q and k first (a backend may fuse it with the store)
    ) -> torch.Tensor:
        """Stores k/v into their slots, then returns the attention output [T, num_heads, head_dim].
        May rotate or overwrite q, k and v in place."""

    def prepare_prefill(self, max_tokens: int, dtype: torch.dtype, device: torch.device) -> int:
        """Warmup: builds whatever prefills of up to `max_tokens` would build on first use.
        Returns how many kernel variants it prepared."""
        return 0


def slot_mapping(layout: StepLayout) -> list[int]:
    """Cache slot of every new token, in flattened step order."""
    slots: list[int] = []
    bs = layout.block_size
    for n, ctx, table in zip(layout.query_lens, layout.context_lens, layout.block_tables):
        for pos in range(ctx - n, ctx):
            slots.append(table[pos // bs] * bs + pos % bs)
    return slots
