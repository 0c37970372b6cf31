"""The paged KV pool: one key and one value tensor per layer, in blocks of `block_size` tokens.

Layout [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim] in one allocation,
so its size is known exactly and per-layer views are free. Block ids come from the router.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KVSpec:
    num_layers: int
    num_kv_heads: int  # on this rank
    head_dim: int
    block_size: int
    dtype: torch.dtype

    @property
    def bytes_per_block(self) -> int:
        element = torch.empty((), dtype=self.dtype).element_size()
        return self.num_layers * 2 * self.block_size * self.num_kv_heads * self.head_dim * element

    def blocks_for_tokens(self, tokens: int) -> int:
        return tokens // self.block_size


class KVCache:
    def __init__(self, spec: KVSpec, num_blocks: int, device: torch.device):
        if num_blocks < 1:
            raise ValueError(f"a KV cache needs at least one block, got {num_blocks}")
        self.spec = spec
        self.num_blocks = num_blocks
        self.data = torch.zeros(
            (spec.num_layers, 2, num_blocks, spec.block_size, spec.num_kv_heads, spec.head_dim),
            dtype=spec.dtype,
            device=device,
        )

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data[index, 0], self.data[index, 1]
