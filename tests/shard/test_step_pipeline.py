"""The step pipeline with overlap on, driven on the CPU: step N+1 is launched before step N
completes, so decodes read their input token from the device-side results of step N."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from shard_server.pb import generate_pb2 as pb
from shard_server.requests import InvalidStepError
from shard_server.step_pipeline import StepPipeline, StreamedStep

from .helpers import BlockPool, load_runner

GREEDY = pb.SamplingParameters()
SEEDED = pb.SamplingParameters(do_sample=True, temperature=0.8, top_k=20, top_p=0.9, seed=5)
PENALISED = pb.SamplingParameters(do_sample=True, repetition_penalty=1.3, seed=6)
PROMPTS = {1: [5, 9, 14, 3, 22], 2: [7, 7, 30, 2, 11, 40, 41, 8, 1], 3: [60, 61]}


@pytest.fixture()
def runner(tiny_model_dirs):
    return load_runner(tiny_model_dirs["llama"], block_size=4, num_blocks=64)


def scripted_steps(sampling: dict[int, pb.SamplingParameters], decodes: int) -> list[pb.StepRequest]:
    """Every step of a short run, written in advance as a router writes pipelined steps: prefill
    all, then `decodes` decode steps that never name a token, then the releases."""
    pool, held = BlockPool(64, seed=1), {}

    def grow(seq_id: int, tokens: int) -> list[int]:
        need = -(-tokens // 4) - held.get(seq_id, 0)
        held[seq_id] = held.get(seq_id, 0) + need
        return pool.take(need)

    first = pb.StepRequest(step_id=1)
    for seq_id, prompt in PROMPTS.items():
        first.new_sequences.add(id=seq_id, input_ids=prompt, prompt_len=len(prompt), sampling=sampling[seq_id])
        first.sequences.add(id=seq_id, num_tokens=len(prompt), new_block_ids=grow(seq_id, len(prompt)), sample=True)
    steps = [first]
    for k in range(1, decodes + 1):
        step = pb.StepRequest(step_id=1 + k)
        for seq_id, prompt in PROMPTS.items():
            step.sequences.add(id=seq_id, num_tokens=1, new_block_ids=grow(seq_id, len(prompt) + k), sample=True)
        steps.append(step)
    steps.append(pb.StepRequest(step_id=decodes + 2, released_ids=list(PROMPTS)))
    return steps


def tokens_of(responses: list[pb.StepResponse]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for response in responses:
        for output in response.outputs:
            out.setdefault(output.id, []).append(output.token.id)
    return out


class Recorder:
    """Collects the pipeline's answers in the order they are given."""

    def __init__(self, expected: int):
        self.answers: list[tuple[int, pb.StepResponse | None, BaseException | None]] = []
        self._expected, self._done = expected, threading.Event()

    def step(self, request: pb.StepRequest) -> StreamedStep:
        def on_done(response, error):
            self.answers.append((request.step_id, response, error))
            if len(self.answers) == self._expected:
                self._done.set()

        return StreamedStep(request, on_done)

    def wait(self) -> None:
        assert self._done.wait(timeout=120), f"only {len(self.answers)} answers"


def record_order(runner, order: list[str]) -> None:
    """Has the runner note each launch, input preparation, settling and answer in `order`."""
    launch, settle, answer, prepare = runner.launch, runner.settle, runner.answer, runner._prepare
    runner._prepare = lambda work: (order.append("prepare"), prepare(work))[1]
    runner.launch = lambda request, settle=None: (order.append(f"launch {request.step_id}"), launch(request, settle))[1]
    runner.settle = lambda launched: (order.append(f"settle {launched.response.step_id}"), settle(launched))[1]
    runner.answer = lambda launched: (order.append(f"answer {launched.response.step_id}"), answer(launched))[1]


def run_pipelined(runner, steps: list[pb.StepRequest], overlap: bool = True) -> Recorder:
    order: list[str] = []
    record_order(runner, order)
    recorder = Recorder(len(steps))
    with ThreadPoolExecutor(max_workers=1) as worker:
        pipeline = StepPipeline(runner, worker, overlap=overlap)
        # Hold the worker until every step is queued, as when the router's steps are already
        # waiting: otherwise the order would depend on how fast this thread submits.
        queued = threading.Event()
        worker.submit(queued.wait)
        for step in steps:
            pipeline.submit(recorder.step(step))
        queued.set()
        recorder.wait()
    recorder.order = order
    return recorder


@pytest.mark.parametrize("sampling", [{1: GREEDY, 2: SEEDED, 3: GREEDY}, {1: GREEDY, 2: PENALISED, 3: SEEDED}])
def test_overlapped_steps_give_the_tokens_of_steps_run_one_by_one(tiny_model_dirs, runner, sampling):
    steps = scripted_steps(sampling, decodes=6)
    expected = tokens_of([runner.step(step) for step in steps])
    fresh = load_runner(tiny_model_dirs["llama"], block_size=4, num_blocks=64)
    recorder = run_pipelined(fresh, steps)
    assert [step_id for step_id, _, _ in recorder.answers] == [s.step_id for s in steps]
    assert all(error is None for _, _, error in recorder.answers)
    assert tokens_of([response for _, response, _ in recorder.answers]) == expected
    assert all(len(tokens) == 7 for tokens in expected.values())
    assert len(fresh.table) == 0


def test_the_next_step_is_launched_before_the_previous_completes(runner):
    steps = scripted_steps({1: GREEDY, 2: SEEDED, 3: GREEDY}, decodes=3)
    order = run_pipelined(runner, steps).order
    assert order[:7] == ["launch 1", "prepare", "launch 2", "prepare", "settle 1", "answer 1", "launch 3"]


def test_a_step_after_a_verification_answers_it_once_its_own_work_is_queued(runner):
    """Drafting and planning the step after a verification need its kept tokens: that step is
    settled first, but its answer (host work the GPU would wait for) comes after."""

    class ConstantDrafts:  # every decode verifies k drafts, whatever the model says
        bytes_per_block = 0

        def allocate(self, num_blocks):
            pass

        def draft(self, items):
            for item in items:
                item.drafts = [7] * item.draft_budget

    runner.drafter = ConstantDrafts()
    prompt = [3, 4, 5, 6] * 4
    first = pb.StepRequest(step_id=1)
    first.new_sequences.add(id=1, input_ids=prompt, prompt_len=len(prompt), sampling=GREEDY)
    first.sequences.add(id=1, num_tokens=len(prompt), new_block_ids=range(8), sample=True)
    steps = [first]
    for step_id in (2, 3, 4):
        step = pb.StepRequest(step_id=step_id)
        step.sequences.add(id=1, num_tokens=1, sample=True, max_draft_tokens=3, new_block_ids=[8 + step_id])
        steps.append(step)
    recorder = run_pipelined(runner, steps)
    assert recorder.order == [
        "launch 1", "prepare",
        "launch 2", "settle 1", "prepare", "answer 1",
        "launch 3", "settle 2", "prepare", "answer 2",
        "launch 4", "settle 3", "prepare", "answer 3",
        "settle 4", "answer 4",
    ]  # fmt: skip
    assert all(error is None for _, _, error in recorder.answers)
    assert [step_id for step_id, _, _ in recorder.answers] == [1, 2, 3, 4]
    assert [output.drafted for _, response, _ in recorder.answers[1:] for output in response.outputs] == [3, 3, 3]


def test_a_step_arriving_while_the_launched_one_runs_is_launched_before_that_one_completes(runner):
    """The router's next step often lands after the worker has found its queue empty. Waiting
    for the running step then would leave the device idle for the next step's whole launch."""
    steps = scripted_steps({1: GREEDY, 2: SEEDED, 3: GREEDY}, decodes=1)
    order: list[str] = []
    record_order(runner, order)
    # Step 1 "runs on the device" until step 2 has been launched (or 10 s pass, so a pipeline
    # that waits for it instead cannot hang the test).
    started = time.monotonic()
    runner.finished = lambda launched: "launch 2" in order or time.monotonic() - started > 10
    recorder = Recorder(len(steps))
    with ThreadPoolExecutor(max_workers=1) as worker:
        pipeline = StepPipeline(runner, worker, overlap=True)
        pipeline.submit(recorder.step(steps[0]))
        time.sleep(0.3)  # the worker has launched step 1 and found nothing queued
        for step in steps[1:]:
            pipeline.submit(recorder.step(step))
        recorder.wait()
    assert [event for event in order if event != "prepare"][:3] == ["launch 1", "launch 2", "settle 1"]
    assert time.monotonic() - started < 10
    assert [step_id for step_id, _, _ in recorder.answers] == [s.step_id for s in steps]


def test_a_finished_step_is_answered_while_the_queue_stays_empty(runner):
    """Nothing arrives after step 1: it is answered once done, without waiting for more."""
    steps = scripted_steps({1: GREEDY, 2: GREEDY, 3: GREEDY}, decodes=0)
    recorder = Recorder(1)
    with ThreadPoolExecutor(max_workers=1) as worker:
        StepPipeline(runner, worker, overlap=True).submit(recorder.step(steps[0]))
        recorder.wait()
    assert recorder.answers[0][2] is None and len(recorder.answers[0][1].outputs) == 3


def test_a_sequence_needing_its_tokens_on_the_host_settles_the_step_before(runner):
    steps = scripted_steps({1: GREEDY, 2: PENALISED, 3: GREEDY}, decodes=2)
    order = run_pipelined(runner, steps).order
    # The repetition penalty reads every token: step 1 settles before step 2 samples, but
    # after step 2 is prepared and its forward queued, so the GPU has work while it waits;
    # it is answered once step 2's sampling is queued too.
    assert order[:6] == ["launch 1", "prepare", "launch 2", "prepare", "settle 1", "answer 1"]


def test_without_overlap_each_step_completes_before_the_next_launches(runner):
    steps = scripted_steps({1: GREEDY, 2: SEEDED, 3: GREEDY}, decodes=2)
    order = run_pipelined(runner, steps, overlap=False).order
    assert order[:8] == ["launch 1", "prepare", "settle 1", "answer 1", "launch 2", "prepare", "settle 2", "answer 2"]


def test_a_failed_step_is_answered_in_its_place(runner):
    steps = scripted_steps({1: GREEDY, 2: SEEDED, 3: GREEDY}, decodes=1)
    bad = pb.StepRequest(step_id=99, sequences=[pb.ScheduledSequence(id=1234, num_tokens=1, sample=True)])
    recorder = run_pipelined(runner, [steps[0], bad, steps[1]])
    assert [step_id for step_id, _, _ in recorder.answers] == [1, 99, 2]
    assert isinstance(recorder.answers[1][2], InvalidStepError)
    assert recorder.answers[0][2] is None and recorder.answers[2][2] is None
    assert len(recorder.answers[2][1].outputs) == 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: CUDA graphs, events, pinned copies")
@pytest.mark.parametrize("sampling", [{1: GREEDY, 2: GREEDY, 3: GREEDY}, {1: GREEDY, 2: SEEDED, 3: PENALISED}])
def test_on_a_gpu_overlapped_graph_steps_give_the_tokens_of_steps_run_one_by_one(tiny_model_dirs, sampling):
    from shard_server.warmup import PoolSizing, warmup

    from .test_triton_runner import make_runner

    def graph_runner():
        runner = make_runner(tiny_model_dirs["llama"], "triton", torch.device("cuda"))
        warmup(runner, 64, 8, PoolSizing(1024, 0.05, (1, 2, 4)))
        assert runner.graphs is not None
        return runner

    steps = scripted_steps(sampling, decodes=12)
    sequential = graph_runner()
    expected = tokens_of([sequential.step(step) for step in steps])
    recorder = run_pipelined(graph_runner(), steps)
    assert all(error is None for _, _, error in recorder.answers)
    assert tokens_of([response for _, response, _ in recorder.answers]) == expected
    computing = [response for _, response, _ in recorder.answers if response.outputs]
    assert all(0 < response.device_ns <= response.forward_ns for response in computing)
    # The device's wait for a step's inputs is part of its device time.
    assert all(response.input_wait_ns <= response.device_ns for response in computing)


def test_a_step_out_of_device_memory_is_answered_as_such_and_its_sequences_recompute(tiny_model_dirs, runner):
    """Step 3's forward runs out of device memory: it answers `out_of_memory` with no outputs,
    step 4 (queued behind it, planned before the router heard) skips its sequences, and once
    the router releases and re-announces them with what they generated, greedy decoding goes
    on as if nothing happened; the shard keeps serving throughout."""
    greedy = {seq_id: GREEDY for seq_id in PROMPTS}
    expected = tokens_of([runner.step(step) for step in scripted_steps(greedy, decodes=4)])
    steps = scripted_steps(greedy, decodes=3)[:4]  # prefill, decode, decode (out of memory), decode
    pool = BlockPool(64, seed=2)
    recompute = pb.StepRequest(step_id=5, released_ids=list(PROMPTS))
    for seq_id, prompt in PROMPTS.items():
        known = prompt + expected[seq_id][:2]  # what the router had: the tokens of steps 1 and 2
        recompute.new_sequences.add(id=seq_id, input_ids=known, prompt_len=len(prompt), sampling=GREEDY)
        recompute.sequences.add(id=seq_id, num_tokens=len(known), new_block_ids=pool.take(4), sample=True)
    follow = [pb.StepRequest(step_id=6 + k, sequences=[pb.ScheduledSequence(id=i, num_tokens=1, sample=True)
                                                        for i in PROMPTS]) for k in range(2)]  # fmt: skip
    fresh = load_runner(tiny_model_dirs["llama"], block_size=4, num_blocks=64)
    forward, calls = fresh._forward, []

    def forward_once_out_of_memory(*args):
        calls.append(1)
        if len(calls) == 3:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")
        return forward(*args)

    fresh._forward = forward_once_out_of_memory
    recorder = run_pipelined(fresh, [*steps, recompute, *follow])
    answers = {step_id: (response, error) for step_id, response, error in recorder.answers}
    assert all(error is None for _, error in answers.values())
    assert answers[3][0].out_of_memory and not answers[3][0].outputs
    assert not answers[4][0].out_of_memory and not answers[4][0].outputs  # skipped, not failed
    assert not any(answers[i][0].out_of_memory for i in (1, 2, 5, 6, 7))
    got = tokens_of([answers[i][0] for i in (1, 2, 5, 6, 7)])
    assert got == {seq_id: tokens[:5] for seq_id, tokens in expected.items()}
