"""Sampling: each processor against transformers' (or a plain loop), seeded determinism,
support constraints, and robustness to extreme parameters."""

import math
from dataclasses import replace

import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st

from shard_server.pb import generate_pb2 as pb
from shard_server.requests import InvalidStepError, SamplingParams, SequenceRefused
from shard_server.sampling import (
    Sampler,
    SamplingRows,
    apply_frequency_presence,
    apply_min_p,
    apply_repetition_penalty,
    apply_temperature,
    apply_top_k,
    apply_top_p,
    apply_typical_p,
    argmax_suffices,
    token_counts,
)

VOCAB = 50


def random_logits(rows: int, seed: int = 0, vocab: int = VOCAB) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def rows_for(params, positions=None, all_tokens=None, generated=None, top_n=None) -> SamplingRows:
    n = len(params)
    return SamplingRows(
        params=params,
        positions=positions or [10] * n,
        all_tokens=all_tokens or [[0]] * n,
        generated_tokens=generated or [[]] * n,
        top_n=top_n or [0] * n,
        previous_tokens=[0] * n,
    )


def per_row_reference(logits, processor_for_row):
    out = []
    for i in range(logits.shape[0]):
        processor = processor_for_row(i)
        row = logits[i : i + 1]
        out.append(row if processor is None else processor(None, row.clone()))
    return torch.cat(out)


def test_repetition_penalty_matches_transformers():
    logits = random_logits(3)
    seen = [[1, 5, 5, 7], [2], [3, 4, 9, 11, 40]]
    penalties = [1.3, 1.0, 0.7]
    padded = torch.tensor([r + [r[0]] * (5 - len(r)) for r in seen])
    ours = apply_repetition_penalty(logits, padded, torch.tensor(penalties))
    expected = torch.cat(
        [
            transformers.RepetitionPenaltyLogitsProcessor(p)(torch.tensor([r]), logits[i : i + 1].clone())
            for i, (r, p) in enumerate(zip(seen, penalties))
        ]
    )
    torch.testing.assert_close(ours, expected)
    assert not torch.equal(ours[0], logits[0]) and torch.equal(ours[1], logits[1])


def test_frequency_and_presence_penalty_match_plain_loop():
    logits = random_logits(2)
    generated = [[3, 3, 3, 8], []]
    frequency, presence = [0.5, 0.9], [0.25, 1.0]
    padded = torch.tensor([r + [VOCAB] * (4 - len(r)) for r in generated])
    ours = apply_frequency_presence(
        logits, token_counts(padded, VOCAB), torch.tensor(frequency), torch.tensor(presence)
    )
    expected = logits.clone()
    for i, tokens in enumerate(generated):
        for token in set(tokens):
            expected[i, token] -= frequency[i] * tokens.count(token) + presence[i]
    torch.testing.assert_close(ours, expected)
    assert ours[0, 3] == pytest.approx(logits[0, 3].item() - 1.75)


def test_temperature_matches_transformers():
    logits = random_logits(3)
    temps = [0.5, 1.0, 2.5]
    ours = apply_temperature(logits, torch.tensor(temps))
    expected = per_row_reference(logits, lambda i: transformers.TemperatureLogitsWarper(temps[i]))
    torch.testing.assert_close(ours, expected)


def test_top_k_matches_transformers():
    logits = random_logits(4)
    ks = [1, 5, 0, 10_000]
    ours = apply_top_k(logits, torch.tensor(ks))
    expected = per_row_reference(
        logits, lambda i: transformers.TopKLogitsWarper(ks[i]) if 0 < ks[i] < VOCAB else None
    )
    torch.testing.assert_close(ours, expected)
    assert (ours[0] > float("-inf")).sum() == 1 and (ours[1] > float("-inf")).sum() == 5


def test_top_p_matches_transformers():
    logits = random_logits(4)
    ps = [0.1, 0.5, 0.95, 1.0]
    ours = apply_top_p(logits, torch.tensor(ps))
    expected = per_row_reference(
        logits, lambda i: transformers.TopPLogitsWarper(ps[i]) if ps[i] < 1 else None
    )
    torch.testing.assert_close(ours, expected)
    assert torch.equal(ours[3], logits[3])


def test_typical_p_matches_transformers():
    logits = random_logits(4)
    masses = [0.2, 0.6, 0.9, 1.0]
    ours = apply_typical_p(logits, torch.tensor(masses))
    expected = per_row_reference(
        logits, lambda i: transformers.TypicalLogitsWarper(masses[i]) if masses[i] < 1 else None
    )
    torch.testing.assert_close(ours, expected)
    assert (ours[0] == float("-inf")).any()


def test_greedy_applies_penalties_and_reports_logprobs():
    logits = torch.zeros(1, VOCAB)
    logits[0, 4], logits[0, 9] = 5.0, 4.0
    sampler = Sampler(VOCAB, torch.device("cpu"))
    plain = sampler(logits, rows_for([SamplingParams()], top_n=[3]))
    assert plain.ids.tolist() == [4]
    assert plain.logprobs[0].item() == pytest.approx(logits.log_softmax(-1)[0, 4].item())
    assert plain.top_ids[0].tolist()[:2] == [4, 9]
    penalised = sampler(logits, rows_for([SamplingParams(repetition_penalty=2.0)], all_tokens=[[4]]))
    assert penalised.ids.tolist() == [9]


def sample_many(params: SamplingParams, logits_row: torch.Tensor, draws: int) -> torch.Tensor:
    sampler = Sampler(logits_row.shape[0], torch.device("cpu"))
    logits = logits_row.expand(draws, -1).clone()
    rows = rows_for([params] * draws, positions=list(range(draws)))
    return sampler(logits, rows).ids


def test_seeded_draws_follow_the_distribution():
    logits_row = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5])
    ids = sample_many(SamplingParams(do_sample=True, seed=42), logits_row, 20_000)
    observed = torch.bincount(ids, minlength=5).float() / ids.numel()
    torch.testing.assert_close(observed, logits_row.softmax(-1), atol=0.015, rtol=0)


def test_top_k_and_top_p_restrict_the_support():
    logits_row = random_logits(1, seed=5)[0] / 3
    top5 = set(torch.topk(logits_row, 5).indices.tolist())
    ids = sample_many(SamplingParams(do_sample=True, top_k=5, seed=3), logits_row, 2000)
    assert set(ids.tolist()) <= top5 and len(set(ids.tolist())) > 1
    probs, order = logits_row.softmax(-1).sort(descending=True)
    nucleus = set(order[: int((probs.cumsum(0) < 0.6).sum()) + 1].tolist())
    ids = sample_many(SamplingParams(do_sample=True, top_p=0.6, seed=3), logits_row, 2000)
    assert set(ids.tolist()) <= nucleus and len(set(ids.tolist())) > 1


def test_seeded_draw_is_independent_of_batch():
    sampler = Sampler(VOCAB, torch.device("cpu"))
    target = random_logits(1, seed=11)
    params = SamplingParams(do_sample=True, temperature=1.5, seed=2**40 + 17)
    alone = sampler(target, rows_for([params], positions=[33])).ids.item()
    others = random_logits(5, seed=12)
    batch = torch.cat([others[:2], target, others[2:]])
    mixed = [
        SamplingParams(do_sample=True, top_k=3, seed=1),
        SamplingParams(),
        params,
        SamplingParams(do_sample=True, top_p=0.5, seed=9),
        SamplingParams(repetition_penalty=1.5),
    ]
    result = sampler(batch, rows_for(mixed, positions=[1, 2, 33, 4, 5], all_tokens=[[0], [1], [2], [3], [4]]))
    assert result.ids[2].item() == alone
    # The draw varies with the seed and with the position.
    by_seed = {
        sampler(
            target, rows_for([SamplingParams(do_sample=True, temperature=3, seed=s)], positions=[33])
        ).ids.item()
        for s in range(20)
    }
    by_pos = {
        sampler(
            target, rows_for([SamplingParams(do_sample=True, temperature=3, seed=1)], positions=[p])
        ).ids.item()
        for p in range(20)
    }
    assert len(by_seed) > 3 and len(by_pos) > 3


def test_logprob_comes_from_the_processed_distribution():
    sampler = Sampler(VOCAB, torch.device("cpu"))
    logits = random_logits(1, seed=4)
    params = SamplingParams(do_sample=True, temperature=0.5, top_k=4, seed=8)
    out = sampler(logits, rows_for([params], top_n=[6]))
    processed = apply_top_k(logits / 0.5, torch.tensor([4])).log_softmax(-1)
    assert out.logprobs[0].item() == pytest.approx(processed[0, out.ids[0]].item(), abs=1e-5)
    assert torch.isinf(out.top_logprobs[0, 4:]).all() and torch.isfinite(out.top_logprobs[0, :4]).all()
    assert out.top_logprobs[0].tolist() == sorted(out.top_logprobs[0].tolist(), reverse=True)


@pytest.mark.parametrize(
    "field,value",
    [
        ("temperature", -1.0),
        ("temperature", math.nan),
        ("top_p", 1.5),
        ("top_p", -0.1),
        ("typical_p", 2.0),
        ("min_p", 1.5),
        ("min_p", -0.1),
        ("min_p", math.nan),
        ("repetition_penalty", -2.0),
        ("frequency_penalty", math.inf),
        ("presence_penalty", math.nan),
    ],
)
def test_invalid_parameters_are_rejected(field, value):
    with pytest.raises(InvalidStepError, match=field):
        SamplingParams.from_proto(pb.SamplingParameters(do_sample=True, **{field: value}))


@settings(max_examples=60, deadline=None)
@given(
    do_sample=st.booleans(),
    # width=32 (bounds exact in f32): the values a float proto field can hold; 0.99999999 is 1.0 there, which the
    # one rule refuses for top_p and typical_p (as the router does, in f32 too).
    temperature=st.floats(2.0**-100, 1e4, width=32),
    top_k=st.integers(0, 2**31),
    top_p=st.floats(2.0**-30, 1.0, exclude_max=True, width=32),
    typical_p=st.floats(2.0**-30, 1.0, exclude_max=True, width=32),
    min_p=st.floats(0.0, 1.0, width=32),
    repetition_penalty=st.floats(2.0**-20, 2.0**20, width=32),
    frequency_penalty=st.floats(-2.0, 2.0, width=32),
    presence_penalty=st.floats(-2.0, 2.0, width=32),
    seed=st.integers(0, 2**64 - 1),
)
def test_extreme_valid_parameters_always_yield_a_token(**fields):
    params = SamplingParams.from_proto(pb.SamplingParameters(**fields))
    sampler = Sampler(VOCAB, torch.device("cpu"))
    out = sampler(
        random_logits(2, seed=fields["seed"] % 1000),
        rows_for([params, SamplingParams()], all_tokens=[[1, 2], [3]], generated=[[2, 2], []], top_n=[3, 0]),
    )
    assert all(0 <= i < VOCAB for i in out.ids.tolist())
    assert math.isfinite(out.logprobs[0].item()) and out.logprobs[0].item() <= 0


def test_argmax_suffices_only_for_unprocessed_greedy_rows():
    from shard_server.requests import SamplingParams
    from shard_server.sampling import argmax_suffices

    assert argmax_suffices(SamplingParams())
    assert argmax_suffices(SamplingParams(temperature=0.5, top_k=3, top_p=0.5, min_p=0.2, seed=9))  # warpers skip greedy
    assert not argmax_suffices(SamplingParams(do_sample=True))
    assert not argmax_suffices(SamplingParams(repetition_penalty=1.2))
    assert not argmax_suffices(SamplingParams(frequency_penalty=0.1))
    assert not argmax_suffices(SamplingParams(presence_penalty=-0.1))


def test_uniforms_stay_below_one_so_the_noise_is_finite():
    from shard_server.sampling import uniform_from_bits

    bits = torch.tensor([0, 0xFF, 0xFFFFFF00, 0xFFFFFFFF], dtype=torch.int64)
    uniform = uniform_from_bits(bits)
    assert bool(((uniform > 0) & (uniform < 1)).all()), uniform
    assert bool(torch.isfinite(-torch.log(-torch.log(uniform))).all())


def test_a_ruled_out_token_is_never_drawn_even_where_its_noise_is_largest():
    """A key whose noise peaks (uniform rounds to 1 in float32) on a token the logits rule out:
    before the clamp that token's -inf + inf was NaN, and argmax drew it."""
    from shard_server.sampling import _mix32, row_keys

    vocab = 49152
    sampler = Sampler(vocab, torch.device("cpu"))
    seeds = list(range(4000))
    keys = row_keys(seeds, [0] * len(seeds), torch.device("cpu"))
    bits = _mix32(_mix32(keys.unsqueeze(1) ^ sampler.vocab_hashes.unsqueeze(0)))
    peaks = ((bits >> 8) == (1 << 24) - 1).nonzero()
    assert len(peaks) > 0, "no peaking key among these seeds"
    seed_index, token = (int(v) for v in peaks[0])
    logits = torch.full((1, vocab), float("-inf"))
    allowed = (token + 1) % vocab
    logits[0, allowed] = 0.0
    params = SamplingParams(do_sample=True, seed=seeds[seed_index])
    rows = SamplingRows([params], positions=[0], all_tokens=[], generated_tokens=[], top_n=[0], previous_tokens=[])
    assert int(sampler(logits, rows).ids[0]) == allowed


# -- min_new_tokens: stop tokens suppressed until enough exist ---------------------------
def test_stop_tokens_cannot_be_drawn_before_min_new_tokens():
    logits = random_logits(3)
    logits[:, 7] = 100.0  # the stop token would win every row
    banned = SamplingParams(min_new_tokens=4, stop_token_ids=(7, 9))
    rows = SamplingRows([banned, banned, SamplingParams()], positions=[10] * 3, all_tokens=[], generated_tokens=[],
                        top_n=[0] * 3, previous_tokens=[], generated_counts=[3, 4, 0])  # fmt: skip
    ids = Sampler(VOCAB, torch.device("cpu"))(logits.clone(), rows).ids.tolist()
    # Row 0 has 3 tokens (< 4): neither stop token; row 1 has its 4: free again; row 2 has no floor.
    assert ids[0] not in (7, 9) and ids[0] == logits[0].clone().index_fill(0, torch.tensor([7, 9]), -1e9).argmax()
    assert ids[1] == 7 and ids[2] == 7


def test_sampled_rows_respect_min_new_tokens_too():
    logits = random_logits(1)
    logits[0, 3] = 50.0
    params = SamplingParams(do_sample=True, temperature=0.5, seed=11, min_new_tokens=2, stop_token_ids=(3,))
    rows = SamplingRows([params], positions=[5], all_tokens=[], generated_tokens=[], top_n=[1], previous_tokens=[],
                        generated_counts=[1])  # fmt: skip
    out = Sampler(VOCAB, torch.device("cpu"))(logits, rows)
    assert out.ids.item() != 3 and torch.isfinite(out.logprobs).all()
    assert not argmax_suffices(params)  # the fast argmax path would ignore the floor


def test_min_new_tokens_from_the_wire_needs_stop_ids_in_the_vocabulary():
    msg = pb.SamplingParameters(min_new_tokens=3, stop_token_ids=[2])
    params = SamplingParams.from_proto(msg)
    assert params.min_new_tokens == 3 and params.stop_token_ids == (2,)
    with pytest.raises(SequenceRefused, match="needs stop_token_ids"):
        SamplingParams.from_proto(pb.SamplingParameters(min_new_tokens=3))
    with pytest.raises(SequenceRefused, match="outside the vocabulary"):
        SamplingParams.from_proto(pb.SamplingParameters(min_new_tokens=1, stop_token_ids=[VOCAB])).check_vocab(VOCAB)


# -- min_p: vLLM's min-p, after temperature --------------------------------------------
def test_min_p_matches_transformers():
    logits = random_logits(4)
    ps = [0.05, 0.3, 1.0, 0.0]
    ours = apply_min_p(logits, torch.tensor(ps))
    expected = per_row_reference(logits, lambda i: transformers.MinPLogitsWarper(ps[i]) if ps[i] > 0 else None)
    torch.testing.assert_close(ours, expected)
    assert (ours[2] > float("-inf")).sum() == 1  # min_p 1 keeps only the top token
    assert torch.equal(ours[3], logits[3])


def test_min_p_draws_never_fall_below_the_threshold():
    logits_row = random_logits(1, seed=21)[0] / 3
    probs = logits_row.softmax(-1)
    below = set((probs < 0.2 * probs.max()).nonzero().flatten().tolist())
    plain = set(sample_many(SamplingParams(do_sample=True, seed=5), logits_row, 4000).tolist())
    assert plain & below, "without min_p the low tokens are drawn"
    kept = set(sample_many(SamplingParams(do_sample=True, min_p=0.2, seed=5), logits_row, 4000).tolist())
    assert not kept & below and len(kept) > 1
    # Applied after temperature, as vLLM does: a hot temperature lets more tokens pass.
    hot = set(sample_many(SamplingParams(do_sample=True, temperature=3.0, min_p=0.2, seed=5), logits_row, 4000).tolist())
    assert hot & below


def test_min_p_one_is_greedy_and_zero_changes_nothing():
    sampler = Sampler(VOCAB, torch.device("cpu"))
    logits = random_logits(6, seed=3)
    base = [SamplingParams(do_sample=True, seed=s, top_k=(0, 7)[s % 2]) for s in range(6)]
    before = sampler(logits.clone(), rows_for(base, top_n=[3] * 6))
    with_zero = sampler(logits.clone(), rows_for([replace(p, min_p=0.0) for p in base], top_n=[3] * 6))
    assert torch.equal(before.ids, with_zero.ids) and torch.equal(before.logprobs, with_zero.logprobs)
    assert torch.equal(before.top_logprobs, with_zero.top_logprobs)
    # One row with min_p 1 in a mixed batch: it draws the argmax, the others are unchanged.
    mixed = base[:2] + [replace(base[2], temperature=2.0, min_p=1.0)] + base[3:]
    out = sampler(logits.clone(), rows_for(mixed, top_n=[3] * 6))
    assert out.ids[2].item() == logits[2].argmax().item() and out.logprobs[2].item() == 0.0
    keep = [0, 1, 3, 4, 5]
    assert torch.equal(out.ids[keep], before.ids[keep])
    assert SamplingParams.from_proto(pb.SamplingParameters(do_sample=True, min_p=0.25)).min_p == 0.25


def test_rows_sampled_a_chunk_at_a_time_match_one_pass(monkeypatch):
    """Above SAMPLE_CHUNK_ENTRIES the rows go through the processors in chunks (the sampler's
    memory stays bounded at any batch): every output equals the one-pass result, with a
    grammar mask on some rows, every processor on others, and top-n widths that differ."""
    import shard_server.sampling as sampling
    from shard_server.sampling import TokenMask

    n = 11
    logits = random_logits(n, seed=21).to(torch.bfloat16)
    kinds = [
        SamplingParams(do_sample=True, temperature=0.8, top_k=7, top_p=0.9, typical_p=0.95, min_p=0.01, seed=5),
        SamplingParams(repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.2),
        SamplingParams(),
        SamplingParams(do_sample=True, seed=9, logit_bias=((3, 5.0),), watermark=True),
    ]
    params = [replace(kinds[i % len(kinds)], seed=100 + i) for i in range(n)]
    rows = SamplingRows(
        params=params,
        positions=list(range(20, 20 + n)),
        all_tokens=[[i, i + 1, 2] for i in range(n)],
        generated_tokens=[[i % 4, 7] for i in range(n)],
        top_n=[i % 4 for i in range(n)],
        previous_tokens=list(range(n)),
        generated_counts=[2] * n,
    )
    constrained = torch.tensor([1, 4, 9])
    bits = torch.randint(0, 2**31 - 1, (3, -(-VOCAB // 32)), generator=torch.Generator().manual_seed(3),
                         dtype=torch.int32)  # fmt: skip
    rows.token_mask = TokenMask(bits, constrained)
    sampler = Sampler(VOCAB, torch.device("cpu"))
    whole = sampler(logits, rows)
    monkeypatch.setattr(sampling, "SAMPLE_CHUNK_ENTRIES", 3 * VOCAB)  # chunks of 3, 3, 3, 2 rows
    passes, one_pass = [], Sampler._sample

    def counted(self, chunk, chunk_rows, top_n):
        passes.append(chunk.shape[0])
        return one_pass(self, chunk, chunk_rows, top_n)

    monkeypatch.setattr(Sampler, "_sample", counted)
    chunked = sampler(logits, rows)
    assert passes == [3, 3, 3, 2]
    assert torch.equal(chunked.ids, whole.ids)
    assert torch.equal(chunked.logprobs, whole.logprobs)
    assert chunked.top_ids.shape == (n, 3)
    assert torch.equal(chunked.top_ids, whole.top_ids) and torch.equal(chunked.top_logprobs, whole.top_logprobs)
    # The mask held in every chunk: a constrained row never draws a forbidden token.
    for k, row in enumerate(constrained.tolist()):
        token = chunked.ids[row].item()
        assert (bits[k, token // 32].item() >> (token % 32)) & 1
