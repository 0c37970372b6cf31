"""Causal attention of fresh prompts over their own keys, through torch's dense SDPA.

A prompt with no cached prefix, in an eager step, attends only to the keys it brings, so it
needs no page table: torch's SDPA (cuDNN's Hopper kernel on an H200) runs it at about twice
the paged Triton kernel's rate. cuDNN builds an execution plan per shape (~40 ms on first
use), so each prompt is padded at its end to a multiple of DENSE_BUCKET_TOKENS, and the
prompts of one bucket go together in batches of a power of two: warmup builds the plan of
every (batch, bucket) a step's token budget allows. Padding rows repeat the prompt's last
row: causal masking keeps them out of every real row, whatever they hold.

The step's index arrays (which rows and KV slots each batch gathers) are built on the host
with the rest of the step's metadata: a layer's batch costs a few gathers, one SDPA and a copy
per prompt, not a dozen launches per prompt.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..device_copy import host_to_device
from .base import AttentionShape

# On an H200 (bench/gpu_prefill_attention.py, 8B heads) the dense kernel takes 0.53x the
# paged kernel's time at 1024 tokens, 0.51x at 2048; but each call costs ~60 us of host work
# and padded copies of q, k and v, which only a long prompt's attention time repays.
DENSE_PREFILL_MIN_TOKENS = 1024
DENSE_BUCKET_TOKENS = 256


@dataclass(frozen=True)
class DensePlan:
    """One batch of same-bucket prompts, with the step row of each of its positions."""

    prompts: tuple[tuple[int, int], ...]  # (first row, length) of each
    length: int  # the bucket: tokens each prompt is padded to
    rows: np.ndarray  # [count * length] the step's row of each position (padding: the prompt's last)


@dataclass(frozen=True)
class DenseBatch:
    """A `DensePlan` with its `rows` on the device, and their KV slots."""

    prompts: tuple[tuple[int, int], ...]
    length: int
    rows: torch.Tensor
    slots: torch.Tensor


class DensePrefill:
    def __init__(self, shape: AttentionShape, min_tokens: int | None = DENSE_PREFILL_MIN_TOKENS):
        """`min_tokens`: the shortest fresh prompt that takes this path; None: none does."""
        self.shape = shape
        self.min_tokens = min_tokens
        self.gqa = shape.num_heads != shape.num_kv_heads

    def takes(self, query_lens: list[int], context_lens: list[int]) -> list[bool]:
        """Which sequences of an eager step take this path: fresh prompts, long enough."""
        if self.min_tokens is None or self.shape.sliding_window:
            return [False] * len(query_lens)
        return [q == c and q >= self.min_tokens for q, c in zip(query_lens, context_lens)]

    @staticmethod
    def plan(prompts: list[tuple[int, int]]) -> list[DensePlan]:
        """Batches for the (first row, length) of each dense prompt: by bucket, then in powers of two."""
        by_bucket: dict[int, list[tuple[int, int]]] = {}
        for start, length in prompts:
            by_bucket.setdefault(round_up(length, DENSE_BUCKET_TOKENS), []).append((start, length))
        plans = []
        for bucket, members in sorted(by_bucket.items()):
            while members:
                count = 1 << (len(members).bit_length() - 1)
                batch, members = members[:count], members[count:]
                plans.append(_plan(batch, bucket))
        return plans

    @staticmethod
    def to_device(plan: DensePlan, slot_of_row: np.ndarray, device: torch.device) -> DenseBatch:
        """The plan's arrays in one host-to-device copy, with the slots of its rows."""
        both = host_to_device(torch.from_numpy(np.stack([plan.rows, slot_of_row[plan.rows]]).astype(np.int64)), device)
        return DenseBatch(plan.prompts, plan.length, both[0], both[1])

    def attend(self, q, v, k_cache, v_cache, out, batch: DenseBatch) -> None:
        """Writes the attention of the batch's prompts into their rows of `out`. Keys come back
        from the cache, where the store just wrote them rotated; values are never rotated, so
        they come from the cache only when it holds them narrower (fp8)."""
        shape, count = self.shape, len(batch.prompts)

        def gathered(source, index, heads):
            return source.index_select(0, index).view(count, batch.length, heads, shape.head_dim).to(q.dtype)

        def cache(c):
            return c.view(-1, shape.num_kv_heads, shape.head_dim)

        queries = gathered(q, batch.rows, shape.num_heads)
        keys = gathered(cache(k_cache), batch.slots, shape.num_kv_heads)
        values = gathered(cache(v_cache), batch.slots, shape.num_kv_heads) if v_cache.dtype != v.dtype else gathered(
            v, batch.rows, shape.num_kv_heads)  # fmt: skip
        attended = self._sdpa(queries, keys, values)
        # A copy per prompt into its rows (a device-to-device memcpy): one index_copy_ of the
        # batch ran at ~1 TB/s, 3.2 ms of a mix prefill step (kernel_profile_fp8_h200.json, run12).
        for i, (start, length) in enumerate(batch.prompts):
            out[start : start + length] = attended[i, :length]

    def causal(self, q, k, v) -> torch.Tensor:
        """[n, heads, D] causal attention of one prompt, computed padded to its bucket."""
        length = q.shape[0]
        padded = round_up(length, DENSE_BUCKET_TOKENS)

        def bucketed(x):
            return torch.cat([x, x[-1:].expand(padded - length, *x.shape[1:])]).unsqueeze(0)

        return self._sdpa(bucketed(q), bucketed(k), bucketed(v))[0, :length]

    def _sdpa(self, q, k, v) -> torch.Tensor:
        """[B, L, heads, D] token-major inputs -> causal attention, [B, L, heads, D] contiguous."""
        attended = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, scale=self.shape.scale,
            enable_gqa=self.gqa,
        )  # fmt: skip
        return attended.transpose(1, 2).contiguous()

    def prepare(self, max_tokens: int, dtype: torch.dtype, device: torch.device) -> int:
        """Runs each batch shape a step of up to `max_tokens` can hold (bucket by bucket, in
        powers of two), so no request pays for building a plan. Returns the count."""
        if self.min_tokens is None:
            return 0
        shape = self.shape
        first = round_up(self.min_tokens, DENSE_BUCKET_TOKENS)
        shapes = [(count, length) for length in range(first, round_up(max_tokens, DENSE_BUCKET_TOKENS) + 1,
                                                      DENSE_BUCKET_TOKENS)  # fmt: skip
                  for count in _powers_of_two(max(1, max_tokens // length))]
        for count, length in shapes:
            q = torch.zeros((count, length, shape.num_heads, shape.head_dim), dtype=dtype, device=device)
            kv = torch.zeros((count, length, shape.num_kv_heads, shape.head_dim), dtype=dtype, device=device)
            self._sdpa(q, kv, kv)
        return len(shapes)


def _plan(prompts: list[tuple[int, int]], bucket: int) -> DensePlan:
    positions = np.arange(bucket, dtype=np.int64)
    rows = np.concatenate([start + np.minimum(positions, length - 1) for start, length in prompts])
    return DensePlan(tuple(prompts), bucket, rows)


def _powers_of_two(limit: int) -> list[int]:
    return [1 << i for i in range(limit.bit_length())]


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple
