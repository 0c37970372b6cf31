"""The fused Triton kernels (RMSNorm + residual, SiLU·mul, in-place rotary) against the
plain-torch paths they replace, and a whole model with them against the model without.

On CPU the kernels run through Triton's interpreter (forced on with `on_cpu=True`).
Tolerances: float32 1e-5; bf16 one rounding step (the kernels round once where torch
rounds after every op), so 2e-2 absolute on unit-scale values.
"""

import pytest
import torch

pytest.importorskip("triton")

from shard_server.kernels.dispatch import fused_kernels, use_fused  # noqa: E402
from shard_server.layers.norm import RMSNorm, norm_heads  # noqa: E402
from shard_server.layers.rotary import RotaryEmbedding, apply_rotary  # noqa: E402
from shard_server.models.config import RopeScaling  # noqa: E402

from shard_server.attention.base import StepLayout  # noqa: E402
from shard_server.distributed import ParallelContext  # noqa: E402
from shard_server.kv_cache import KVCache, KVSpec  # noqa: E402
from shard_server.models.config import ModelConfig  # noqa: E402
from shard_server.models.registry import build_model  # noqa: E402
from shard_server.weights import WeightStore, read_config  # noqa: E402

from .tiny_models import make_tiny_model, make_tiny_moe_model  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}
DTYPES = [torch.float32, torch.bfloat16]


def _randn(*shape, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(dtype=dtype, device=DEVICE)


def test_switch_controls_the_fused_path():
    x = torch.zeros(2, 2, device=DEVICE)
    with fused_kernels(False):
        assert not use_fused(x)
    with fused_kernels(True, on_cpu=True):
        assert use_fused(x)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [64, 96])  # 96: a masked, non-power-of-two row
def test_add_rmsnorm_matches_torch(dtype, hidden):
    norm = RMSNorm(hidden, 1e-5, dtype, torch.device(DEVICE))
    norm.weight.copy_(_randn(hidden, dtype=dtype, seed=1))
    x, residual = _randn(5, hidden, dtype=dtype, seed=2), _randn(5, hidden, dtype=dtype, seed=3)
    with fused_kernels(False):
        want_out, want_sum = norm.add_and_norm(x, residual)
        want_plain = norm(x)
    with fused_kernels(True, on_cpu=True):
        got_out, got_sum = norm.add_and_norm(x, residual)
        got_plain = norm(x)
    atol = TOLERANCE[dtype]
    torch.testing.assert_close(got_sum, want_sum, atol=atol, rtol=atol)  # the interpreter may truncate
    torch.testing.assert_close(got_out, want_out, atol=atol, rtol=atol)
    torch.testing.assert_close(got_plain, want_plain, atol=atol, rtol=atol)
    assert got_out.abs().max() > 0.5


@pytest.mark.parametrize("dtype", DTYPES)
def test_post_norm_add_rmsnorm_matches_torch(dtype):
    """Gemma's post-norm of a sublayer, the residual add and the next norm, in one launch."""
    hidden, device = 96, torch.device(DEVICE)
    post, norm = RMSNorm(hidden, 1e-6, dtype, device), RMSNorm(hidden, 1e-5, dtype, device)
    post.weight.copy_(_randn(hidden, dtype=dtype, seed=4) + 1.0)
    norm.weight.copy_(_randn(hidden, dtype=dtype, seed=5))
    x, residual = _randn(5, hidden, dtype=dtype, seed=6) * 30, _randn(5, hidden, dtype=dtype, seed=7)
    with fused_kernels(False):
        want_out, want_sum = norm.add_and_norm(x, residual, before=post)
        assert not torch.equal(want_sum, x + residual)  # the post-norm changed x
    with fused_kernels(True, on_cpu=True):
        got_out, got_sum = norm.add_and_norm(x, residual, before=post)
        two_launches = norm.add_and_norm(post(x), residual)
    atol = TOLERANCE[dtype]
    torch.testing.assert_close(got_sum, want_sum, atol=atol, rtol=atol)
    torch.testing.assert_close(got_out, want_out, atol=atol, rtol=atol)
    # The one launch computes what the two it replaces did: bit for bit in Triton's interpreter.
    # Compiled for a GPU, the fused row's reductions may round differently: two ulps at the
    # tensor's scale (seen on an H100: fp32 and bf16 rows one or two ulps apart).
    ulps = 0.0 if DEVICE == "cpu" else 2 * torch.finfo(dtype).eps
    for got, want in ((got_sum, two_launches[1]), (got_out, two_launches[0])):
        torch.testing.assert_close(got, want, atol=ulps * want.abs().max().item(), rtol=ulps)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads, kv_heads, dim", [(4, 2, 64), (6, 2, 96), (3, 3, 16)])  # 96: masked dims
def test_per_head_norms_of_q_and_k_in_one_launch_match_torch(dtype, heads, kv_heads, dim):
    """Qwen3's q_norm / k_norm over the views of a fused qkv output, normed in place; v untouched."""
    device, tokens = torch.device(DEVICE), 5
    q_norm, k_norm = RMSNorm(dim, 1e-6, dtype, device), RMSNorm(dim, 1e-5, dtype, device)
    q_norm.weight.copy_(_randn(dim, dtype=dtype, seed=8) + 1.0)
    k_norm.weight.copy_(_randn(dim, dtype=dtype, seed=9))
    qkv = _randn(tokens, (heads + 2 * kv_heads) * dim, dtype=dtype, seed=10) * 4

    def views(t):
        q, k, v = t.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
        return q.view(tokens, heads, dim), k.view(tokens, kv_heads, dim), v

    q, k, _ = views(qkv.clone())
    with fused_kernels(False):
        want_q, want_k = norm_heads(q, k, q_norm, k_norm)
    fused = qkv.clone()
    q, k, v = views(fused)
    with fused_kernels(True, on_cpu=True):
        got_q, got_k = norm_heads(q, k, q_norm, k_norm)
    assert got_q.data_ptr() == q.data_ptr(), "normed in place"
    atol = TOLERANCE[dtype]
    torch.testing.assert_close(got_q, want_q, atol=atol, rtol=atol)
    torch.testing.assert_close(got_k, want_k, atol=atol, rtol=atol)
    assert torch.equal(v, views(qkv)[2]), "v is not touched"
    assert not torch.allclose(want_k.float(), views(qkv)[1].float(), atol=0.1), "the norm changed k"


def test_post_norm_needs_a_residual():
    from shard_server.kernels.norm import fused_rmsnorm

    x = torch.ones(2, 8)
    with pytest.raises(ValueError, match="needs a residual"):
        fused_rmsnorm(x, torch.ones(8), 1e-6, pre=(torch.ones(8), 1e-6))


def _gated_reference(activation: str, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    from torch.nn import functional as F

    return (F.silu(gate) if activation == "silu" else F.gelu(gate, approximate="tanh")) * up


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_act_mul_matches_torch(dtype, activation):
    from shard_server.kernels.activation import fused_act_mul

    gate_up = _randn(3, 2 * 1100, dtype=dtype, seed=4) * 3  # 1100: two column blocks, masked
    gate_up[0, :4] = torch.tensor([-200.0, -30.0, 30.0, 200.0])  # the activation's saturations
    gate, up = gate_up.chunk(2, dim=-1)
    with fused_kernels(True, on_cpu=True):
        got = fused_act_mul(gate_up, activation)
    want = _gated_reference(activation, gate, up)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, atol=TOLERANCE[dtype] * 4, rtol=TOLERANCE[dtype])


def test_an_activation_without_a_kernel_is_refused_by_name():
    from shard_server.kernels.activation import fused_act_mul

    with pytest.raises(ValueError, match="relu2"):
        fused_act_mul(torch.zeros(1, 4, device=DEVICE), "relu2")


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_in_place_matches_torch(dtype):
    heads, kv_heads, dim, tokens = 6, 2, 32, 7  # 6 heads: a masked, non-power-of-two head count
    rotary = RotaryEmbedding(dim, 64, 10000.0, RopeScaling(), dtype, torch.device(DEVICE))
    qkv = _randn(tokens, (heads + 2 * kv_heads) * dim, dtype=dtype, seed=5)
    positions = torch.tensor([0, 3, 9, 17, 40, 41, 63], device=DEVICE)
    q = qkv[:, : heads * dim].view(tokens, heads, dim)
    k = qkv[:, heads * dim : (heads + kv_heads) * dim].view(tokens, kv_heads, dim)
    v_before = qkv[:, (heads + kv_heads) * dim :].clone()
    cos, sin = rotary.lookup(positions)
    want_q, want_k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    with fused_kernels(True, on_cpu=True):
        got_q, got_k = rotary.for_step(positions).apply(q, k)
    assert got_q.data_ptr() == q.data_ptr()  # rotated in place, inside the qkv buffer
    atol = TOLERANCE[dtype]
    torch.testing.assert_close(got_q, want_q, atol=atol, rtol=atol)
    torch.testing.assert_close(got_k, want_k, atol=atol, rtol=atol)
    torch.testing.assert_close(qkv[:, (heads + kv_heads) * dim :], v_before, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [5000, 4096, 49152 + 7])  # masked tail, one exact chunk, many chunks
def test_greedy_tail_matches_torch(dtype, vocab):
    from shard_server.kernels.greedy import fused_greedy

    logits = _randn(3, vocab, dtype=dtype, seed=7) * 4
    logits[1, vocab - 1] = 50  # the max in the last, masked chunk
    logits[2, 10] = logits[2, vocab // 2] = 60  # a tie: the first index wins, as in torch
    with fused_kernels(True, on_cpu=True):
        ids, logprobs = fused_greedy(logits)
    full = logits.float()
    want_ids = full.argmax(dim=1)
    assert ids.tolist() == want_ids.tolist() and ids.dtype == torch.int64
    assert ids[1] == vocab - 1 and ids[2] == 10
    want = full.log_softmax(dim=1).gather(1, want_ids.unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(logprobs, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", ["llama", "qwen3", "olmoe"])  # q/k norms: qwen3's per head, olmoe's whole
def test_model_logits_with_fused_kernels_match_torch(tmp_path, family):
    (make_tiny_moe_model if family == "olmoe" else make_tiny_model)(family, tmp_path)
    device = torch.device(DEVICE)
    config = ModelConfig.from_dict(read_config(tmp_path))
    with WeightStore(tmp_path) as store:
        model = build_model(config, store, ParallelContext(), "reference", torch.float32, device)
    spec = KVSpec(config.num_hidden_layers, config.num_key_value_heads, config.head_dim, 4, torch.float32)
    cache = KVCache(spec, 16, device)
    tokens = 13
    ids = torch.randint(0, config.vocab_size, (tokens,), generator=torch.Generator().manual_seed(6)).to(device)
    metadata = model.layers[0].self_attn.backend.build_metadata(StepLayout([tokens], [tokens], [[3, 0, 7, 5]], 4), device)
    positions = torch.arange(tokens, device=device)
    with torch.inference_mode():
        with fused_kernels(False):
            want = model.compute_logits(model(ids, positions, cache, metadata))
        with fused_kernels(True, on_cpu=True):
            got = model.compute_logits(model(ids, positions, cache, metadata))
    assert want.abs().max() > 1.0, "logits too flat to compare"
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("rows", [1, 3, 16])
@pytest.mark.parametrize("k", [256, 300])  # 300: a masked reduction tail
@pytest.mark.parametrize("split_k", [1, 2])  # 2: float32 partials of two K ranges, summed
def test_skinny_matmul_matches_torch(rows, k, split_k):
    from shard_server.kernels.skinny_matmul import SkinnyConfig, skinny_applies, skinny_matmul

    dtype = torch.float16  # the interpreter's bf16 dots are unreliable (see the attention tests)
    x = _randn(rows, k, dtype=dtype, seed=8)
    weight = _randn(80, k, dtype=dtype, seed=9) * 0.1  # 80 outputs: a masked last feature block
    assert skinny_applies(x, weight)
    config = SkinnyConfig(block_n=32, block_k=128, num_warps=4, num_stages=2, split_k=split_k)
    with fused_kernels(True, on_cpu=True):
        got = skinny_matmul(x, weight, config)
    want = (x.float() @ weight.float().T).to(dtype)
    torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-3)
    assert not skinny_applies(x.float(), weight.float())  # float32 would round to tf32
    assert not skinny_applies(_randn(17, k, dtype=dtype, seed=1), weight)


def test_skinny_config_follows_the_measured_table():
    from shard_server.kernels.skinny_matmul import DEEP, SQUARE, WIDE, config_for

    assert config_for(1, 6144, 4096) == WIDE  # qkv
    assert config_for(1, 4096, 4096) == SQUARE  # o
    assert config_for(4, 4096, 14336) == DEEP  # down
    assert config_for(1, 28672, 4096) is None  # gate_up: cuBLAS
    assert config_for(16, 28672, 4096) == WIDE
    from shard_server.kernels.skinny_matmul import FP8_WEIGHTS

    # fp8 weights: one config for every projection (cuBLAS has no bf16 x fp8 product).
    assert {config_for(1, n, k, weights_fp8=True) for n, k in [(6144, 4096), (4096, 14336), (28672, 4096)]} == {FP8_WEIGHTS}


@pytest.mark.parametrize("dtype", DTYPES)
def test_masked_greedy_matches_the_torch_mask(dtype):
    """The grammar's mask inside the greedy kernel: the argmax and logprob of the masked
    distribution, as apply_token_mask + argmax + log_softmax give them, for constrained and
    unconstrained rows in one batch, and a chunk with nothing allowed."""
    from shard_server.kernels.greedy import fused_greedy
    from shard_server.sampling import TokenMask, apply_token_mask

    vocab = 9000  # three chunks, the last one partial
    logits = _randn(4, vocab, dtype=dtype, seed=11) * 4
    words = (vocab + 31) // 32
    gen = torch.Generator().manual_seed(5)
    bits = torch.randint(-(2**31), 2**31 - 1, (2, words), generator=gen, dtype=torch.int64).to(torch.int32)
    bits[1] = 0
    bits[1, 8500 // 32] = 1 << (8500 % 32)  # row 3 allows one token, in the last chunk only
    logits[3, 8500] = -30  # far below the forbidden maximum
    rows = torch.tensor([1, 3])
    slots = torch.tensor([-1, 0, -1, 1], dtype=torch.int32)
    with fused_kernels(True, on_cpu=True):
        ids, logprobs = fused_greedy(logits, bits.to(DEVICE), slots.to(DEVICE))
    want = apply_token_mask(logits.float(), TokenMask(bits.to(DEVICE), rows.to(DEVICE)))
    want_ids = want.argmax(dim=1)
    assert ids.tolist() == want_ids.tolist()
    assert ids[3] == 8500
    want_lp = want.log_softmax(dim=1).gather(1, want_ids.unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(logprobs, want_lp, atol=1e-5, rtol=1e-5)
    assert logprobs[3] == 0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim, width", [(16, 12), (128, 96), (96, 96)])  # partial (half 6, 48: masked), full 96
def test_partial_rotary_in_place_matches_transformers_phi3(dtype, dim, width):
    """Partial rotary (Phi-4-mini: 96 of 128 dims) in the in-place kernel: the first `width`
    dims of each head rotate as transformers' Phi-3 apply_rotary_pos_emb rotates them, the
    others are left bit for bit; a full rotary head of 96 dims (not a power of two) too."""
    from transformers.models.phi3.modeling_phi3 import apply_rotary_pos_emb

    heads, kv_heads, tokens = 6, 2, 7
    rotary = RotaryEmbedding(width, 64, 10000.0, RopeScaling(), dtype, torch.device(DEVICE))
    qkv = _randn(tokens, (heads + 2 * kv_heads) * dim, dtype=dtype, seed=6)
    positions = torch.tensor([0, 3, 9, 17, 40, 41, 63], device=DEVICE)
    q = qkv[:, : heads * dim].view(tokens, heads, dim)
    k = qkv[:, heads * dim : (heads + kv_heads) * dim].view(tokens, kv_heads, dim)
    before = qkv.clone()
    cos, sin = rotary.lookup(positions)  # [T, 1, width]
    # transformers' layout: [batch, heads, T, dim], cos/sin [batch, T, width]
    want_q, want_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos.transpose(0, 1),
                                          sin.transpose(0, 1))  # fmt: skip
    want_q, want_k = want_q[0].transpose(0, 1), want_k[0].transpose(0, 1)
    torch.testing.assert_close(apply_rotary(q, cos, sin), want_q, atol=0, rtol=0)  # the torch path
    step = rotary.for_step(positions)
    with fused_kernels(True, on_cpu=True):
        assert not step.fusable(q) or width == dim == 128  # the fused store takes full rotary only
        got_q, got_k = step.apply(q, k)
    assert got_q.data_ptr() == q.data_ptr()  # rotated in place, inside the qkv buffer
    atol = TOLERANCE[dtype]
    torch.testing.assert_close(got_q, want_q, atol=atol, rtol=atol)
    torch.testing.assert_close(got_k, want_k, atol=atol, rtol=atol)
    rows = qkv.view(tokens, heads + 2 * kv_heads, dim)
    assert torch.equal(rows[:, :, width:], before.view_as(rows)[:, :, width:])  # pass-through dims untouched
    assert torch.equal(rows[:, heads + kv_heads :], before.view_as(rows)[:, heads + kv_heads :])  # v untouched
