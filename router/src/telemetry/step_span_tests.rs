use super::*;
use opentelemetry::trace::{SpanId, TraceFlags, TraceId, TraceState, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};

fn tracer() -> (SdkTracer, InMemorySpanExporter, SdkTracerProvider) {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    (provider.tracer("test"), exporter, provider)
}

fn request(n: u64) -> SpanContext {
    SpanContext::new(
        TraceId::from(u128::from(n) << 64 | 1),
        SpanId::from(n),
        TraceFlags::SAMPLED,
        false,
        TraceState::default(),
    )
}

fn finished(exporter: &InMemorySpanExporter, name: &str) -> Vec<SpanData> {
    let spans = exporter.get_finished_spans().unwrap();
    spans.into_iter().filter(|s| s.name == name).collect()
}

const SHAPE: StepShape = StepShape {
    step_id: 42,
    sequences: 5,
    tokens: 300,
};

#[test]
fn a_step_is_a_child_of_the_first_request_and_links_the_others() {
    let (tracer, exporter, _provider) = tracer();
    let requests = [request(1), request(2), request(3)];
    let step = StepTrace::begin(&tracer, SHAPE, &requests).unwrap();
    let propagated = step.context().span().span_context().clone();
    let response = pb::StepResponse {
        forward_ns: 3_000_000,
        sample_ns: 500_000,
        ..Default::default()
    };
    step.end(Ok(&response));
    let [span] = finished(&exporter, "step").try_into().unwrap();
    assert_eq!(span.span_context.trace_id(), requests[0].trace_id());
    assert_eq!(span.parent_span_id, requests[0].span_id());
    assert_eq!(propagated.span_id(), span.span_context.span_id());
    let linked: Vec<SpanId> = span
        .links
        .iter()
        .map(|l| l.span_context.span_id())
        .collect();
    assert_eq!(linked, vec![SpanId::from(2), SpanId::from(3)]);
    let attribute = |key: &str| {
        span.attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.clone())
    };
    assert_eq!(attribute("textgen.step.id"), Some(42i64.into()));
    assert_eq!(attribute("textgen.step.traced_requests"), Some(3i64.into()));
    assert_eq!(attribute("textgen.shard.forward_ms"), Some(3.0f64.into()));
}

#[test]
fn no_traced_request_means_no_step_span() {
    let (tracer, exporter, _provider) = tracer();
    assert!(StepTrace::begin(&tracer, SHAPE, &[]).is_none());
    assert!(exporter.get_finished_spans().unwrap().is_empty());
}

#[test]
fn links_stop_at_the_sdk_limit_and_a_failed_step_is_an_error() {
    let (tracer, exporter, _provider) = tracer();
    let requests: Vec<SpanContext> = (1..=300).map(request).collect();
    let step = StepTrace::begin(&tracer, SHAPE, &requests).unwrap();
    step.end(Err("shard 0 timed out"));
    let [span] = finished(&exporter, "step").try_into().unwrap();
    assert_eq!(span.links.len(), MAX_LINKS);
    assert_eq!(span.links.dropped_count, 0, "nothing is silently dropped");
    assert_eq!(span.status, Status::error("shard 0 timed out"));
}

#[test]
fn the_queue_span_starts_when_the_request_was_submitted() {
    let (tracer, exporter, _provider) = tracer();
    let waited = Duration::from_millis(250);
    record_queue(&tracer, &request(7), waited);
    let [span] = finished(&exporter, "queue").try_into().unwrap();
    assert_eq!(span.parent_span_id, SpanId::from(7));
    let length = span.end_time.duration_since(span.start_time).unwrap();
    assert_eq!(length, waited);
}
