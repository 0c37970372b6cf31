"""Causal attention of a fresh prompt over its own keys, through torch's dense SDPA.

A prompt with no cached prefix, in an eager step, attends only to the keys it brings, so it
needs no page table: torch's SDPA (cuDNN's Hopper kernel on an H200) runs it at about twice
the paged Triton kernel's rate. cuDNN builds an execution plan per shape (~40 ms on first
use), so the prompt is zero-padded at its end to a multiple of DENSE_BUCKET_TOKENS (causal
masking keeps the padding out of every real row) and warmup builds each bucket's plan.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .base import AttentionShape

# On an H200 (bench/gpu_prefill_attention.py, 8B heads) the dense kernel takes 0.53x the
# paged kernel's time at 1024 tokens, 0.51x at 2048; but each call costs ~60 us of host work
# and padded copies of q, k and v, which only a long prompt's attention time repays.
DENSE_PREFILL_MIN_TOKENS = 1024
DENSE_BUCKET_TOKENS = 256


class DensePrefill:
    def __init__(self, shape: AttentionShape, min_tokens: int | None = DENSE_PREFILL_MIN_TOKENS):
        """`min_tokens`: the shortest fresh prompt that takes this path; None: none does."""
        self.shape = shape
        self.min_tokens = min_tokens
        self.gqa = shape.num_heads != shape.num_kv_heads

    def takes(self, query_lens: np.ndarray, context_lens: np.ndarray) -> np.ndarray:
        """Which sequences of an eager step take this path: fresh prompts, long enough."""
        if self.min_tokens is None or self.shape.sliding_window:
            return np.zeros(len(query_lens), dtype=bool)
        return (query_lens == context_lens) & (query_lens >= self.min_tokens)

    def attend(self, q, v, k_cache, v_cache, out, slot_mapping, start: int, length: int) -> None:
        """Writes the attention of the prompt in rows [start, start + length) into `out`. Its
        keys come back from the cache, where the store just wrote them rotated; values are
        never rotated, so they come from the cache only when it holds them narrower (fp8)."""
        shape = self.shape
        rows = slice(start, start + length)

        def stored(cache):
            return cache.view(-1, shape.num_kv_heads, shape.head_dim).index_select(0, slot_mapping[rows]).to(q.dtype)

        values = stored(v_cache) if v_cache.dtype != v.dtype else v[rows]
        out[rows] = self.causal(q[rows], stored(k_cache), values)[:length]

    def causal(self, q, k, v) -> torch.Tensor:
        """[n, heads, D] causal attention, computed on copies zero-padded to the next bucket."""
        length = q.shape[0]
        padded = round_up(length, DENSE_BUCKET_TOKENS)

        def heads_first(x):  # token-major like x (a plain copy), seen as [1, heads, padded, D]
            buffer = x.new_empty((padded, x.shape[1], x.shape[2]))
            buffer[:length] = x
            buffer[length:] = 0
            return buffer.transpose(0, 1).unsqueeze(0)

        attended = F.scaled_dot_product_attention(
            heads_first(q), heads_first(k), heads_first(v), is_causal=True, scale=self.shape.scale, enable_gqa=self.gqa
        )
        return attended[0].transpose(0, 1)

    def prepare(self, max_tokens: int, dtype: torch.dtype, device: torch.device) -> int:
        """Runs once per bucket that a fresh chunk of up to `max_tokens` (the most a step
        holds) pads to, so no request pays for building a plan. Returns the count."""
        if self.min_tokens is None:
            return 0
        shape = self.shape
        first, last = (round_up(n, DENSE_BUCKET_TOKENS) for n in (self.min_tokens, max_tokens))
        lengths = range(first, last + 1, DENSE_BUCKET_TOKENS)
        for length in lengths:
            q = torch.zeros((length, shape.num_heads, shape.head_dim), dtype=dtype, device=device)
            kv = torch.zeros((length, shape.num_kv_heads, shape.head_dim), dtype=dtype, device=device)
            self.causal(q, kv, kv)
        return len(lengths)


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple
