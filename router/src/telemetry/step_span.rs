//! The scheduler's spans: a queue span per request (submission → first step) and one span
//! per step that has traced requests in it.
//!
//! A step serves many requests, but a span has one parent. The step span is a child of the
//! oldest traced request in the batch and carries a link to every other one (up to
//! [`MAX_LINKS`]); the shard spans of that step are its children. One span per step keeps
//! the cost independent of the batch size (docs/observability.md explains the choice).
//! These spans use the OpenTelemetry API directly: they need explicit start times and are
//! built only when some request in the step is traced.
use std::time::{Duration, SystemTime};

use opentelemetry::trace::Span as _;
use opentelemetry::trace::{Link, SpanContext, SpanKind, Status, TraceContextExt, Tracer};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{SdkTracer, Span as SdkSpan};

use crate::pb;

/// Links per step span: the SDK's default limit, so none is silently dropped.
pub const MAX_LINKS: usize = 128;

fn parent_context(parent: &SpanContext) -> Context {
    Context::new().with_remote_span_context(parent.clone())
}

/// Records the time a request waited before its first step, ending now.
pub fn record_queue(tracer: &SdkTracer, parent: &SpanContext, waited: Duration) {
    let now = SystemTime::now();
    let mut span = tracer
        .span_builder("queue")
        .with_kind(SpanKind::Internal)
        .with_start_time(now.checked_sub(waited).unwrap_or(now))
        .with_attributes([KeyValue::new(
            "textgen.queue.duration_ms",
            waited.as_secs_f64() * 1e3,
        )])
        .start_with_context(tracer, &parent_context(parent));
    span.end_with_timestamp(now);
}

/// What a step span says about its step.
#[derive(Debug, Clone, Copy)]
pub struct StepShape {
    pub step_id: u64,
    pub sequences: usize,
    pub tokens: u32,
}

/// A step in flight with its span; [`StepTrace::context`] goes into the Step call.
pub struct StepTrace {
    span: SdkSpan,
    context: Context,
}

impl StepTrace {
    /// Opens the step span under `requests[0]`, linked to the others. `None` when no
    /// request in the step is traced.
    pub fn begin(tracer: &SdkTracer, shape: StepShape, requests: &[SpanContext]) -> Option<Self> {
        let (first, others) = requests.split_first()?;
        let links: Vec<Link> = others
            .iter()
            .take(MAX_LINKS)
            .map(|other| Link::with_context(other.clone()))
            .collect();
        let span = tracer
            .span_builder("step")
            .with_kind(SpanKind::Internal)
            .with_links(links)
            .with_attributes([
                KeyValue::new("textgen.step.id", shape.step_id as i64),
                KeyValue::new("textgen.step.sequences", shape.sequences as i64),
                KeyValue::new("textgen.step.tokens", i64::from(shape.tokens)),
                KeyValue::new("textgen.step.traced_requests", requests.len() as i64),
            ])
            .start_with_context(tracer, &parent_context(first));
        let context = Context::new().with_remote_span_context(span.span_context().clone());
        Some(Self { span, context })
    }

    /// The context to propagate to the shards.
    pub fn context(&self) -> &Context {
        &self.context
    }

    pub fn end(mut self, outcome: Result<&pb::StepResponse, &str>) {
        match outcome {
            Ok(response) => {
                self.span.set_attribute(KeyValue::new(
                    "textgen.shard.forward_ms",
                    response.forward_ns as f64 / 1e6,
                ));
                self.span.set_attribute(KeyValue::new(
                    "textgen.shard.sample_ms",
                    response.sample_ns as f64 / 1e6,
                ));
            }
            Err(message) => self.span.set_status(Status::error(message.to_owned())),
        }
        self.span.end();
    }
}

#[cfg(test)]
#[path = "step_span_tests.rs"]
mod tests;
