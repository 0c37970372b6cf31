"""The paged KV pool: one key and one value tensor per layer, in blocks of `block_size` tokens.

Layout [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim] in one allocation,
so its size is known exactly and per-layer views are free. Block ids come from the router.

The pool may be stored in fp8 (TGI's `--kv-cache-dtype`): half the bytes of bf16, so twice
the tokens fit and a decode reads half the KV traffic. Values are cast with scale 1 and
saturated at the format's largest finite value (a plain cast to e5m2 overflows to inf).
Attention always reads keys and values back from the pool then, so a prompt computes the
same whether its prefix came from the prefix cache or not.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


KV_CACHE_DTYPES = {"fp8_e4m3fn": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in KV_CACHE_DTYPES.values()


def fp8_max(dtype: torch.dtype) -> float:
    """The largest finite value of an fp8 pool's dtype; 0.0 for any other (nothing to clamp)."""
    return float(torch.finfo(dtype).max) if is_fp8(dtype) else 0.0


def to_cache_dtype(values: torch.Tensor, cache_dtype: torch.dtype) -> torch.Tensor:
    """`values` as the pool stores them: saturated into an fp8 range, or just cast."""
    if is_fp8(cache_dtype):
        limit = fp8_max(cache_dtype)
        return values.clamp(-limit, limit).to(cache_dtype)
    return values.to(cache_dtype)


def write_rows(flat_cache: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor) -> None:
    """flat_cache[slots] = rows, cast to the pool's dtype. fp8 goes through a byte view:
    index_copy_ has no fp8 kernel on the CPU."""
    rows = to_cache_dtype(rows, flat_cache.dtype)
    if is_fp8(flat_cache.dtype):
        flat_cache.view(torch.uint8).index_copy_(0, slots, rows.view(torch.uint8))
    else:
        flat_cache.index_copy_(0, slots, rows)


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
