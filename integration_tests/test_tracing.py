"""One request, followed across the three processes in an OTLP receiver.

Two short-lived servers: one exports over OTLP/gRPC (set by the launcher's --otlp-endpoint
flag), the other over OTLP/HTTP (set only by the standard OTEL_* variables, which must pass
through the launcher to router and shard unchanged). Each test sends a request with a known
W3C traceparent and checks the span tree the receiver got:

    HTTP server span (router, parent = the caller's span)
      └─ GenAI request span (router)
           ├─ queue (router)
           └─ step × N (router)
                └─ shard.step (shard, through gRPC metadata)
                     ├─ forward
                     └─ sampling
"""

from __future__ import annotations

import json
import secrets
import time

import httpx
import pytest

from otlp_receiver import GrpcReceiver, HttpReceiver, ReceivedSpan
from server import Server

MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
SERVER_KIND = 2  # opentelemetry.proto.trace.v1.Span.SpanKind.SPAN_KIND_SERVER
STATUS_ERROR = 2
# Exporters batch for 5 s by default; the tests need not wait that long.
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "200", "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=it%20run"}


def new_traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def by_name(spans: list[ReceivedSpan], name: str, component: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.name == name and s.component == component]


def one(spans: list[ReceivedSpan], component: str, predicate) -> ReceivedSpan:
    found = [s for s in spans if s.component == component and predicate(s)]
    assert len(found) == 1, [(s.component, s.name) for s in spans]
    return found[0]


def trace_complete(steps_expected: int):
    def ready(spans: list[ReceivedSpan]) -> bool:
        requests = [s for s in spans if s.attributes.get("gen_ai.operation.name")]
        steps = by_name(spans, "step", "router")
        forwards = by_name(spans, "forward", "shard")
        return bool(requests) and len(steps) >= steps_expected and len(forwards) >= len(steps) > 0
    return ready


def check_chain(spans: list[ReceivedSpan], caller_span_id: str, operation: str) -> ReceivedSpan:
    """Asserts the parent/child chain across the processes; returns the request span."""
    http = one(spans, "router", lambda s: s.kind == SERVER_KIND and "http.route" in s.attributes)
    assert http.parent_span_id == caller_span_id, "the HTTP span continues the caller's span"
    assert http.attributes["http.response.status_code"] == 200
    request = one(spans, "router", lambda s: s.attributes.get("gen_ai.operation.name") == operation)
    assert request.parent_span_id == http.span_id
    queue = by_name(spans, "queue", "router")
    assert [q.parent_span_id for q in queue] == [request.span_id]
    steps = by_name(spans, "step", "router")
    assert steps and all(step.parent_span_id == request.span_id for step in steps)
    step_ids = {step.span_id for step in steps}
    shard_steps = by_name(spans, "shard.step", "shard")
    assert {s.parent_span_id for s in shard_steps} == step_ids, "every step reached the shard"
    assert all(s.kind == SERVER_KIND and s.status_code != STATUS_ERROR for s in shard_steps)
    shard_step_ids = {s.span_id for s in shard_steps}
    for name in ("forward", "sampling"):
        children = by_name(spans, name, "shard")
        assert len(children) == len(shard_steps)
        assert {c.parent_span_id for c in children} == shard_step_ids
    forward = by_name(spans, "forward", "shard")[0]
    parent = next(s for s in shard_steps if s.span_id == forward.parent_span_id)
    assert parent.start_ns <= forward.start_ns < forward.end_ns <= parent.end_ns
    for span in (http, request, *steps, *shard_steps):
        assert span.resource["deployment.environment"] == "it run", "OTEL_RESOURCE_ATTRIBUTES"
    return request


def check_genai(request: ReceivedSpan, *, max_tokens: int, input_tokens: int, output_tokens: int,
                finish_reasons: list[str]) -> None:
    a = request.attributes
    assert request.name == f"{a['gen_ai.operation.name']} {MODEL_ID}"
    assert a["gen_ai.provider.name"] == "textgen"
    assert a["gen_ai.request.model"] == MODEL_ID
    assert a["gen_ai.request.max_tokens"] == max_tokens
    assert a["gen_ai.request.temperature"] == pytest.approx(0.7)
    assert a["gen_ai.request.top_p"] == pytest.approx(0.9)
    assert a["gen_ai.request.seed"] == 42
    assert a["gen_ai.usage.input_tokens"] == input_tokens
    assert a["gen_ai.usage.output_tokens"] == output_tokens
    assert a["gen_ai.response.finish_reasons"] == finish_reasons
    ttft = a["gen_ai.response.time_to_first_chunk"]
    assert 0 < ttft < (request.end_ns - request.start_ns) / 1e9


@pytest.fixture(scope="module")
def grpc_stack():
    receiver = GrpcReceiver()
    server = Server("--otlp-endpoint", receiver.endpoint, "--max-batch-prefill-tokens", "256",
                    env=FAST_EXPORT)
    yield server, receiver
    server.stop()
    receiver.stop()


@pytest.fixture(scope="module")
def http_stack():
    receiver = HttpReceiver()
    env = {**FAST_EXPORT, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
           "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_SERVICE_NAME": "textgen-it"}
    server = Server("--max-batch-prefill-tokens", "256", env=env)
    yield server, receiver
    server.stop()
    receiver.stop()


def prompt_tokens(url: str, prompt: str) -> int:
    return len(httpx.post(url + "/tokenize", json={"inputs": prompt}, timeout=30).json())


def test_grpc_trace_follows_generate_across_processes(grpc_stack):
    server, receiver = grpc_stack
    traceparent, trace_id, caller = new_traceparent()
    prompt = "Tracing test: the capital of France is"
    answer = httpx.post(
        server.url + "/generate",
        json={"inputs": prompt, "parameters": {"max_new_tokens": 6, "temperature": 0.7, "top_p": 0.9,
                                               "seed": 42, "details": True}},
        headers={"traceparent": traceparent}, timeout=120,
    )
    assert answer.status_code == 200, answer.text
    details = answer.json()["details"]
    generated = details["generated_tokens"]
    spans = receiver.store.wait_for(trace_complete(generated), trace_id)
    request = check_chain(spans, caller, "text_completion")
    check_genai(request, max_tokens=6, input_tokens=prompt_tokens(server.url, prompt),
                output_tokens=generated, finish_reasons=[details["finish_reason"]])
    assert int(answer.headers["x-prompt-tokens"]) == request.attributes["gen_ai.usage.input_tokens"]
    # One step per generated token at least: the prefill samples the first, each decode one more.
    assert len(by_name(spans, "step", "router")) >= generated
    services = {s.component: s.resource["service.name"] for s in spans}
    assert services == {"router": "textgen-router", "shard": "textgen-shard"}


def test_http_trace_follows_a_streamed_chat_completion(http_stack):
    server, receiver = http_stack
    traceparent, trace_id, caller = new_traceparent()
    messages = [{"role": "user", "content": "Say hello to the tracing test."}]
    body = {"model": MODEL_ID, "messages": messages, "max_tokens": 5, "temperature": 0.7, "top_p": 0.9,
            "seed": 42, "stream": True, "stream_options": {"include_usage": True}}
    chunks = []
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body,
                      headers={"traceparent": traceparent}, timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[len("data: "):]))
    usage = chunks[-1]["usage"]
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    templated = httpx.post(server.url + "/chat_tokenize", json={"model": MODEL_ID, "messages": messages},
                           timeout=30).json()
    spans = receiver.store.wait_for(trace_complete(usage["completion_tokens"]), trace_id)
    request = check_chain(spans, caller, "chat")
    check_genai(request, max_tokens=5, input_tokens=len(templated["tokenize_response"]),
                output_tokens=usage["completion_tokens"], finish_reasons=finish)
    assert usage["prompt_tokens"] == request.attributes["gen_ai.usage.input_tokens"]
    # The HTTP span covers the whole SSE body, so it ends after the request span.
    http = one(spans, "router", lambda s: s.kind == SERVER_KIND and "http.route" in s.attributes)
    assert http.end_ns >= request.end_ns
    assert {s.resource["service.name"] for s in spans} == {"textgen-it"}
    assert set(receiver.paths) == {"/v1/traces"}


def test_a_request_without_traceparent_starts_its_own_trace(grpc_stack):
    server, receiver = grpc_stack
    before = {s.trace_id for s in receiver.store.spans()}
    answer = httpx.post(server.url + "/generate", json={"inputs": "Hi", "parameters": {"max_new_tokens": 2}},
                        timeout=120)
    assert answer.status_code == 200

    def fresh_generate_traces() -> set[str]:
        return {s.trace_id for s in receiver.store.spans()
                if s.trace_id not in before and s.name == "forward"}

    receiver.store.wait_for(lambda _: bool(fresh_generate_traces()), trace_id=None)
    (trace_id,) = fresh_generate_traces()
    spans = receiver.store.wait_for(trace_complete(2), trace_id)
    spans = receiver.store.wait_for(
        lambda found: any(s.kind == SERVER_KIND and s.component == "router" for s in found), trace_id)
    http = one(spans, "router", lambda s: s.kind == SERVER_KIND)
    assert http.parent_span_id == "", "a root span"
    assert http.attributes["http.route"] == "/generate"


def test_a_shared_step_is_a_child_of_the_oldest_request_and_links_the_others(grpc_stack):
    server, receiver = grpc_stack
    (old_parent, old_trace, _), (new_parent, new_trace, _) = new_traceparent(), new_traceparent()

    def stream(traceparent: str, max_new_tokens: int):
        body = {"inputs": "Count slowly: one, two,", "parameters": {"max_new_tokens": max_new_tokens,
                                                                    "stop": [], "seed": 1}}
        return httpx.stream("POST", server.url + "/generate_stream", json=body,
                            headers={"traceparent": traceparent}, timeout=120)

    # The older request is generating when the newer one arrives, so they share steps.
    with stream(old_parent, 24) as older:
        lines = older.iter_lines()
        next(line for line in lines if line.startswith("data:"))
        with stream(new_parent, 3) as newer:
            assert newer.status_code == 200 and sum(1 for _ in newer.iter_lines()) > 0
        assert sum(1 for _ in lines) > 0
    def has_request_span(spans):
        return any(s.attributes.get("gen_ai.operation.name") for s in spans)

    new_spans = receiver.store.wait_for(
        lambda spans: has_request_span(spans) and bool(by_name(spans, "queue", "router")), new_trace)
    new_request = one(new_spans, "router", lambda s: s.attributes.get("gen_ai.operation.name") is not None)

    def linked_steps(spans):
        return [s for s in by_name(spans, "step", "router") if (new_trace, new_request.span_id) in s.links]

    old_spans = receiver.store.wait_for(
        lambda spans: has_request_span(spans) and bool(linked_steps(spans)), old_trace)
    old_request = one(old_spans, "router", lambda s: s.attributes.get("gen_ai.operation.name") is not None)
    shared = linked_steps(old_spans)
    assert all(step.parent_span_id == old_request.span_id for step in shared)
    assert all(step.attributes["textgen.step.traced_requests"] >= 2 for step in shared)
    # The newer request's own trace still has its queue span and its GenAI attributes.
    (queue,) = by_name(new_spans, "queue", "router")
    assert queue.parent_span_id == new_request.span_id


def test_an_unreachable_collector_never_affects_serving():
    from server import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    server = Server("--otlp-endpoint", dead, env=FAST_EXPORT)
    try:
        traceparent, _, _ = new_traceparent()
        answer = httpx.post(server.url + "/generate", json={"inputs": "Hi", "parameters": {"max_new_tokens": 3}},
                            headers={"traceparent": traceparent}, timeout=120)
        assert answer.status_code == 200, answer.text
    finally:
        started = time.monotonic()
        code = server.stop()
    assert code == 0, server.log()
    assert time.monotonic() - started < 30, "flushing to a dead collector is bounded"
