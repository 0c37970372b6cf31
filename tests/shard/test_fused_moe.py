"""The fused MoE kernel (shard_server/kernels/fused_moe.py) against `reference_experts`.

On CPU the kernels run through Triton's interpreter (forced on with `on_cpu=True`), in float32
and float16 (the interpreter's bf16 dots are unreliable, see test_fused_kernels.py); tiny shapes
with small tiles, so masked edges and several row tiles an expert are covered. On a GPU, bf16 at
a Qwen3-30B-A3B-like shape, eagerly and replayed from a CUDA graph.

Tolerances, on unit-scale outputs: float32 1e-4 (the same float32 products summed in another
order); float16 / bf16 a few rounding steps of the model dtype (gate, up, SiLU and the product
are each rounded, and a last-bit difference in one of them moves the expert's output by about
that step), so 1e-2 and 3e-2.
"""

from dataclasses import replace

import pytest
import torch

pytest.importorskip("triton")

from shard_server.distributed import ParallelContext  # noqa: E402
from shard_server.kernels.dispatch import fused_kernels  # noqa: E402
from shard_server.kernels import fused_moe, moe_align  # noqa: E402
from shard_server.kernels.fused_moe import TILES, MoeTile, fused_experts, fused_moe_applies, tile_for  # noqa: E402
from shard_server.kernels.moe_align import align_pairs, align_to_blocks  # noqa: E402
from shard_server.models import moe as moe_module  # noqa: E402
from shard_server.models.config import ModelConfig  # noqa: E402
from shard_server.models.moe import MoeBlock, experts_forward, reference_experts, route  # noqa: E402

from .fp8_checkpoints import block_fp8_experts, fp8_experts  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"  # the small cases: compiled on a GPU, interpreted on CPU
needs_cuda = pytest.mark.skipif(not CUDA, reason="GPU-sized case: the Triton interpreter is too slow on CPU")
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 3e-2}
SMALL = MoeTile(block_m=16, block_n=16, block_k=16, group_m=2, num_warps=4, num_stages=2)  # masked edges, many tiles


def make_case(tokens, experts, top_k, hidden, inter, skew=0.0, renormalize=True, dtype=torch.float32,
              device=DEVICE, seed=0):  # fmt: skip
    """x, w13, w2 (scaled so every stage stays unit-sized), routing weights and ids."""
    gen = torch.Generator(device).manual_seed(seed)  # on the device: the GPU cases' weights are 800 MB

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device)

    x = randn(tokens, hidden)
    w13 = randn(experts, 2 * inter, hidden) / hidden**0.5
    w2 = randn(experts, hidden, inter) / inter**0.5
    logits = randn(tokens, experts)
    logits[:, :top_k] += skew  # skewed: every token to the same top_k experts, the rest get none
    weights, ids = route(logits, top_k, renormalize)
    return x.to(dtype), w13.to(dtype), w2.to(dtype), weights, ids


def check_alignment(topk_ids, experts, block_m):
    sorted_pairs, block_expert = align_to_blocks(topk_ids, experts, block_m)
    flat = topk_ids.reshape(-1).cpu()
    pairs = flat.numel()
    sorted_pairs, block_expert = sorted_pairs.cpu().long(), block_expert.cpu().long()
    blocks = -(-(pairs + min(experts, pairs) * (block_m - 1)) // block_m)
    assert sorted_pairs.shape == (blocks * block_m,) and block_expert.shape == (blocks,)
    real = sorted_pairs[sorted_pairs < pairs]
    assert sorted(real.tolist()) == list(range(pairs)), "every (token, k) pair exactly once"
    assert torch.all((sorted_pairs < pairs) | (sorted_pairs == pairs)), "padding is marked `pairs`"
    counts = torch.bincount(flat, minlength=experts)
    used = int(((counts + block_m - 1) // block_m).sum())
    assert torch.all(block_expert[:used] >= 0) and torch.all(block_expert[used:] == -1)
    tiles = sorted_pairs.view(blocks, block_m)
    for b in range(blocks):
        row = tiles[b]
        if block_expert[b] < 0:
            assert torch.all(row == pairs), "blocks past the last group hold only padding"
            continue
        assert torch.all(flat[row[row < pairs]] == block_expert[b]), "a block holds one expert's pairs"
        assert (row < pairs).any(), "no block of padding alone inside the groups"
    seen = block_expert[:used]
    assert torch.all(seen[1:] >= seen[:-1]) and seen.unique().numel() == int((counts > 0).sum())
    assert int((sorted_pairs[: used * block_m] < pairs).sum()) == pairs  # groups start at tile edges


@pytest.mark.parametrize("tokens, experts, top_k, skew, block_m", [
    (1, 4, 1, 0.0, 16), (1, 8, 2, 0.0, 16), (7, 8, 2, 0.0, 4), (13, 16, 4, 8.0, 16),
    (40, 4, 2, 0.0, 16), (33, 3, 3, 0.0, 16), (64, 128, 8, 0.0, 64), (9, 6, 2, 20.0, 1),
])  # fmt: skip
def test_alignment_groups_every_pair_once_in_aligned_blocks(tokens, experts, top_k, skew, block_m):
    _, _, _, _, ids = make_case(tokens, experts, top_k, 4, 4, skew=skew, seed=tokens + experts)
    check_alignment(ids, experts, block_m)


def check_against_the_torch_ops(align, tokens, experts, top_k, skew, block_m):
    """`align(ids, experts, block_m)` on the fused path gives align_to_blocks' int32 tensors exactly."""
    _, _, _, _, ids = make_case(tokens, experts, top_k, 4, 4, skew=skew, seed=tokens + experts)
    want = align_to_blocks(ids, experts, block_m)
    with fused_kernels(True, on_cpu=True):
        got = align(ids, experts, block_m)
    assert got[0].dtype == got[1].dtype == torch.int32
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("tokens, experts, top_k, skew, block_m", [
    (1, 4, 1, 0.0, 16), (1, 128, 8, 0.0, 16), (7, 8, 2, 0.0, 4), (13, 16, 4, 8.0, 16), (9, 6, 2, 20.0, 1),
    (40, 60, 4, 0.0, 16),   # 60 experts (Qwen2-MoE): not a power of two
    (32, 128, 8, 0.0, 16),  # 256 pairs: the most it takes
    (24, 3, 1, 30.0, 64),   # every pair on one expert, wide row tiles
])  # fmt: skip
def test_the_sorting_program_equals_the_torch_ops(tokens, experts, top_k, skew, block_m):
    """The one program a decode batch's pairs (up to ALIGN_IN_ONE_PROGRAM_UP_TO) take."""
    assert tokens * top_k <= moe_align.ALIGN_IN_ONE_PROGRAM_UP_TO
    check_against_the_torch_ops(align_pairs, tokens, experts, top_k, skew, block_m)


@pytest.mark.parametrize("tokens, experts, top_k, skew, block_m, layout_cells", [
    (1, 4, 1, 0.0, 16, 4096),       # one chunk, one pair
    (300, 8, 2, 5.0, 64, 4096),     # five chunks, skewed, wide row tiles
    (600, 60, 4, 0.0, 16, 128),     # 60 experts (not a power of two); the layout scans two chunks a step
    (512, 128, 8, 0.0, 128, 128),   # 4,096 pairs, 32 chunks, one a scan step
    (100, 6, 2, 20.0, 1, 16),       # row tiles of one
    (24, 3, 1, 30.0, 16, 4096),     # every pair on one expert
])  # fmt: skip
def test_the_chunked_alignment_equals_the_torch_ops(tokens, experts, top_k, skew, block_m, layout_cells,
                                                    monkeypatch):  # fmt: skip
    monkeypatch.setattr(moe_align, "ALIGN_IN_ONE_PROGRAM_UP_TO", 0)
    monkeypatch.setattr(moe_align, "ALIGN_LAYOUT_CELLS", layout_cells)
    check_against_the_torch_ops(align_pairs, tokens, experts, top_k, skew, block_m)


def test_alignment_past_one_programs_share_goes_by_chunks(monkeypatch):
    _, _, _, _, ids = make_case(6, 8, 2, 4, 4, seed=5)
    torch_calls, chunked_calls = [], []
    monkeypatch.setattr(moe_align, "ALIGN_IN_ONE_PROGRAM_UP_TO", 11)
    monkeypatch.setattr(moe_align, "align_to_blocks", lambda *args: torch_calls.append(args) or "torch")
    monkeypatch.setattr(moe_align, "_align_in_chunks", lambda *args: chunked_calls.append(args) or "chunks")
    with fused_kernels(True, on_cpu=True):
        assert moe_align.align_pairs(ids, 8, 16) == "chunks" and len(chunked_calls) == 1
        monkeypatch.setattr(moe_align, "ALIGN_IN_ONE_PROGRAM_UP_TO", 12)
        assert moe_align.align_pairs(ids, 8, 16) not in ("torch", "chunks")
        monkeypatch.setattr(moe_align, "ALIGN_MAX_EXPERTS", 7)  # more experts than a program's compare holds
        assert moe_align.align_pairs(ids, 8, 16) == "torch" and len(torch_calls) == 1


def test_alignment_with_every_pair_on_one_expert():
    ids = torch.full((10, 1), 2, dtype=torch.int64, device=DEVICE)
    check_alignment(ids, 5, 4)
    sorted_pairs, block_expert = align_to_blocks(ids, 5, 4)
    assert block_expert.tolist() == [2, 2, 2, -1, -1, -1, -1]  # 7 blocks: ceil((10 + 5 * 3) / 4)
    assert sorted_pairs[:12].tolist() == list(range(10)) + [10, 10]  # token order within the group


@pytest.mark.parametrize("tokens, experts, top_k, skew, renormalize", [
    (1, 4, 1, 0.0, True),     # one token, top 1
    (1, 8, 2, 0.0, False),    # one token, most experts empty
    (9, 8, 2, 0.0, True),
    (13, 16, 4, 8.0, False),  # skewed: 4 experts get every token, 12 get none
    (40, 4, 2, 0.0, True),    # several row tiles an expert
    (6, 5, 5, 0.0, True),     # top_k == experts
    (24, 3, 1, 30.0, False),  # all tokens to one expert
])  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fused_experts_match_the_reference(tokens, experts, top_k, skew, renormalize, dtype):
    x, w13, w2, weights, ids = make_case(tokens, experts, top_k, hidden=40, inter=24, skew=skew,
                                         renormalize=renormalize, dtype=dtype, seed=tokens * experts)  # fmt: skip
    want = reference_experts(x, w13, w2, weights, ids)
    with fused_kernels(True, on_cpu=True):
        got = fused_experts(x, w13, w2, weights, ids, SMALL)
    assert got.dtype == dtype and got.shape == want.shape
    assert want.abs().max() > 0.3, "outputs too small to compare"
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


def test_default_tiles_through_experts_forward():
    """experts_forward takes the fused path under the switch, with the table's tile."""
    x, w13, w2, weights, ids = make_case(5, 4, 2, hidden=48, inter=40, seed=3)
    want = reference_experts(x, w13, w2, weights, ids)
    with fused_kernels(True, on_cpu=True):
        got = experts_forward(x, w13, w2, weights, ids)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_mixed_weights_stay_on_the_torch_path(monkeypatch):
    x, w13, w2, weights, ids = make_case(3, 4, 2, hidden=16, inter=16, seed=4)
    assert fused_moe_applies(x, w13, w2)
    q13, q2, _ = fp8_experts(w13, w2)
    assert fused_moe_applies(x, q13, q2), "fp8 experts (with their scales) take the kernel"
    assert not fused_moe_applies(x, q13, w2)
    assert not fused_moe_applies(x.half(), w13, w2)
    calls = []
    monkeypatch.setattr(moe_module, "reference_experts", lambda *args: calls.append(args) or "reference")
    monkeypatch.setattr(moe_module, "fused_experts", lambda *a, **kw: pytest.fail("mixed weights reached the kernel"))
    with fused_kernels(True, on_cpu=True):
        assert experts_forward(x, q13, w2, weights, ids) == "reference"
    assert len(calls) == 1


@pytest.mark.parametrize("tokens, experts, top_k, skew", [(1, 8, 2, 0.0), (13, 16, 4, 8.0), (40, 4, 2, 0.0)])
def test_fp8_experts_match_the_dequantizing_reference(tokens, experts, top_k, skew):
    """fp8 weights widened in registers and each feature scaled by its row's scale: the reference
    with the experts dequantized, within float32's rounding (every e4m3 value is exact there)."""
    x, w13, w2, weights, ids = make_case(tokens, experts, top_k, hidden=40, inter=24, skew=skew, seed=tokens)
    q13, q2, scales = fp8_experts(w13, w2)
    want = reference_experts(x, q13, q2, weights, ids, scales)
    assert (want - reference_experts(x, w13, w2, weights, ids)).abs().max() > 1e-4, "fp8 rounding changed nothing"
    with fused_kernels(True, on_cpu=True):
        got = fused_experts(x, q13, q2, weights, ids, SMALL, scales=scales)
        through_forward = experts_forward(x, q13, q2, weights, ids, scales)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(through_forward, want, atol=1e-4, rtol=1e-4)


def test_tile_table_covers_every_shape():
    assert tile_for(1 * 8, 128) == TILES[0][1]  # decode
    assert tile_for(256 * 8, 128).block_m == 32
    assert tile_for(8192 * 8, 128) == TILES[-1][1]  # prefill
    assert tile_for(4096 * 8, 128).block_m == 128 and tile_for(2048 * 8, 128).block_m == 64  # 256 / 128 rows an expert
    assert tile_for(10**9, 1) == TILES[-1][1] and tile_for(1, 10**6) == TILES[0][1]
    for _, tile in TILES:
        assert min(tile.block_m, tile.block_n, tile.block_k) >= 16  # tensor-core tiles


@pytest.mark.parametrize("model_type, renormalize", [("qwen2_moe", False), ("mixtral", True)])
def test_moe_block_with_the_fused_experts(model_type, renormalize):
    """The whole block (router, routed experts, Qwen2-MoE's gated shared expert outside the
    kernel) gives the same output on both paths."""
    raw = dict(model_type=model_type, vocab_size=160, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
               num_attention_heads=4, num_key_value_heads=2, num_experts=6, num_local_experts=6,
               num_experts_per_tok=2, moe_intermediate_size=24, shared_expert_intermediate_size=40,
               norm_topk_prob=renormalize)  # fmt: skip
    cfg = ModelConfig.from_dict(raw)
    block = MoeBlock(cfg, ParallelContext(), torch.float32, torch.device(DEVICE))
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for param in block.parameters():
            param.copy_(torch.randn(param.shape, generator=gen).to(DEVICE) / param.shape[-1] ** 0.5)
    assert (block.shared_expert is not None) == (model_type == "qwen2_moe")
    x = torch.randn(11, 32, generator=gen).to(DEVICE)
    with torch.inference_mode():
        with fused_kernels(False):
            want = block(x)
        with fused_kernels(True, on_cpu=True):
            got = block(x)
    assert want.abs().max() > 0.3
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


# Qwen3-30B-A3B's MoE layer: hidden 2048, 128 experts, top 8, moe intermediate 768.
QWEN3_30B = dict(experts=128, top_k=8, hidden=2048, inter=768)


@needs_cuda
@pytest.mark.parametrize("tokens", [1, 7, 256])
def test_gpu_bf16_at_a_qwen3_30b_shape(tokens):
    x, w13, w2, weights, ids = make_case(tokens, dtype=torch.bfloat16, device="cuda", seed=tokens, **QWEN3_30B)
    want = reference_experts(x, w13, w2, weights, ids)
    got = experts_forward(x, w13, w2, weights, ids)  # fused: CUDA tensors, the default switch
    assert want.abs().max() > 0.3
    torch.testing.assert_close(got.float(), want.float(), atol=3e-2, rtol=3e-2)
    assert torch.equal(experts_forward(x, w13, w2, weights, ids), got), "the same bits every run (no atomics)"


@needs_cuda
@pytest.mark.parametrize("tokens", [1, 7, 256, 1024])  # 1,024 tokens: 8,192 pairs aligned in chunks
def test_gpu_fused_experts_under_a_cuda_graph(tokens):
    """Captured once, replayed with other inputs and other routing (skewed too): the reference's
    results, so nothing in the capture depends on the routing it saw."""
    x, w13, w2, weights, ids = make_case(tokens, dtype=torch.bfloat16, device="cuda", seed=tokens, **QWEN3_30B)
    static = [x.clone(), weights.clone(), ids.clone()]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        experts_forward(static[0], w13, w2, static[1], static[2])  # compile and warm outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = experts_forward(static[0], w13, w2, static[1], static[2])
    for seed, skew in ((tokens + 1, 0.0), (tokens + 2, 30.0)):
        x2, _, _, weights2, ids2 = make_case(tokens, dtype=torch.bfloat16, device="cuda", seed=seed, skew=skew,
                                             **QWEN3_30B)  # fmt: skip
        for buffer, value in zip(static, (x2, weights2, ids2)):
            buffer.copy_(value)
        graph.replay()
        want = reference_experts(x2, w13, w2, weights2, ids2)
        torch.testing.assert_close(out.float(), want.float(), atol=3e-2, rtol=3e-2)


@needs_cuda
@pytest.mark.parametrize("tokens", [1, 7, 256])
def test_gpu_fp8_experts_at_a_qwen3_30b_shape(tokens):
    """bf16 rows against e4m3 experts: the dequantizing reference, within bf16's rounding."""
    x, w13, w2, weights, ids = make_case(tokens, dtype=torch.bfloat16, device="cuda", seed=tokens, **QWEN3_30B)
    q13, q2, scales = fp8_experts(w13.float(), w2.float())
    want = reference_experts(x, q13, q2, weights, ids, scales)
    got = experts_forward(x, q13, q2, weights, ids, scales)
    assert want.abs().max() > 0.3
    torch.testing.assert_close(got.float(), want.float(), atol=3e-2, rtol=3e-2)


@needs_cuda
@pytest.mark.parametrize("tokens", [1, 7, 256])
def test_gpu_block_fp8_experts_at_a_qwen3_30b_shape(tokens):
    """Qwen3-30B-A3B-FP8's 128x128 blocks, rank 1 of 4 (intermediate rows [192, 384): the slice
    starts half-way into a block): bf16 rows against the reference on the dequantized weights."""
    shape = {**QWEN3_30B, "inter": 768}
    x, w13, w2, weights, ids = make_case(tokens, dtype=torch.float32, device="cuda", seed=tokens, **shape)
    q13, q2, scales, dense13, dense2 = block_fp8_experts(w13, w2, (128, 128), first=192, inter=192, seed=tokens)
    x = x.to(torch.bfloat16)
    want = reference_experts(x, dense13.to(torch.bfloat16), dense2.to(torch.bfloat16), weights, ids)
    got = experts_forward(x, q13, q2, weights, ids, scales)
    assert want.abs().max() > 0.3
    torch.testing.assert_close(got.float(), want.float(), atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("tokens, experts, top_k, renormalize, dtype", [
    (1, 128, 8, True, torch.bfloat16), (5, 60, 4, False, torch.bfloat16), (3, 8, 2, True, torch.float16),
    (4, 6, 6, False, torch.bfloat16), (0, 8, 2, True, torch.bfloat16),
    (2, 1024, 8, True, torch.float32),  # bf16 would hold ties among 1,024 logits, which torch orders its own way
])  # fmt: skip
def test_routing_in_one_launch_equals_the_torch_ops(tokens, experts, top_k, renormalize, dtype):
    logits = (torch.randn(tokens, experts, generator=torch.Generator().manual_seed(experts)) * 3).to(DEVICE, dtype)
    want = moe_module.reference_route(logits, top_k, renormalize)
    with fused_kernels(True, on_cpu=True):
        got = route(logits, top_k, renormalize)
    assert got[1].dtype == torch.int64 and got[0].dtype == torch.float32 and got[0].shape == (tokens, top_k)
    assert torch.equal(got[1], want[1]), "the same experts, in the same order"
    torch.testing.assert_close(got[0], want[0], atol=1e-6, rtol=1e-5)


def test_a_tie_goes_to_the_earliest_expert():
    logits = torch.tensor([[0.0, 2.0, 1.0, 2.0, 2.0]], device=DEVICE)
    with fused_kernels(True, on_cpu=True):
        weights, ids = route(logits, 3, renormalize=True)
    assert ids.tolist() == [[1, 3, 4]]
    torch.testing.assert_close(weights, torch.full((1, 3), 1 / 3, device=DEVICE))


def test_fp8_experts_without_their_scales_are_refused():
    x, w13, w2, weights, ids = make_case(3, 4, 2, hidden=16, inter=16, seed=6)
    q13, q2, scales = fp8_experts(w13, w2)
    with fused_kernels(True, on_cpu=True):
        with pytest.raises(ValueError, match="fp8 experts need their scales"):
            fused_experts(x, q13, q2, weights, ids)
        with pytest.raises(ValueError, match="only fp8 experts take them"):
            fused_experts(x, w13, w2, weights, ids, scales=scales)


@pytest.mark.parametrize("tokens, experts, top_k, skew, block, first, dtype", [
    (1, 8, 2, 0.0, (16, 16), 0, torch.float32),    # one token, most experts empty
    (13, 16, 4, 8.0, (16, 32), 16, torch.float32),  # skewed; w2's columns start mid-block
    (40, 4, 2, 0.0, (24, 48), 8, torch.float32),    # several row tiles an expert; both slices start mid-block
    (9, 6, 2, 0.0, (32, 16), 40, torch.float32),    # a slice past the first blocks
    (9, 6, 2, 0.0, (24, 48), 20, torch.float16),
    (1, 4, 1, 0.0, (128, 128), 0, torch.float16),   # the Hub's blocks
])  # fmt: skip
def test_block_fp8_experts_match_the_dequantized_weights(tokens, experts, top_k, skew, block, first, dtype):
    """Block-scaled fp8 experts (a rank's slice of each, the checkpoint's scale blocks as stored)
    against the reference on the weights dequantized element by element: the reference's own
    dequantization exactly, the kernel within float32 (float16) rounding. Each block's scale
    differs up to 64x from its neighbours', so a scale from a wrong block (gate for up, a
    neighbouring row or K block, a slice offset dropped) is far outside the tolerance."""
    hidden = 40 if block[1] < 40 else block[1] + 8  # a partial last block either way
    x, w13, w2, weights, ids = make_case(tokens, experts, top_k, hidden=hidden, inter=first + 24, skew=skew,
                                         seed=tokens + first)  # fmt: skip
    q13, q2, scales, dense13, dense2 = block_fp8_experts(w13, w2, block, first=first, inter=24, seed=first)
    x = x.to(dtype)
    want = reference_experts(x, dense13.to(dtype), dense2.to(dtype), weights, ids)
    assert want.abs().max() > 0.3, "outputs too small to compare"
    assert torch.equal(reference_experts(x, q13, q2, weights, ids, scales), want)
    with fused_kernels(True, on_cpu=True):
        got = fused_experts(x, q13, q2, weights, ids, SMALL, scales=scales)
        through_forward = experts_forward(x, q13, q2, weights, ids, scales)  # the table's tiles, block_k cut to bk
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)
    torch.testing.assert_close(through_forward.float(), want.float(), atol=tol, rtol=tol)


def test_block_scales_that_do_not_fit_the_experts_are_refused():
    x, w13, w2, weights, ids = make_case(3, 4, 2, hidden=40, inter=24, seed=6)
    q13, q2, scales, _, _ = block_fp8_experts(w13, w2, (16, 16))
    with fused_kernels(True, on_cpu=True):
        fused_experts(x, q13, q2, weights, ids, SMALL, scales=scales)  # fits
        for bad, message in [
            (replace(scales, w13=scales.w13[:, 1:]), r"block scales of w13: torch.float32 \[4, 3, 3\].*need float32 "
                                                     r"\[4, 4, 3\] \(16x16 blocks from row 0\)"),
            (replace(scales, w2=scales.w2[:, :, :1]), r"block scales of w2: .*\[4, 3, 1\].*need float32 \[4, 3, 2\]"),
            (replace(scales, first=12), r"w13.*need float32 \[4, 6, 3\] \(16x16 blocks from row 12\)"),
            (replace(scales, block=(16, 8)), r"w13.*need float32 \[4, 4, 5\]"),
            (replace(scales, block=None), r"row scales of w13.*need float32 \[4, 48\] \(one a row\)"),
            (replace(scales, w2=scales.w2.double()), r"w2: torch.float64"),
        ]:  # fmt: skip
            with pytest.raises(ValueError, match=message):
                fused_experts(x, q13, q2, weights, ids, SMALL, scales=bad)
            with pytest.raises(ValueError, match=message):
                reference_experts(x, q13, q2, weights, ids, bad)


def test_block_scales_the_kernel_cannot_tile_take_the_reference(monkeypatch):
    """Blocks of 24 columns: no tensor-core K tile fits in one, so the experts stay on the torch path."""
    x, w13, w2, weights, ids = make_case(5, 4, 2, hidden=40, inter=24, seed=8)
    q13, q2, scales, dense13, dense2 = block_fp8_experts(w13, w2, (24, 24))
    assert not fused_moe_applies(x, q13, q2, scales) and fused_moe_applies(x, q13, q2, replace(scales, block=(24, 32)))
    monkeypatch.setattr(moe_module, "fused_experts", lambda *a, **kw: pytest.fail("24-column blocks took the kernel"))
    with fused_kernels(True, on_cpu=True):
        got = experts_forward(x, q13, q2, weights, ids, scales)
    assert torch.equal(got, reference_experts(x, dense13, dense2, weights, ids))
    with pytest.raises(ValueError, match="block scales of 24 columns"):
        fused_moe.fused_experts(x, q13, q2, weights, ids, SMALL, scales=scales)
