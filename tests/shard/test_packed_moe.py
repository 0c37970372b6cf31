"""GPTQ and AWQ Mixture-of-Experts checkpoints: experts packed (`layers/packed_experts.py`), the
routers as stored, attention and shared-expert linears packed as a dense model's.

Each checkpoint is compared with its oracle, the same model with the dequantized weights dense
(int4_checkpoints.py): every expert's weights are equal, logits differ only by summation order
(1e-5 relative, fp32), greedy tokens are equal, TP=2 gives TP=1's logits (1e-4). The fused
kernel (`kernels/fused_moe_packed.py`, through Triton's interpreter on CPU) is checked against
the reference loop over the same packed experts, float32 and float16, contiguous groups and
act-order, 4 and 8 bits.
"""

from __future__ import annotations

import pytest
import torch

from shard_server.distributed import ParallelContext
from shard_server.kernels.dispatch import fused_kernels
from shard_server.kernels.fused_moe import MoeTile
from shard_server.kernels.fused_moe_packed import fused_packed_experts
from shard_server.kernels.moe_pairs_packed import packed_pair_experts
from shard_server.layers.packed_experts import PackedExperts
from shard_server.models.config import ModelConfig, UnsupportedModelError
from shard_server.models.moe import MoeBlock, reference_experts, route
from shard_server.weights import WeightsError, read_config

from .int4_checkpoints import awq_config, damaged_copy, gptq_config
from .quantized_checkpoints import pack_quantized_config, write_family_checkpoints
from .test_int4_checkpoints import assert_generates_the_oracles_tokens, assert_two_ranks_give_one_ranks_logits, rel
from .test_tensor_parallel import load_rank_model
from .tiny_models import make_tiny_moe_model

FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe")  # w1/w2/w3 names; a packed shared expert; top-3
FORMATS = {
    "gptq4-g32-asym-v2": gptq_config(4, 32, sym=False, checkpoint_format="gptq_v2"),
    "gptq4-g32-actorder-sym-v1": gptq_config(4, 32, desc_act=True, sym=True),
    "gptq8-channel-asym-v1": gptq_config(8, -1, sym=False),
    "awq-g32": awq_config(32),
    # llm-compressor's W4A16 of an MoE model: asymmetric, act-order groups, routers ignored.
    "ct-w4a16-g32-actorder": {**pack_quantized_config(4, 32, symmetric=False, actorder="group"),
                              "ignore": ["lm_head", "re:.*mlp.gate$"]},  # fmt: skip
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """{(family, format): (quantized dir, oracle dir)}."""
    return write_family_checkpoints(tmp_path_factory, FAMILIES, make_tiny_moe_model, FORMATS)


CASES = [(family, name) for family in FAMILIES for name in FORMATS]


def _blocks(model) -> list[MoeBlock]:
    return [layer.mlp for layer in model.layers]


@pytest.mark.parametrize(("family", "name"), CASES)
def test_every_expert_stays_packed_and_holds_the_oracles_weights(checkpoints, family, name):
    packed_dir, oracle_dir = checkpoints[family, name]
    model, oracle = load_rank_model(packed_dir, ParallelContext()), load_rank_model(oracle_dir, ParallelContext())
    assert model.config.quantize == FORMATS[name]["quant_method"]
    for block, dense in zip(_blocks(model), _blocks(oracle)):
        assert isinstance(block.w13, PackedExperts) and isinstance(block.w2, PackedExperts)
        assert block.w13.qweight.dtype == torch.int32 and block.w13.bits == model.config.packed.bits
        assert torch.equal(block.router, dense.router)
        for e in range(block.w13.experts):
            assert torch.equal(block.w13.dequantize(torch.float32, e), dense.w13[e]), (family, name, e)
            assert torch.equal(block.w2.dequantize(torch.float32, e), dense.w2[e]), (family, name, e)
        if block.shared_expert is not None:
            assert block.shared_expert.gate_up_proj.packed is not None
            assert torch.equal(block.shared_expert.down_proj.packed.dequantize(), dense.shared_expert.down_proj.weight)


@pytest.mark.parametrize(("family", "name"), CASES)
def test_a_packed_moe_model_generates_its_oracles_greedy_tokens(checkpoints, family, name):
    assert_generates_the_oracles_tokens(*checkpoints[family, name])


def test_two_ranks_match_one(checkpoints):
    """Each rank reads its intermediate rows of every expert: gate/up output columns (cutting
    qzeros words, and AWQ's qweight words) and down input rows (whole words; act-order: the groups
    its rows use, padded to the most any expert needs)."""
    cases = [("qwen3_moe", "gptq4-g32-asym-v2"), ("mixtral", "awq-g32"), ("qwen2_moe", "gptq4-g32-actorder-sym-v1"),
             ("qwen3_moe", "gptq8-channel-asym-v1"), ("qwen2_moe", "ct-w4a16-g32-actorder")]  # fmt: skip
    assert_two_ranks_give_one_ranks_logits({case: checkpoints[case][0] for case in cases})


def test_each_rank_holds_its_slice_of_every_expert(checkpoints):
    cfg_dir = checkpoints["qwen3_moe", "awq-g32"][0]
    whole = _blocks(load_rank_model(cfg_dir, ParallelContext()))
    for rank in range(2):
        ctx = ParallelContext(rank, 2)
        part = _blocks(load_rank_model(cfg_dir, ctx))
        for block, full in zip(part, whole):
            start, end = ctx.split(full.moe.expert_intermediate_size)
            size = full.moe.expert_intermediate_size
            rows = torch.cat([torch.arange(start, end), size + torch.arange(start, end)])
            for e in range(full.w13.experts):
                assert torch.equal(block.w13.dequantize(torch.float32, e), full.w13.dequantize(torch.float32, e)[rows])
                assert torch.equal(block.w2.dequantize(torch.float32, e), full.w2.dequantize(torch.float32, e)[:, start:end])


# The fused kernel against the reference loop, over the same packed experts: interpreted on CPU,
# compiled on a GPU (bf16 too there: the interpreter's bf16 dots are unreliable).

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
DTYPES = [torch.float32, torch.float16, *([torch.bfloat16] if CUDA else [])]
TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 3e-2}
SMALL = MoeTile(block_m=16, block_n=16, block_k=32, group_m=2, num_warps=4, num_stages=2)  # masked edges, many tiles


@pytest.mark.parametrize("name", list(FORMATS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens, skew", [(1, 0.0), (7, 0.0), (12, 6.0)])  # 12: every token to the same experts
def test_the_fused_kernel_gives_the_reference_loops_output(checkpoints, name, dtype, tokens, skew):
    block = _blocks(load_rank_model(checkpoints["qwen3_moe", name][0], ParallelContext()))[0]
    gen = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, block.router.shape[1], generator=gen).to(dtype).to(DEVICE)
    logits = torch.randn(tokens, block.w13.experts, generator=gen)
    logits[:, :3] += skew
    weights, ids = (t.to(DEVICE) for t in route(logits, block.moe.top_k, True))
    w13, w2 = _on(block.w13, dtype, DEVICE), _on(block.w2, dtype, DEVICE)
    want = reference_experts(x, w13, w2, weights, ids)
    for tile in (None, SMALL):
        with fused_kernels(True, on_cpu=True):
            got = fused_packed_experts(x, w13, w2, weights, ids, tile=tile)
        assert got.dtype == dtype
        assert rel(got, want) < TOLERANCE[dtype], (name, tile)


@pytest.mark.parametrize("name", ["gptq4-g32-asym-v2", "gptq8-channel-asym-v1", "awq-g32"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [1, 3])  # 3 and 9 pairs over 8 experts: some hit twice
def test_the_pairs_kernel_gives_the_reference_loops_output(checkpoints, name, dtype, tokens):
    """Decode batches pair by pair: the exact quantized weight (the reference rounds it to the
    activations' dtype first), so float32 to 1e-5 and half dtypes within a rounding."""
    block = _blocks(load_rank_model(checkpoints["qwen3_moe", name][0], ParallelContext()))[0]
    gen = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, block.router.shape[1], generator=gen).to(dtype).to(DEVICE)
    weights, ids = (t.to(DEVICE) for t in route(torch.randn(tokens, block.w13.experts, generator=gen), 3, True))
    w13, w2 = _on(block.w13, dtype, DEVICE), _on(block.w2, dtype, DEVICE)
    with fused_kernels(True, on_cpu=True):
        got = packed_pair_experts(x, w13, w2, weights, ids)
    assert got.dtype == dtype
    assert rel(got, reference_experts(x, w13, w2, weights, ids)) < TOLERANCE[dtype], name


@pytest.mark.parametrize("pairs_on", [True, False])  # as shipped, and off for a profile's A/B
def test_decode_batches_take_the_pairs_and_one_token_act_order_or_more_pairs_the_grouped_kernel(checkpoints,
                                                                                                monkeypatch, pairs_on):  # fmt: skip
    from shard_server.kernels import moe_pairs_packed
    from shard_server.models import moe

    monkeypatch.setattr(moe_pairs_packed, "PACKED_PAIRS", pairs_on)
    taken = []
    monkeypatch.setattr(moe, "packed_pair_experts", lambda *args: taken.append("pairs") or "pairs")
    monkeypatch.setattr(moe, "fused_packed_experts", lambda *args: taken.append("grouped") or "grouped")
    few = "pairs" if pairs_on else "grouped"
    # Top 1 of 8 experts: a quarter of them is 2 pairs, 2 tokens.
    for name, tokens, want in (("gptq4-g32-asym-v2", 2, few), ("gptq4-g32-asym-v2", 1, "grouped"),
                               ("gptq4-g32-asym-v2", 3, "grouped"), ("gptq4-g32-actorder-sym-v1", 2, "grouped")):  # fmt: skip
        block = _blocks(load_rank_model(checkpoints["qwen3_moe", name][0], ParallelContext()))[0]
        x = torch.randn(tokens, block.router.shape[1])
        weights, ids = route(torch.randn(tokens, block.w13.experts), 1, True)
        with fused_kernels(True, on_cpu=True):
            assert moe.experts_forward(x, block.w13, block.w2, weights, ids) == want, (name, tokens)


def _on(experts: PackedExperts, dtype, device) -> PackedExperts:
    """The same experts on `device` with their scales in `dtype` (a half model's checkpoint stores them so)."""
    return PackedExperts(experts.bits, experts.qweight.to(device), experts.zeros.to(device),
                         experts.scales.to(dtype).to(device), experts.g_idx.to(device), experts.group_rows)  # fmt: skip


def _random_experts(experts: int, depth: int, width: int, group: int, device) -> PackedExperts:
    """Random 4-bit words with zero points near 8 and fp16 scales that keep outputs unit-sized."""
    gen = torch.Generator(device).manual_seed(depth)
    groups = depth // group
    return PackedExperts(
        4, torch.randint(-(2**31), 2**31 - 1, (experts, depth // 8, width), generator=gen, device=device,
                         dtype=torch.int32),
        torch.randint(6, 10, (experts, groups, width), generator=gen, device=device).to(torch.int16),
        (torch.rand(experts, groups, width, generator=gen, device=device) * 0.5 / depth**0.5).half(),
        (torch.arange(depth, device=device) // group).int().expand(experts, depth).contiguous(), group,
    )  # fmt: skip


@pytest.mark.skipif(not CUDA, reason="GPU-sized case: the Triton interpreter is too slow on CPU")
@pytest.mark.parametrize("way, tokens", [("grouped", 1), ("grouped", 16), ("grouped", 300), ("pairs", 1), ("pairs", 4)])
def test_a_qwen3_30b_shaped_layer_matches_the_reference_eagerly_and_from_a_cuda_graph(way, tokens):
    """128 experts, hidden 2048, 768 intermediate rows (one rank), groups of 128, top 8, bf16."""
    w13, w2 = _random_experts(128, 2048, 2 * 768, 128, "cuda"), _random_experts(128, 768, 2048, 128, "cuda")
    experts = fused_packed_experts if way == "grouped" else packed_pair_experts
    gen = torch.Generator("cuda").manual_seed(tokens)
    x = torch.randn(tokens, 2048, generator=gen, device="cuda").bfloat16()
    weights, ids = route(torch.randn(tokens, 128, generator=gen, device="cuda"), 8, True)
    want = reference_experts(x, w13, w2, weights, ids)
    assert rel(experts(x, w13, w2, weights, ids), want) < TOLERANCE[torch.bfloat16]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = experts(x, w13, w2, weights, ids)
    x.copy_(torch.randn(tokens, 2048, generator=gen, device="cuda").bfloat16())
    graph.replay()
    assert rel(replayed, reference_experts(x, w13, w2, weights, ids)) < TOLERANCE[torch.bfloat16]


def test_no_pairs_give_zeros():
    block_in, out = 64, 32
    experts = PackedExperts(4, torch.zeros(3, block_in // 8, 2 * out, dtype=torch.int32),
                            torch.zeros(3, 1, 2 * out, dtype=torch.int16), torch.ones(3, 1, 2 * out),
                            torch.zeros(3, block_in, dtype=torch.int32), block_in)  # fmt: skip
    down = PackedExperts(4, torch.zeros(3, out // 8, block_in, dtype=torch.int32), torch.zeros(3, 1, block_in, dtype=torch.int16),
                         torch.ones(3, 1, block_in), torch.zeros(3, out, dtype=torch.int32), out)  # fmt: skip
    x = torch.randn(0, block_in)
    with fused_kernels(True, on_cpu=True):
        got = fused_packed_experts(x, experts, down, torch.zeros(0, 2), torch.zeros(0, 2, dtype=torch.long))
    assert got.shape == (0, block_in)


# Bad checkpoints and configs.

EXPERT = "model.layers.1.mlp.experts.2"


@pytest.mark.parametrize("name,edit,message", [
    ("gptq4-g32-asym-v2", lambda t: t.pop(f"{EXPERT}.down_proj.scales"), f"{EXPERT}.down_proj.scales is missing"),
    ("awq-g32", lambda t: t.pop(f"{EXPERT}.up_proj.qweight"), f"{EXPERT}.up_proj.qweight is missing \\(awq 4-bit"),
    ("gptq4-g32-actorder-sym-v1", lambda t: t.update({f"{EXPERT}.up_proj.g_idx": t[f"{EXPERT}.up_proj.g_idx"].flip(0)}),
     f"{EXPERT}.up_proj.g_idx differs from {EXPERT}.gate_proj.g_idx"),
    ("gptq4-g32-asym-v2", lambda t: t.update({f"{EXPERT}.gate_proj.qweight": t[f"{EXPERT}.gate_proj.qweight"].float()}),
     f"{EXPERT}.gate_proj.qweight is F32"),
])  # fmt: skip
def test_a_bad_expert_is_refused_naming_its_tensor(checkpoints, tmp_path, name, edit, message):
    directory = damaged_copy(checkpoints["qwen3_moe", name][0], tmp_path / name, edit)
    with pytest.raises(WeightsError, match=message):
        load_rank_model(directory, ParallelContext())


def test_an_moe_checkpoint_may_leave_only_its_routers_unquantized(checkpoints):
    raw = read_config(checkpoints["mixtral", "awq-g32"][0])
    ModelConfig.from_dict({**raw, "quantization_config": {**awq_config(32), "modules_to_not_convert": ["gate"]}})
    with pytest.raises(UnsupportedModelError, match="modules_to_not_convert \\['self_attn.o_proj'\\]"):
        ModelConfig.from_dict({**raw, "quantization_config": {**awq_config(32),
                                                              "modules_to_not_convert": ["gate", "self_attn.o_proj"]}})
    dense = {**raw, "model_type": "mistral"}  # a router means nothing there
    with pytest.raises(UnsupportedModelError, match="modules_to_not_convert \\['gate'\\]"):
        ModelConfig.from_dict({**dense, "quantization_config": {**awq_config(32), "modules_to_not_convert": ["gate"]}})
