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
    """Computes causal attention for a flattened step against the paged KV cache.

    Everything the runner, warmup and the CUDA-graph code call on a backend is declared here,
    so a new backend is one file that subclasses this and the others need not know it. An ABC
    rather than a Protocol: a backend missing a method then fails when it is built, naming the
    method, not mid-step; and the shared parts (`shape`, `sliding_window`) live here once.

    A backend serves one `shape`: the per-layer views of `per_layer.py` give each layer of a
    model whose layers differ (Gemma's sliding and global layers) its own.
    """

    name: str  # what --attention calls it
    # Whether `build_metadata` takes the fixed shapes of a CUDA graph (pad_to, width, tokens)
    # and `refill` rewrites such metadata in place; if not, steps run eagerly.
    cuda_graphs: bool = False

    def __init__(self, shape: AttentionShape):
        self.shape = shape

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.cuda_graphs and cls.refill is AttentionBackend.refill:
            raise TypeError(f"{cls.__name__} says cuda_graphs but does not define refill")

    @property
    def sliding_window(self) -> int | None:
        """The keys a query sees: the last `sliding_window` positions up to its own; None: all."""
        return self.shape.sliding_window

    @abstractmethod
    def build_metadata(
        self,
        layout: StepLayout,
        device: torch.device,
        pad_to: int | None = None,
        width: int | None = None,
        tokens: int | None = None,
    ):
        """Per-step tensors shared by every layer (slot mapping, gather indices, masks).

        `pad_to`, `width`, `tokens`: the fixed shape of a CUDA graph's step (a decode graph's
        batch and block-table width; a mixed graph's token bucket too), which only a backend
        with `cuda_graphs` takes; the others refuse them."""

    def refill(self, metadata, layout: StepLayout) -> None:
        """Rewrites padded metadata (built with `pad_to`) in place for a layout of the same
        shape: what a captured CUDA graph reads on replay. Only with `cuda_graphs`."""
        raise NotImplementedError(f"the {self.name} attention backend cannot run from CUDA graphs")

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


def refuse_graph_shapes(backend: AttentionBackend, pad_to, width, tokens) -> None:
    """For a backend without `cuda_graphs`: a graph's fixed shapes are a caller's bug."""
    if (pad_to, width, tokens) != (None, None, None):
        raise ValueError(f"the {backend.name} attention backend builds no padded (CUDA-graph) metadata")


def slot_mapping(layout: StepLayout) -> list[int]:
    """Cache slot of every new token, in flattened step order."""
    slots: list[int] = []
    bs = layout.block_size
    for n, ctx, table in zip(layout.query_lens, layout.context_lens, layout.block_tables):
        for pos in range(ctx - n, ctx):
            slots.append(table[pos // bs] * bs + pos % bs)
    return slots
