"""The prototype decode kernel (bench/gpu_fp8_decode_prototype.py) equals the shipped one.

On the CPU through Triton's interpreter, small shapes: unsplit and split-KV, an fp8 pool and
a float32 one. Its speed is measured on the GPU by the benchmark itself.
"""

import pytest
import torch

pytest.importorskip("triton")

from bench.gpu_fp8_decode_prototype import decode_rows  # noqa: E402
from shard_server.attention.base import AttentionShape  # noqa: E402
from shard_server.attention.triton_paged import TritonPagedAttention  # noqa: E402
from shard_server.kv_cache import to_cache_dtype  # noqa: E402

from tests.shard.test_triton_attention import DEVICE, make_step  # noqa: E402


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float8_e4m3fn], ids=str)
@pytest.mark.parametrize("splits", [1, 4])
@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (6, 2)])
def test_prototype_equals_the_shipped_kernel(kv_dtype, splits, heads, kv_heads):
    device = torch.device(DEVICE)
    specs = [(1, 5), (1, 33), (1, 1), (1, 17)]
    layout, q, k, v, k_cache, v_cache = make_step(specs, heads, kv_heads, 16, 4, torch.float32, device)
    k, v = (to_cache_dtype(t, kv_dtype).float() for t in (k, v))  # exact in the pool (see test_fp8_kv_cache)
    k_cache, v_cache = to_cache_dtype(k_cache, kv_dtype), to_cache_dtype(v_cache, kv_dtype)
    backend = TritonPagedAttention(AttentionShape(heads, kv_heads, 16, 0.25))
    metadata = backend.build_metadata(layout, device)
    shipped = backend.forward(q, k, v, k_cache, v_cache, metadata)
    got = decode_rows(backend, q, k_cache, v_cache, metadata, splits, block_n=8)
    torch.testing.assert_close(got, shipped, atol=1e-4, rtol=0)
