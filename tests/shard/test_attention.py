"""Paged reference attention equals dense causal attention over the same keys and values."""

import random

import pytest
import torch

from shard_server.attention.base import AttentionShape, StepLayout, slot_mapping
from shard_server.attention.reference import ReferenceAttention

HEADS, KV_HEADS, DIM, BLOCK = 4, 2, 8, 4
NUM_BLOCKS = 96


def dense_attention(q, k, v, window=None):
    """q: [n, H, D] for the last n positions of k/v [ctx, Hkv, D]; plain causal softmax."""
    n, ctx = q.shape[0], k.shape[0]
    k = k.repeat_interleave(HEADS // KV_HEADS, dim=1)
    v = v.repeat_interleave(HEADS // KV_HEADS, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * DIM**-0.5
    q_pos = torch.arange(ctx - n, ctx).unsqueeze(1)
    k_pos = torch.arange(ctx).unsqueeze(0)
    allowed = k_pos <= q_pos
    if window is not None:
        allowed &= k_pos > q_pos - window
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def run_case(specs, window=None, seed=0, fill=0.0):
    """specs: list of (query_len, context_len). Returns (paged output, dense output)."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    free = list(range(NUM_BLOCKS))
    rng.shuffle(free)
    k_cache = torch.full((NUM_BLOCKS, BLOCK, KV_HEADS, DIM), fill)
    v_cache = torch.zeros_like(k_cache)
    tables, qs, ks, vs, expected = [], [], [], [], []
    for n, ctx in specs:
        blocks = -(-ctx // BLOCK) + rng.randint(0, 1)  # sometimes a spare block at the end
        table, free = free[:blocks], free[blocks:]
        tables.append(table)
        full_k = torch.randn(ctx, KV_HEADS, DIM, generator=gen)
        full_v = torch.randn(ctx, KV_HEADS, DIM, generator=gen)
        q = torch.randn(n, HEADS, DIM, generator=gen)
        for pos in range(ctx - n):  # earlier context is already in the cache
            k_cache[table[pos // BLOCK], pos % BLOCK] = full_k[pos]
            v_cache[table[pos // BLOCK], pos % BLOCK] = full_v[pos]
        qs.append(q), ks.append(full_k[ctx - n :]), vs.append(full_v[ctx - n :])
        expected.append(dense_attention(q, full_k, full_v, window))
    layout = StepLayout([n for n, _ in specs], [c for _, c in specs], tables, BLOCK)
    backend = ReferenceAttention(AttentionShape(HEADS, KV_HEADS, DIM, DIM**-0.5, window))
    metadata = backend.build_metadata(layout, torch.device("cpu"))
    out = backend.forward(torch.cat(qs), torch.cat(ks), torch.cat(vs), k_cache, v_cache, metadata)
    # The new keys must have landed in their slots.
    flat_k = k_cache.view(-1, KV_HEADS, DIM)
    torch.testing.assert_close(flat_k[torch.tensor(slot_mapping(layout))], torch.cat(ks))
    return out, torch.cat(expected)


CASES = {
    "single_fresh_prefill": [(13, 13)],
    "decodes_only": [(1, 5), (1, 1), (1, 16), (1, 9)],
    "chunk_over_cached_prefix": [(7, 20)],
    "block_boundaries": [(4, 8), (1, 4), (1, 5), (8, 8), (4, 4)],
    "mixed_step": [(1, 30), (9, 9), (1, 2), (6, 17), (1, 12), (5, 5)],
    "similar_prefills": [(8, 8), (8, 8), (7, 7), (8, 12), (1, 6)],
    "many_tiny": [(1, 1), (2, 2), (1, 3), (2, 3), (1, 2), (3, 3), (1, 1), (2, 4)],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_paged_equals_dense(case):
    out, expected = run_case(CASES[case])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", sorted(CASES))
def test_sliding_window_equals_dense(case):
    out, expected = run_case(CASES[case], window=3)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("seed", range(8))
def test_random_steps_equal_dense(seed):
    rng = random.Random(seed)
    specs = []
    for _ in range(rng.randint(1, 8)):
        ctx = rng.randint(1, 40)
        specs.append((rng.choice([1, rng.randint(1, ctx)]), ctx))
    out, expected = run_case(specs, seed=seed)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", ["decodes_only", "mixed_step", "chunk_over_cached_prefix"])
def test_slots_outside_the_context_are_ignored(case):
    """Huge values in slots a sequence does not own (padding, spare blocks) must not leak in."""
    out, expected = run_case(CASES[case], fill=1e4)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_similar_chunks_share_one_padded_call_and_a_long_one_runs_alone():
    backend = ReferenceAttention(AttentionShape(HEADS, KV_HEADS, DIM, DIM**-0.5))
    similar = StepLayout([8, 8, 7], [8, 8, 7], [[0, 1], [2, 3], [4, 5]], BLOCK)
    metadata = backend.build_metadata(similar, torch.device("cpu"))
    assert len(metadata.groups) == 1 and not metadata.chunks
    uneven = StepLayout([60, 2, 2], [60, 2, 2], [list(range(15)), [15], [16]], BLOCK)
    metadata = backend.build_metadata(uneven, torch.device("cpu"))
    assert not metadata.groups and len(metadata.chunks) == 3
