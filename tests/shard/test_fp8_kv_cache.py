"""The KV pool stored in fp8 (`--kv-cache-dtype`): both backends, the store kernels, the CLI.

Tolerance against an fp32 pool: e4m3 keeps 3 mantissa bits, so rounding moves a value by
~2^-3 / sqrt(12) = 3.6 % of itself (rms), e5m2 by 7.2 %; the attention output of these random
steps moves by about as much (measured 2.8-3.7 % and 4.9-7.8 % relative L2), bounded here at
5 % and 10 %. Between the backends on the same fp8 pool the dequantized inputs are identical,
so they agree as closely as on an fp32 pool.

Triton 3.9's interpreter rounds float32 to fp8 wrongly when rounding carries into the next
power of two (0.49 -> 0.25, where the GPU and torch give 0.5), so on the CPU the store kernels
get inputs that fp8 holds exactly; the GPU cases round arbitrary values.
"""

import pytest
import torch

from shard_server.attention.base import AttentionShape, StepLayout, slot_mapping
from shard_server.attention.reference import ReferenceAttention
from shard_server.kv_cache import KV_CACHE_DTYPES, KVSpec, fp8_max, is_fp8, to_cache_dtype, write_rows

from .test_triton_attention import CASES, CUDA, DEVICE, make_step, needs_cuda

rounds_on_the_gpu = pytest.mark.skipif(not CUDA, reason="rounds arbitrary values: the interpreter's fp8 rounding is wrong")

FP8 = sorted(KV_CACHE_DTYPES.values(), key=str)
SHAPE = AttentionShape(4, 2, 16, 16**-0.5)
DRIFT = {torch.float8_e4m3fn: 0.05, torch.float8_e5m2: 0.10}  # relative L2 of the output


def pool_step(specs, kv_dtype, device="cpu", seed=0, exact=False):
    """make_step's float32 step with its pool stored as `kv_dtype`; `exact`: the new keys and
    values too are values fp8 holds exactly."""
    layout, q, k, v, k_cache, v_cache = make_step(specs, 4, 2, 16, 4, torch.float32, torch.device(device), seed)
    if exact:
        k, v = (to_cache_dtype(t, kv_dtype).float() for t in (k, v))
    return layout, q, k, v, to_cache_dtype(k_cache, kv_dtype), to_cache_dtype(v_cache, kv_dtype)


def same_bits(a, b) -> bool:
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("kv_dtype", FP8, ids=str)
def test_saturating_cast_never_makes_inf_or_nan(kv_dtype):
    big = torch.tensor([1e6, -1e6, 3.0, 0.0])
    stored = to_cache_dtype(big, kv_dtype).float()
    assert torch.isfinite(stored).all()
    assert stored.tolist()[:2] == [fp8_max(kv_dtype), -fp8_max(kv_dtype)]
    assert stored[2] == 3.0 and fp8_max(torch.bfloat16) == 0.0


@pytest.mark.parametrize("kv_dtype", [torch.float32, *FP8], ids=str)
def test_write_rows_fills_only_the_given_slots(kv_dtype):
    flat = to_cache_dtype(torch.zeros(6, 2, 3), kv_dtype)
    rows = torch.arange(12, dtype=torch.float32).view(2, 2, 3)
    write_rows(flat, torch.tensor([4, 1]), rows)
    assert flat.dtype == kv_dtype
    stored = to_cache_dtype(rows, kv_dtype).float()  # e5m2 rounds 9 to 8
    assert torch.equal(flat[4].float(), stored[0]) and torch.equal(flat[1].float(), stored[1])
    assert flat[[0, 2, 3, 5]].float().abs().sum() == 0


def test_an_fp8_pool_takes_a_quarter_of_an_fp32_ones_bytes():
    spec = KVSpec(num_layers=2, num_kv_heads=2, head_dim=16, block_size=4, dtype=torch.float32)
    fp8 = KVSpec(num_layers=2, num_kv_heads=2, head_dim=16, block_size=4, dtype=torch.float8_e4m3fn)
    assert fp8.bytes_per_block * 4 == spec.bytes_per_block


@pytest.mark.parametrize("kv_dtype", FP8, ids=str)
@pytest.mark.parametrize("case", ["mixed_step", "block_boundaries", "chunk_over_cached_prefix", "single_fresh_prefill"])
def test_reference_on_an_fp8_pool_stays_near_the_full_precision_one(case, kv_dtype):
    specs = CASES[case]
    layout, q, k, v, k_cache, v_cache = make_step(specs, 4, 2, 16, 4, torch.float32, torch.device("cpu"))
    backend = ReferenceAttention(SHAPE)
    metadata = backend.build_metadata(layout, torch.device("cpu"))
    exact = backend.forward(q, k, v, k_cache.clone(), v_cache.clone(), metadata)
    k8, v8 = to_cache_dtype(k_cache, kv_dtype), to_cache_dtype(v_cache, kv_dtype)
    got = backend.forward(q, k, v, k8, v8, metadata)
    assert got.dtype == q.dtype and torch.isfinite(got).all()
    assert (got - exact).norm() <= DRIFT[kv_dtype] * exact.norm()
    slots = torch.tensor(slot_mapping(layout))
    assert same_bits(k8.view(-1, 2, 16)[slots], to_cache_dtype(k, kv_dtype))
    assert same_bits(v8.view(-1, 2, 16)[slots], to_cache_dtype(v, kv_dtype))


def test_a_prompt_computes_the_same_fresh_or_over_its_cached_prefix():
    """With fp8, attention reads the stored (rounded) keys even for a fresh prompt: a prefix
    cache hit must not change what the rest of the prompt computes."""
    kv_dtype = torch.float8_e4m3fn
    gen = torch.Generator().manual_seed(3)
    n, block = 11, 4
    q, k, v = (torch.randn(n, h, 16, generator=gen) for h in (4, 2, 2))
    table = [[2, 0, 1]]
    backend = ReferenceAttention(SHAPE)
    pool = lambda: to_cache_dtype(torch.zeros(3, block, 2, 16), kv_dtype)  # noqa: E731
    k8, v8 = pool(), pool()
    fresh = backend.forward(q, k, v, k8, v8, backend.build_metadata(StepLayout([n], [n], table, block), torch.device("cpu")))
    k8, v8 = pool(), pool()
    head = StepLayout([6], [6], table, block)
    backend.forward(q[:6], k[:6], v[:6], k8, v8, backend.build_metadata(head, torch.device("cpu")))
    tail = StepLayout([n - 6], [n], table, block)
    rest = backend.forward(q[6:], k[6:], v[6:], k8, v8, backend.build_metadata(tail, torch.device("cpu")))
    torch.testing.assert_close(rest, fresh[6:], atol=1e-5, rtol=0)


@pytest.mark.parametrize("kv_dtype", FP8, ids=str)
@pytest.mark.parametrize("dense_min_tokens", [None, 5])
def test_triton_equals_reference_on_the_same_fp8_pool(kv_dtype, dense_min_tokens):
    """The store kernel rounds exactly as the reference cast, and both read the same values
    (the dense path included: its keys and values come back from the pool too)."""
    from shard_server.attention.triton_paged import TritonPagedAttention

    specs = CASES["mixed_step"]
    layout, q, k, v, k_cache, v_cache = pool_step(specs, kv_dtype, DEVICE, exact=not CUDA)
    device = torch.device(DEVICE)
    reference, triton_backend = ReferenceAttention(SHAPE), TritonPagedAttention(SHAPE, dense_min_tokens)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    expected = reference.forward(q, k, v, ref_k, ref_v, reference.build_metadata(layout, device))
    metadata = triton_backend.build_metadata(layout, device)
    assert bool(metadata.dense_rows) == (dense_min_tokens is not None)
    got = triton_backend.forward(q, k, v, k_cache, v_cache, metadata)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
    assert same_bits(k_cache, ref_k) and same_bits(v_cache, ref_v)


@rounds_on_the_gpu
def test_the_fused_rotary_store_rounds_rotated_keys_into_the_fp8_pool():
    from shard_server.attention.triton_paged import TritonPagedAttention
    from shard_server.kernels.dispatch import fused_kernels
    from shard_server.layers.rotary import RotaryEmbedding
    from shard_server.models.config import RopeScaling

    kv_dtype = torch.float8_e4m3fn
    device = torch.device(DEVICE)
    specs = [(1, 30), (9, 9), (6, 17)]
    layout, q, k, v, k_cache, v_cache = pool_step(specs, kv_dtype, DEVICE)
    k, v = k * 600, v * 600  # past e4m3's 448: saturated, never NaN
    positions = torch.tensor([p for n, c in specs for p in range(c - n, c)], device=device)
    step = RotaryEmbedding(16, 64, 10000.0, RopeScaling(), torch.float32, device).for_step(positions)
    reference, triton_backend = ReferenceAttention(SHAPE), TritonPagedAttention(SHAPE, None)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    with fused_kernels(False):
        expected = reference.forward(q.clone(), k.clone(), v, ref_k, ref_v, reference.build_metadata(layout, device), step)
    with fused_kernels(True, on_cpu=True):
        got = triton_backend.forward(q, k, v, k_cache, v_cache, triton_backend.build_metadata(layout, device), step)
    assert torch.isfinite(k_cache.float()).all() and k_cache.float().abs().max() == fp8_max(kv_dtype)
    # Rotation in float32 on both sides, then one rounding: a key may land one fp8 step apart.
    torch.testing.assert_close(k_cache.float(), ref_k.float(), atol=0, rtol=1 / 8)
    assert same_bits(v_cache, ref_v)
    torch.testing.assert_close(got, expected, atol=2e-2 * 600, rtol=0)


def test_the_shard_cli_takes_tgis_kv_cache_dtypes():
    from shard_server.cli import parse_config

    base = ["serve", "--model-path", "/m", "--uds-path", "/tmp/s"]
    assert parse_config(base).kv_dtype(torch.bfloat16) == torch.bfloat16
    assert parse_config([*base, "--kv-cache-dtype", "fp8_e5m2"]).kv_dtype(torch.bfloat16) == torch.float8_e5m2
    assert is_fp8(parse_config([*base, "--kv-cache-dtype", "fp8_e4m3fn"]).kv_dtype(torch.float32))
    for bad in ("fp8", "int8", ""):
        with pytest.raises(SystemExit):
            parse_config([*base, "--kv-cache-dtype", bad])


def test_values_load_by_words_unless_switched_off_or_rows_are_not_whole_words():
    from shard_server.attention.triton_paged import TritonPagedAttention

    backend = TritonPagedAttention(AttentionShape(32, 8, 128, 128**-0.5))
    assert backend._value_load(torch.device("cuda")) == "words_ptx"  # on by default
    assert backend._value_load(torch.device("cpu")) == "words"  # the interpreter runs no PTX
    backend.fp8_values_by_words = False
    assert backend._value_load(torch.device("cuda")) == "plain"
    odd = TritonPagedAttention(AttentionShape(4, 2, 18, 18**-0.5))  # rows of 18: not whole words
    assert odd._value_load(torch.device("cuda")) == "plain"


def test_decode_tiles_over_an_fp8_pool_are_light_only_in_their_band():
    """Word-read decode tiles are light for launches of WORDS_LIGHT_PROGRAMS programs (tiles x
    KV heads x splits) and wide outside it; plain reads keep their one tile."""
    from shard_server.attention.triton_paged import WORDS_LIGHT_PROGRAMS, TritonPagedAttention

    backend = TritonPagedAttention(AttentionShape(32, 8, 128, 128**-0.5))
    light, wide = backend.small_fp8_words, backend.small_fp8_words_wide
    assert wide.block_n > light.block_n and light.block_q == wide.block_q == backend.small.block_q
    band = WORDS_LIGHT_PROGRAMS
    for programs in (band.start, band.stop - 1, 80 * 8):
        assert backend.fp8_decode_tile("words_ptx", programs) == light
    for programs in (1, band.start - 1, band.stop, 256 * 8):
        assert backend.fp8_decode_tile("words", programs) == wide
    assert backend.fp8_decode_tile("plain", 80 * 8) == backend.small_fp8 == backend.fp8_decode_tile("plain", 1)


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("kv_dtype", FP8, ids=str)
@pytest.mark.parametrize("case", ["decodes_only", "block_boundaries", "mixed_step", "many_tiny"])
def test_values_read_by_words_give_the_plain_reads_output(case, kv_dtype, splits):
    """fp16 queries over an fp8 pool: the values widened word by word are the same fp16 values
    in the same places, so the output is the same, bit for bit, in every decode tile (also
    with each tile's keys in several ranges, as graph steps of few sequences run them)."""
    from shard_server.attention.triton_paged import TritonPagedAttention

    layout, q, k, v, k_cache, v_cache = pool_step(CASES[case], kv_dtype, DEVICE, exact=not CUDA)
    q, k, v = (t.half() for t in (q, k, v))
    device = torch.device(DEVICE)
    outputs = []
    for by_words in (False, True):
        backend = TritonPagedAttention(SHAPE, None)
        backend.fp8_values_by_words = by_words
        # the same tile both ways: only the loads differ
        backend.small_fp8 = backend.small_fp8_words_wide = backend.small_fp8_words
        metadata = backend.build_metadata(layout, device)
        metadata.splits = splits
        outputs.append(backend.forward(q, k, v, k_cache.clone(), v_cache.clone(), metadata))
    assert torch.equal(outputs[0], outputs[1])


@needs_cuda
@pytest.mark.parametrize("kv_dtype", FP8, ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("by_words,splits", [(False, 1), (True, 1), (True, 4)])
def test_gpu_triton_equals_reference_on_an_fp8_pool_at_real_sizes(kv_dtype, dtype, by_words, splits):
    """8B head shapes: long decodes, a chunk over a cached prefix, and a fresh prompt on the
    dense path, in the model dtype over an fp8 pool (also with the values read by words, and
    with the decode tiles' keys split in ranges as in graph steps)."""
    from shard_server.attention.triton_paged import TritonPagedAttention

    specs = [(1, 3000), (1, 17), (200, 1500), (1100, 1100)] + [(1, 64 + i) for i in range(40)]
    device = torch.device("cuda")
    layout, q, k, v, k_cache, v_cache = make_step(specs, 32, 8, 128, 16, dtype, device)
    k_cache, v_cache = to_cache_dtype(k_cache, kv_dtype), to_cache_dtype(v_cache, kv_dtype)
    shape = AttentionShape(32, 8, 128, 128**-0.5)
    reference, triton_backend = ReferenceAttention(shape), TritonPagedAttention(shape, 1024)
    triton_backend.fp8_values_by_words = by_words
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    expected = reference.forward(q, k, v, ref_k, ref_v, reference.build_metadata(layout, device))
    metadata = triton_backend.build_metadata(layout, device)
    metadata.splits = splits
    assert metadata.dense_rows  # the fresh 1100-token prompt
    got = triton_backend.forward(q, k, v, k_cache, v_cache, metadata)
    torch.testing.assert_close(got.float(), expected.float(), atol=2e-2, rtol=0)
    assert same_bits(k_cache, ref_k) and same_bits(v_cache, ref_v)
