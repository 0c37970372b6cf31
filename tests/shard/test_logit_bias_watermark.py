"""Logit bias and the green-list watermark: exact effect on logits, greedy included, the
shard's checks, and the detector telling watermarked from plain token streams."""

import pytest
import torch

from shard_server.pb import generate_pb2 as pb
from shard_server.requests import InvalidStepError, SamplingParams
from shard_server.sampling import Sampler, SamplingRows, apply_logit_bias
from shard_server.watermark import apply_watermark, green_mask, z_score

VOCAB = 64


def rows(params, previous=None) -> SamplingRows:
    n = len(params)
    return SamplingRows(
        params=params,
        positions=[3] * n,
        all_tokens=[[0]] * n,
        generated_tokens=[[]] * n,
        top_n=[0] * n,
        previous_tokens=previous or [0] * n,
    )


def test_logit_bias_adds_per_row_and_leaves_other_rows_alone():
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(1))
    params = [
        SamplingParams(logit_bias=((5, 100.0), (7, -3.5))),
        SamplingParams(),
        SamplingParams(logit_bias=((63, -100.0),)),
    ]
    out = apply_logit_bias(logits, params)
    expected = logits.clone()
    expected[0, 5] += 100.0
    expected[0, 7] -= 3.5
    expected[2, 63] -= 100.0
    torch.testing.assert_close(out, expected)


def test_logit_bias_steers_greedy_decoding():
    logits = torch.zeros(2, VOCAB)
    logits[:, 3] = 5.0
    sampler = Sampler(VOCAB, torch.device("cpu"))
    params = [SamplingParams(logit_bias=((9, 100.0),)), SamplingParams(logit_bias=((3, -100.0), (4, 1.0)))]
    out = sampler(logits, rows(params))
    assert out.ids.tolist() == [9, 4]


def test_logit_bias_from_proto_and_vocab_check():
    msg = pb.SamplingParameters(logit_bias=[pb.LogitBias(token_id=2, bias=-1.5)])
    params = SamplingParams.from_proto(msg)
    assert params.logit_bias == ((2, -1.5),)
    params.check_vocab(3)
    with pytest.raises(InvalidStepError, match="outside the vocabulary"):
        params.check_vocab(2)
    with pytest.raises(InvalidStepError, match="finite"):
        SamplingParams.from_proto(pb.SamplingParameters(logit_bias=[pb.LogitBias(token_id=1, bias=float("nan"))]))


@pytest.mark.parametrize("gamma, delta", [(0.0, 2.0), (1.0, 2.0), (0.5, float("inf"))])
def test_watermark_parameters_are_checked(gamma, delta):
    msg = pb.SamplingParameters(watermark=True, watermark_gamma=gamma, watermark_delta=delta)
    with pytest.raises(InvalidStepError, match="watermark"):
        SamplingParams.from_proto(msg)


def test_green_share_is_gamma_and_depends_on_previous_token():
    vocab = 50_000
    a = green_mask(torch.tensor([17]), vocab, torch.tensor([0.25]))
    b = green_mask(torch.tensor([18]), vocab, torch.tensor([0.25]))
    assert abs(a.float().mean().item() - 0.25) < 0.01
    overlap = (a & b).float().mean().item()
    assert abs(overlap - 0.25 * 0.25) < 0.01, "splits after different tokens are independent"


def test_watermark_adds_delta_to_green_tokens_only():
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(2))
    previous = torch.tensor([4, 9])
    gamma = torch.tensor([0.5, 0.5])
    out = apply_watermark(logits, previous, gamma, torch.tensor([2.0, 0.0]))
    green = green_mask(previous, VOCAB, gamma)
    torch.testing.assert_close(out[0], logits[0] + 2.0 * green[0].float())
    torch.testing.assert_close(out[1], logits[1])


def _generate(sampler: Sampler, steps: int, watermark: bool, seed: int) -> list[int]:
    """Samples from a flat distribution, so only the watermark can favour green tokens."""
    params = SamplingParams(
        do_sample=True, seed=seed, watermark=watermark, watermark_gamma=0.25, watermark_delta=2.0
    )
    tokens = [1]
    for position in range(steps):
        logits = torch.zeros(1, sampler.vocab_size)
        sampled = sampler(logits, SamplingRows([params], [position], [], [], [0], [tokens[-1]]))
        tokens.append(int(sampled.ids[0]))
    return tokens


def test_detector_finds_the_watermark_and_not_plain_text():
    sampler = Sampler(1000, torch.device("cpu"))
    marked = z_score(_generate(sampler, 200, True, seed=7), 1000, 0.25)
    plain = z_score(_generate(sampler, 200, False, seed=7), 1000, 0.25)
    assert marked > 6, marked
    assert abs(plain) < 3, plain
