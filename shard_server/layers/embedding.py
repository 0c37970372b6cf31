"""Token embedding and LM head, with the vocabulary split across ranks.

Each rank holds a block of ceil(vocab / world_size) rows; the last block is zero-padded when
the vocabulary does not divide evenly, so the gathered logits are cut back to `vocab_size`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..distributed import ParallelContext
from ..weights import WeightStore


class VocabParallelEmbedding(nn.Module):
    def __init__(
        self, vocab_size: int, dim: int, ctx: ParallelContext, dtype: torch.dtype, device: torch.device
    ):
        super().__init__()
        self.ctx = ctx
        self.vocab_size = vocab_size
        self.start, self.end, block = ctx.padded_split(vocab_size)
        self.weight = nn.Parameter(torch.zeros((block, dim), dtype=dtype, device=device), requires_grad=False)

    def load(self, store: WeightStore, name: str) -> None:
        _load_vocab_rows(self.weight, store, name, self.start, self.end)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if not self.ctx.is_parallel:
            return F.embedding(ids, self.weight)
        # Ids outside this rank's range embed to zero; the all-reduce fills them in.
        outside = (ids < self.start) | (ids >= self.end)
        local = (ids - self.start).masked_fill(outside, 0)
        out = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0)
        return self.ctx.all_reduce(out)


class LMHead(nn.Module):
    """Projects hidden states to logits over the full vocabulary: float32, or in the model
    dtype when the caller reads them itself (the decode graphs' greedy choice)."""

    def __init__(
        self,
        vocab_size: int,
        dim: int,
        ctx: ParallelContext,
        dtype: torch.dtype,
        device: torch.device,
        tied_to: VocabParallelEmbedding | None = None,
    ):
        super().__init__()
        self.ctx = ctx
        self.vocab_size = vocab_size
        self.tied_to = tied_to
        self.start, self.end, block = ctx.padded_split(vocab_size)
        if tied_to is None:
            self.weight = nn.Parameter(
                torch.zeros((block, dim), dtype=dtype, device=device), requires_grad=False
            )

    def load(self, store: WeightStore, name: str) -> None:
        if self.tied_to is None:
            _load_vocab_rows(self.weight, store, name, self.start, self.end)

    def forward(self, hidden: torch.Tensor, float32: bool = True) -> torch.Tensor:
        weight = self.tied_to.weight if self.tied_to is not None else self.weight
        logits = self.ctx.all_gather_last_dim(F.linear(hidden, weight))
        if logits.shape[-1] != self.vocab_size:
            logits = logits[..., : self.vocab_size]  # drop the padding rows' columns
        return logits.float() if float32 else logits


def _load_vocab_rows(weight: torch.Tensor, store: WeightStore, name: str, start: int, end: int) -> None:
    """Copies rows [start, end) into the head of `weight`; padding rows stay zero."""
    if end > start:
        weight[: end - start].copy_(store.get_rows(name, start, end))
