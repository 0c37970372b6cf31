"""bench/gpu_fused_moe.py's pure pieces on CPU (the timing itself needs a GPU)."""

import torch

from bench.gpu_fused_moe import CANDIDATES, SHAPES, fp8_copy, hit_bytes
from shard_server.kernels.fused_moe import tile_for
from shard_server.models.moe import reference_experts, route


def test_hit_bytes_count_each_expert_hit_once():
    ids = torch.tensor([[0, 3], [3, 5], [0, 5]])
    assert hit_bytes(ids, hidden=4, inter=2, element=2) == 3 * 3 * 4 * 2 * 2  # experts 0, 3, 5


def test_the_fp8_copy_is_what_quantize_fp8_serves():
    gen = torch.Generator().manual_seed(0)
    w13, w2 = torch.randn(4, 12, 8, generator=gen), torch.randn(4, 8, 6, generator=gen)
    q13, q2, scales = fp8_copy(w13, w2)
    assert q13.dtype == q2.dtype == torch.float8_e4m3fn and scales.w13.shape == (4, 12) and scales.w2.shape == (4, 8)
    x = torch.randn(3, 8, generator=gen)
    weights, ids = route(torch.randn(3, 4, generator=gen), 2, renormalize=True)
    got = reference_experts(x, q13, q2, weights, ids, scales)
    want = reference_experts(x, w13, w2, weights, ids)
    assert float((got - want).norm() / want.norm()) < 0.1  # e4m3's rounding, not a wrong scale


def test_every_shape_gets_a_shipped_tile_and_the_candidates_are_tensor_core_tiles():
    for experts, _, _, top_k in SHAPES.values():
        for tokens in (1, 4096):
            assert tile_for(tokens * top_k, experts) is not None
    assert all(min(t.block_m, t.block_n, t.block_k) >= 16 for t in CANDIDATES)
