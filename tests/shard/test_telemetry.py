"""Shard tracing: settings from flags and OTEL_* variables, and the spans of a traced step."""

import pytest

from shard_server.telemetry import StepTiming, StepTracer, TraceSettings, TraceSettingsError

PARENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{PARENT_TRACE}-{PARENT_SPAN}-01"


def test_off_without_an_endpoint_or_when_disabled():
    assert TraceSettings.resolve(None, None, {}) is None
    assert TraceSettings.resolve(None, None, {"OTEL_SERVICE_NAME": "x"}) is None
    disabled = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_SDK_DISABLED": "true"}
    assert TraceSettings.resolve(None, None, disabled) is None


def test_resolution_follows_the_router_rules():
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
           "OTEL_RESOURCE_ATTRIBUTES": "service.name=attr,team=a%2Cb"}
    s = TraceSettings.resolve(None, None, env)
    assert (s.protocol, s.endpoint, s.service_name) == ("http/protobuf", "http://c:4318/v1/traces", "attr")
    assert s.resource_attributes == {"team": "a,b"}
    specific = {**env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:1/x", "OTEL_SERVICE_NAME": "svc"}
    s = TraceSettings.resolve(None, None, specific)
    assert (s.endpoint, s.service_name) == ("http://t:1/x", "svc")
    s = TraceSettings.resolve("collector:4317", "flag-name", {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:1"})
    assert (s.protocol, s.endpoint, s.service_name) == ("grpc", "http://collector:4317", "flag-name")


@pytest.mark.parametrize("env, message", [
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:1", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "http/json"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "ftp://c:1"}, "OTEL_EXPORTER_OTLP_ENDPOINT"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:1", "OTEL_RESOURCE_ATTRIBUTES": "novalue"}, "novalue"),
])
def test_bad_settings_name_the_variable(env, message):
    with pytest.raises(TraceSettingsError, match=message):
        TraceSettings.resolve(None, None, env)


@pytest.fixture
def tracer_and_spans():
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    settings = TraceSettings("grpc", "http://unused:4317", "textgen-shard", {"deployment.environment": "t"})
    tracer = StepTracer(settings, rank=1, world_size=2, exporter=exporter)
    yield tracer, exporter
    tracer.shutdown()


def test_untraced_steps_have_no_parent(tracer_and_spans):
    tracer, _ = tracer_and_spans
    assert tracer.parent_of(None) is None
    assert tracer.parent_of([("user-agent", "grpc"), ("tracestate", "a=b")]) is None


def test_a_traced_step_records_step_forward_and_sampling_under_the_router_span(tracer_and_spans):
    tracer, exporter = tracer_and_spans
    parent = tracer.parent_of([("traceparent", TRACEPARENT), ("user-agent", "tonic")])
    timing = StepTiming(received_ns=1_000, done_ns=10_000, forward_ns=6_000, sample_ns=2_000)
    tracer.record_step(parent, step_id=7, sequences=3, timing=timing, error=None)
    tracer.flush()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    step, forward, sampling = spans["shard.step"], spans["forward"], spans["sampling"]
    assert format(step.context.trace_id, "032x") == PARENT_TRACE
    assert format(step.parent.span_id, "016x") == PARENT_SPAN and step.parent.is_remote
    assert forward.parent.span_id == step.context.span_id == sampling.parent.span_id
    assert (step.start_time, step.end_time) == (1_000, 10_000)
    assert (forward.start_time, forward.end_time) == (2_000, 8_000)
    assert (sampling.start_time, sampling.end_time) == (8_000, 10_000)
    assert step.attributes["textgen.step.id"] == 7 and step.attributes["textgen.shard.rank"] == 1
    assert step.resource.attributes["service.name"] == "textgen-shard"
    assert step.resource.attributes["deployment.environment"] == "t"


def test_a_failed_step_is_recorded_as_an_error(tracer_and_spans):
    from opentelemetry.trace import StatusCode

    tracer, exporter = tracer_and_spans
    parent = tracer.parent_of([("traceparent", TRACEPARENT)])
    tracer.record_step(parent, step_id=8, sequences=1, timing=None, error="InvalidStepError: bad id")
    tracer.flush()
    (step,) = exporter.get_finished_spans()
    assert step.status.status_code == StatusCode.ERROR and "bad id" in step.status.description
