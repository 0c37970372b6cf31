"""The `triton` backend equals `reference` on the same paged cache and step.

On CPU the kernels run through Triton's interpreter, so those cases use small shapes; the
GPU-sized cases (8k contexts, hundreds of sequences, bf16/fp16 at real head sizes) need CUDA.
Tolerances: float32 1e-4 (exact dots, different summation order); bf16/fp16 2e-2 absolute
on unit-scale outputs (inputs rounded to 8/11 mantissa bits, probabilities rounded once
before the value product).
"""

import random

import pytest
import torch

pytest.importorskip("triton")

from shard_server.attention.base import AttentionShape, StepLayout, slot_mapping  # noqa: E402
from shard_server.attention.reference import ReferenceAttention  # noqa: E402
from shard_server.attention.dense_prefill import DENSE_BUCKET_TOKENS, DENSE_PREFILL_MIN_TOKENS  # noqa: E402
from shard_server.attention.triton_paged import (  # noqa: E402
    MAX_SPLITS,
    MAX_SPLITS_SMALL,
    MIN_PROGRAMS,
    SPLIT_TARGET_PROGRAMS,
    TritonPagedAttention,
    split_count,
)

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"  # small cases: compiled on a GPU, interpreted on CPU
needs_cuda = pytest.mark.skipif(not CUDA, reason="GPU-sized case: the Triton interpreter is too slow on CPU")


def make_step(specs, heads, kv_heads, dim, block, dtype, device, seed=0, spare_blocks=8):
    """Random paged cache holding each sequence's earlier context, plus the step's q/k/v."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    need = sum(-(-ctx // block) + 1 for _, ctx in specs) + spare_blocks
    free = list(range(need))
    rng.shuffle(free)
    shape = (need, block, kv_heads, dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)  # garbage outside owned slots
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    tables = []
    for _, ctx in specs:
        blocks = -(-ctx // block) + rng.randint(0, 1)
        tables.append(free[:blocks])
        free = free[blocks:]
    total = sum(n for n, _ in specs)
    q = torch.randn(total, heads, dim, generator=gen).to(dtype)
    k = torch.randn(total, kv_heads, dim, generator=gen).to(dtype)
    v = torch.randn(total, kv_heads, dim, generator=gen).to(dtype)
    layout = StepLayout([n for n, _ in specs], [c for _, c in specs], tables, block)
    to = lambda t: t.to(device)  # noqa: E731
    return layout, to(q), to(k), to(v), to(k_cache), to(v_cache)


def compare(specs, heads=4, kv_heads=2, dim=16, block=4, dtype=torch.float32, device=DEVICE, window=None,
            seed=0, atol=1e-4, dense_min_tokens=DENSE_PREFILL_MIN_TOKENS):  # fmt: skip
    """Returns the triton backend's metadata, for checks of which path each sequence took."""
    device = torch.device(device)
    layout, q, k, v, k_cache, v_cache = make_step(specs, heads, kv_heads, dim, block, dtype, device, seed)
    shape = AttentionShape(heads, kv_heads, dim, dim**-0.5, window)
    reference, triton_backend = ReferenceAttention(shape), TritonPagedAttention(shape, dense_min_tokens)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    expected = reference.forward(q, k, v, ref_k, ref_v, reference.build_metadata(layout, device))
    metadata = triton_backend.build_metadata(layout, device)
    got = triton_backend.forward(q, k, v, k_cache, v_cache, metadata)
    torch.testing.assert_close(got.float(), expected.float(), atol=atol, rtol=0)
    # Only the step's slots changed, and they hold the new keys and values.
    torch.testing.assert_close(k_cache, ref_k, atol=0, rtol=0)
    torch.testing.assert_close(v_cache, ref_v, atol=0, rtol=0)
    slots = torch.tensor(slot_mapping(layout), device=device)
    torch.testing.assert_close(k_cache.view(-1, kv_heads, dim)[slots], k, atol=0, rtol=0)
    return metadata


CASES = {
    "single_fresh_prefill": [(13, 13)],
    "decodes_only": [(1, 5), (1, 1), (1, 16), (1, 9)],
    "chunk_over_cached_prefix": [(7, 20)],
    "block_boundaries": [(4, 8), (1, 4), (1, 5), (8, 8), (4, 4), (1, 64), (1, 65)],
    "mixed_step": [(1, 30), (9, 9), (1, 2), (6, 17), (1, 12), (5, 5)],
    "long_chunk_many_tiles": [(70, 90), (1, 129)],
    "many_tiny": [(1, 1), (2, 2), (1, 3), (2, 3), (1, 2), (3, 3), (1, 1), (2, 4)],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_triton_equals_reference_float32(case):
    compare(CASES[case])


@pytest.mark.parametrize("case", ["mixed_step", "block_boundaries", "chunk_over_cached_prefix"])
def test_sliding_window(case):
    compare(CASES[case], window=3)


@pytest.mark.parametrize("case", ["single_fresh_prefill", "mixed_step", "many_tiny", "block_boundaries"])
@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (4, 4), (6, 2)])
def test_dense_prefill_path_equals_reference(case, heads, kv_heads):
    """Fresh prompts of at least the threshold take SDPA, every other sequence the paged kernel."""
    specs = CASES[case]
    metadata = compare(specs, heads=heads, kv_heads=kv_heads, dense_min_tokens=2)
    starts = [sum(n for n, _ in specs[:i]) for i in range(len(specs))]
    fresh = {(start, n) for start, (n, ctx) in zip(starts, specs) if n == ctx and n >= 2}
    assert set(metadata.dense_rows) == fresh and fresh
    tiled = {int(s) for launch in metadata.launches for s in launch.tile_seq.tolist()}
    assert tiled == {i for i, (start, (n, ctx)) in enumerate(zip(starts, specs)) if (start, n) not in fresh}


def test_dense_prompts_batch_by_bucket_in_powers_of_two():
    """Seven prompts: five in the first bucket (a batch of 4, then 1), two in the second; a
    padded position repeats its prompt's last row, and only real rows are written back."""
    from shard_server.attention.dense_prefill import DensePrefill

    b = DENSE_BUCKET_TOKENS
    prompts = [(0, b), (b, 3), (2 * b, b + 1), (4 * b, b), (5 * b, b), (6 * b, 2 * b), (8 * b, 7)]
    plans = DensePrefill.plan(prompts)
    assert [(len(p.prompts), p.length) for p in plans] == [(4, b), (1, b), (2, 2 * b)]
    first = plans[0]
    assert first.prompts == ((0, b), (b, 3), (4 * b, b), (5 * b, b))
    assert first.rows.size == 4 * b and first.rows[b : b + 3].tolist() == [b, b + 1, b + 2]
    assert set(first.rows[b + 3 : 2 * b].tolist()) == {b + 2}  # padding: the last real row
    assert first.rows[2 * b :].tolist() == list(range(4 * b, 6 * b))
    assert plans[1].prompts == ((8 * b, 7),) and plans[2].prompts == ((2 * b, b + 1), (6 * b, 2 * b))


def test_dense_path_is_never_taken_under_a_sliding_window_or_in_a_padded_step():
    backend = TritonPagedAttention(AttentionShape(4, 2, 16, 0.25, sliding_window=3), dense_min_tokens=1)
    layout = StepLayout([9], [9], [[0, 1, 2]], 4)
    assert backend.build_metadata(layout, torch.device(DEVICE)).dense_rows == ()
    backend = TritonPagedAttention(AttentionShape(4, 2, 16, 0.25), dense_min_tokens=1)
    assert backend.build_metadata(layout, torch.device(DEVICE)).dense_rows == ((0, 9),)
    assert backend.build_metadata(StepLayout([1], [1], [[0]], 4), torch.device(DEVICE), pad_to=2).dense_rows == ()


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2), (8, 1), (16, 2)])
def test_gqa_groups_including_non_power_of_two(heads, kv_heads):
    compare(CASES["mixed_step"], heads=heads, kv_heads=kv_heads)


def test_head_dim_not_a_power_of_two():
    compare(CASES["mixed_step"], dim=24)


def test_float16_on_the_interpreter():
    # bf16 runs in the GPU cases only: Triton 3.9's interpreter gets bf16 tl.dot wrong.
    compare(CASES["mixed_step"], dtype=torch.float16, atol=2e-2)


@pytest.mark.parametrize("seed", range(4))
def test_random_steps(seed):
    rng = random.Random(seed)
    specs = []
    for _ in range(rng.randint(1, 6)):
        ctx = rng.randint(1, 80)
        specs.append((rng.choice([1, rng.randint(1, ctx)]), ctx))
    compare(specs, seed=seed)


def test_padded_metadata_and_refill_match_unpadded():
    """The CUDA-graph path: a decode step padded to 8 rows, then refilled with a new layout."""
    heads, kv_heads, dim, block = 4, 2, 16, 4
    device = torch.device(DEVICE)
    shape = AttentionShape(heads, kv_heads, dim, dim**-0.5)
    backend = TritonPagedAttention(shape)
    first, q, k, v, k_cache, v_cache = make_step([(1, 5), (1, 9), (1, 2)], heads, kv_heads, dim, block,
                                                 torch.float32, device)  # fmt: skip
    metadata = backend.build_metadata(first, device, pad_to=8, width=16)
    second = StepLayout([1, 1, 1, 1, 1], [3, 6, 1, 7, 4], [[0], [1, 2], [3], [4, 5], [6]], block)
    backend.refill(metadata, second)
    fresh = backend.build_metadata(second, device)
    pad = lambda t: torch.cat([t, torch.randn(3, *t.shape[1:], device=device)])  # noqa: E731
    q2, k2, v2 = (torch.randn(5, h, dim, device=device) for h in (heads, kv_heads, kv_heads))
    cache_a, cache_b = (k_cache.clone(), v_cache.clone()), (k_cache.clone(), v_cache.clone())
    padded_out = backend.forward(pad(q2), pad(k2), pad(v2), *cache_a, metadata)
    plain_out = backend.forward(q2, k2, v2, *cache_b, fresh)
    torch.testing.assert_close(padded_out[:5], plain_out, atol=1e-6, rtol=0)
    torch.testing.assert_close(padded_out[5:], torch.zeros(3, heads, dim, device=device))  # padding attends to nothing
    torch.testing.assert_close(cache_a[0], cache_b[0], atol=0, rtol=0)  # padding wrote no slot


def test_refill_writes_only_the_block_table_columns_the_step_reads():
    """A graph's table spans the model's whole context; a step writes the columns it uses, the
    rest keep whatever an earlier step left (never read: the kernel stops at each sequence's
    own blocks)."""
    backend = TritonPagedAttention(AttentionShape(4, 2, 16, 0.25))
    device = torch.device(DEVICE)
    metadata = backend.build_metadata(StepLayout([1], [3], [[0]], 4), device, pad_to=4, width=64)
    metadata.block_tables.fill_(-7)
    backend.refill(metadata, StepLayout([1, 1], [5, 2], [[9, 4, 8], [3]], 4))
    tables = metadata.block_tables.cpu()
    assert tables[:, :2].tolist() == [[9, 4], [3, 0], [0, 0], [0, 0]]
    assert (tables[:, 2:] == -7).all()
    assert metadata.context_lens.cpu().tolist() == [5, 2, 0, 0]


def compare_split(specs, pad_to, heads=4, kv_heads=2, dim=16, block=4, dtype=torch.float32, device=DEVICE,
                  atol=1e-4, seed=0, merge_in_kernel=False, launches=1):  # fmt: skip
    """A decode step padded as a CUDA graph pads it: its keys split over several programs,
    merged by a launch of their own or (`merge_in_kernel`) by each tile's last program; the
    step runs `launches` times on the same metadata, as a graph replays it."""
    device = torch.device(device)
    layout, q, k, v, k_cache, v_cache = make_step(specs, heads, kv_heads, dim, block, dtype, device, seed)
    shape = AttentionShape(heads, kv_heads, dim, dim**-0.5)
    reference, triton_backend = ReferenceAttention(shape), TritonPagedAttention(shape)
    triton_backend.merge_splits_in_kernel = merge_in_kernel
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    expected = reference.forward(q, k, v, ref_k, ref_v, reference.build_metadata(layout, device))
    width = max(-(-c // block) for _, c in specs) + 2
    metadata = triton_backend.build_metadata(layout, device, pad_to=pad_to, width=width)
    assert metadata.splits > 1
    assert (metadata.arrivals is not None) == merge_in_kernel
    pad = lambda t: torch.cat([t, torch.randn(pad_to - len(specs), *t.shape[1:], device=device).to(dtype)])  # noqa: E731
    q, k, v = pad(q), pad(k), pad(v)
    for _ in range(launches):
        got = triton_backend.forward(q, k, v, k_cache, v_cache, metadata)
        torch.testing.assert_close(got[: len(specs)].float(), expected.float(), atol=atol, rtol=0)
        assert got[len(specs) :].abs().max() == 0  # padding attends to nothing
        if merge_in_kernel:  # each tile's last program set its count back for the next launch
            assert not metadata.arrivals.any()
    torch.testing.assert_close(k_cache, ref_k, atol=0, rtol=0)
    return metadata.splits


def test_split_count_spreads_long_contexts_over_the_gpu_up_to_the_target():
    # An 8B's 8 KV heads: batch 1 fills the SMs with 16 ranges, the measured batches take
    # 8 up to 64, 4 at 96, 2 at 256; past the target a launch is not split.
    assert [split_count(b, 8) for b in (1, 2, 4, 32, 64, 96, 256, 300, 512)] == [16, 8, 8, 8, 8, 4, 2, 1, 1]
    for tiles in range(1, 600):
        for heads in (1, 2, 8):
            splits = split_count(tiles, heads)
            assert splits & (splits - 1) == 0 and splits <= MAX_SPLITS_SMALL
            programs = tiles * heads * splits
            if splits > MAX_SPLITS:  # only a launch that stays small
                assert programs // 2 < MIN_PROGRAMS
            else:
                assert splits == 1 or programs <= SPLIT_TARGET_PROGRAMS
                assert splits == MAX_SPLITS or programs * 2 > SPLIT_TARGET_PROGRAMS


@pytest.mark.parametrize("specs", [[(1, 200)], [(1, 5), (1, 64), (1, 65), (1, 200), (1, 130)], [(1, 1), (1, 3)]])
def test_split_kv_decodes_equal_reference(specs):
    splits = compare_split(specs, pad_to=len(specs) + 1)
    assert splits >= 8  # the longest context spreads over several non-empty splits


@pytest.mark.parametrize("specs", [[(1, 200)], [(1, 5), (1, 64), (1, 65), (1, 200), (1, 130)]])
def test_split_kv_merged_by_each_tiles_last_program_equals_reference(specs):
    assert compare_split(specs, pad_to=len(specs) + 1, merge_in_kernel=True, launches=2) >= 8


@pytest.mark.parametrize("merge_in_kernel", [False, True])
@pytest.mark.parametrize("min_keys", [64, 128, 512])
def test_split_kv_with_a_least_range_equals_reference(monkeypatch, min_keys, merge_in_kernel):
    # Contexts shorter than SPLITS ranges of min_keys leave trailing programs with no keys: they
    # write no partial output, and the combine must not read one. Uninitialised buffers come
    # out NaN here, so a partial read where none was written poisons the output.
    from shard_server.attention import triton_paged

    monkeypatch.setattr(triton_paged, "MIN_SPLIT_KEYS", min_keys)
    empty = torch.empty

    def nan_empty(*size, **kwargs):
        out = empty(*size, **kwargs)
        return out.fill_(float("nan")) if out.is_floating_point() else out

    monkeypatch.setattr(torch, "empty", nan_empty)
    specs = [(1, 5), (1, 64), (1, 65), (1, 200), (1, 130), (1, 700)]
    assert compare_split(specs, pad_to=len(specs) + 1, merge_in_kernel=merge_in_kernel) >= 8


# (rotary width, dense prefill threshold): full rotary takes the fused rotary + KV store
# kernel; partial rotary (12 of 16 dims, Phi-4-mini's 0.75) does not, so the in-place rotary
# kernel rotates q and k, then the plain store.
@pytest.mark.parametrize("width,dense_min_tokens", [(16, DENSE_PREFILL_MIN_TOKENS), (16, 5), (12, DENSE_PREFILL_MIN_TOKENS)])
def test_rotary_in_the_triton_backend_equals_rotary_then_reference(width, dense_min_tokens):
    from shard_server.kernels.dispatch import fused_kernels
    from shard_server.layers.rotary import RotaryEmbedding
    from shard_server.models.config import RopeScaling

    heads, kv_heads, dim, block = 6, 2, 16, 4  # 6 heads: a masked, non-power-of-two head count
    device = torch.device(DEVICE)
    specs = [(1, 30), (9, 9), (1, 2), (6, 17)]
    layout, q, k, v, k_cache, v_cache = make_step(specs, heads, kv_heads, dim, block, torch.float32, device)
    positions = torch.tensor([p for n, c in specs for p in range(c - n, c)], device=device)
    step = RotaryEmbedding(width, 64, 10000.0, RopeScaling(), torch.float32, device).for_step(positions)
    shape = AttentionShape(heads, kv_heads, dim, dim**-0.5)
    reference, triton_backend = ReferenceAttention(shape), TritonPagedAttention(shape, dense_min_tokens)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    with fused_kernels(False):
        expected = reference.forward(q.clone(), k.clone(), v, ref_k, ref_v, reference.build_metadata(layout, device), step)
    with fused_kernels(True, on_cpu=True):
        assert step.fusable(q) == (width == dim)
        got = triton_backend.forward(q, k, v, k_cache, v_cache, triton_backend.build_metadata(layout, device), step)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
    torch.testing.assert_close(k_cache, ref_k, atol=1e-5, rtol=0)  # rotated keys (their first `width` dims), in their slots
    torch.testing.assert_close(v_cache, ref_v, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_head_norms_in_the_rotary_store_equal_norming_first(dtype):
    # Qwen3's and Gemma 3's q_norm / k_norm inside the rotary + KV store launch, against the
    # per-head norm kernel's launch and then the plain rotation (and, in float32, the torch
    # norms, rotation and reference backend): same outputs, same cache.
    from shard_server.kernels.dispatch import fused_kernels
    from shard_server.layers.norm import RMSNorm, norm_heads
    from shard_server.layers.rotary import HeadNormedRotation, RotaryEmbedding
    from shard_server.models.config import RopeScaling

    heads, kv_heads, dim, block = 6, 2, 16, 4
    device = torch.device(DEVICE)
    specs = [(1, 30), (9, 9), (6, 17)]
    layout, q, k, v, k_cache, v_cache = make_step(specs, heads, kv_heads, dim, block, dtype, device)
    q, k = q * 3.0, k * 0.5  # rows far from unit RMS: the norm matters
    positions = torch.tensor([p for n, c in specs for p in range(c - n, c)], device=device)
    step = RotaryEmbedding(dim, 64, 10000.0, RopeScaling(), dtype, device).for_step(positions)
    generator = torch.Generator().manual_seed(3)
    norms = []
    for eps in (1e-6, 1e-5):
        norm = RMSNorm(dim, eps, dtype, device)
        norm.weight.copy_(1.0 + 0.5 * torch.randn(dim, generator=generator))
        norms.append(norm)
    rotation = HeadNormedRotation(step, tuple(norms))
    shape = AttentionShape(heads, kv_heads, dim, dim**-0.5)
    backend = TritonPagedAttention(shape)
    metadata = backend.build_metadata(layout, device)
    original_k, original_v = k_cache.clone(), v_cache.clone()  # the contexts' keys and values
    first_k, first_v = k_cache.clone(), v_cache.clone()
    with fused_kernels(True, on_cpu=True):
        assert rotation.fusable(q)
        normed_q, normed_k = norm_heads(q.clone(), k.clone(), *norms)  # the per-head norm launch
        expected = backend.forward(normed_q, normed_k, v, first_k, first_v, metadata, step)
        got = backend.forward(q.clone(), k.clone(), v, k_cache, v_cache, metadata, rotation)
    exact = dict(atol=1e-6, rtol=0) if dtype == torch.float32 else dict(atol=0, rtol=2**-7)  # bf16: one rounding apart
    torch.testing.assert_close(got, expected, **exact)
    torch.testing.assert_close(k_cache, first_k, **exact)
    torch.testing.assert_close(v_cache, first_v, atol=0, rtol=0)
    if dtype == torch.float32:
        reference = ReferenceAttention(shape)
        ref_k, ref_v = original_k, original_v
        with fused_kernels(False):
            assert not rotation.fusable(q)
            want = reference.forward(q.clone(), k.clone(), v, ref_k, ref_v, reference.build_metadata(layout, device),
                                     rotation)  # fmt: skip
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
        torch.testing.assert_close(k_cache, ref_k, atol=1e-5, rtol=0)


def test_refill_rejects_a_different_shape():
    backend = TritonPagedAttention(AttentionShape(4, 2, 16, 0.25))
    metadata = backend.build_metadata(StepLayout([1], [3], [[0]], 4), torch.device(DEVICE), pad_to=2, width=4)
    with pytest.raises(ValueError):
        backend.refill(metadata, StepLayout([1] * 3, [1] * 3, [[0], [1], [2]], 4))
    with pytest.raises(ValueError):
        backend.refill(metadata, StepLayout([1], [20], [[0, 1, 2, 3, 4]], 4))


# -- GPU-sized cases ------------------------------------------------------------------------
GPU_DTYPES = [torch.bfloat16, torch.float16]


@needs_cuda
@pytest.mark.parametrize("dtype", GPU_DTYPES)
def test_gpu_8k_context_decode_and_chunk(dtype):
    compare([(1, 8192), (512, 8192), (1, 8000)], heads=32, kv_heads=8, dim=128, block=16, dtype=dtype,
            device="cuda", atol=2e-2)  # fmt: skip


@needs_cuda
@pytest.mark.parametrize("dtype", GPU_DTYPES)
def test_gpu_many_tiny_sequences(dtype):
    rng = random.Random(7)
    specs = [(rng.choice([1, 1, 2, 3]), rng.randint(3, 40)) for _ in range(300)]
    compare(specs, heads=32, kv_heads=8, dim=128, block=16, dtype=dtype, device="cuda", atol=2e-2)


@needs_cuda
@pytest.mark.parametrize("dtype", GPU_DTYPES)
def test_gpu_split_kv_long_contexts(dtype):
    compare_split([(1, 8192), (1, 3000), (1, 17)], pad_to=4, heads=32, kv_heads=8, dim=128, block=16,
                  dtype=dtype, device="cuda", atol=2e-2)  # fmt: skip


@needs_cuda
@pytest.mark.parametrize("batch", [1, 4])
def test_gpu_split_kv_merged_in_kernel_over_many_launches(batch):
    """The last program's merge reads partials other SMs wrote: repeated launches would show a
    merge that ran before every partial was visible."""
    specs = [(1, 8192), (1, 3000), (1, 17), (1, 1024)][:batch]
    compare_split(specs, pad_to=batch + 1, heads=32, kv_heads=8, dim=128, block=16, dtype=torch.bfloat16,
                  device="cuda", atol=2e-2, merge_in_kernel=True, launches=200)  # fmt: skip


@needs_cuda
@pytest.mark.parametrize("dtype", GPU_DTYPES)
def test_gpu_dense_prefill_with_decodes_and_a_cached_chunk(dtype):
    metadata = compare([(2048, 2048), (1100, 1100), (1, 100), (300, 1000), (100, 100)], heads=32, kv_heads=8,
                       dim=128, block=16, dtype=dtype, device="cuda", atol=2e-2)  # fmt: skip
    assert [length for _, length in metadata.dense_rows] == [2048, 1100]  # 1100: padded to a bucket


@needs_cuda
def test_gpu_mixed_prefill_and_decodes_float32():
    rng = random.Random(3)
    specs = [(1, rng.randint(1, 3000)) for _ in range(64)] + [(2048, 2048), (300, 1000)]
    compare(specs, heads=32, kv_heads=8, dim=128, block=16, device="cuda", atol=1e-4)


@pytest.mark.parametrize("query_lens", [[1], [1, 1, 1], [5, 1, 1], [3, 7], [1] * 9 + [130], [17, 2, 1, 1, 1]])
def test_every_metadata_section_starts_16_byte_aligned(query_lens):
    """Triton specialises kernels on pointer alignment: a section whose alignment followed the
    batch shape would compile a new kernel variant for new batch shapes while serving."""
    backend = TritonPagedAttention(AttentionShape(8, 2, 16, 0.25))
    contexts = [n + 3 * i for i, n in enumerate(query_lens)]
    tables = [list(range(10 * i, 10 * i + -(-c // 4))) for i, c in enumerate(contexts)]
    for pad_to in (None, len(query_lens) + 3):
        if pad_to is not None and any(n != 1 for n in query_lens):
            continue  # padding is for decode graphs
        metadata = backend.build_metadata(StepLayout(query_lens, contexts, tables, 4), torch.device("cpu"), pad_to=pad_to)
        views = [metadata.slot_mapping, metadata.query_starts, metadata.query_lens, metadata.context_lens,
                 metadata.block_tables] + [t for launch in metadata.launches for t in (launch.tile_seq, launch.tile_first)]  # fmt: skip
        assert all(view.data_ptr() % 16 == 0 for view in views), [view.storage_offset() for view in views]


def test_prepare_runs_every_batch_shape_a_chunk_of_the_step_budget_pads_to(monkeypatch):
    """Each bucket up to the one the whole budget pads to, in every power-of-two batch that fits."""
    dense = TritonPagedAttention(AttentionShape(4, 2, 16, 0.25), dense_min_tokens=300).dense
    seen = []
    original = dense._sdpa
    monkeypatch.setattr(dense, "_sdpa", lambda q, k, v: seen.append(tuple(q.shape[:2])) or original(q, k, v))
    b = DENSE_BUCKET_TOKENS
    # A chunk of 4 buckets + 7 tokens pads to 5 buckets; two prompts of 2 buckets fit in it.
    assert dense.prepare(4 * b + 7, torch.float32, torch.device("cpu")) == 5
    assert seen == [(1, 2 * b), (2, 2 * b), (1, 3 * b), (1, 4 * b), (1, 5 * b)]
    seen.clear()
    assert dense.prepare(8 * b, torch.float32, torch.device("cpu")) == 11
    assert seen[:3] == [(1, 2 * b), (2, 2 * b), (4, 2 * b)] and (2, 4 * b) in seen and (2, 5 * b) not in seen
    backend = TritonPagedAttention(AttentionShape(4, 2, 16, 0.25), None)
    assert backend.prepare_prefill(4096, torch.float32, torch.device("cpu")) == 0


def test_a_prompt_not_a_multiple_of_the_bucket_is_padded_without_changing_its_rows():
    """Padding at the end: causal masking keeps it out of every real row."""
    dense = TritonPagedAttention(AttentionShape(4, 2, 16, 0.25), dense_min_tokens=1).dense
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(37, 4, 16, generator=gen)
    k, v = torch.randn(37, 2, 16, generator=gen), torch.randn(37, 2, 16, generator=gen)
    got = dense.causal(q, k, v)[:37]
    expand = lambda x: x.repeat_interleave(2, dim=1).transpose(0, 1)  # noqa: E731
    expected = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), expand(k), expand(v), is_causal=True, scale=0.25
    )
    torch.testing.assert_close(got, expected.transpose(0, 1), atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype,dense", [(torch.bfloat16, True), (torch.float16, True), (torch.float32, False)])
def test_the_registry_turns_the_dense_path_on_for_half_precision_only(dtype, dense):
    from shard_server.attention.registry import create_backend

    backend = create_backend("triton", AttentionShape(4, 2, 16, 0.25), dtype)
    assert (backend.dense.min_tokens == DENSE_PREFILL_MIN_TOKENS) == dense
    assert (backend.dense.min_tokens is None) == (not dense)
