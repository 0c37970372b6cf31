"""Speculative decoding on the shard: n-gram drafts, verification in one forward, and text
that is the same, token for token, with drafts as without (greedy and seeded sampling)."""

from __future__ import annotations

import math

import pytest

from shard_server.pb import generate_pb2 as pb
from shard_server.requests import InvalidStepError
from shard_server.speculation import BULK_TOKENS, NgramIndex, kept_tokens

from .helpers import StepDriver, load_runner

GREEDY = pb.SamplingParameters()
SEEDED = pb.SamplingParameters(do_sample=True, temperature=0.7, top_k=8, top_p=0.9, seed=11)
PENALISED = pb.SamplingParameters(repetition_penalty=1.2)
# Repeats, so that prompt lookup finds something from the first decode on.
PROMPT = [5, 9, 14, 3, 22, 7, 5, 9, 14, 3, 22, 7, 5, 9]


# -- the drafter and the acceptance rule -------------------------------------------------------
def test_ngram_proposes_what_followed_the_longest_latest_match():
    index = NgramIndex()
    #          0  1  2  3  4  5  6  7  8  9
    tokens = [1, 2, 3, 4, 9, 2, 3, 5, 1, 2, 3]
    # Suffix 1 2 3 matched at 0..2 (4 follows); the shorter 2 3 also at 5..6 (5 follows),
    # but the longest match wins.
    assert index.propose(tokens, 3) == [4, 9, 2]
    assert index.propose(tokens, 1) == [4]
    tokens.append(7)  # suffix 3 7: never seen
    assert index.propose(tokens, 4) == []
    assert index.propose([8, 8], 4) == []  # too short for a 2-gram and its match


def test_ngram_prefers_the_most_recent_match_and_never_matches_itself():
    index = NgramIndex()
    tokens = [4, 5, 1, 4, 5, 2, 4, 5]
    assert index.propose(tokens, 2) == [2, 4]  # the later 4 5 (followed by 2), not the first
    assert index.propose([4, 5], 3) == []  # the suffix itself is not an earlier match


def test_ngram_index_grows_with_the_sequence():
    index, tokens = NgramIndex(), [3, 1, 4, 1, 5]
    assert index.propose(tokens, 2) == []
    tokens += [9, 3, 1]
    assert index.propose(tokens, 2) == [4, 1]
    assert index.indexed == len(tokens) - 1


def test_ngram_index_of_a_prompt_at_once_equals_one_token_at_a_time():
    """A prompt is indexed in bulk (BULK_TOKENS or more new tokens), a step's tokens one at a
    time: both give the same index and drafts, whatever the mix of growths."""
    import random

    rng = random.Random(3)
    for _ in range(60):
        vocab = rng.choice([3, 7, 50, 200_000])  # few symbols: many repeats and overwrites
        tokens = [rng.randrange(vocab) for _ in range(rng.randrange(0, 300))]
        bulk, single = NgramIndex(), NgramIndex()
        for _ in range(12):
            for end in range(single.indexed + 1, len(tokens) + 1):
                single.propose(tokens[:end], 4)  # one new token each call
            assert bulk.propose(tokens, 4) == single.propose(tokens, 4)
            assert bulk.last_end == single.last_end and bulk.indexed == single.indexed
            growth = rng.choice([0, 1, 5, BULK_TOKENS - 1, BULK_TOKENS, 100])
            tokens = tokens + [rng.randrange(vocab) for _ in range(growth)]


@pytest.mark.parametrize(
    ("chosen", "drafts", "kept"),
    [
        ([7], [], [7]),
        ([4, 6], [5], [4]),  # first draft rejected: the target's own token ends it
        ([5, 6, 9], [5, 6], [5, 6, 9]),  # all kept, plus the token after them
        ([5, 8, 1], [5, 6], [5, 8]),
    ],
)
def test_kept_tokens(chosen, drafts, kept):
    assert kept_tokens(chosen, drafts) == kept


# -- the runner -------------------------------------------------------------------------------
@pytest.fixture()
def runner(tiny_model_dirs):
    return load_runner(tiny_model_dirs["llama"], block_size=4, num_blocks=128)


def generate(runner, sampling: pb.SamplingParameters, new_tokens: int, k: int, seq_id: int = 1):
    """Prefill, then decodes with up to k drafts each, as a router would schedule them.
    Returns (tokens, drafted, per-step token counts)."""
    driver = StepDriver(runner)
    new = pb.NewSequence(id=seq_id, input_ids=PROMPT, prompt_len=len(PROMPT), sampling=sampling)
    first = pb.ScheduledSequence(
        id=seq_id, num_tokens=len(PROMPT), new_block_ids=driver.blocks_for(seq_id, len(PROMPT)), sample=True
    )
    out = [driver.step(new=[new], scheduled=[first]).outputs[0].token.id]
    drafted, per_step = 0, []
    while len(out) < new_tokens:
        known = len(PROMPT) + len(out)
        drafts = min(k, new_tokens - len(out) - 1)
        scheduled = pb.ScheduledSequence(
            id=seq_id, num_tokens=1, new_block_ids=driver.blocks_for(seq_id, known + drafts), sample=True,
            max_draft_tokens=drafts,
        )  # fmt: skip
        (output,) = driver.step(scheduled=[scheduled]).outputs
        tokens = [output.token.id, *(t.id for t in output.next_tokens)]
        assert len(tokens) <= drafts + 1 and output.drafted <= drafts
        out += tokens
        drafted += output.drafted
        per_step.append(len(tokens))
    driver.step(released=[seq_id])
    return out, drafted, per_step


class OracleDrafts:
    """Stands in for the n-gram index: drafts the known continuation `text`, with every
    `wrong_every`-th draft position replaced by a wrong token (0: never)."""

    def __init__(self, text: list[int], wrong_every: int):
        self.text, self.wrong_every = text, wrong_every

    def propose(self, tokens: list[int], k: int) -> list[int]:
        drafts = self.text[len(tokens) : len(tokens) + k]
        if self.wrong_every:
            drafts = [t if (len(tokens) + j) % self.wrong_every else t + 1 for j, t in enumerate(drafts)]
        return drafts


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("wrong_every", [0, 3, 1], ids=["right", "some-wrong", "all-wrong"])
def test_verified_drafts_change_nothing_but_the_step_count(runner, monkeypatch, sampling, wrong_every):
    plain, drafted_off, _ = generate(runner, sampling, 40, k=0)
    assert drafted_off == 0
    oracle = OracleDrafts(PROMPT + plain, wrong_every)
    monkeypatch.setattr("shard_server.speculation.NgramIndex", lambda: oracle)
    speculative, drafted, per_step = generate(runner, sampling, 40, k=4)
    assert speculative == plain
    assert drafted > 0
    if wrong_every == 0:  # right drafts are all kept: 4 drafts and the token after them
        assert per_step[:-1] == [5] * (len(per_step) - 1)
    elif wrong_every == 1:
        assert set(per_step) == {1}
    else:
        assert 1 < max(per_step) < 5


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_prompt_lookup_drafts_change_nothing(runner, sampling):
    plain, _, _ = generate(runner, sampling, 40, k=0)
    speculative, drafted, _ = generate(runner, sampling, 40, k=4)
    assert speculative == plain
    if sampling is GREEDY:  # the greedy text repeats the prompt's 2-grams; the seeded one need not
        assert drafted > 0, "the repeating prompt gives prompt lookup something to draft"


def test_a_sequence_that_reads_its_history_is_not_drafted_for(runner):
    plain, _, _ = generate(runner, PENALISED, 12, k=0)
    speculative, drafted, per_step = generate(runner, PENALISED, 12, k=4)
    assert speculative == plain
    assert drafted == 0 and set(per_step) == {1}


def test_logprobs_and_alternatives_come_with_every_kept_token(runner, monkeypatch):
    plain, _, _ = generate(runner, GREEDY, 12, k=0)
    monkeypatch.setattr("shard_server.speculation.NgramIndex", lambda: OracleDrafts(PROMPT + plain, 0))
    driver = StepDriver(runner)
    new = pb.NewSequence(id=3, input_ids=PROMPT, prompt_len=len(PROMPT), sampling=GREEDY, top_n_tokens=2)
    first = pb.ScheduledSequence(id=3, num_tokens=len(PROMPT), new_block_ids=driver.blocks_for(3, len(PROMPT)),
                                 sample=True)  # fmt: skip
    driver.step(new=[new], scheduled=[first])
    known = runner.table.get(3).known_len
    scheduled = pb.ScheduledSequence(
        id=3, num_tokens=1, new_block_ids=driver.blocks_for(3, known + 4), sample=True, max_draft_tokens=4
    )
    (output,) = driver.step(scheduled=[scheduled]).outputs
    assert [output.token.id, *(t.id for t in output.next_tokens)] == plain[1:6]
    for token in [output.token, *output.next_tokens]:
        assert token.logprob <= 0.0
        assert len(token.top_ids) == 2 and token.top_ids[0] == token.id  # greedy: the best one


# Upper 0.1 % point of the chi-square distribution with 3 degrees of freedom (4 categories).
CHI2_3DOF_P001 = 16.27


def chi_square(observed: list[int], expected: list[float]) -> float:
    return sum((o - e) ** 2 / e for o, e in zip(observed, expected))


def sample_batch(runner, seeds, decodes: int, drafts: dict | None = None) -> list[list[pb.Token]]:
    """Each seed's sequence (top-k 4 sampling, its top-4 alternatives reported) through a
    prefill and `decodes` decode steps, all in one batch; with `drafts` (tokens so far ->
    draft) the first decode verifies one draft. Returns each sequence's tokens."""
    driver, outs = StepDriver(runner), {seed: [] for seed in seeds}
    new = [pb.NewSequence(id=seed, input_ids=PROMPT, prompt_len=len(PROMPT), top_n_tokens=4,
                          sampling=pb.SamplingParameters(do_sample=True, top_k=4, seed=seed)) for seed in seeds]  # fmt: skip
    first = [pb.ScheduledSequence(id=seed, num_tokens=len(PROMPT), new_block_ids=driver.blocks_for(seed, len(PROMPT)),
                                  sample=True) for seed in seeds]  # fmt: skip
    for output in driver.step(new=new, scheduled=first).outputs:
        outs[output.id].append(output.token)
    for _ in range(decodes):
        k = 1 if drafts is not None else 0
        scheduled = [pb.ScheduledSequence(id=seed, num_tokens=1, sample=True, max_draft_tokens=k,
                                          new_block_ids=driver.blocks_for(seed, len(PROMPT) + len(outs[seed]) + k))
                     for seed in seeds]  # fmt: skip
        for output in driver.step(scheduled=scheduled).outputs:
            outs[output.id] += [output.token, *output.next_tokens]
        drafts = None
    driver.step(released=list(seeds))
    return [outs[seed] for seed in seeds]


def rank_counts(drawn: list[pb.Token], reference: list[pb.Token]) -> tuple[list[int], list[float]]:
    """How often each drawn token was the reference distribution's r-th most likely (observed),
    against the sum of the reference probabilities of rank r (expected)."""
    observed, expected = [0] * 4, [0.0] * 4
    for token, ref in zip(drawn, reference):
        observed[list(ref.top_ids).index(token.id)] += 1
        for r, logprob in enumerate(ref.top_logprobs):
            expected[r] += math.exp(logprob)
    return observed, expected


def test_kept_drafts_follow_the_models_distribution(tiny_model_dirs, monkeypatch):
    """A chi-square test over many seeds. Each sequence verifies one draft, its most likely
    next token, so about a third keep it and sample the token after it in the same step. Those
    tokens, and every first one, are ranked under the distribution a plain decode (no drafts)
    computes at the same position; the counts per rank must fit that distribution's mass."""
    seeds = range(900)
    runner = load_runner(tiny_model_dirs["llama"], block_size=4, num_blocks=len(seeds) * 6)
    plain = sample_batch(runner, seeds, decodes=2)
    # The draft for each sequence: the most likely token after its first one.
    likely = {tuple(PROMPT + [tokens[0].id]): tokens[1].top_ids[0] for tokens in plain}

    class LikelyDraft:
        def propose(self, tokens, k):
            return [likely[tuple(tokens)]][:k] if tuple(tokens) in likely else []

    monkeypatch.setattr("shard_server.speculation.NgramIndex", LikelyDraft)
    speculative = sample_batch(runner, seeds, decodes=1, drafts=likely)
    firsts = [(spec[1], ref[1]) for spec, ref in zip(speculative, plain)]
    kept = [(spec[2], ref[2]) for spec, ref in zip(speculative, plain) if len(spec) == 3]
    assert len(kept) > 150, "enough drafts kept to test the tokens sampled after them"
    for pairs in (firsts, kept):
        observed, expected = rank_counts(*zip(*pairs))
        assert min(expected) > 5, expected  # the test's approximation holds
        assert chi_square(observed, expected) < CHI2_3DOF_P001, (observed, expected)
    # Seeded, the text is the plain one token for token, so the test above checks the
    # speculative path's draws against the plain decode's distribution at each position.
    assert [[t.id for t in spec] for spec in speculative] == [[t.id for t in ref[: len(spec)]] for spec, ref in zip(speculative, plain)]


def test_drafts_are_refused_where_the_protocol_does_not_allow_them(runner):
    driver = StepDriver(runner)
    new = pb.NewSequence(id=5, input_ids=PROMPT, prompt_len=len(PROMPT), sampling=GREEDY)
    chunk = pb.ScheduledSequence(id=5, num_tokens=4, new_block_ids=driver.blocks_for(5, 8), sample=False,
                                 max_draft_tokens=2)  # fmt: skip
    with pytest.raises(InvalidStepError, match="drafts need a decode"):
        driver.step(new=[new], scheduled=[chunk])
    driver = StepDriver(runner)  # the refused step changed nothing on the shard
    first = pb.ScheduledSequence(id=5, num_tokens=len(PROMPT), new_block_ids=driver.blocks_for(5, len(PROMPT)),
                                 sample=True)  # fmt: skip
    driver.step(new=[new], scheduled=[first])
    # The blocks hold the decode's position but not the drafts' positions.
    known = runner.table.get(5).known_len
    short = pb.ScheduledSequence(id=5, num_tokens=1, new_block_ids=driver.blocks_for(5, known), sample=True,
                                 max_draft_tokens=runner.block_size * 2)  # fmt: skip
    with pytest.raises(InvalidStepError, match="no KV slot"):
        driver.step(scheduled=[short])


# -- verifications replayed from the mixed-step CUDA graphs -----------------------------------
@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_verifications_through_the_mixed_graphs_give_the_eager_tokens(tiny_model_dirs, monkeypatch, sampling):
    """A verification replays the mixed graph that holds it, gathering all its rows. On a GPU
    the graphs are captured at warmup; on the CPU each replay is an eager re-run of the
    captured closure (the host path: static inputs, sample rows, output rows)."""
    pytest.importorskip("triton")
    import torch

    import shard_server.mixed_graphs as mixed_graphs
    from shard_server.mixed_graphs import MixedGraphs
    from shard_server.warmup import PoolSizing, warmup

    from .test_mixed_graphs import _EagerGraph
    from .test_triton_runner import make_runner

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    eager = make_runner(tiny_model_dirs["llama"], "triton", device, num_blocks=128)
    plain, _, _ = generate(eager, sampling, 24, k=0)
    monkeypatch.setattr("shard_server.speculation.NgramIndex", lambda: OracleDrafts(PROMPT + plain, 3))
    expected, drafted, _ = generate(eager, sampling, 24, k=4)
    assert expected == plain and drafted > 0

    runner = make_runner(tiny_model_dirs["llama"], "triton", device, num_blocks=128)
    if cuda:
        warmup(runner, 64, 8, PoolSizing(1024, 0.05, (1, 2, 4, 8)))
    else:
        monkeypatch.setattr(mixed_graphs, "record_graph", lambda run, pool, dev: (_EagerGraph(run, out := run()), out))
        runner.mixed_graphs = MixedGraphs(runner.model, runner.backend, runner.block_size,
                                          runner.config.max_position_embeddings, device, max_seqs=8)  # fmt: skip
        runner.mixed_graphs.capture_bucket(32, runner.kv_cache)
    replays = []
    original = runner.mixed_graphs.run
    monkeypatch.setattr(runner.mixed_graphs, "run", lambda *a, **kw: replays.append(kw.get("sample_rows")) or original(*a, **kw))
    replayed, _, per_step = generate(runner, sampling, 24, k=4)
    assert replayed == plain
    assert any(rows is not None and len(rows) == 5 for rows in replays), "verifications were replayed"


# -- a step planned before the verification in flight answers --------------------------------
def _prefilled_with_oracle_drafts(runner, monkeypatch, seq_id: int, tokens: int):
    """Sequence `seq_id` prefilled through a StepDriver, with drafts that are always its greedy
    text: (that text, `tokens` long; the driver; the prefill's sampled token)."""
    plain, _, _ = generate(runner, GREEDY, tokens, k=0)
    monkeypatch.setattr("shard_server.speculation.NgramIndex", lambda: OracleDrafts(PROMPT + plain, 0))
    driver = StepDriver(runner)
    new = pb.NewSequence(id=seq_id, input_ids=PROMPT, prompt_len=len(PROMPT), sampling=GREEDY)
    first = pb.ScheduledSequence(id=seq_id, num_tokens=len(PROMPT), sample=True,
                                 new_block_ids=driver.blocks_for(seq_id, len(PROMPT)))  # fmt: skip
    return plain, driver, driver.step(new=[new], scheduled=[first]).outputs[0].token.id


@pytest.mark.parametrize("next_drafts", [4, 0], ids=["verification", "plain-decode"])
def test_a_step_planned_before_a_verification_answers_settles_it_first(runner, monkeypatch, next_drafts):
    """The router plans step N+1 before N's answer. If N verifies drafts for a sequence that
    N+1 schedules, the shard completes N before planning N+1: only then are N's kept tokens,
    and the sequence's position, on its host."""
    plain, driver, first_token = _prefilled_with_oracle_drafts(runner, monkeypatch, 1, 20)
    out = [first_token]

    def request(step_id: int, drafts: int, upper_bound: int) -> pb.StepRequest:
        scheduled = pb.ScheduledSequence(id=1, num_tokens=1, sample=True, max_draft_tokens=drafts,
                                         new_block_ids=driver.blocks_for(1, upper_bound))  # fmt: skip
        return pb.StepRequest(step_id=step_id, sequences=[scheduled])

    known = len(PROMPT) + len(out)
    verifying = runner.launch(request(10, 4, known + 4))
    assert runner.table.get(1).verifying
    settled = []

    def settle() -> None:
        settled.append(runner.complete(verifying))

    # Slots for N+1 as if N kept all its drafts, as the router reserves them.
    following = runner.launch(request(11, next_drafts, known + 5 + next_drafts), settle=settle)
    assert len(settled) == 1, "the verification in flight was completed before the next step was planned"
    for response in (settled[0], runner.complete(following)):
        (output,) = response.outputs
        out += [output.token.id, *(t.id for t in output.next_tokens)]
    assert out == plain[: len(out)]
    assert len(out) >= 1 + 5 + 1, "the verification kept its drafts"
    assert not runner.table.get(1).verifying


def test_without_a_way_to_settle_a_step_reading_an_unanswered_verification_is_refused(runner, monkeypatch):
    _, driver, _ = _prefilled_with_oracle_drafts(runner, monkeypatch, 2, 8)
    known = runner.table.get(2).known_len
    verify = pb.ScheduledSequence(id=2, num_tokens=1, sample=True, max_draft_tokens=4,
                                  new_block_ids=driver.blocks_for(2, known + 4))  # fmt: skip
    runner.launch(pb.StepRequest(step_id=20, sequences=[verify]))
    assert runner.table.get(2).verifying
    after = pb.ScheduledSequence(id=2, num_tokens=1, sample=True, new_block_ids=driver.blocks_for(2, known + 5))
    with pytest.raises(InvalidStepError, match="known"):
        runner.launch(pb.StepRequest(step_id=21, sequences=[after]))


def test_the_kernel_profiles_verify_case_verifies_k_drafts_a_sequence(tiny_model_dirs):
    """bench/gpu_kernel_profile.py's verification steps (RepeatDrafts, verify_request) really
    verify k drafts for every sequence, step after step, on the runner the GPU profile uses."""
    from bench.gpu_kernel_profile import RepeatDrafts, verify_request
    from bench.gpu_step_profile import _prefill_batch

    runner = load_runner(tiny_model_dirs["llama"], block_size=4, num_blocks=64)
    _prefill_batch(runner, 2, 12, blocks_each=16)
    runner.drafter = RepeatDrafts()
    for _ in range(3):
        response = runner.step(verify_request(2, 4))
        assert [o.drafted for o in response.outputs] == [4, 4], response
        assert all(not o.error for o in response.outputs)
