//! The request span: one per generation request, a child of the HTTP span, carrying the
//! OpenTelemetry GenAI semantic-convention attributes. The scheduler parents its queue and
//! step spans to it through [`RequestTrace::span_context`].
use std::time::Instant;

use opentelemetry::trace::{SpanContext, TraceContextExt};
use opentelemetry::{Array, StringValue, Value};
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::pb;

/// Values a request is known by once validated.
#[derive(Debug, Clone, Copy)]
pub struct RequestShape<'a> {
    pub input_tokens: u32,
    pub max_new_tokens: u32,
    pub sampling: &'a pb::SamplingParameters,
    /// The seed the client asked for (a drawn seed is not reported).
    pub seed: Option<u64>,
}

/// Follows one request; every method is a no-op when traces are not exported.
#[derive(Debug)]
pub struct RequestTrace {
    span: tracing::Span,
    arrived: Instant,
    first_chunk_seen: bool,
    finish_reasons: Vec<&'static str>,
}

/// GenAI's operation name for a metrics route label.
pub fn operation_of(route: &str) -> &'static str {
    if route.starts_with("chat") {
        "chat"
    } else {
        "text_completion"
    }
}

impl RequestTrace {
    /// Opens the span under the current one (the HTTP span) when traces are exported.
    pub fn start(route: &'static str) -> Self {
        let span = if super::tracer().is_some() {
            let operation = operation_of(route);
            let model = super::served_model();
            tracing::info_span!(
                "gen_ai_request",
                otel.name = format!("{operation} {model}"),
                otel.status_code = Empty,
                gen_ai.operation.name = operation,
                gen_ai.provider.name = "textgen",
                gen_ai.request.model = model,
                gen_ai.response.model = model,
                textgen.route = route,
                gen_ai.request.max_tokens = Empty,
                gen_ai.request.temperature = Empty,
                gen_ai.request.top_p = Empty,
                gen_ai.request.seed = Empty,
                gen_ai.usage.input_tokens = Empty,
                gen_ai.usage.output_tokens = Empty,
                gen_ai.response.time_to_first_chunk = Empty,
                error.type = Empty,
            )
        } else {
            tracing::Span::none()
        };
        Self {
            span,
            arrived: Instant::now(),
            first_chunk_seen: false,
            finish_reasons: Vec::new(),
        }
    }

    /// The span the scheduler's spans hang under: `None` when it is not recorded, so the
    /// scheduler does no tracing work for this request.
    pub fn span_context(&self) -> Option<SpanContext> {
        if self.span.is_none() {
            return None;
        }
        let context = self.span.context();
        let span = context.span();
        let span_context = span.span_context();
        (span_context.is_valid() && span_context.is_sampled()).then(|| span_context.clone())
    }

    pub fn on_validated(&self, shape: RequestShape<'_>) {
        if self.span.is_none() {
            return;
        }
        let span = &self.span;
        span.record("gen_ai.usage.input_tokens", i64::from(shape.input_tokens));
        span.record("gen_ai.request.max_tokens", i64::from(shape.max_new_tokens));
        // 1.0 is the neutral value of both: report them when they change sampling.
        if let Some(temperature) = shape.sampling.temperature.filter(|&t| t != 1.0) {
            span.record("gen_ai.request.temperature", f64::from(temperature));
        }
        if let Some(top_p) = shape.sampling.top_p.filter(|&p| p != 1.0) {
            span.record("gen_ai.request.top_p", f64::from(top_p));
        }
        if let Some(seed) = shape.seed {
            // OTel integers are i64; a seed above i64::MAX keeps its bits.
            span.record("gen_ai.request.seed", seed as i64);
        }
    }

    /// Called for every streamed chunk; the first one sets the time to first chunk.
    pub fn on_chunk(&mut self) {
        if self.first_chunk_seen {
            return;
        }
        self.first_chunk_seen = true;
        if !self.span.is_none() {
            let seconds = self.arrived.elapsed().as_secs_f64();
            self.span
                .record("gen_ai.response.time_to_first_chunk", seconds);
        }
    }

    /// One choice finished for this reason (`stop`, `length`, ...).
    pub fn add_finish_reason(&mut self, reason: &'static str) {
        if !self.span.is_none() {
            self.finish_reasons.push(reason);
        }
    }

    /// The request succeeded: usage (every prompt's tokens, every choice's output) and
    /// finish reasons.
    pub fn succeed(&mut self, input_tokens: u32, output_tokens: u32) {
        if self.span.is_none() {
            return;
        }
        self.span
            .record("gen_ai.usage.input_tokens", i64::from(input_tokens));
        self.span
            .record("gen_ai.usage.output_tokens", i64::from(output_tokens));
        let reasons: Vec<StringValue> = self
            .finish_reasons
            .iter()
            .map(|reason| StringValue::from(*reason))
            .collect();
        self.span.set_attribute(
            "gen_ai.response.finish_reasons",
            Value::Array(Array::String(reasons)),
        );
    }

    /// The request failed; `error_type` is the metrics outcome label.
    pub fn fail(&self, error_type: &'static str) {
        if !self.span.is_none() {
            self.span.record("error.type", error_type);
            self.span.record("otel.status_code", "error");
        }
    }
}
