"""The shard process end to end: `python -m shard_server serve` over a real unix socket."""

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest
import torch
import transformers

from shard_server.pb import generate_pb2 as pb
from shard_server.pb import generate_pb2_grpc as pb_grpc
from shard_server.service import ShardService
from shard_server.warmup import CPU_WARMUP_TOKENS

REPO = Path(__file__).resolve().parents[2]
BLOCK = 4
KV_TOKENS = 1024
SAMPLING = pb.SamplingParameters(
    do_sample=True, temperature=0.9, top_k=40, top_p=0.95, repetition_penalty=1.1, seed=77
)


@pytest.fixture(scope="module")
def shard(tiny_model_dirs, tmp_path_factory):
    base = str(tmp_path_factory.mktemp("sock") / "shard")
    command = [
        sys.executable,
        "-m",
        "shard_server",
        "serve",
        "--model-path",
        str(tiny_model_dirs["llama"]),
        "--uds-path",
        base,
        "--rank",
        "0",
        "--world-size",
        "1",
        "--device",
        "cpu",
        "--kv-cache-tokens",
        str(KV_TOKENS),
        "--block-size",
        str(BLOCK),
    ]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    socket = Path(f"{base}-0")
    deadline = time.monotonic() + 120
    while not socket.exists():
        assert process.poll() is None, process.stdout.read().decode()
        assert time.monotonic() < deadline, "shard did not bind its socket"
        time.sleep(0.1)
    channel = grpc.insecure_channel(f"unix://{socket}")
    yield process, pb_grpc.TextGenerationShardStub(channel), socket
    channel.close()
    if process.poll() is None:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def stub(shard):
    _, stub, _ = shard
    return stub


@pytest.fixture(scope="module")
def reference(tiny_model_dirs):
    return transformers.LlamaForCausalLM.from_pretrained(tiny_model_dirs["llama"]).eval()


def prompt_of(length: int, seed: int) -> list[int]:
    return torch.randint(0, 160, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


class Router:
    """Just enough of a router to drive the shard: block accounting and step ids."""

    def __init__(self, stub, first_block: int = 0):
        self.stub = stub
        self.next_block = first_block
        self.owned: dict[int, int] = {}
        self.step_id = 0

    def grow(self, seq_id: int, total: int) -> list[int]:
        need = -(-total // BLOCK) - self.owned.get(seq_id, 0)
        blocks = list(range(self.next_block, self.next_block + max(0, need)))
        self.next_block += len(blocks)
        self.owned[seq_id] = self.owned.get(seq_id, 0) + len(blocks)
        return blocks

    def step(self, new=(), scheduled=(), released=()):
        self.step_id += 1
        for seq_id in released:
            self.owned.pop(seq_id, None)
        return self.stub.Step(
            pb.StepRequest(
                step_id=self.step_id, new_sequences=new, sequences=scheduled, released_ids=released
            )
        )

    def run(self, seq_id: int, input_ids: list[int], prompt_len: int, new_tokens: int, chunk: int, **fields):
        """Prefills input_ids in chunks, then decodes; returns the sampled Token messages."""
        new = [pb.NewSequence(id=seq_id, input_ids=input_ids, prompt_len=prompt_len, **fields)]
        done, tokens, responses = 0, [], []
        while done < len(input_ids):
            n = min(chunk, len(input_ids) - done)
            sample = done + n == len(input_ids)
            response = self.step(
                new,
                [
                    pb.ScheduledSequence(
                        id=seq_id, num_tokens=n, new_block_ids=self.grow(seq_id, done + n), sample=sample
                    )
                ],
            )
            responses.append(response)
            new, done = [], done + n
        tokens.append(responses[-1].outputs[0].token)
        for _ in range(new_tokens - 1):
            total = len(input_ids) + len(tokens)
            response = self.step(
                scheduled=[
                    pb.ScheduledSequence(
                        id=seq_id, num_tokens=1, new_block_ids=self.grow(seq_id, total), sample=True
                    )
                ]
            )
            tokens.append(response.outputs[0].token)
        return tokens, responses


def test_info_health_and_warmup(stub):
    info = stub.Info(pb.InfoRequest())
    assert (info.model_type, info.dtype, info.device_type) == ("llama", "float32", "cpu")
    assert (info.block_size, info.vocab_size, info.max_position_embeddings) == (BLOCK, 160, 512)
    assert (info.rank, info.world_size, info.attention_backend) == (0, 1, "reference")
    assert info.long_rope_prompt_tokens == 0, "no LongRoPE: every prompt may share the prefix cache"
    stub.Health(pb.HealthRequest())
    with pytest.raises(grpc.RpcError) as error:
        stub.Step(pb.StepRequest(step_id=1, sequences=[pb.ScheduledSequence(id=1, num_tokens=1)]))
    assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    warm = stub.Warmup(pb.WarmupRequest(max_batch_prefill_tokens=300, max_batch_size=8))
    assert (warm.num_blocks, warm.block_size) == (KV_TOKENS // BLOCK, BLOCK)
    assert warm.step_tokens == CPU_WARMUP_TOKENS and warm.step_us > 0  # 300 asked
    stub.ClearCache(pb.ClearCacheRequest())


def test_greedy_chunked_prefill_and_decode_match_transformers(stub, reference):
    prompt = prompt_of(19, seed=1)
    tokens, responses = Router(stub).run(1, prompt, len(prompt), 15, chunk=7)
    ids = torch.tensor([prompt])
    expected = reference.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=15,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    assert [t.id for t in tokens] == expected[0, len(prompt) :].tolist()
    assert all(not r.outputs for r in responses[:-1]), "non-sampling chunks report nothing"
    assert all(t.logprob <= 0 for t in tokens)
    # Every step that computed something reports its shard-side timings (the router's
    # textgen_shard_*_duration_seconds histograms).
    assert all(r.forward_ns > 0 and r.sample_ns > 0 for r in responses)
    assert all(r.device_ns == 0 and r.input_wait_ns == 0 for r in responses), "no device clock on the CPU"


def test_preempted_sequence_resent_gives_the_same_tokens(stub):
    stub.ClearCache(pb.ClearCacheRequest())
    prompt = prompt_of(10, seed=2)
    straight, _ = Router(stub).run(5, prompt, len(prompt), 12, chunk=4, sampling=SAMPLING)
    router = Router(stub)
    first, _ = router.run(6, prompt, len(prompt), 5, chunk=10, sampling=SAMPLING)
    router.step(released=[6])  # preempted: the shard forgets it, the router keeps the tokens
    resent = prompt + [t.id for t in first]
    rest, _ = router.run(6, resent, len(prompt), 7, chunk=6, sampling=SAMPLING)
    assert [t.id for t in first + rest] == [t.id for t in straight]
    assert len({t.id for t in straight}) > 3, "sampling should not be degenerate"


def test_batched_sequences_match_their_solo_runs(stub):
    stub.ClearCache(pb.ClearCacheRequest())
    prompts = {11: prompt_of(9, 3), 12: prompt_of(14, 4), 13: prompt_of(3, 5)}
    solo = {
        i: [t.id for t in Router(stub).run(i, p, len(p), 6, chunk=5, sampling=SAMPLING)[0]]
        for i, p in prompts.items()
    }
    stub.ClearCache(pb.ClearCacheRequest())
    router = Router(stub)
    new = [
        pb.NewSequence(id=i, input_ids=p, prompt_len=len(p), sampling=SAMPLING) for i, p in prompts.items()
    ]
    sched = [
        pb.ScheduledSequence(id=i, num_tokens=len(p), new_block_ids=router.grow(i, len(p)), sample=True)
        for i, p in prompts.items()
    ]
    got = {o.id: [o.token.id] for o in router.step(new, sched).outputs}
    for _ in range(5):
        sched = [
            pb.ScheduledSequence(
                id=i, num_tokens=1, new_block_ids=router.grow(i, len(prompts[i]) + len(got[i])), sample=True
            )
            for i in prompts
        ]
        for output in router.step(scheduled=sched).outputs:
            got[output.id].append(output.token.id)
    assert got == solo


def test_prefill_logprobs_and_top_n(stub, reference):
    stub.ClearCache(pb.ClearCacheRequest())
    prompt = prompt_of(11, seed=6)
    tokens, responses = Router(stub).run(
        21, prompt, len(prompt), 2, chunk=4, prefill_logprobs=True, top_n_tokens=3
    )
    reported = [lp for r in responses for o in r.outputs for lp in o.prefill_logprobs]
    with torch.no_grad():
        logprobs = reference(torch.tensor([prompt])).logits[0].log_softmax(-1)
    expected = [logprobs[p, prompt[p + 1]].item() for p in range(len(prompt) - 1)]
    assert reported == pytest.approx(expected, abs=1e-4)
    assert len(responses[0].outputs) == 1 and not responses[0].outputs[0].HasField("token")
    assert all(len(t.top_ids) == 3 and t.top_ids[0] == t.id for t in tokens)


@pytest.mark.parametrize(
    "request_fields, message",
    [
        (dict(sequences=[pb.ScheduledSequence(id=999, num_tokens=1)]), "not known"),
        (
            dict(
                new_sequences=[pb.NewSequence(id=31, input_ids=[1, 2], prompt_len=2)],
                sequences=[pb.ScheduledSequence(id=31, num_tokens=2, new_block_ids=[10**6], sample=True)],
            ),
            "outside the pool",
        ),
        (dict(new_sequences=[pb.NewSequence(id=32, input_ids=[1, 999], prompt_len=2)]), "vocab"),
        (
            dict(
                new_sequences=[pb.NewSequence(id=34, input_ids=[1, 2], prompt_len=2)],
                sequences=[pb.ScheduledSequence(id=34, num_tokens=5, new_block_ids=[0, 1], sample=True)],
            ),
            "only 2 tokens",
        ),
        (
            dict(
                new_sequences=[pb.NewSequence(id=35, input_ids=[1] * 9, prompt_len=9)],
                sequences=[pb.ScheduledSequence(id=35, num_tokens=9, new_block_ids=[0], sample=True)],
            ),
            "blocks",
        ),
        (dict(new_sequences=[pb.NewSequence(id=36, input_ids=[], prompt_len=0)]), "empty"),
    ],
)
def test_bad_steps_are_rejected_and_the_shard_survives(stub, request_fields, message):
    with pytest.raises(grpc.RpcError) as error:
        stub.Step(pb.StepRequest(step_id=1, **request_fields))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in error.value.details()
    stub.Health(pb.HealthRequest())
    # A rejected step leaves no state behind: the same ids can be registered again.
    for seq in request_fields.get("new_sequences", []):
        stub.Step(
            pb.StepRequest(
                step_id=2,
                new_sequences=[pb.NewSequence(id=seq.id, input_ids=[1, 2], prompt_len=2)],
                released_ids=[seq.id],
            )
        )


def test_a_sequence_with_refused_parameters_fails_alone_and_the_step_runs(stub):
    """Issue 27, defect 1: one request's parameters fail that request only, with a reason
    naming only its own field, and the shard skips it until the router releases it."""
    refused = pb.NewSequence(
        id=40, input_ids=[1, 2], prompt_len=2, sampling=pb.SamplingParameters(temperature=float("inf"), seed=7)
    )
    good = pb.NewSequence(id=41, input_ids=[3, 4], prompt_len=2)
    first = stub.Step(
        pb.StepRequest(
            step_id=1,
            new_sequences=[refused, good],
            sequences=[
                pb.ScheduledSequence(id=40, num_tokens=2, new_block_ids=[0], sample=True),
                pb.ScheduledSequence(id=41, num_tokens=2, new_block_ids=[1], sample=True),
            ],
        )
    )
    outputs = {o.id: o for o in first.outputs}
    assert outputs[40].error == "temperature must be finite and > 0, got inf"
    assert not outputs[40].HasField("token")
    assert outputs[41].HasField("token") and not outputs[41].error
    # A step planned before the router heard still names it: skipped, the rest runs.
    second = stub.Step(
        pb.StepRequest(
            step_id=2,
            sequences=[pb.ScheduledSequence(id=40, num_tokens=1, sample=True), pb.ScheduledSequence(id=41, num_tokens=1, sample=True)],
        )
    )
    assert [o.id for o in second.outputs] == [41]
    # Released, the id is forgotten and may be registered again.
    stub.Step(pb.StepRequest(step_id=3, released_ids=[40, 41]))
    stub.Step(pb.StepRequest(step_id=4, new_sequences=[pb.NewSequence(id=40, input_ids=[1, 2], prompt_len=2)]))
    stub.Step(pb.StepRequest(step_id=5, released_ids=[40]))


def test_clear_cache_forgets_sequences(stub):
    router = Router(stub)
    router.run(41, [1, 2, 3], 3, 2, chunk=3)
    stub.ClearCache(pb.ClearCacheRequest())
    with pytest.raises(grpc.RpcError) as error:
        router.step(scheduled=[pb.ScheduledSequence(id=41, num_tokens=1, sample=True)])
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_streamed_steps_run_in_order_and_each_decode_feeds_the_shards_own_token(stub):
    stub.ClearCache(pb.ClearCacheRequest())
    prompt = prompt_of(13, seed=8)
    expected, _ = Router(stub).run(51, prompt, len(prompt), 6, chunk=13, sampling=SAMPLING)
    stub.ClearCache(pb.ClearCacheRequest())
    router = Router(stub)
    new = pb.NewSequence(id=51, input_ids=prompt, prompt_len=len(prompt), sampling=SAMPLING)
    requests = [
        pb.StepRequest(
            step_id=1,
            new_sequences=[new],
            sequences=[pb.ScheduledSequence(id=51, num_tokens=13, new_block_ids=router.grow(51, 13), sample=True)],
        )
    ]
    for k in range(5):
        blocks = router.grow(51, 14 + k)
        requests.append(
            pb.StepRequest(
                step_id=2 + k,
                sequences=[pb.ScheduledSequence(id=51, num_tokens=1, new_block_ids=blocks, sample=True)],
            )
        )
    # Every request is written before any answer is read, as the router's pipeline does: a
    # decode never waits for the router to have seen the token it continues from.
    responses = list(stub.StepStream(iter(requests)))
    assert [r.step_id for r in responses] == [1, 2, 3, 4, 5, 6]
    assert [r.outputs[0].token.id for r in responses] == [t.id for t in expected]


def test_a_bad_streamed_step_ends_the_stream_with_its_status_after_the_good_ones(stub):
    stub.ClearCache(pb.ClearCacheRequest())
    good = pb.StepRequest(
        step_id=1,
        new_sequences=[pb.NewSequence(id=61, input_ids=[1, 2, 3], prompt_len=3)],
        sequences=[pb.ScheduledSequence(id=61, num_tokens=3, new_block_ids=[0], sample=True)],
    )
    bad = pb.StepRequest(step_id=2, sequences=[pb.ScheduledSequence(id=999, num_tokens=1)])
    answers = []
    with pytest.raises(grpc.RpcError) as error:
        for response in stub.StepStream(iter([good, bad, good])):
            answers.append(response.step_id)
    assert answers == [1]
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "Step 2" in error.value.details() and "not known" in error.value.details()
    stub.Health(pb.HealthRequest())
    stub.ClearCache(pb.ClearCacheRequest())
    assert [r.step_id for r in stub.StepStream(iter([good]))] == [1]


def test_a_constrained_sequence_without_a_tokenizer_is_refused_alone(stub):
    """The tiny checkpoint has no tokenizer.json: a grammar cannot be run, the rest can."""
    stub.ClearCache(pb.ClearCacheRequest())
    grammar = pb.Grammar(llguidance='{"grammars": [{"lark_grammar": "start: /[0-9]+/"}]}', stop_token_ids=[0])
    constrained = pb.NewSequence(id=50, input_ids=[1, 2], prompt_len=2, grammar=grammar)
    free = pb.NewSequence(id=51, input_ids=[3, 4], prompt_len=2)
    response = stub.Step(
        pb.StepRequest(
            step_id=1,
            new_sequences=[constrained, free],
            sequences=[
                pb.ScheduledSequence(id=50, num_tokens=2, new_block_ids=[0], sample=True),
                pb.ScheduledSequence(id=51, num_tokens=2, new_block_ids=[1], sample=True),
            ],
        )
    )
    outputs = {o.id: o for o in response.outputs}
    assert "needs the model's tokenizer.json" in outputs[50].error
    assert outputs[51].HasField("token") and not outputs[51].error
    stub.Step(pb.StepRequest(step_id=2, released_ids=[50, 51]))


def test_sigterm_stops_cleanly(shard):
    process, stub, socket = shard
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0
    assert not socket.exists()


def test_a_step_answered_after_the_event_loop_closed_is_dropped_quietly():
    # At SIGTERM the server stops and its loop closes while the worker may still finish a
    # step; answering it raised "Event loop is closed" and logged the pipeline as stopped.
    service = ShardService(SimpleNamespace(device=torch.device("cpu")), identity=None, sizing=None)
    try:
        loop = asyncio.new_event_loop()
        answer = loop.create_future()
        loop.close()
        context = SimpleNamespace(invocation_metadata=lambda: ())
        step = service._streamed(pb.StepRequest(step_id=7), context, loop, answer)
        step.on_done(pb.StepResponse(step_id=7), None)
        assert not answer.done()
    finally:
        service.close()
