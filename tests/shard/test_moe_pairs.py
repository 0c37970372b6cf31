"""The decode path of the routed experts (shard_server/kernels/moe_pairs.py) against `reference_experts`.

On CPU through Triton's interpreter, in float32 and float16, with small tiles so masked edges
and several feature slices are covered; tolerances as in test_fused_moe.py. Cases include what
`pairs_apply` keeps off this path (every token on the same experts, top_k == experts): the
kernels must be right wherever they are called, only slower there.
"""

import pytest
import torch

pytest.importorskip("triton")

from shard_server.kernels import moe_pairs  # noqa: E402
from shard_server.kernels.dispatch import fused_kernels  # noqa: E402
from shard_server.kernels.moe_pairs import PairsTile, pair_experts, pairs_apply  # noqa: E402
from shard_server.models import moe as moe_module  # noqa: E402
from shard_server.models.moe import experts_forward, reference_experts  # noqa: E402

from .fp8_checkpoints import block_fp8_experts, fp8_experts  # noqa: E402
from .test_fused_moe import TOLERANCE, make_case  # noqa: E402

SMALL = PairsTile(block_n=8, block_k=16, num_warps=4)  # edges masked in both dimensions, two K tiles in down


@pytest.mark.parametrize("tokens, experts, top_k, skew", [
    (1, 8, 2, 0.0),     # one token
    (3, 16, 4, 0.0),
    (5, 4, 2, 0.0),     # tokens sharing experts
    (6, 5, 5, 0.0),     # top_k == experts
    (4, 16, 2, 30.0),   # every token on the same two experts
])  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_pair_experts_match_the_reference(tokens, experts, top_k, skew, dtype):
    x, w13, w2, weights, ids = make_case(tokens, experts, top_k, hidden=40, inter=24, skew=skew, dtype=dtype,
                                         seed=tokens * experts + top_k)  # fmt: skip
    want = reference_experts(x, w13, w2, weights, ids)
    with fused_kernels(True, on_cpu=True):
        got = pair_experts(x, w13, w2, weights, ids, gate_up_tile=SMALL, down_tile=SMALL)
    assert got.dtype == dtype and got.shape == want.shape
    assert want.abs().max() > 0.3, "outputs too small to compare"
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("tokens, experts, top_k", [(1, 8, 2), (3, 16, 4)])
def test_fp8_pair_experts_match_the_dequantizing_reference(tokens, experts, top_k):
    x, w13, w2, weights, ids = make_case(tokens, experts, top_k, hidden=40, inter=24, seed=7 + tokens)
    q13, q2, scales = fp8_experts(w13, w2)
    want = reference_experts(x, q13, q2, weights, ids, scales)
    assert (want - reference_experts(x, w13, w2, weights, ids)).abs().max() > 1e-4, "fp8 rounding changed nothing"
    with fused_kernels(True, on_cpu=True):
        got = pair_experts(x, q13, q2, weights, ids, scales, gate_up_tile=SMALL, down_tile=SMALL)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_which_batches_and_weights_take_the_pairs_path():
    x, w13, w2, _, ids = make_case(2, 16, 2, hidden=16, inter=16)
    assert pairs_apply(x, w13, w2, ids, None), "4 pairs over 16 experts"
    _, _, _, _, more = make_case(5, 16, 1, hidden=16, inter=16)
    assert not pairs_apply(x, w13, w2, more, None), "5 pairs over 16 experts: the grouped GEMMs"
    assert not pairs_apply(x, w13, w2, ids[:0], None), "no pairs"
    q13, q2, row_scales = fp8_experts(w13, w2)
    assert pairs_apply(x, q13, q2, ids, row_scales)
    assert not pairs_apply(x, q13, q2, ids, None), "fp8 experts without their scales"
    assert not pairs_apply(x, w13, w2, ids, row_scales), "scales for float experts"
    assert not pairs_apply(x.half(), w13, w2, ids, None), "weights of another dtype"
    b13, b2, block_scales, _, _ = block_fp8_experts(w13, w2, (16, 16))
    assert not pairs_apply(x, b13, b2, ids, block_scales), "block scales: the grouped kernel"


def test_experts_forward_takes_the_pairs_path_for_a_decode_batch(monkeypatch):
    x, w13, w2, weights, ids = make_case(1, 16, 4, hidden=48, inter=40, seed=5)
    want = reference_experts(x, w13, w2, weights, ids)
    calls = []
    real = moe_pairs.pair_experts
    monkeypatch.setattr(moe_module, "pair_experts", lambda *args: calls.append(args) or real(*args))
    with fused_kernels(True, on_cpu=True):
        got = experts_forward(x, w13, w2, weights, ids)
    assert len(calls) == 1
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
