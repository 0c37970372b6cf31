"""Constrained decoding in the shard: llguidance masks on a tiny random model that uses the
demo model's real tokenizer (SmolLM2's 49152 ids), on the CPU."""

from __future__ import annotations

import json
import re
import shutil

import jsonschema
import llguidance
import numpy as np
import pytest
import torch
import transformers

from launcher.demo_model import ensure_demo_model
from shard_server.grammar import GrammarEngine
from shard_server.pb import generate_pb2 as pb
from shard_server.requests import SequenceRefused
from shard_server.sampling import TokenMask, apply_token_mask

from .helpers import StepDriver, load_runner
from .test_step_pipeline import run_pipelined
from .tiny_models import COMMON

STOP = 2  # <|im_end|>, the demo model's EOS
PLATE = r"[0-9]{3}-[a-z]{2}"
SCHEMA = {
    "type": "object",
    "properties": {
        "n": {"type": "integer", "minimum": 0, "maximum": 999},
        "color": {"enum": ["red", "green", "blue"]},
        "ok": {"type": "boolean"},
    },
    "required": ["n", "color", "ok"],
    "additionalProperties": False,
}
SAMPLED = pb.SamplingParameters(do_sample=True, temperature=1.5, seed=11)
PROMPT = [9, 418, 1023, 77, 5012, 31]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny random Llama with the demo model's vocabulary and tokenizer.json."""
    directory = tmp_path_factory.mktemp("grammar_model")
    tokenizer_json = ensure_demo_model() / "tokenizer.json"
    config = transformers.LlamaConfig(**{**COMMON, "vocab_size": 49152, "tie_word_embeddings": True})
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() > 1:
                param.normal_(0, 0.15)
    model.save_pretrained(directory)
    shutil.copy(tokenizer_json, directory / "tokenizer.json")
    return directory


@pytest.fixture(scope="module")
def engine(model_dir):
    return GrammarEngine.for_model_dir(model_dir, 49152)  # one tokenizer build for the module


@pytest.fixture()
def runner(model_dir, engine):
    runner = load_runner(model_dir, block_size=4, num_blocks=128)
    runner.grammars = engine
    return runner


@pytest.fixture(scope="module")
def tokenizer(engine):
    return engine.tokenizer((STOP,))


def grammar(source: str, stops=(STOP,)) -> pb.Grammar:
    return pb.Grammar(llguidance=source, stop_token_ids=list(stops))


def regex(pattern: str) -> pb.Grammar:
    return grammar(llguidance.LLMatcher.grammar_from_regex(pattern))


def run(driver: StepDriver, sequences: dict[int, pb.NewSequence], max_new: int = 40) -> dict[int, list]:
    """Prefills every sequence in one step, then decodes them together until each one emits
    the stop token, fails or reaches max_new; returns each one's outputs."""
    outputs: dict[int, list] = {i: [] for i in sequences}
    live = set(sequences)
    lengths = {i: len(msg.input_ids) for i, msg in sequences.items()}
    new = list(sequences.values())
    for _ in range(max_new):
        scheduled = [
            pb.ScheduledSequence(
                id=i,
                num_tokens=lengths[i] if new else 1,
                new_block_ids=driver.blocks_for(i, lengths[i] if new else lengths[i] + 1),
                sample=True,
            )
            for i in sorted(live)
        ]
        if not new:
            for i in live:
                lengths[i] += 1
        response = driver.step(new=new, scheduled=scheduled)
        new = []
        for output in response.outputs:
            outputs[output.id].append(output)
            if output.error or output.token.id == STOP or len(outputs[output.id]) >= max_new:
                live.discard(output.id)
        if not live:
            break
    driver.step(released=list(sequences))
    return outputs


def ids(outputs) -> list[int]:
    return [o.token.id for o in outputs]


def new_seq(seq_id: int, prompt=PROMPT, **fields) -> pb.NewSequence:
    return pb.NewSequence(id=seq_id, input_ids=prompt, prompt_len=len(prompt), **fields)


def test_a_regex_grammar_gives_a_matching_string_then_the_stop_token(runner, tokenizer):
    out = run(StepDriver(runner), {1: new_seq(1, grammar=regex(PLATE))})[1]
    tokens = ids(out)
    assert tokens[-1] == STOP and STOP not in tokens[:-1]
    assert re.fullmatch(PLATE, tokenizer.decode_str(tokens[:-1]))
    assert all(not o.error for o in out)
    assert runner.grammars.timing.steps >= len(tokens) and runner.grammars.timing.total_ns > 0


def test_a_json_schema_grammar_gives_valid_json(runner, tokenizer):
    # Compact JSON: a random model would fill flexible whitespace forever.
    compact = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA, defaults={"whitespace_flexible": False})
    tokens = ids(run(StepDriver(runner), {1: new_seq(1, grammar=grammar(compact))}, max_new=60)[1])
    assert tokens[-1] == STOP
    jsonschema.validate(json.loads(tokenizer.decode_str(tokens[:-1])), SCHEMA)


def test_sampled_constrained_output_still_matches(runner, tokenizer):
    texts = set()
    for seed in (11, 12, 13):
        sampling = pb.SamplingParameters(do_sample=True, temperature=1.5, seed=seed, top_k=50, repetition_penalty=1.2)
        tokens = ids(run(StepDriver(runner), {1: new_seq(1, grammar=regex(PLATE), sampling=sampling)})[1])
        assert tokens[-1] == STOP
        text = tokenizer.decode_str(tokens[:-1])
        assert re.fullmatch(PLATE, text)
        texts.add(text)
    assert len(texts) > 1, "different seeds should draw different strings"


def test_an_unconstrained_neighbour_gets_the_tokens_it_gets_alone(runner):
    alone = ids(run(StepDriver(runner), {2: new_seq(2)}, max_new=12)[2])
    together = run(
        StepDriver(runner), {1: new_seq(1, grammar=regex(PLATE)), 2: new_seq(2), 3: new_seq(3, sampling=SAMPLED)}, 12
    )
    assert ids(together[2]) == alone
    sampled_alone = ids(run(StepDriver(runner), {3: new_seq(3, sampling=SAMPLED)}, max_new=12)[3])
    assert ids(together[3]) == sampled_alone


def test_a_malformed_grammar_fails_its_sequence_only(runner):
    out = run(StepDriver(runner), {1: new_seq(1, grammar=grammar('{"grammars": [')), 2: new_seq(2)}, max_new=3)
    assert len(out[1]) == 1 and out[1][0].error.startswith("grammar: ")
    assert not out[1][0].HasField("token")
    assert len(out[2]) == 3 and all(o.HasField("token") for o in out[2])
    bad_regex = run(StepDriver(runner), {3: new_seq(3, grammar=regex("[a-"))}, max_new=2)[3]
    assert "invalid regex" in bad_regex[0].error


@pytest.mark.parametrize(
    "engine_of, stops, message",
    [
        (lambda e: GrammarEngine(None, 49152), (STOP,), "needs the model's tokenizer.json"),
        (lambda e: e, (), "stop_token_ids is empty"),
        (lambda e: e, (49152,), "stop token 49152 is outside the vocabulary"),
    ],
)
def test_unusable_grammar_settings_are_refused(runner, engine, engine_of, stops, message):
    runner.grammars = engine_of(engine)
    out = run(StepDriver(runner), {1: new_seq(1, grammar=grammar(llguidance.LLMatcher.grammar_from_regex("a"), stops))})
    assert message in out[1][0].error


def test_a_replay_after_preemption_continues_the_grammar(runner, tokenizer):
    straight = ids(run(StepDriver(runner), {1: new_seq(1, grammar=regex(PLATE))})[1])
    first = ids(run(StepDriver(runner), {1: new_seq(1, grammar=regex(PLATE))}, max_new=3)[1])
    assert first == straight[:3]
    resent = pb.NewSequence(id=1, input_ids=PROMPT + first, prompt_len=len(PROMPT), grammar=regex(PLATE))
    rest = ids(run(StepDriver(runner), {1: resent})[1])
    assert first + rest == straight


def test_a_replay_that_breaks_the_grammar_is_refused(runner, tokenizer):
    broken = tokenizer.tokenize_str("12x")
    resent = pb.NewSequence(id=1, input_ids=PROMPT + broken, prompt_len=len(PROMPT), grammar=regex(PLATE))
    out = run(StepDriver(runner), {1: resent, 2: new_seq(2)}, max_new=2)
    assert out[1][0].error.startswith("grammar: replayed tokens do not match it")
    assert len(out[2]) == 2


def test_a_dead_end_is_an_error_output_and_the_sequence_is_skipped_after(runner, tokenizer):
    driver = StepDriver(runner)
    first = driver.step(
        new=[new_seq(1, grammar=regex(PLATE)), new_seq(2)],
        scheduled=[
            pb.ScheduledSequence(id=i, num_tokens=len(PROMPT), new_block_ids=driver.blocks_for(i, len(PROMPT)), sample=True)
            for i in (1, 2)
        ],
    )
    assert all(o.HasField("token") for o in first.outputs)
    # A matcher in error (llguidance's resource limits can do this) has no allowed token.
    runner.table.get(1).grammar.matcher.consume_token(tokenizer.tokenize_str("x")[0])
    decode = [
        pb.ScheduledSequence(id=i, num_tokens=1, new_block_ids=driver.blocks_for(i, len(PROMPT) + 1), sample=True)
        for i in (1, 2)
    ]
    second = {o.id: o for o in driver.step(scheduled=decode).outputs}
    assert second[1].error.startswith("grammar dead end: ") and not second[1].HasField("token")
    assert second[2].HasField("token") and not second[2].error
    assert 1 in runner.table.failed and 1 not in runner.table
    third = driver.step(scheduled=[pb.ScheduledSequence(id=i, num_tokens=1, sample=True) for i in (1, 2)])
    assert [o.id for o in third.outputs] == [2]


def test_a_completed_grammar_forces_the_stop_token(engine, tokenizer):
    matcher = engine.compile(regex("ab"), [])
    matcher.replay(tokenizer.tokenize_str("ab"))
    bits = engine.allocate(1, pinned=False)
    assert engine.fill([matcher], bits) == {}
    assert allowed_ids(bits[0]) == [STOP]


def test_stop_tokens_are_allowed_only_when_the_grammar_accepts(engine, tokenizer):
    bits = engine.allocate(2, pinned=False)
    fresh, accepting = engine.compile(regex("[a-z]+"), []), engine.compile(regex("[a-z]+"), [])
    accepting.replay(tokenizer.tokenize_str("hello"))
    engine.fill([fresh, accepting], bits)
    assert STOP not in allowed_ids(bits[0]) and STOP in allowed_ids(bits[1])
    assert accepting.consume(STOP) is None and not accepting.matcher.is_stopped(), "stop tokens are not consumed"


def test_logprobs_are_those_of_the_masked_distribution(runner, model_dir, tokenizer):
    out = run(StepDriver(runner), {1: new_seq(1, grammar=regex(PLATE), top_n_tokens=20)}, max_new=1)[1][0]
    digits = {tokenizer.tokenize_str(str(d))[0] for d in range(10)}
    model = transformers.LlamaForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        raw = model(torch.tensor([PROMPT])).logits[0, -1].log_softmax(dim=-1)
    masked = raw[sorted(digits)].log_softmax(dim=-1)
    assert out.token.id in digits
    assert out.token.logprob >= raw[out.token.id].item()
    assert out.token.logprob == pytest.approx(masked.max().item(), abs=1e-4)
    # Only 10 tokens are allowed: top-20 reports those 10, never a forbidden one.
    assert set(out.token.top_ids) == digits and len(out.token.top_ids) == 10
    assert np.exp(list(out.token.top_logprobs)).sum() == pytest.approx(1.0, abs=1e-4)


def test_pipelined_steps_settle_and_skip_a_sequence_failed_meanwhile(model_dir, engine, monkeypatch):
    steps = scripted_constrained_steps(decodes=5)
    expected = {}
    one_by_one = load_runner(model_dir, block_size=4, num_blocks=128)
    one_by_one.grammars = engine
    for response in [one_by_one.step(step) for step in steps]:
        for output in response.outputs:
            expected.setdefault(output.id, []).append(output.token.id)
    pipelined = load_runner(model_dir, block_size=4, num_blocks=128)
    pipelined.grammars = engine
    answers = run_pipelined(pipelined, steps).answers
    got = {}
    for _, response, error in answers:
        assert error is None
        for output in response.outputs:
            got.setdefault(output.id, []).append(output.token.id)
    assert got == expected
    # Now the constrained sequence fails on its 3rd token, found while step 4 is launched.
    from shard_server import grammar as grammar_module

    calls = {"n": 0}
    consume = grammar_module.SequenceGrammar.consume

    def failing(self, token):
        calls["n"] += 1
        return "grammar dead end: injected" if calls["n"] == 3 else consume(self, token)

    monkeypatch.setattr(grammar_module.SequenceGrammar, "consume", failing)
    fresh = load_runner(model_dir, block_size=4, num_blocks=128)
    fresh.grammars = engine
    answers = run_pipelined(fresh, steps).answers
    outputs = [o for _, response, _ in answers for o in response.outputs if o.id == 1]
    assert [bool(o.error) for o in outputs] == [False, False, True]
    neighbour = [o.token.id for _, response, _ in answers for o in response.outputs if o.id == 2]
    assert neighbour == expected[2]


def test_the_fused_masked_greedy_gives_the_torch_paths_tokens_and_logprobs(model_dir, engine, monkeypatch):
    """On a GPU, greedy rows take the argmax under the mask in one Triton pass (constrained
    and free rows together); here through the interpreter, against the torch mask path."""
    from shard_server import runner as runner_module
    from shard_server.kernels.dispatch import fused_kernels

    masked_calls = []
    fused_greedy = runner_module.fused_greedy
    monkeypatch.setattr(runner_module, "fused_greedy",
                        lambda logits, bits=None, slots=None: masked_calls.append(bits is not None)
                        or fused_greedy(logits, bits, slots))  # fmt: skip

    steps = scripted_constrained_steps(decodes=4)

    def run(fused: bool) -> dict[int, list[tuple[int, float]]]:
        runner = load_runner(model_dir, block_size=4, num_blocks=128)
        runner.grammars = engine
        out: dict[int, list[tuple[int, float]]] = {}
        with fused_kernels(fused, on_cpu=True):
            for step in steps:
                for o in runner.step(step).outputs:
                    assert not o.error
                    out.setdefault(o.id, []).append((o.token.id, o.token.logprob))
        return out

    fused, plain = run(True), run(False)
    assert masked_calls and all(masked_calls)  # every step had the constrained row
    assert {i: [t for t, _ in v] for i, v in fused.items()} == {i: [t for t, _ in v] for i, v in plain.items()}
    for i in fused:
        assert [lp for _, lp in fused[i]] == pytest.approx([lp for _, lp in plain[i]], abs=1e-4)


def scripted_constrained_steps(decodes: int) -> list[pb.StepRequest]:
    """Steps written in advance, as pipelined: 1 constrained, 2 greedy, never naming a token."""
    first = pb.StepRequest(step_id=1)
    first.new_sequences.extend([new_seq(1, grammar=regex("[a-z]{12}")), new_seq(2)])
    blocks = {1: list(range(0, 20)), 2: list(range(20, 40))}
    for i in (1, 2):
        first.sequences.add(id=i, num_tokens=len(PROMPT), new_block_ids=blocks[i], sample=True)
    steps = [first]
    for k in range(decodes):
        step = pb.StepRequest(step_id=2 + k)
        for i in (1, 2):
            step.sequences.add(id=i, num_tokens=1, sample=True)
        steps.append(step)
    steps.append(pb.StepRequest(step_id=decodes + 2, released_ids=[1, 2]))
    return steps


def allowed_ids(row: torch.Tensor) -> list[int]:
    bits = (row.unsqueeze(1) >> torch.arange(32, dtype=torch.int32)) & 1
    return bits.flatten().nonzero().flatten().tolist()


def test_apply_token_mask_matches_the_bits():
    generator = torch.Generator().manual_seed(3)
    vocab = 100  # not a multiple of 32: the last word's spare bits are ignored
    bits = torch.randint(-(2**31), 2**31 - 1, (2, 4), dtype=torch.int32, generator=generator)
    logits = torch.randn(3, vocab, generator=generator)
    masked = apply_token_mask(logits, TokenMask(bits, torch.tensor([2, 0])))
    for mask_row, logit_row in ((0, 2), (1, 0)):
        allowed = set(allowed_ids(bits[mask_row]))
        for token in range(vocab):
            expected = logits[logit_row, token].item() if token in allowed else float("-inf")
            assert masked[logit_row, token].item() == expected
    assert torch.equal(masked[1], logits[1])


def test_creating_a_tokenizer_is_lazy(model_dir):
    engine = GrammarEngine.for_model_dir(model_dir, 49152)
    assert engine._tokenizers == {}
    with pytest.raises(SequenceRefused):
        GrammarEngine(model_dir / "missing.json", 49152).tokenizer((STOP,))


def test_each_reply_reports_its_mask_time_and_free_steps_report_none(runner):
    driver = StepDriver(runner)
    prompt_len = len(PROMPT)
    blocks = driver.blocks_for(1, prompt_len)
    constrained = driver.step(
        new=[new_seq(1, grammar=regex(PLATE))],
        scheduled=[pb.ScheduledSequence(id=1, num_tokens=prompt_len, new_block_ids=blocks, sample=True)],
    )
    driver.step(released=[1])
    blocks = driver.blocks_for(2, prompt_len)
    free = driver.step(
        new=[new_seq(2)],
        scheduled=[pb.ScheduledSequence(id=2, num_tokens=prompt_len, new_block_ids=blocks, sample=True)],
    )
    driver.step(released=[2])
    assert constrained.mask_ns > 0
    assert free.mask_ns == 0
